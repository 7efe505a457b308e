//! Refused input changes nothing, at every public entry point that takes
//! numbers, tensors or masks from outside:
//!
//! - non-finite numbers (NaN, infinities, values beyond `f32`) and values
//!   out of their contract range into the normaliser (update, normalise,
//!   restore), the heuristic (decide, its signal tracker, restore), the
//!   observation tracker, the max-growth and policy controllers, the
//!   feature batch and the policy's network and sampler are typed errors
//!   naming the field;
//! - a mask row that allows nothing is [`Error::EmptyMask`] in the
//!   sampler, the network, `Policy::act` and the mask constructors;
//! - the state after a refused call equals the state before: exported
//!   normaliser and heuristic state, the trackers, the policy controller's
//!   LSTM state, history and sampling generator (two twin controllers, one
//!   refused in between, keep deciding alike), the feature batch's rows,
//!   the sampler's generator.

mod common;

use common::{R0C0, R0C1, observation, seed, with_metrics};
use leyline::testing::{extreme_f32, extreme_f64};
use leyline::{LifecycleOp, NUM_ACTION_HEADS, SeedStage};
use proptest::prelude::*;
use tamiyo::Error;
use tamiyo::controller::{PolicyController, PolicyControllerConfig};
use tamiyo::features::{FeatureBatch, ObservationTracker, RawObservation, SlotExtras};
use tamiyo::growth::MaxGrowthController;
use tamiyo::heads::{OP, SLOT, head_sizes};
use tamiyo::heuristic::{HeuristicController, SignalTracker};
use tamiyo::masks::{MaskConfig, MaskTensors};
use tamiyo::normaliser::{NormaliserConfig, NormaliserState, RunningMeanStd};
use tamiyo::policy::{
    GraphedAct, LstmState, Policy, PolicyConfig, PolicyRng, SampleMode, Sampler, SamplingConfig,
};
use tch::{Device, Kind, Tensor};
use tolaria::controller::{Controller, EpochObservation};

const SLOTS: [kasmina::host::SlotId; 2] = [R0C0, R0C1];

/// Whether `error` is a non-finite or out-of-range refusal of `field`.
fn refuses(error: &Error, field: &str) -> bool {
    matches!(
        error,
        Error::NonFinite { field: f, .. } | Error::InvalidInput { field: f, .. } if *f == field
    )
}

// ---------------------------------------------------------------- normaliser

fn normaliser(welford: bool) -> RunningMeanStd {
    let config = NormaliserConfig {
        momentum: if welford { None } else { Some(0.99) },
        ..NormaliserConfig::default()
    };
    let mut normaliser = RunningMeanStd::new(4, config, Device::Cpu).expect("normaliser");
    let warm = Tensor::from_slice(&[0.5_f32, 1.0, -2.0, 3.0, 1.5, 0.0, 2.0, -1.0]).view([2, 4]);
    normaliser.update(&warm).expect("warm-up");
    normaliser
}

