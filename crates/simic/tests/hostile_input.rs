//! Hostile input at Simic's public entry points (leyline's `testing`
//! strategies: NaN, infinities, values beyond `f32`, integer extremes): a
//! typed error naming the field, or a finite result; never a panic; and a
//! refused call changes nothing (the state after it equals the state before,
//! compared value for value).
//!
//! By class:
//!
//! - non-finite values into state: GAE, the PPO update (a poisoned batch, a
//!   poisoned evaluation, an overflowing loss), the value normaliser, the
//!   rollout buffer's host side, CartPole's states, a checkpoint's import;
//! - validation up front: every float of `PpoConfig`, the trainer and size
//!   fields of `SimicConfig`, `CartpoleConfig`, the loss scalars, the
//!   anomaly thresholds, the buffer's shape;
//! - all-or-nothing mutation: `CartPoleVec::step`, `record_policy`,
//!   `record_host`, `set_reward`, `record_contributions`,
//!   `CoalitionValues::insert`, `Simic::import_state`, a failed round.
//!
//! Cases are few and small (CPU, a CartPole-sized network), so the file
//! runs in seconds.

use leyline::Telemetry;
use leyline::testing::{extreme_f32, extreme_f64, extreme_i64, extreme_usize, non_finite_f64};
use proptest::prelude::*;
use simic::Error;
use simic::buffer::{BufferShape, HostStep, RolloutBuffer};
use simic::cartpole::env::states_tensor;
use simic::cartpole::{ActorCritic, CartPoleVec, CartpoleConfig};
use simic::counterfactual::{Coalition, CoalitionValues, RewardInputs, ShapleyConfig, ShapleyPlan};
use simic::gae::compute_gae;
use simic::ppo::{
    AnomalyThresholds, EntropyAnneal, Evaluation, HeadCoefficients, LossScalars, PpoBatch,
    PpoConfig, PpoTrainer, ValueNormaliser, ValueNormaliserConfig, ppo_loss,
};
use simic::rewards::RewardNormaliser;
use simic::vectorized::{Simic, SimicConfig};
use tamiyo::masks::MaskTensors;
use tamiyo::policy::{PolicyConfig, PolicyRng, SampledActions};
use tch::{Device, Kind, Tensor};
use tolaria::optim::GroupOptimizerConfig;

/// Few cases: each runs libtorch on the CPU.
fn cases(n: u32) -> ProptestConfig {
    ProptestConfig::with_cases(n)
}

fn f32s(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&tensor.detach().to_kind(Kind::Float).reshape([-1])).expect("f32s")
}

/// `tensor` with element `index` (modulo its size) replaced by `value`.
fn with_value(tensor: &Tensor, index: usize, value: f32) -> Tensor {
    let mut values = f32s(tensor);
    let at = index % values.len();
    values[at] = value;
    Tensor::from_slice(&values).view(tensor.size().as_slice())
}

fn same_tensors(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            a.size() == b.size()
                && f32s(a)
                    .iter()
                    .zip(f32s(b))
                    .all(|(x, y)| x.to_bits() == y.to_bits())
        })
}

// --- GAE -------------------------------------------------------------------

const GAE_ROWS: i64 = 2;
const GAE_STEPS: i64 = 3;

fn gae_tensor(values: &[f32]) -> Tensor {
    Tensor::from_slice(values).view([GAE_ROWS, GAE_STEPS])
}

fn flags(pattern: [u8; 6]) -> Tensor {
    Tensor::from_slice(&pattern.map(|flag| flag != 0)).view([GAE_ROWS, GAE_STEPS])
}