#[test]
fn a_non_finite_row_is_refused_by_name_and_the_normaliser_stays_usable() {
    for welford in [false, true] {
        let mut normaliser = normaliser(welford);
        let before = normaliser.state().expect("state");
        let mut rows = vec![1.0_f32; 12];
        rows[6] = f32::NAN;
        let error = normaliser
            .update(&Tensor::from_slice(&rows).view([3, 4]))
            .expect_err("NaN row");
        assert!(
            matches!(
                &error,
                Error::NonFinite { field: "RunningMeanStd.update.batch", value, index }
                    if value.is_nan() && index == &[1, 2]
            ),
            "{error}"
        );
        assert_eq!(normaliser.state().expect("state"), before, "unchanged");
        // An f64 value beyond f32 would be infinite in the state.
        let huge = Tensor::from_slice(&[1e300_f64, 0.0, 0.0, 0.0]).view([1, 4]);
        let error = normaliser.update(&huge).expect_err("beyond f32");
        assert_eq!(
            error.field(),
            Some("RunningMeanStd.update.batch"),
            "{error}"
        );
        assert_eq!(normaliser.state().expect("state"), before, "unchanged");
        // Finite values whose moments overflow f32.
        let wide =
            Tensor::from_slice(&[f32::MAX, 0.0, 0.0, 0.0, -f32::MAX, 0.0, 0.0, 0.0]).view([2, 4]);
        let error = normaliser.update(&wide).expect_err("overflowing moments");
        assert!(matches!(error, Error::NonFinite { .. }), "{error}");
        assert_eq!(normaliser.state().expect("state"), before, "unchanged");
        // Still usable, and its checkpoint still loads.
        normaliser
            .update(&Tensor::from_slice(&[2.0_f32; 4]).view([1, 4]))
            .expect("a good batch after the refused ones");
        let state = normaliser.state().expect("state");
        RunningMeanStd::from_state(&state, Device::Cpu).expect("the checkpoint loads");
        // Normalising refuses a NaN on the CPU.
        let x = Tensor::from_slice(&[0.0_f32, f32::INFINITY, 0.0, 0.0]).view([1, 4]);
        let error = normaliser.normalize(&x).expect_err("inf input");
        assert_eq!(error.field(), Some("RunningMeanStd.normalize.x"), "{error}");
        // Reset is complete.
        normaliser.reset().expect("reset");
        let fresh = normaliser.state().expect("state");
        assert_eq!(
            (fresh.mean, fresh.var, fresh.count),
            (vec![0.0; 4], vec![1.0; 4], 1e-4)
        );
    }
}

#[test]
fn non_finite_saved_states_are_refused_by_name() {
    let state = normaliser(false).state().expect("state");
    for (edit, field) in [
        (
            (|s: &mut NormaliserState| s.mean[1] = f64::NAN) as fn(&mut NormaliserState),
            "NormaliserState.mean",
        ),
        (|s| s.var[3] = f64::INFINITY, "NormaliserState.var"),
        (|s| s.count = f64::NEG_INFINITY, "NormaliserState.count"),
    ] {
        let mut bad = state.clone();
        edit(&mut bad);
        let error = RunningMeanStd::from_state(&bad, Device::Cpu).expect_err(field);
        assert!(
            matches!(error, Error::NonFinite { field: f, .. } if f == field),
            "{error}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_normaliser_update_is_all_or_nothing(
        values in prop::collection::vec(extreme_f32(), 12),
        welford in any::<bool>(),
    ) {
        let mut normaliser = normaliser(welford);
        let before = normaliser.state().expect("state");
        let result = normaliser.update(&Tensor::from_slice(&values).view([3, 4]));
        if values.iter().any(|v| !v.is_finite()) {
            prop_assert!(result.is_err(), "a non-finite batch was taken");
        }
        match result {
            Ok(()) => {
                let after = normaliser.state().expect("state");
                prop_assert!(after.mean.iter().chain(&after.var).all(|v| v.is_finite()));
                prop_assert!(RunningMeanStd::from_state(&after, Device::Cpu).is_ok());
            }
            Err(error) => {
                prop_assert!(
                    matches!(&error, Error::NonFinite { field, .. }
                        if field.starts_with("RunningMeanStd.update.")),
                    "{}", error
                );
                prop_assert_eq!(normaliser.state().expect("state"), before);
            }
        }
    }
}

// ------------------------------------------------------ heuristic and others

/// The observation numbers the controllers read, by the field name their
/// refusal carries, with the range the contract allows.
const FIELDS: [(&str, f64, f64); 13] = [
    ("observation.train_loss", f64::MIN, f64::MAX),
    ("observation.val_loss", f64::MIN, f64::MAX),
    ("observation.train_accuracy", 0.0, 100.0),
    ("observation.val_accuracy", 0.0, 100.0),
    ("seed.alpha", 0.0, 1.0),
    ("seed.alpha_target", 0.0, 1.0),
    ("seed.metrics.train_accuracy", 0.0, 100.0),
    ("seed.metrics.val_accuracy", 0.0, 100.0),
    ("seed.metrics.accuracy_at_stage_start", 0.0, 100.0),
    ("seed.metrics.improvement_since_stage_start", -100.0, 100.0),
    ("seed.metrics.gradient_norm", 0.0, f64::MAX),
    ("seed.metrics.gradient_ratio", 0.0, 10.0),
    ("seed.metrics.counterfactual_contribution", -100.0, 100.0),
];

/// A HOLDING seed that contributes (the heuristic would fossilize it), at
/// epoch 5, with field `field` of [`FIELDS`] set to `value`. Built field by
/// field, so it need not pass `EpochObservation::new`.
fn hostile_observation(field: usize, value: f64) -> EpochObservation {
    let mut state = with_metrics(seed("s", R0C0, "norm", SeedStage::Holding), |m| {
        m.counterfactual_contribution = Some(2.0);
        m.gradient_ratio = Some(1.0);
        m.epochs_total = 9;
    });
    let mut observation = observation(5, 1.0, 60.0, Vec::new(), &SLOTS);
    let name = FIELDS[field].0;
    match name {
        "observation.train_loss" => observation.metrics.train_loss = value,
        "observation.val_loss" => observation.metrics.val_loss = value,
        "observation.train_accuracy" => observation.metrics.train_accuracy = value,
        "observation.val_accuracy" => observation.metrics.val_accuracy = value,
        "seed.alpha" => state.alpha = value,
        "seed.alpha_target" => state.alpha_target = value,
        _ => {
            let m = state.metrics.as_mut().expect("metrics");
            match name {
                "seed.metrics.train_accuracy" => m.train_accuracy = value,
                "seed.metrics.val_accuracy" => m.val_accuracy = value,
                "seed.metrics.accuracy_at_stage_start" => m.accuracy_at_stage_start = value,
                "seed.metrics.improvement_since_stage_start" => {
                    m.improvement_since_stage_start = value
                }
                "seed.metrics.gradient_norm" => m.gradient_norm = value,
                "seed.metrics.gradient_ratio" => m.gradient_ratio = Some(value),
                _ => m.counterfactual_contribution = Some(value),
            }
        }
    }
    observation.seeds = vec![state];
    observation
}

/// A heuristic fed flat epochs 0..=4: stabilised, on a plateau.
fn warmed_up() -> HeuristicController {
    let mut controller = HeuristicController::new();
    for epoch in 0..5 {
        controller
            .decide_checked(&observation(epoch, 1.0, 60.0, Vec::new(), &SLOTS))
            .expect("decide");
    }
    controller
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn controllers_and_the_tracker_refuse_impossible_numbers_and_change_nothing(
        field in 0..FIELDS.len(),
        value in extreme_f64(),
    ) {
        let (name, low, high) = FIELDS[field];
        let observation = hostile_observation(field, value);
        let valid = value.is_finite() && (low..=high).contains(&value);

        let mut heuristic = warmed_up();
        let before = heuristic.export_state();
        let tracker_before = heuristic.tracker().clone();
        match heuristic.decide_checked(&observation) {
            Ok(decision) => prop_assert!(valid, "{} = {} decided {:?}", name, value, decision),
            Err(error) => {
                prop_assert!(!valid, "{} = {} refused: {}", name, value, error);
                prop_assert!(refuses(&error, name), "{}", error);
                if !value.is_finite() {
                    prop_assert!(
                        matches!(error, Error::NonFinite { .. }),
                        "{} = {}: {}", name, value, error
                    );
                }
                prop_assert_eq!(heuristic.export_state(), before);
                prop_assert_eq!(heuristic.tracker(), &tracker_before);
                // Through Tolaria's trait: the same field, WAIT downstream.
                let through_trait = heuristic.decide(&observation).expect_err("refused");
                let named = matches!(
                    &through_trait,
                    tolaria::Error::Controller { field: f, .. } if *f == name
                );
                prop_assert!(named, "{}", through_trait);
            }
        }

        let growth = MaxGrowthController::new(MaskConfig::default());
        let grown = growth.decide_checked(&observation);
        prop_assert_eq!(grown.is_ok(), valid, "{} = {}", name, value);
        if let Err(error) = grown {
            prop_assert!(refuses(&error, name), "{}", error);
        }

        let mut tracker = ObservationTracker::new(&SLOTS, 25).expect("tracker");
        tracker
            .observe(&common::observation(0, 2.0, 40.0, Vec::new(), &SLOTS), &[])
            .expect("first epoch");
        let history = format!("{tracker:?}");
        let observed = tracker.observe(&observation, &[]);
        prop_assert_eq!(observed.is_ok(), valid, "{} = {}", name, value);
        if let Err(error) = observed {
            prop_assert!(refuses(&error, name), "{}", error);
            prop_assert_eq!(format!("{tracker:?}"), history);
        }
    }

    #[test]
    fn the_signal_tracker_refuses_non_finite_figures_and_keeps_its_history(
        loss in extreme_f64(),
        accuracy in extreme_f64(),
    ) {
        let mut tracker = SignalTracker::default();
        tracker.update(1.0, 50.0).expect("finite");
        let before = tracker.clone();
        let valid = loss.is_finite() && (0.0..=100.0).contains(&accuracy);
        match tracker.update(loss, accuracy) {
            Ok(()) => prop_assert!(valid),
            Err(error) => {
                prop_assert!(!valid, "{}", error);
                prop_assert!(
                    refuses(&error, "tracker.val_loss") || refuses(&error, "tracker.val_accuracy"),
                    "{}", error
                );
                prop_assert_eq!(tracker, before);
            }
        }
    }
}

#[test]
fn a_holding_seed_is_never_pruned_or_fossilized_on_a_non_finite_contribution() {
    for contribution in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut controller = warmed_up();
        let before = controller.export_state();
        let field = FIELDS
            .iter()
            .position(|(name, _, _)| *name == "seed.metrics.counterfactual_contribution")
            .expect("field");
        let error = controller
            .decide_checked(&hostile_observation(field, contribution))
            .expect_err("refused");
        assert!(
            matches!(
                error,
                Error::NonFinite {
                    field: "seed.metrics.counterfactual_contribution",
                    ..
                }
            ),
            "{contribution}: {error}"
        );
        assert_eq!(controller.export_state(), before, "{contribution}");
        // The same controller still decides on a sound observation.
        let decision = controller
            .decide_checked(&hostile_observation(field, 2.0))
            .expect("decide");
        assert_eq!(decision.op, LifecycleOp::Fossilize);
    }
}