proptest! {
    #![proptest_config(cases(32))]

    #[test]
    fn gae_gives_finite_results_or_names_what_is_wrong(
        rewards in prop::array::uniform6(extreme_f32()),
        values in prop::array::uniform6(extreme_f32()),
        bootstrap in prop::array::uniform6(extreme_f32()),
        gamma in extreme_f64(),
        lambda in extreme_f64(),
    ) {
        let finite = |list: &[f32; 6]| list.iter().all(|v| v.is_finite());
        let result = compute_gae(
            &gae_tensor(&rewards),
            &gae_tensor(&values),
            &flags([0, 1, 0, 0, 0, 0]),
            &flags([0, 0, 1, 0, 0, 1]),
            &gae_tensor(&bootstrap),
            gamma,
            lambda,
        );
        let discounts_ok = (0.0..=1.0).contains(&gamma) && (0.0..=1.0).contains(&lambda);
        match result {
            Ok((advantages, returns)) => {
                prop_assert!(discounts_ok);
                prop_assert!(finite(&rewards) && finite(&values) && finite(&bootstrap));
                prop_assert!(f32s(&advantages).iter().chain(&f32s(&returns)).all(|v| v.is_finite()));
            }
            Err(Error::InvalidConfig { field, .. }) => {
                prop_assert!(!discounts_ok, "{field}");
                prop_assert!(field == "compute_gae.gamma" || field == "compute_gae.lambda");
            }
            Err(Error::InvalidInput { field, .. }) => {
                prop_assert!(discounts_ok);
                let named = match field {
                    "compute_gae.rewards" => &rewards,
                    "compute_gae.values" => &values,
                    "compute_gae.bootstrap_values" => &bootstrap,
                    other => return Err(TestCaseError::fail(format!("unexpected field {other}"))),
                };
                prop_assert!(!finite(named), "{field} was finite");
            }
            Err(Error::NonFinite { what, .. }) => {
                // Finite inputs whose results overflow f32.
                prop_assert!(finite(&rewards) && finite(&values) && finite(&bootstrap));
                prop_assert!(what == "compute_gae.advantages" || what == "compute_gae.returns");
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }
}

#[test]
fn gae_refuses_rewards_beyond_f32_as_the_rewards() {
    // f64 rewards of 1e39 for f32 values would become infinite.
    let rewards = Tensor::from_slice(&[0.0_f64, 1e39, 0.0, 0.0, 0.0, 0.0]).view([2, 3]);
    let zeros = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    let result = compute_gae(&rewards, &zeros, &zeros, &zeros, &zeros, 0.99, 0.95);
    assert!(
        matches!(
            result,
            Err(Error::InvalidInput {
                field: "compute_gae.rewards",
                ..
            })
        ),
        "{result:?}"
    );
}

// --- the PPO update ----------------------------------------------------------

const ROWS: i64 = 8;

/// A CartPole network, eight observations and actions, and the batch the
/// network itself would have produced.
struct Ppo {
    agent: ActorCritic,
    obs: Tensor,
    actions: Tensor,
}

impl Ppo {
    fn new() -> Ppo {
        let obs: Vec<f32> = (0..ROWS * 4)
            .map(|i| ((i as f32) * 0.37).sin() * 0.05)
            .collect();
        let actions: Vec<i64> = (0..ROWS).map(|i| i % 2).collect();
        Ppo {
            agent: ActorCritic::new(Device::Cpu, 11).expect("agent"),
            obs: Tensor::from_slice(&obs).view([ROWS, 4]),
            actions: Tensor::from_slice(&actions).view([ROWS, 1]),
        }
    }

    fn trainer(&self, epochs: usize, minibatches: usize) -> PpoTrainer {
        let config = PpoConfig {
            learning_rate: 1e-2,
            target_kl: None,
            epochs,
            minibatches,
            value_warmup_updates: 0,
            ..PpoConfig::default()
        };
        PpoTrainer::new(self.agent.parameters(), config, Device::Cpu).expect("trainer")
    }

    fn batch(&self) -> PpoBatch {
        let _guard = tch::no_grad_guard();
        let log_probs = self
            .agent
            .logits(&self.obs)
            .expect("logits")
            .log_softmax(-1, Kind::Float)
            .gather(1, &self.actions, false)
            .view([ROWS, 1, 1]);
        let values = self
            .agent
            .values(&self.obs)
            .expect("values")
            .view([ROWS, 1]);
        let advantages: Vec<f32> = (0..ROWS).map(|i| (i as f32 - 3.5) * 0.3).collect();
        let advantages = Tensor::from_slice(&advantages).view([ROWS, 1]);
        let ones = Tensor::ones([ROWS, 1], (Kind::Float, Device::Cpu));
        PpoBatch {
            log_probs,
            returns: &values + &advantages,
            old_values: values,
            advantages,
            head_weights: ones.unsqueeze(-1),
            actor_weight: ones.copy(),
            value_weight: ones,
        }
    }

    fn evaluate(&self, rows: &Tensor) -> simic::Result<Evaluation> {
        let x = self.obs.index_select(0, rows);
        let log_softmax = self.agent.logits(&x)?.log_softmax(-1, Kind::Float);
        let chosen = self.actions.index_select(0, rows);
        Ok(Evaluation {
            anchor: None,
            log_probs: log_softmax.gather(1, &chosen, false).unsqueeze(-1),
            entropies: (log_softmax.exp() * &log_softmax)
                .sum_dim_intlist(&[-1_i64][..], true, Kind::Float)
                .neg()
                .unsqueeze(-1),
            values: self.agent.values(&x)?.unsqueeze(-1),
            auxiliary: None,
        })
    }
}

/// Everything an update may change, copied.
struct TrainerState {
    tensors: Vec<Tensor>,
    updates: u64,
    rng: PolicyRng,
    learning_rate: f64,
}

fn trainer_state(trainer: &PpoTrainer) -> TrainerState {
    let optimizer = trainer.optimizer();
    let mut tensors: Vec<Tensor> = trainer.parameters().iter().map(Tensor::detach).collect();
    tensors.extend(optimizer.state_tensors());
    tensors.push(optimizer.step_count_tensor().shallow_clone());
    tensors.push(optimizer.learning_rate_tensor().shallow_clone());
    TrainerState {
        tensors: tensors.iter().map(|t| t.detach().copy()).collect(),
        updates: trainer.updates(),
        rng: trainer.rng().clone(),
        learning_rate: optimizer.config().learning_rate(),
    }
}

fn same_state(a: &TrainerState, b: &TrainerState) -> bool {
    same_tensors(&a.tensors, &b.tensors)
        && a.updates == b.updates
        && a.rng == b.rng
        && a.learning_rate == b.learning_rate
}

const BATCH_FIELDS: [&str; 7] = [
    "PpoBatch.log_probs",
    "PpoBatch.advantages",
    "PpoBatch.returns",
    "PpoBatch.old_values",
    "PpoBatch.head_weights",
    "PpoBatch.actor_weight",
    "PpoBatch.value_weight",
];

fn poison_batch(batch: PpoBatch, field: usize, index: usize, value: f32) -> PpoBatch {
    let put = |tensor: &Tensor| with_value(tensor, index, value);
    match field {
        0 => PpoBatch {
            log_probs: put(&batch.log_probs),
            ..batch
        },
        1 => PpoBatch {
            advantages: put(&batch.advantages),
            ..batch
        },
        2 => PpoBatch {
            returns: put(&batch.returns),
            ..batch
        },
        3 => PpoBatch {
            old_values: put(&batch.old_values),
            ..batch
        },
        4 => PpoBatch {
            head_weights: put(&batch.head_weights),
            ..batch
        },
        5 => PpoBatch {
            actor_weight: put(&batch.actor_weight),
            ..batch
        },
        _ => PpoBatch {
            value_weight: put(&batch.value_weight),
            ..batch
        },
    }
}

/// A clean update of the refused trainer and of a twin that never saw the
/// refusal end in the same parameters: the refusal left nothing behind
/// (parameters, moments, step counts, learning rate, counter, generator).
fn refusal_left_nothing(
    ppo: &Ppo,
    trainer: &mut PpoTrainer,
    epochs: usize,
    minibatches: usize,
) -> bool {
    let twin = Ppo::new();
    let mut twin_trainer = twin.trainer(epochs, minibatches);
    let ours = trainer.update(&ppo.batch(), |rows| ppo.evaluate(rows));
    let theirs = twin_trainer.update(&twin.batch(), |rows| twin.evaluate(rows));
    ours.is_ok()
        && theirs.is_ok()
        && same_state(&trainer_state(trainer), &trainer_state(&twin_trainer))
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn a_poisoned_batch_is_refused_naming_the_field_and_changes_nothing(
        field in 0..BATCH_FIELDS.len(),
        index in 0..64usize,
        value in prop_oneof![
            non_finite_f64().prop_map(|v| v as f32),
            Just(1e39_f64 as f32),
            Just(-1.0_f32),
            Just(f32::MIN),
            Just(f32::MAX),
        ],
        minibatches in 1..=2usize,
    ) {
        let ppo = Ppo::new();
        let mut trainer = ppo.trainer(2, minibatches);
        let batch = poison_batch(ppo.batch(), field, index, value);
        let before = trainer_state(&trainer);
        let result = trainer.update(&batch, |rows| ppo.evaluate(rows));
        let weight = field >= 4;
        let must_refuse = !value.is_finite() || (weight && value < 0.0);
        match result {
            Err(Error::InvalidInput { field: named, .. }) => {
                prop_assert!(must_refuse, "{named} refused {value}");
                prop_assert_eq!(named, BATCH_FIELDS[field]);
            }
            // Finite but extreme: a loss or gradient that overflows.
            Err(Error::NonFinite { what, .. }) => {
                prop_assert!(!must_refuse, "{what}");
                prop_assert!(what == "ppo.loss" || what == "ppo.grad_norm");
            }
            Ok(stats) => {
                prop_assert!(!must_refuse);
                prop_assert!(stats.total_loss.is_finite());
                prop_assert!(trainer.parameters().iter().all(|p| f32s(p).iter().all(|v| v.is_finite())));
                return Ok(());
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
        prop_assert!(same_state(&before, &trainer_state(&trainer)), "a refused update changed the trainer");
        prop_assert!(refusal_left_nothing(&ppo, &mut trainer, 2, minibatches));
    }

    #[test]
    fn a_non_finite_loss_is_refused_before_any_step_and_changes_nothing(
        output in 0..3usize,
        row in 0..ROWS,
        bad in prop_oneof![non_finite_f64(), Just(1e30), Just(-1e30)],
        minibatches in 1..=2usize,
    ) {
        let ppo = Ppo::new();
        let mut trainer = ppo.trainer(2, minibatches);
        let before = trainer_state(&trainer);
        let batch = ppo.batch();
        // One row of the evaluation (log-probs, entropies or values) is
        // replaced by `bad`; with two minibatches it may come after a step.
        let result = trainer.update(&batch, |rows| {
            let evaluation = ppo.evaluate(rows)?;
            let keep = rows.ne(row);
            let poison = |out: &Tensor| {
                let keep = keep.view([-1, 1, 1]).expand_as(&out.view([-1, 1, 1])).view(out.size().as_slice());
                out.where_self(&keep, &Tensor::from(bad as f32))
            };
            Ok(match output {
                0 => Evaluation { log_probs: poison(&evaluation.log_probs), ..evaluation },
                1 => Evaluation { entropies: poison(&evaluation.entropies), ..evaluation },
                _ => Evaluation { values: poison(&evaluation.values), ..evaluation },
            })
        });
        // A NaN always poisons the loss; an infinity does too except in a
        // log-probability, whose ratio is clamped.
        let must_refuse = bad.is_nan() || (bad.is_infinite() && output != 0);
        match result {
            Err(Error::NonFinite { what, .. }) => {
                prop_assert!(what == "ppo.loss" || what == "ppo.grad_norm", "{what}");
                prop_assert!(same_state(&before, &trainer_state(&trainer)), "a refused update changed the trainer");
                prop_assert!(refusal_left_nothing(&ppo, &mut trainer, 2, minibatches));
            }
            Ok(stats) => {
                prop_assert!(!must_refuse, "{bad} in output {output} passed: {stats:?}");
                prop_assert!(trainer.parameters().iter().all(|p| f32s(p).iter().all(|v| v.is_finite())));
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }

    #[test]
    fn loss_scalars_are_checked_before_the_loss(
        values in prop::array::uniform6(extreme_f64()),
        clipped in any::<bool>(),
    ) {
        let ppo = Ppo::new();
        let batch = ppo.batch();
        let rows = Tensor::arange(ROWS, (Kind::Int64, Device::Cpu));
        let evaluation = ppo.evaluate(&rows).expect("evaluation");
        let coefficients = HeadCoefficients::new(&PpoConfig::default(), Device::Cpu).expect("coefficients");
        let scalars = LossScalars {
            clip: values[0],
            value_coef: values[1],
            value_clip: clipped.then_some(values[2]),
            entropy_coef: values[3],
            floor_scale: values[4],
            contribution_coef: values[5],
            objective: simic::ppo::Objective::Ppo,
        };
        let fits = |v: f64| v.is_finite() && v.abs() <= f64::from(f32::MAX);
        let positive = |v: f64| fits(v) && v > 0.0;
        let non_negative = |v: f64| fits(v) && v >= 0.0;
        let valid = positive(values[0])
            && (!clipped || positive(values[2]))
            && [values[1], values[3], values[4], values[5]].into_iter().all(non_negative);
        match ppo_loss(&batch, &evaluation, &coefficients, &scalars) {
            Ok(_) => prop_assert!(valid),
            Err(Error::InvalidInput { field, .. }) => {
                prop_assert!(!valid);
                prop_assert!(field.starts_with("LossScalars."));
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }
}

// --- configurations -----------------------------------------------------------

type PpoSetter = fn(&mut PpoConfig, f64);

/// Every float of `PpoConfig` with the field its error must name.
const PPO_FLOATS: [(&str, PpoSetter); 17] = [
    ("PpoConfig.learning_rate", |c, v| c.learning_rate = v),
    ("PpoConfig.adam_eps", |c, v| c.adam_eps = v),
    ("PpoConfig.clip", |c, v| c.clip = v),
    ("PpoConfig.gamma", |c, v| c.gamma = v),
    ("PpoConfig.gae_lambda", |c, v| c.gae_lambda = v),
    ("PpoConfig.target_kl", |c, v| c.target_kl = Some(v)),
    ("PpoConfig.kl_stop_factor", |c, v| c.kl_stop_factor = v),
    ("PpoConfig.entropy_coef", |c, v| c.entropy_coef = v),
    ("PpoConfig.entropy_anneal.final_coef", |c, v| {
        c.entropy_anneal = Some(EntropyAnneal {
            final_coef: v,
            updates: 1,
        })
    }),
    ("PpoConfig.head_entropy_multipliers", |c, v| {
        c.head_entropy_multipliers = vec![v]
    }),
    ("PpoConfig.entropy_floors", |c, v| {
        c.entropy_floors = vec![v]
    }),
    ("PpoConfig.entropy_floor_coefs", |c, v| {
        c.entropy_floor_coefs = vec![v]
    }),
    ("PpoConfig.value_coef", |c, v| c.value_coef = v),
    ("PpoConfig.value_warmup_start", |c, v| {
        c.value_warmup_start = v
    }),
    ("PpoConfig.value_clip", |c, v| c.value_clip = Some(v)),
    ("PpoConfig.max_grad_norm", |c, v| c.max_grad_norm = v),
    ("PpoConfig.advantage_std_floor", |c, v| {
        c.advantage_std_floor = v
    }),
];

/// A small Simic configuration (one environment, a small policy).
fn simic_config() -> SimicConfig {
    let mut config = SimicConfig::reference(2);
    config.n_envs = 1;
    config.trainer.batch_size = 32;
    config.policy = PolicyConfig {
        feature_dim: 16,
        hidden_dim: 16,
        ..PolicyConfig::default()
    };
    config
}

type SimicSetter = fn(&mut SimicConfig, f64, usize);

/// Fields of `SimicConfig` set from a hostile float (`true`) or size
/// (`false`), with the field the error must name.
const SIMIC_FIELDS: [(&str, bool, SimicSetter); 14] = [
    (
        "SimicConfig.trainer.optimizer.host.learning_rate",
        true,
        |c, v, _| c.trainer.optimizer.host = GroupOptimizerConfig::sgd(v, 0.9),
    ),
    (
        "SimicConfig.trainer.optimizer.seed.momentum",
        true,
        |c, v, _| c.trainer.optimizer.seed = GroupOptimizerConfig::sgd(0.01, v),
    ),
    ("SimicConfig.n_envs", false, |c, _, n| c.n_envs = n),
    ("SimicConfig.episode_length", false, |c, _, n| {
        c.episode_length = u32::try_from(n).unwrap_or(u32::MAX)
    }),
    ("SimicConfig.trainer.batch_size", false, |c, _, n| {
        c.trainer.batch_size = n
    }),
    (
        "SimicConfig.trainer.validation_batch_size",
        false,
        |c, _, n| c.trainer.validation_batch_size = n,
    ),
    ("SimicConfig.trainer.microbatches", false, |c, _, n| {
        c.trainer.microbatches = n
    }),
    ("SimicConfig.trainer.clip_grad_norm", true, |c, v, _| {
        c.trainer.clip_grad_norm = Some(v)
    }),
    (
        "SimicConfig.trainer.snapshot_interval_epochs",
        false,
        |c, _, n| c.trainer.snapshot_interval_epochs = n,
    ),
    ("PpoConfig.learning_rate", true, |c, v, _| {
        c.ppo.learning_rate = v
    }),
    ("PpoConfig.epochs", false, |c, _, n| c.ppo.epochs = n),
    ("ValueNormaliserConfig.momentum", true, |c, v, _| {
        c.value_normaliser.momentum = v
    }),
    ("RewardNormaliserConfig.clip", true, |c, v, _| {
        c.reward_normaliser.clip = v
    }),
    ("ShapleyConfig.permutations", false, |c, _, n| {
        c.shapley = Some(ShapleyConfig {
            permutations: n,
            ..ShapleyConfig::default()
        })
    }),
];

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn every_ppo_float_is_finite_and_in_range_or_named(
        field in 0..PPO_FLOATS.len(),
        value in extreme_f64(),
    ) {
        let (name, set) = PPO_FLOATS[field];
        let mut config = PpoConfig::default();
        set(&mut config, value);
        match config.validate() {
            Ok(()) => prop_assert!(value.is_finite(), "{name} accepted {value}"),
            Err(Error::InvalidConfig { field, .. }) => prop_assert_eq!(field, name),
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }

    #[test]
    fn simic_config_checks_its_fields_before_a_round(
        field in 0..SIMIC_FIELDS.len(),
        value in extreme_f64(),
        size in extreme_usize(),
    ) {
        let (name, float, set) = SIMIC_FIELDS[field];
        let mut config = simic_config();
        set(&mut config, value, size);
        match config.validate() {
            Ok(()) => {
                let sane = if float { value.is_finite() } else { size > 0 };
                prop_assert!(sane, "{name} accepted {value} / {size}");
            }
            Err(Error::InvalidConfig { field, .. }) => prop_assert_eq!(field, name),
            Err(other) => return Err(TestCaseError::fail(format!("{name}: untyped: {other}"))),
        }
    }

    #[test]
    fn cartpole_config_names_its_own_fields(value in extreme_f64(), which in 0..3usize) {
        let mut config = CartpoleConfig::default();
        let name = match which {
            0 => { config.learning_rate = value; "CartpoleConfig.learning_rate" }
            1 => { config.clip = value; "CartpoleConfig.clip" }
            _ => { config.gamma = value; "CartpoleConfig.gamma" }
        };
        match config.validate() {
            Ok(()) => prop_assert!(value.is_finite()),
            Err(Error::InvalidConfig { field, .. }) => prop_assert_eq!(field, name),
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }

    #[test]
    fn anomaly_thresholds_are_finite_and_positive(values in prop::array::uniform3(extreme_f64())) {
        let thresholds = AnomalyThresholds {
            ratio_explosion: values[0],
            ratio_collapse: values[1],
            value_collapse_std: values[2],
        };
        let valid = values[0].is_finite() && values[0] > 0.0
            && values[1].is_finite() && values[1] > 0.0
            && values[2].is_finite() && values[2] >= 0.0;
        match thresholds.validate() {
            Ok(()) => prop_assert!(valid),
            Err(Error::InvalidConfig { field, .. }) => {
                prop_assert!(!valid);
                prop_assert!(field.starts_with("AnomalyThresholds."));
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }

    #[test]
    fn buffer_shapes_are_checked_before_allocating(
        sizes in prop::array::uniform4(extreme_usize()),
    ) {
        let shape = BufferShape {
            n_envs: sizes[0],
            max_steps: sizes[1],
            obs_dim: sizes[2],
            num_slots: sizes[3],
        };
        match RolloutBuffer::new(shape, Device::Cpu) {
            Ok(buffer) => prop_assert!(sizes.iter().all(|&s| s >= 1) && buffer.shape() == shape),
            Err(Error::InvalidConfig { field, .. }) => prop_assert!(field.starts_with("BufferShape.")),
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }
}

#[test]
fn simic_config_refuses_empty_batches_and_a_nan_learning_rate() {
    let mut config = simic_config();
    config.trainer.batch_size = 0;
    assert!(matches!(
        config.validate(),
        Err(Error::InvalidConfig {
            field: "SimicConfig.trainer.batch_size",
            ..
        })
    ));
    let mut config = simic_config();
    config.trainer.validation_batch_size = 0;
    assert!(matches!(
        config.validate(),
        Err(Error::InvalidConfig {
            field: "SimicConfig.trainer.validation_batch_size",
            ..
        })
    ));
    let mut config = simic_config();
    config.trainer.optimizer.host = GroupOptimizerConfig::sgd(f64::NAN, 0.9);
    assert!(matches!(
        config.validate(),
        Err(Error::InvalidConfig {
            field: "SimicConfig.trainer.optimizer.host.learning_rate",
            ..
        })
    ));
    let mut config = simic_config();
    config.ppo.learning_rate = f64::NAN;
    let refused = Simic::new(config, 3, Device::Cpu, Telemetry::disabled());
    assert!(matches!(
        refused,
        Err(Error::InvalidConfig {
            field: "PpoConfig.learning_rate",
            ..
        })
    ));
    simic_config()
        .validate()
        .expect("the small configuration is valid");
}

// --- the value normaliser ------------------------------------------------------

proptest! {
    #![proptest_config(cases(32))]

    #[test]
    fn value_normaliser_updates_are_all_or_nothing(
        returns in prop::array::uniform4(extreme_f32()),
        weights in prop::array::uniform4(extreme_f32()),
        weighted in any::<bool>(),
    ) {
        let mut normaliser = ValueNormaliser::new(ValueNormaliserConfig::default(), Device::Cpu).expect("normaliser");
        normaliser.update(&Tensor::from_slice(&[1.0_f32, 2.0, 4.0]), None).expect("first update");
        let before = normaliser.state().expect("state");
        let x = Tensor::from_slice(&returns);
        let w = Tensor::from_slice(&weights);
        let result = normaliser.update(&x, weighted.then_some(&w));
        let inputs_ok = returns.iter().all(|v| v.is_finite())
            && (!weighted || weights.iter().all(|v| v.is_finite() && *v >= 0.0));
        match result {
            Ok(()) => {
                prop_assert!(inputs_ok);
                let after = normaliser.state().expect("state");
                prop_assert!(after.mean.is_finite() && after.var.is_finite() && after.var >= 0.0);
                prop_assert_eq!(after.updates, before.updates + 1);
            }
            Err(error) => {
                match &error {
                    Error::InvalidInput { field, .. } => prop_assert!(!inputs_ok, "{field}"),
                    Error::NonFinite { what, .. } => prop_assert!(inputs_ok, "{what}"),
                    other => return Err(TestCaseError::fail(format!("untyped: {other}"))),
                }
                let after = normaliser.state().expect("state");
                prop_assert_eq!(after, before);
            }
        }
    }
}

// --- the rollout buffer -----------------------------------------------------------

const ENVS: usize = 2;
const STEPS: usize = 3;
const SLOTS: usize = 2;
const OBS: usize = 5;

fn buffer() -> RolloutBuffer {
    RolloutBuffer::new(
        BufferShape {
            n_envs: ENVS,
            max_steps: STEPS,
            obs_dim: OBS,
            num_slots: SLOTS,
        },
        Device::Cpu,
    )
    .expect("buffer")
}

fn host(rewards: Vec<f32>) -> HostStep {
    HostStep {
        rewards,
        terminated: vec![false; ENVS],
        truncated: vec![true; ENVS],
        forced: vec![false; ENVS],
        valid: vec![true; ENVS],
    }
}

/// Everything a buffer holds, as the round would read it.
fn contents(buffer: &RolloutBuffer) -> Vec<Tensor> {
    let rollout = buffer.finish().expect("finish");
    let mut tensors = vec![
        rollout.obs,
        rollout.blueprints.to_kind(Kind::Float),
        rollout.actions.to_kind(Kind::Float),
        rollout.log_probs,
        rollout.values,
        rollout.relevance.to_kind(Kind::Float),
        rollout.bootstrap,
        rollout.slot_by_op.to_kind(Kind::Float),
        rollout.rewards,
        rollout.terminated.to_kind(Kind::Float),
        rollout.truncated.to_kind(Kind::Float),
        rollout.forced.to_kind(Kind::Float),
        rollout.valid.to_kind(Kind::Float),
        rollout.contributions,
        rollout.contribution_mask,
    ];
    tensors.extend(rollout.heads.iter().map(|mask| mask.to_kind(Kind::Float)));
    tensors
}

fn sample(n: i64) -> SampledActions {
    let heads = leyline::NUM_ACTION_HEADS as i64;
    SampledActions {
        actions: Tensor::ones([n, heads], (Kind::Int64, Device::Cpu)),
        log_probs: Tensor::full([n, heads], -0.5, (Kind::Float, Device::Cpu)),
        entropies: Tensor::ones([n, heads], (Kind::Float, Device::Cpu)),
        relevance: Tensor::ones([n, heads], (Kind::Bool, Device::Cpu)),
        masks: MaskTensors::allow_all(ENVS, SLOTS, Device::Cpu)
            .expect("masks")
            .heads,
    }
}

proptest! {
    #![proptest_config(cases(32))]

    #[test]
    fn host_rewards_enter_only_finite(
        rewards in prop::array::uniform2(extreme_f32()),
        step in 0..STEPS,
        replacement in extreme_f32(),
        env in 0..ENVS,
    ) {
        let mut buffer = buffer();
        buffer.record_host(0, &host(vec![0.25, -0.5])).expect("a finite step");
        let before = contents(&buffer);
        match buffer.record_host(step, &host(rewards.to_vec())) {
            Ok(()) => prop_assert!(rewards.iter().all(|r| r.is_finite())),
            Err(Error::InvalidInput { field: "HostStep.rewards", .. }) => {
                prop_assert!(rewards.iter().any(|r| !r.is_finite()));
                prop_assert!(same_tensors(&before, &contents(&buffer)));
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
        // The rollback rule's rewrite: only a finite reward, and nothing
        // changes when refused.
        let before = contents(&buffer);
        match buffer.set_reward(env, step, replacement) {
            Ok(()) => prop_assert!(replacement.is_finite()),
            Err(Error::InvalidInput { field: "RolloutBuffer.set_reward", .. }) => {
                prop_assert!(!replacement.is_finite());
                prop_assert!(same_tensors(&before, &contents(&buffer)));
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
        prop_assert!(buffer.set_reward(ENVS, 0, 1.0).is_err());
        prop_assert!(buffer.finish().is_ok());
    }

    #[test]
    fn contribution_targets_enter_only_as_finite_f32(
        values in prop::array::uniform2(prop::option::of(extreme_f64())),
    ) {
        let mut buffer = buffer();
        buffer.record_contributions(1, 1, &[Some(2.5), None]).expect("a finite target");
        let before = contents(&buffer);
        let fits = |v: &f64| v.is_finite() && v.abs() <= f64::from(f32::MAX);
        match buffer.record_contributions(0, 0, &values) {
            Ok(()) => {
                prop_assert!(values.iter().flatten().all(fits));
                prop_assert!(f32s(&buffer.finish().expect("finish").contributions).iter().all(|v| v.is_finite()));
            }
            Err(Error::InvalidInput { field: "RolloutBuffer.record_contributions", .. }) => {
                prop_assert!(!values.iter().flatten().all(fits));
                prop_assert!(same_tensors(&before, &contents(&buffer)));
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }
}

#[test]
fn record_policy_writes_nothing_when_any_argument_is_refused() {
    let mut buffer = buffer();
    let n = ENVS as i64;
    let obs = Tensor::ones([n, OBS as i64], (Kind::Float, Device::Cpu));
    let blueprints = Tensor::ones([n, SLOTS as i64], (Kind::Int64, Device::Cpu));
    let values = Tensor::full([n], 0.75, (Kind::Float, Device::Cpu));
    let masks = MaskTensors::allow_all(ENVS, SLOTS, Device::Cpu).expect("masks");
    let before = contents(&buffer);
    // Every argument but the last one checked fits: the old code had
    // written the observations, values and actions before refusing it.
    let bad_masks = MaskTensors {
        heads: masks.heads.each_ref().map(Tensor::shallow_clone),
        slot_by_op: Tensor::ones([n, 1], (Kind::Bool, Device::Cpu)),
    };
    let refused = buffer.record_policy(1, &obs, &blueprints, &values, &sample(n), &bad_masks);
    assert!(
        matches!(refused, Err(Error::ShapeMismatch { .. })),
        "{refused:?}"
    );
    assert!(same_tensors(&before, &contents(&buffer)));
    // Integer values are refused too, before anything is written.
    let refused = buffer.record_policy(
        1,
        &obs,
        &blueprints,
        &values.to_kind(Kind::Int64),
        &sample(n),
        &masks,
    );
    assert!(matches!(refused, Err(Error::ShapeMismatch { .. })));
    assert!(same_tensors(&before, &contents(&buffer)));
    // And the same call with fitting masks writes.
    buffer
        .record_policy(1, &obs, &blueprints, &values, &sample(n), &masks)
        .expect("a fitting step");
    assert!(!same_tensors(&before, &contents(&buffer)));
}

// --- CartPole ------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn cartpole_steps_every_environment_or_none(
        actions in prop::array::uniform3(prop_oneof![3 => 0_i64..2, 1 => extreme_i64()]),
        seed in any::<u64>(),
    ) {
        let mut envs = CartPoleVec::new(3, seed).expect("envs");
        let pristine = envs.clone();
        match envs.step(&actions) {
            Ok(step) => {
                prop_assert!(actions.iter().all(|a| *a == 0 || *a == 1));
                prop_assert_eq!(step.rewards.len(), 3);
            }
            Err(Error::InvalidInput { field: "CartPoleVec.step.actions", .. }) => {
                prop_assert!(actions.iter().any(|a| *a != 0 && *a != 1));
                prop_assert_eq!(envs.states(), pristine.states());
                // Lengths, returns and the reset generator too: the two
                // vectors go on identically.
                let mut twin = pristine.clone();
                for _ in 0..40 {
                    let ours = envs.step(&[1, 0, 1]).expect("step");
                    let theirs = twin.step(&[1, 0, 1]).expect("step");
                    prop_assert_eq!(ours, theirs);
                }
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
        // A wrong count moves nothing either.
        let before = envs.states().to_vec();
        prop_assert!(envs.step(&[0, 1]).is_err());
        prop_assert_eq!(envs.states(), before.as_slice());
    }

    #[test]
    fn cartpole_states_are_finite_f32s(state in prop::array::uniform4(extreme_f64()), env in 0..4usize) {
        let mut envs = CartPoleVec::new(3, 5).expect("envs");
        let before = envs.states().to_vec();
        let fits = state.iter().all(|v| v.is_finite() && v.abs() <= f64::from(f32::MAX));
        match envs.set_state(env, state) {
            Ok(()) => {
                prop_assert!(fits && env < 3);
                let obs = envs.observations(Device::Cpu).expect("observations");
                prop_assert!(f32s(&obs).iter().all(|v| v.is_finite()));
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(!fits || env >= 3);
                prop_assert_eq!(envs.states(), before.as_slice());
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
        match states_tensor(&[state], Device::Cpu) {
            Ok(tensor) => prop_assert!(fits && f32s(&tensor).iter().all(|v| v.is_finite())),
            Err(Error::InvalidInput { field, .. }) => {
                prop_assert!(!fits);
                prop_assert_eq!(field, "states_tensor.states");
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }
}

// --- counterfactual attribution -----------------------------------------------------

proptest! {
    #![proptest_config(cases(128))]

    #[test]
    fn coalition_values_are_accuracies_and_refusals_change_nothing(
        value in extreme_f64(),
        bits in 0u64..8,
    ) {
        let mut values = CoalitionValues::new(3).expect("values");
        values.insert(Coalition::EMPTY, 50.0).expect("a plain accuracy");
        let before = values.clone();
        match values.insert(Coalition::from_bits(bits), value) {
            Ok(()) => prop_assert!(value.is_finite() && (0.0..=100.0).contains(&value)),
            Err(Error::InvalidInput { field, .. }) => {
                prop_assert_eq!(field, "CoalitionValues.value");
                prop_assert_eq!(values, before);
            }
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }

    #[test]
    fn attribution_estimates_of_accepted_values_are_finite(
        accuracies in prop::collection::vec(prop_oneof![Just(0.0), Just(100.0), 0.0..=100.0_f64], 8),
        val in extreme_f64(),
    ) {
        let plan = ShapleyPlan::new(3, &ShapleyConfig::default()).expect("plan");
        let values = CoalitionValues::from_fn(3, plan.coalitions(), |c| accuracies[c.bits() as usize % 8]).expect("values");
        let shapley = plan.estimate(&values).expect("estimate");
        prop_assert!(shapley.iter().all(|v| v.mean.is_finite() && v.std.is_finite()));
        match RewardInputs::new(val, &values) {
            Ok(inputs) => {
                prop_assert!(val.is_finite() && (0.0..=100.0).contains(&val));
                prop_assert!(inputs.contributions.iter().flatten().chain(inputs.total.iter()).all(|v| v.is_finite()));
            }
            Err(Error::InvalidInput { .. }) => prop_assert!(!(val.is_finite() && (0.0..=100.0).contains(&val))),
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }

    #[test]
    fn reward_normaliser_refusals_change_nothing(reward in extreme_f64()) {
        let mut normaliser = RewardNormaliser::new(Default::default()).expect("normaliser");
        for seen in [1.0, -2.0, 0.5] {
            normaliser.update_and_normalise(seen).expect("a plain reward");
        }
        let before = normaliser.clone();
        match normaliser.update_and_normalise(reward) {
            Ok(scaled) => prop_assert!(scaled.is_finite() && scaled.abs() <= 10.0),
            Err(Error::InvalidInput { .. }) => prop_assert_eq!(normaliser, before),
            Err(other) => return Err(TestCaseError::fail(format!("untyped: {other}"))),
        }
    }
}

// --- Simic: checkpoints, thresholds, a failed round ---------------------------------

fn simic() -> Simic {
    Simic::new(simic_config(), 3, Device::Cpu, Telemetry::disabled()).expect("simic")
}

/// The trainer's whole state as `export_state` gives it, copied.
fn exported(simic: &Simic) -> (simic::vectorized::SimicState, Vec<(String, Tensor)>) {
    let (state, tensors) = simic.export_state().expect("export");
    let tensors = tensors
        .into_iter()
        .map(|(name, tensor)| (name, tensor.detach().copy()))
        .collect();
    (state, tensors)
}

fn same_export(
    a: &(simic::vectorized::SimicState, Vec<(String, Tensor)>),
    b: &(simic::vectorized::SimicState, Vec<(String, Tensor)>),
) -> bool {
    let tensors = |list: &[(String, Tensor)]| {
        list.iter()
            .map(|(_, t)| t.shallow_clone())
            .collect::<Vec<_>>()
    };
    a.0 == b.0
        && a.1.iter().map(|(n, _)| n).eq(b.1.iter().map(|(n, _)| n))
        && same_tensors(&tensors(&a.1), &tensors(&b.1))
}

proptest! {
    #![proptest_config(cases(16))]

    #[test]
    fn a_refused_import_changes_nothing(
        which in 0..64usize,
        index in 0..1024usize,
        bad in non_finite_f64(),
        drop_one in any::<bool>(),
    ) {
        let mut target = simic();
        // A checkpoint of another trainer (other seed: other parameters).
        let mut source_config = simic_config();
        source_config.seed = 9;
        let source = Simic::new(source_config, 3, Device::Cpu, Telemetry::disabled()).expect("source");
        let (state, mut tensors) = exported(&source);
        let at = which % tensors.len();
        if drop_one {
            let _dropped = tensors.remove(at);
        } else {
            let poisoned = with_value(&tensors[at].1, index, bad as f32);
            tensors[at].1 = poisoned;
        }
        let before = exported(&target);
        match target.import_state(&state, &tensors) {
            Err(Error::InvalidInput { field: "Simic.import_state", .. }) => {}
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
        prop_assert!(same_export(&before, &exported(&target)), "a refused import changed the trainer");
        // The clean checkpoint still imports, and then it is what we hold.
        let (state, tensors) = exported(&source);
        target.import_state(&state, &tensors).expect("a clean import");
        prop_assert!(same_export(&(state, tensors), &exported(&target)));
    }

    #[test]
    fn refused_anomaly_thresholds_are_not_kept(value in non_finite_f64()) {
        let mut simic = simic();
        let before = simic.anomaly_thresholds();
        let refused = simic.set_anomaly_thresholds(AnomalyThresholds {
            ratio_collapse: value,
            ..AnomalyThresholds::default()
        });
        let named = matches!(
            refused,
            Err(Error::InvalidConfig {
                field: "AnomalyThresholds.ratio_collapse",
                ..
            })
        );
        prop_assert!(named, "{refused:?}");
        prop_assert_eq!(simic.anomaly_thresholds(), before);
    }
}

#[test]
fn a_failed_round_puts_the_learning_state_back() {
    use kasmina::host::CnnHostConfig;
    use simic::vectorized::EnvSpec;
    use tolaria::data::synthetic::{ImageTaskOptions, image_task};

    let train = image_task(&ImageTaskOptions::fashion_like(64, 21)).expect("train");
    let validation = image_task(&ImageTaskOptions::fashion_like(32, 22)).expect("validation");
    let spec = EnvSpec::sharded(
        CnnHostConfig::fashion_mnist(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        1,
    )
    .expect("spec");
    let mut simic = simic();
    // A policy whose parameters are NaN: the round fails (in the policy
    // step or, at the latest, in the update's batch check) after it has
    // fed observations to the normaliser.
    {
        let _guard = tch::no_grad_guard();
        for mut parameter in simic.policy().var_store().trainable_variables() {
            let _ = parameter.fill_(f64::NAN);
        }
    }
    let (state, tensors) = exported(&simic);
    let refused = simic.run_round(&spec, true);
    assert!(refused.is_err(), "{refused:?}");
    let (after_state, after_tensors) = exported(&simic);
    assert_eq!(after_state, state, "the round changed the learning state");
    // NaN is not equal to itself: compare the bits.
    let bits = |list: &[(String, Tensor)]| {
        list.iter()
            .flat_map(|(_, t)| f32s(t).into_iter().map(f32::to_bits).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&after_tensors), bits(&tensors));
    assert_eq!(simic.rounds(), 0);
}