#[test]
fn non_finite_heuristic_states_are_refused_by_name() {
    let state = warmed_up().export_state();
    let mut nan_penalty = state.clone();
    nan_penalty.penalties.insert("NORM".to_owned(), f64::NAN);
    let mut inf_baseline = state.clone();
    inf_baseline.baselines.insert("s".to_owned(), f64::INFINITY);
    let mut inf_loss = state.clone();
    inf_loss.previous = Some((f64::INFINITY, 50.0));
    let mut bad_accuracy = state;
    bad_accuracy.previous = Some((1.0, 150.0));
    for (bad, field) in [
        (nan_penalty, "heuristic_state.penalties"),
        (inf_baseline, "heuristic_state.baselines"),
        (inf_loss, "heuristic_state.previous"),
        (bad_accuracy, "heuristic_state.previous"),
    ] {
        let error = HeuristicController::from_state(&bad).expect_err(field);
        assert!(refuses(&error, field), "{field}: {error}");
    }
}

#[test]
fn impossible_extras_are_refused_by_name_and_the_history_is_kept() {
    let extras = SlotExtras {
        blend_tempo_epochs: 5,
        alpha_start: 0.0,
        alpha_steps_total: 4,
        alpha_steps_done: 1,
        gradient_health: Some(0.5),
        interaction_sum: 0.0,
        counterfactual_measured: None,
    };
    let seeds = vec![seed("s", R0C0, "norm", SeedStage::Blending)];
    for (edit, field) in [
        (
            (|e: &mut SlotExtras| e.alpha_start = f64::NAN) as fn(&mut SlotExtras),
            "extras.alpha_start",
        ),
        (
            |e| e.gradient_health = Some(f64::INFINITY),
            "extras.gradient_health",
        ),
        (
            |e| e.interaction_sum = f64::NEG_INFINITY,
            "extras.interaction_sum",
        ),
    ] {
        let mut tracker = ObservationTracker::new(&SLOTS, 25).expect("tracker");
        tracker
            .observe(
                &observation(0, 2.0, 40.0, seeds.clone(), &SLOTS),
                &[Some(extras.clone()), None],
            )
            .expect("first epoch");
        let history = format!("{tracker:?}");
        let mut bad = extras.clone();
        edit(&mut bad);
        let error = tracker
            .observe(
                &observation(1, 2.0, 40.0, seeds.clone(), &SLOTS),
                &[Some(bad), None],
            )
            .expect_err(field);
        assert!(
            matches!(error, Error::NonFinite { field: f, .. } if f == field),
            "{error}"
        );
        assert_eq!(format!("{tracker:?}"), history);
    }
}

#[test]
fn a_refused_batch_write_changes_no_row() {
    let mut tracker = ObservationTracker::new(&SLOTS, 25).expect("tracker");
    let good = tracker
        .observe(&observation(0, 2.0, 40.0, Vec::new(), &SLOTS), &[])
        .expect("observation");
    let mut batch = FeatureBatch::new(2, 2, Device::Cpu).expect("batch");
    batch
        .write_all(&[good.clone(), good.clone()])
        .expect("write");
    let rows: Vec<Vec<f32>> = (0..2)
        .map(|env| batch.host_row(env).expect("row").to_vec())
        .collect();
    let device = batch.obs().copy();
    let mut bad: RawObservation = good.clone();
    bad.base.val_loss = f64::NAN;
    let mut other = good;
    other.base.epoch = 7;
    let error = batch.write_all(&[other, bad]).expect_err("refused");
    assert!(
        matches!(
            error,
            Error::NonFinite {
                field: "observation.val_loss",
                ..
            }
        ),
        "{error}"
    );
    for (env, row) in rows.iter().enumerate() {
        assert_eq!(
            batch.host_row(env).expect("row"),
            row.as_slice(),
            "row {env}"
        );
    }
    assert!(batch.obs().equal(&device), "the device rows are unchanged");
}

// --------------------------------------------------------------- the policy

fn small_policy(seed: i64) -> Policy {
    tch::manual_seed(seed);
    Policy::new(
        PolicyConfig {
            num_slots: 2,
            feature_dim: 16,
            hidden_dim: 16,
            lstm_layers: 1,
        },
        Device::Cpu,
    )
    .expect("policy")
}

/// A copy of `policy` (same weights, whatever other tests drew meanwhile).
fn twin(policy: &Policy) -> Policy {
    let mut copy = small_policy(0);
    copy.var_store_mut()
        .copy(policy.var_store())
        .expect("copy weights");
    copy
}

fn stochastic() -> PolicyControllerConfig {
    PolicyControllerConfig {
        max_epochs: 25,
        sampling: SamplingConfig {
            mode: SampleMode::Stochastic,
            floors: None,
        },
        seed: 17,
        ..PolicyControllerConfig::default()
    }
}

#[test]
fn a_refused_decision_leaves_the_policy_controller_exactly_as_it_was() {
    let policy = small_policy(3);
    let mut refused = PolicyController::new(twin(&policy), &SLOTS, stochastic()).expect("a");
    let mut control = PolicyController::new(policy, &SLOTS, stochastic()).expect("b");
    let training = |epoch: u32| {
        observation(
            epoch,
            2.0 - f64::from(epoch) * 0.1,
            40.0 + f64::from(epoch),
            vec![with_metrics(
                seed("s", R0C0, "norm", SeedStage::Training),
                |m| {
                    m.epochs_total = epoch;
                    m.counterfactual_contribution = Some(f64::from(epoch) * 0.3);
                },
            )],
            &SLOTS,
        )
    };
    for controller in [&mut refused, &mut control] {
        controller.decide(&training(0)).expect("epoch 0");
    }
    let hidden = refused.hidden().h.copy();
    let cell = refused.hidden().c.copy();
    let history = format!("{:?}", refused.tracker());
    let last = refused.last_action().copied();
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300] {
        let mut bad = training(1);
        bad.seeds[0]
            .metrics
            .as_mut()
            .expect("metrics")
            .counterfactual_contribution = Some(value);
        let error = refused.decide_with(&bad, None, &[]).expect_err("refused");
        assert!(
            refuses(&error, "seed.metrics.counterfactual_contribution"),
            "{value}: {error}"
        );
    }
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut bad = training(1);
        bad.metrics.val_loss = value;
        let error = refused.decide(&bad).expect_err("refused");
        assert!(
            matches!(
                error,
                tolaria::Error::Controller {
                    field: "observation.val_loss",
                    ..
                }
            ),
            "{error}"
        );
    }
    assert!(refused.hidden().h.equal(&hidden) && refused.hidden().c.equal(&cell));
    assert_eq!(format!("{:?}", refused.tracker()), history);
    assert_eq!(refused.last_action().copied(), last);
    // History, LSTM state and generator unchanged: the twins keep deciding
    // alike (sampled actions, so a moved generator would show).
    for epoch in 1..8 {
        let a = refused.decide(&training(epoch)).expect("refused twin");
        let b = control.decide(&training(epoch)).expect("control twin");
        assert_eq!(a, b, "epoch {epoch}");
        assert_eq!(
            refused.last_action(),
            control.last_action(),
            "epoch {epoch}"
        );
        assert!(
            refused.hidden().h.equal(&control.hidden().h),
            "epoch {epoch}"
        );
    }
}

#[test]
fn a_policy_with_non_finite_weights_never_poisons_the_carried_state() {
    let policy = small_policy(4);
    {
        let _guard = tch::no_grad_guard();
        for mut variable in policy.var_store().trainable_variables() {
            let _ = variable.fill_(f64::NAN);
        }
    }
    let mut controller = PolicyController::new(policy, &SLOTS, stochastic()).expect("c");
    let hidden = controller.hidden().h.copy();
    let error = controller
        .decide(&observation(0, 1.0, 50.0, Vec::new(), &SLOTS))
        .expect_err("NaN outputs");
    assert!(error.to_string().contains("not finite"), "{error}");
    assert!(controller.hidden().h.equal(&hidden));
    assert!(controller.last_action().is_none());
}

/// Zero logits `[batch, n]` per head for `num_slots` slots.
fn zero_logits(batch: i64, num_slots: usize) -> [Tensor; NUM_ACTION_HEADS] {
    head_sizes(num_slots)
        .map(|size| Tensor::zeros([batch, size as i64], (Kind::Float, Device::Cpu)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn an_all_false_mask_row_is_refused_everywhere_masks_enter(
        target in 0..NUM_ACTION_HEADS + 6,
        row in 0_i64..3,
        greedy in any::<bool>(),
    ) {
        let (batch, slots) = (3_i64, 2_usize);
        let masks = MaskTensors::allow_all(3, slots, Device::Cpu).expect("masks");
        let (head, op) = if target < NUM_ACTION_HEADS {
            let _ = masks.heads[target].get(row).fill_(0);
            (target, None)
        } else {
            let op = target - NUM_ACTION_HEADS;
            let _ = masks.slot_by_op.get(row).get(op as i64).fill_(0);
            (SLOT, Some(LifecycleOp::ALL[op]))
        };
        let expected = |error: &Error| {
            matches!(error, Error::EmptyMask { head: h, op: o, row: r }
                if *h == leyline::HEAD_NAMES[head] && *o == op && *r as i64 == row)
        };
        let error = masks.check_rows().expect_err("empty row");
        prop_assert!(expected(&error), "{}", error);
        prop_assert!(masks.check(batch, slots, Device::Cpu).is_err());
        let rebuilt = MaskTensors::from_tensors(
            masks.heads.each_ref().map(Tensor::shallow_clone),
            masks.slot_by_op.shallow_clone(),
        );
        prop_assert!(rebuilt.is_err_and(|error| expected(&error)));

        let mode = if greedy { SampleMode::Greedy } else { SampleMode::Stochastic };
        let mut sampler =
            Sampler::new(SamplingConfig { mode, floors: None }, 5, Device::Cpu).expect("sampler");
        let rng = sampler.rng().clone();
        let error = sampler.sample(&zero_logits(batch, slots), &masks).expect_err("sample");
        prop_assert!(expected(&error), "{}", error);
        prop_assert_eq!(sampler.rng(), &rng);
        let actions = Tensor::zeros([batch, NUM_ACTION_HEADS as i64], (Kind::Int64, Device::Cpu));
        prop_assert!(sampler.evaluate_actions(&zero_logits(batch, slots), &masks, &actions).is_err());

        let policy = small_policy(6);
        let network = policy.network();
        let obs = Tensor::zeros([batch, network.config().obs_dim() as i64], (Kind::Float, Device::Cpu));
        let blueprints = Tensor::full([batch, slots as i64], -1, (Kind::Int64, Device::Cpu));
        let hidden = network.initial_state(3).expect("state");
        let error = policy
            .act(&obs, &blueprints, &hidden, &masks, &mut sampler)
            .expect_err("act");
        prop_assert!(expected(&error), "{}", error);
        prop_assert_eq!(sampler.rng(), &rng);
        prop_assert!(network.forward(&obs, &blueprints, &hidden, &masks).is_err());
    }

    #[test]
    fn non_finite_policy_inputs_are_refused_on_the_cpu_and_the_generator_stays(
        value in extreme_f32(),
        position in 0_i64..(2 * 85),
        in_hidden in any::<bool>(),
    ) {
        let policy = small_policy(7);
        let network = policy.network();
        let masks = MaskTensors::allow_all(2, 2, Device::Cpu).expect("masks");
        let obs = Tensor::zeros([2, 85], (Kind::Float, Device::Cpu));
        let hidden = network.initial_state(2).expect("state");
        let (field, target) = if in_hidden {
            ("forward.hidden.h", &hidden.h)
        } else {
            ("forward.obs", &obs)
        };
        let _ = target
            .view(-1)
            .narrow(0, position % target.numel() as i64, 1)
            .fill_(f64::from(value));
        let blueprints = Tensor::full([2, 2], 3, (Kind::Int64, Device::Cpu));
        let mut sampler = Sampler::new(SamplingConfig::default(), 9, Device::Cpu).expect("sampler");
        let rng = sampler.rng().clone();
        let mut graphed = GraphedAct::new(&policy, &sampler, 2).expect("graphed");
        let acted = graphed.act(&policy, &mut sampler, &obs, &blueprints, &hidden, &masks);
        match acted {
            Ok(act) => {
                prop_assert!(value.is_finite());
                prop_assert!(act.sample.log_probs.isfinite().all().int64_value(&[]) == 1);
            }
            Err(error) => {
                // A non-finite input by name; an extreme finite one may
                // overflow inside the network, which the sampler refuses.
                prop_assert!(
                    (!value.is_finite() && refuses(&error, field))
                        || (value.is_finite() && refuses(&error, "sample.logits")),
                    "{} = {}: {}", field, value, error
                );
                prop_assert_eq!(sampler.rng(), &rng);
            }
        }
        if !value.is_finite() {
            let sequence = network.forward_sequence(
                &obs.unsqueeze(1),
                &blueprints.unsqueeze(1),
                &hidden,
            );
            let sequence_field = if in_hidden { field } else { "forward_sequence.obs" };
            prop_assert!(sequence.is_err_and(|error| refuses(&error, sequence_field)));
        }
    }
}

#[test]
fn non_finite_logits_are_refused_by_the_sampler_and_the_generator_stays() {
    let mut sampler = Sampler::new(SamplingConfig::default(), 2, Device::Cpu).expect("sampler");
    let masks = MaskTensors::allow_all(2, 2, Device::Cpu).expect("masks");
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let logits = zero_logits(2, 2);
        let _ = logits[OP].get(1).get(2).fill_(value);
        let rng = sampler.rng().clone();
        let error = sampler.sample(&logits, &masks).expect_err("refused");
        assert!(
            matches!(error, Error::NonFinite { field: "sample.logits", ref index, .. } if index == &[1, 2]),
            "{error}"
        );
        assert_eq!(sampler.rng(), &rng);
    }
    sampler
        .sample(&zero_logits(2, 2), &masks)
        .expect("finite logits sample");
}

#[test]
fn mask_constructors_never_build_an_empty_row() {
    assert!(MaskTensors::allow_all(0, 3, Device::Cpu).is_err());
    assert!(MaskTensors::allow_all(2, 0, Device::Cpu).is_err());
    let masks = MaskTensors::allow_all(2, 3, Device::Cpu).expect("masks");
    masks.check_rows().expect("allow_all has no empty row");
    let rebuilt = MaskTensors::from_tensors(
        masks.heads.each_ref().map(Tensor::shallow_clone),
        masks.slot_by_op.shallow_clone(),
    )
    .expect("valid tensors");
    rebuilt.check(2, 3, Device::Cpu).expect("shapes");
    // Shapes are checked before values.
    let short = MaskTensors::from_tensors(
        masks.heads.each_ref().map(Tensor::shallow_clone),
        masks.slot_by_op.narrow(1, 0, 2),
    );
    assert!(matches!(short, Err(Error::ShapeMismatch { .. })));
    let observed = tamiyo::masks::observation_masks(
        &observation(9, 1.0, 50.0, Vec::new(), &SLOTS),
        &MaskConfig::default(),
    )
    .expect("masks");
    MaskTensors::from_masks(&[observed.clone(), observed], Device::Cpu)
        .expect("rule masks")
        .check_rows()
        .expect("never empty");
}

#[test]
fn a_refused_noise_shape_leaves_the_generator_where_it_was() {
    let mut rng = PolicyRng::new(3);
    let _ = rng.uniform(&[4], Device::Cpu).expect("draw");
    let draws = rng.draws();
    assert!(rng.uniform(&[-1], Device::Cpu).is_err());
    assert!(rng.gumbel(&[i64::MAX, 4], Device::Cpu).is_err());
    assert_eq!(rng.draws(), draws);
}

#[test]
fn a_non_finite_lstm_state_is_refused_with_its_position() {
    let hidden = LstmState {
        h: Tensor::zeros([1, 1, 16], (Kind::Float, Device::Cpu)),
        c: Tensor::full([1, 1, 16], f64::NAN, (Kind::Float, Device::Cpu)),
    };
    let policy = small_policy(8);
    let obs = Tensor::zeros([1, 85], (Kind::Float, Device::Cpu));
    let blueprints = Tensor::full([1, 2], -1, (Kind::Int64, Device::Cpu));
    let masks = MaskTensors::allow_all(1, 2, Device::Cpu).expect("masks");
    let error = policy
        .network()
        .step(&obs, &blueprints, &hidden, &masks)
        .expect_err("NaN cell state");
    assert!(
        matches!(error, Error::NonFinite { field: "forward.hidden.c", ref index, .. } if index == &[0, 0, 0]),
        "{error}"
    );
    assert_eq!(error.field(), Some("forward.hidden.c"));
}
