//! The rollout buffer (reference §9 item 17): what a round writes is what a
//! round reads, log-probabilities are stored per head (each ≤ 0), host
//! decisions arrive once per round, the rollback rule can rewrite rewards
//! and mark a terminal, the contribution targets arrive with their mask,
//! demonstrations and the anchor's labels are checked before they are kept,
//! and `reset` clears everything.

use leyline::NUM_ACTION_HEADS;
use simic::buffer::{BufferShape, Demonstration, HostStep, RolloutBuffer};
use tamiyo::masks::MaskTensors;
use tamiyo::policy::{Policy, PolicyConfig, SampleMode, Sampler, SamplingConfig};
use tch::{Device, Kind, Tensor};

const ENVS: usize = 3;
const STEPS: usize = 4;
const SLOTS: usize = 3;

fn shape(obs_dim: usize) -> BufferShape {
    BufferShape {
        n_envs: ENVS,
        max_steps: STEPS,
        obs_dim,
        num_slots: SLOTS,
    }
}

fn host(step: usize, valid: bool) -> HostStep {
    HostStep {
        rewards: (0..ENVS).map(|env| (10 * env + step) as f32).collect(),
        terminated: vec![false; ENVS],
        truncated: vec![step + 1 == STEPS; ENVS],
        forced: (0..ENVS).map(|env| env == 1).collect(),
        valid: vec![valid; ENVS],
    }
}

/// A small policy (libtorch's generator seeded `seed` first) and its
/// sampler.
fn small_policy(seed: i64) -> (Policy, Sampler) {
    tch::manual_seed(seed);
    let policy = Policy::new(
        PolicyConfig {
            feature_dim: 16,
            hidden_dim: 16,
            ..PolicyConfig::default()
        },
        Device::Cpu,
    )
    .expect("policy");
    let sampler = Sampler::new(
        SamplingConfig {
            mode: SampleMode::Stochastic,
            floors: None,
        },
        5,
        Device::Cpu,
    )
    .expect("sampler");
    (policy, sampler)
}

/// Fills a buffer with `STEPS` sampled steps of a small policy; returns it
/// with the per-step log-probabilities the sampler produced.
fn filled() -> (RolloutBuffer, Vec<Tensor>) {
    let (policy, mut sampler) = small_policy(3);
    let config = policy.network().config();
    let mut buffer = RolloutBuffer::new(shape(config.obs_dim()), Device::Cpu).expect("buffer");
    let masks = MaskTensors::allow_all(ENVS, SLOTS, Device::Cpu).expect("masks");
    let mut hidden = policy.network().initial_state(ENVS).expect("hidden");
    let mut log_probs = Vec::new();
    for step in 0..STEPS {
        let obs = Tensor::randn(
            [ENVS as i64, config.obs_dim() as i64],
            (Kind::Float, Device::Cpu),
        );
        let blueprints = Tensor::zeros([ENVS as i64, SLOTS as i64], (Kind::Int64, Device::Cpu));
        let act = policy
            .act(&obs, &blueprints, &hidden, &masks, &mut sampler)
            .expect("act");
        buffer
            .record_policy(step, &obs, &blueprints, &act.value, &act.sample, &masks)
            .expect("record policy");
        buffer
            .record_host(step, &host(step, true))
            .expect("record host");
        log_probs.push(act.sample.log_probs.copy());
        hidden = act.hidden;
    }
    (buffer, log_probs)
}

#[test]
fn stored_log_probs_are_per_head_and_never_positive() {
    let (buffer, log_probs) = filled();
    let rollout = buffer.finish().expect("finish");
    assert_eq!(
        rollout.log_probs.size(),
        [ENVS as i64, STEPS as i64, NUM_ACTION_HEADS as i64]
    );
    for (step, expected) in log_probs.iter().enumerate() {
        let stored = rollout.log_probs.select(1, step as i64);
        assert!(
            stored.equal(expected),
            "step {step}: stored log-probs differ"
        );
    }
    let max = rollout.log_probs.max().double_value(&[]);
    assert!(max <= 0.0, "a stored log-probability is positive: {max}");
    // Per head: the heads of one step are not all the same number.
    let first = rollout.log_probs.select(0, 0).select(0, 0);
    let distinct = Vec::<f32>::try_from(&first).expect("to vec");
    assert!(
        distinct.windows(2).any(|pair| pair[0] != pair[1]),
        "{distinct:?}"
    );
}

#[test]
fn host_decisions_arrive_once_per_round_with_their_weights() {
    let (mut buffer, _) = filled();
    let rollout = buffer.finish().expect("finish");
    let rewards = Vec::<f32>::try_from(&rollout.rewards.reshape([-1])).expect("rewards");
    let expected: Vec<f32> = (0..ENVS)
        .flat_map(|env| (0..STEPS).map(move |step| (10 * env + step) as f32))
        .collect();
    assert_eq!(rewards, expected);
    let truncated = Vec::<bool>::try_from(&rollout.truncated.reshape([-1])).expect("truncated");
    assert_eq!(truncated.iter().filter(|&&t| t).count(), ENVS);
    // Forced steps: actor weight 0, critic weight 0.2; others 1 and 1.
    let zeros = Tensor::zeros([ENVS as i64, STEPS as i64], (Kind::Float, Device::Cpu));
    let batch = rollout.ppo_batch(&zeros, &zeros).expect("batch");
    let actor = Vec::<f32>::try_from(&batch.actor_weight.select(1, 0)).expect("actor");
    let value = Vec::<f32>::try_from(&batch.value_weight.select(1, 0)).expect("value");
    assert_eq!(actor, [1.0, 0.0, 1.0]);
    assert_eq!(value, [1.0, 0.2, 1.0]);

    // The governor's rule rewrites an episode's rewards and ends it.
    buffer.set_reward(2, 1, -10.0).expect("cell");
    buffer.set_terminal(2, 1).expect("terminal");
    let rollout = buffer.finish().expect("finish");
    assert_eq!(rollout.rewards.double_value(&[2, 1]), -10.0);
    assert!(rollout.terminated.int64_value(&[2, 1]) != 0);
    assert!(rollout.truncated.int64_value(&[2, 1]) == 0);
}

#[test]
fn contribution_targets_arrive_with_their_mask() {
    let mut buffer = RolloutBuffer::new(shape(8), Device::Cpu).expect("buffer");
    buffer
        .record_contributions(2, 1, &[Some(1.5), None, Some(-3.0)])
        .expect("record");
    buffer
        .record_contributions(0, 2, &[None, Some(0.25), None])
        .expect("record");
    let rollout = buffer.finish().expect("finish");
    assert_eq!(rollout.contributions.size(), [3, 4, 3]);
    assert_eq!(rollout.contribution_mask.size(), [3, 4, 3]);
    let at = |t: &Tensor, e: i64, s: i64, k: i64| t.double_value(&[e, s, k]);
    assert_eq!(at(&rollout.contributions, 1, 2, 0), 1.5);
    assert_eq!(at(&rollout.contributions, 1, 2, 2), -3.0);
    assert_eq!(at(&rollout.contributions, 2, 0, 1), 0.25);
    assert_eq!(at(&rollout.contribution_mask, 1, 2, 0), 1.0);
    assert_eq!(at(&rollout.contribution_mask, 1, 2, 1), 0.0);
    assert_eq!(at(&rollout.contribution_mask, 2, 0, 1), 1.0);
    assert_eq!(
        rollout
            .contribution_mask
            .sum(Kind::Double)
            .double_value(&[]),
        3.0
    );
    // Bad input is refused: a slot count, a cell, a value.
    assert!(buffer.record_contributions(0, 0, &[Some(1.0)]).is_err());
    assert!(
        buffer
            .record_contributions(STEPS, 0, &[None, None, None])
            .is_err()
    );
    assert!(
        buffer
            .record_contributions(0, ENVS, &[None, None, None])
            .is_err()
    );
    assert!(
        buffer
            .record_contributions(0, 0, &[Some(f64::NAN), None, None])
            .is_err()
    );
    buffer.reset().expect("reset");
    let rollout = buffer.finish().expect("finish");
    assert_eq!(
        rollout
            .contribution_mask
            .sum(Kind::Double)
            .double_value(&[]),
        0.0
    );
    assert_eq!(
        rollout
            .contributions
            .abs()
            .sum(Kind::Double)
            .double_value(&[]),
        0.0
    );
}

#[test]
fn reset_clears_everything() {
    let (mut buffer, _) = filled();
    buffer.reset().expect("reset");
    let rollout = buffer.finish().expect("finish");
    for (name, tensor) in [
        ("obs", &rollout.obs),
        ("log_probs", &rollout.log_probs),
        ("values", &rollout.values),
        ("rewards", &rollout.rewards),
        ("bootstrap", &rollout.bootstrap),
    ] {
        assert_eq!(
            tensor.abs().sum(Kind::Double).double_value(&[]),
            0.0,
            "{name}"
        );
    }
    for (name, tensor) in [
        ("actions", &rollout.actions),
        ("valid", &rollout.valid),
        ("terminated", &rollout.terminated),
        ("truncated", &rollout.truncated),
        ("forced", &rollout.forced),
        ("relevance", &rollout.relevance),
    ] {
        assert_eq!(
            tensor
                .to_kind(Kind::Int64)
                .sum(Kind::Int64)
                .int64_value(&[]),
            0,
            "{name}"
        );
    }
    // Padded rows keep masks that allow every option.
    for mask in rollout
        .heads
        .iter()
        .chain(std::iter::once(&rollout.slot_by_op))
    {
        assert!(mask.all().int64_value(&[]) != 0);
    }
}

#[test]
fn out_of_range_steps_and_wrong_shapes_are_refused() {
    let (mut buffer, _) = filled();
    assert!(buffer.record_host(STEPS, &host(0, true)).is_err());
    let mut short = host(0, true);
    short.rewards.pop();
    assert!(buffer.record_host(0, &short).is_err());
    let mut bad = host(0, true);
    bad.rewards[0] = f32::NAN;
    assert!(buffer.record_host(0, &bad).is_err());
    assert!(buffer.set_terminal(ENVS, 0).is_err());
    assert!(
        buffer
            .set_bootstrap(
                0,
                &Tensor::zeros([ENVS as i64 + 1], (Kind::Float, Device::Cpu))
            )
            .is_err()
    );
}

/// The buffer as a staged step's sink writes what `record_policy` writes,
/// at the step index the step carries on the device, and keeps the raw
/// observations in step order when asked; a tensor that does not fit is
/// refused before anything is written, and a step past the last column is
/// refused on the host.
#[test]
fn the_sink_writes_what_record_policy_writes() {
    use tamiyo::policy::{StepRecord, StepSink};
    let (policy, mut sampler) = small_policy(4);
    let config = policy.network().config();
    let mut direct = RolloutBuffer::new(shape(config.obs_dim()), Device::Cpu).expect("buffer");
    let mut sunk = RolloutBuffer::new(shape(config.obs_dim()), Device::Cpu).expect("buffer");
    let masks = MaskTensors::allow_all(ENVS, SLOTS, Device::Cpu).expect("masks");
    let hidden = policy.network().initial_state(ENVS).expect("hidden");
    assert!(sunk.raw_observations(STEPS).expect("raw").is_none());
    sunk.keep_raw_observations().expect("keep raw");
    let mut raw_by_step: Vec<Tensor> = (0..STEPS).map(|_| Tensor::new()).collect();
    // The steps out of order: the index, not the call order, decides.
    for step in [2usize, 0, 3, 1] {
        let obs = Tensor::randn(
            [ENVS as i64, config.obs_dim() as i64],
            (Kind::Float, Device::Cpu),
        );
        let blueprints = Tensor::full(
            [ENVS as i64, SLOTS as i64],
            step as i64 - 1,
            (Kind::Int64, Device::Cpu),
        );
        let act = policy
            .act(&obs, &blueprints, &hidden, &masks, &mut sampler)
            .expect("act");
        direct
            .record_policy(step, &obs, &blueprints, &act.value, &act.sample, &masks)
            .expect("record policy");
        let index = Tensor::from_slice(&[step as i64]);
        let raw = &obs * 2.0 + 1.0;
        raw_by_step[step] = raw.shallow_clone();
        let record = StepRecord {
            step: &index,
            raw_obs: &raw,
            obs: &obs,
            blueprints: &blueprints,
            masks: &masks,
            value: &act.value,
            sample: &act.sample,
        };
        sunk.check_step(step).expect("a column");
        sunk.record(&record).expect("sink record");
        sunk.mark_recorded(step).expect("mark");
        // A value of the wrong shape is refused, and nothing is written.
        let short = obs.narrow(0, 0, 1);
        let bad = StepRecord {
            obs: &short,
            ..record
        };
        assert!(sunk.record(&bad).is_err());
        for buffer in [&mut direct, &mut sunk] {
            buffer
                .record_host(step, &host(step, true))
                .expect("record host");
        }
    }
    assert!(sunk.check_step(STEPS).is_err());
    assert!(sunk.mark_recorded(STEPS).is_err());
    // The raw observations, step after step, as the normaliser reads them.
    let kept = sunk.raw_observations(STEPS).expect("raw").expect("kept");
    assert!(kept.equal(&Tensor::cat(&raw_by_step, 0)));
    let first_two = sunk.raw_observations(2).expect("raw").expect("kept");
    assert!(first_two.equal(&Tensor::cat(&raw_by_step[..2], 0)));
    let (a, b) = (
        direct.finish().expect("finish"),
        sunk.finish().expect("finish"),
    );
    for (name, x, y) in [
        ("obs", &a.obs, &b.obs),
        ("blueprints", &a.blueprints, &b.blueprints),
        ("actions", &a.actions, &b.actions),
        ("log_probs", &a.log_probs, &b.log_probs),
        ("values", &a.values, &b.values),
        ("relevance", &a.relevance, &b.relevance),
        ("slot_by_op", &a.slot_by_op, &b.slot_by_op),
    ] {
        assert!(x.equal(y), "{name} differs");
    }
    for (x, y) in a.heads.iter().zip(&b.heads) {
        assert!(x.equal(y), "a head's masks differ");
    }
    // The memory key names the buffer's storage: another buffer has
    // another.
    assert_ne!(direct.memory_key(), sunk.memory_key());
    assert_eq!(sunk.memory_key(), sunk.memory_key());
}

/// A demonstration replaces the rows it names (actions, and the relevance
/// of the demonstrated op's heads), clears the relevance of a skipped row,
/// leaves the others as the policy wrote them, and refuses an unwritten
/// step, a wrong row count and an index outside its head without writing.
#[test]
fn a_demonstration_rewrites_its_rows_and_refuses_bad_input() {
    let (mut buffer, _) = filled();
    let before = buffer.finish().expect("finish");
    let germinate = tamiyo::heads::FactoredAction {
        slot: 2,
        blueprint: leyline::BlueprintAction::ConvLight,
        style: leyline::GerminationStyle::SigmoidAdd,
        tempo: leyline::TempoAction::Standard,
        alpha_target: leyline::AlphaTargetAction::Full,
        alpha_speed: leyline::AlphaSpeedAction::Instant,
        alpha_curve: leyline::AlphaCurveAction::Linear,
        op: leyline::LifecycleOp::Germinate,
    }
    .indices();
    let rows = [
        Some(Demonstration::Imitate(germinate)),
        None,
        Some(Demonstration::Skip),
    ];
    // Refused, nothing written: a wrong row count, an index out of its
    // head, a step past the last.
    let mut bad = germinate;
    bad[tamiyo::heads::SLOT] = SLOTS as i64;
    for refused in [
        buffer.record_demonstration(1, &rows[..2]),
        buffer.record_demonstration(1, &[Some(Demonstration::Imitate(bad)), None, None]),
        buffer.record_demonstration(STEPS, &rows),
    ] {
        assert!(refused.is_err());
    }
    let unchanged = buffer.finish().expect("finish");
    assert!(unchanged.actions.equal(&before.actions));
    assert!(unchanged.relevance.equal(&before.relevance));

    buffer
        .record_demonstration(1, &rows)
        .expect("a demonstration");
    let after = buffer.finish().expect("finish");
    let row = |t: &Tensor, env: i64| t.select(0, env).select(0, 1);
    let expected = Tensor::from_slice(&germinate);
    assert!(row(&after.actions, 0).equal(&expected));
    let relevance = Tensor::from_slice(&tamiyo::heads::relevance(leyline::LifecycleOp::Germinate));
    assert!(row(&after.relevance, 0).equal(&relevance));
    assert!(row(&after.actions, 1).equal(&row(&before.actions, 1)));
    assert!(row(&after.relevance, 1).equal(&row(&before.relevance, 1)));
    assert!(row(&after.actions, 2).equal(&row(&before.actions, 2)));
    assert_eq!(
        row(&after.relevance, 2)
            .to_kind(Kind::Int64)
            .sum(Kind::Int64)
            .int64_value(&[]),
        0
    );
    // Other steps are untouched.
    for step in [0, 2, 3] {
        assert!(
            after
                .actions
                .select(1, step)
                .equal(&before.actions.select(1, step))
        );
    }
}

/// The anchor's labels: none until one is recorded; a label writes its
/// action and the relevance of its op's heads at its row and step, leaves
/// the policy's own actions alone, and is gone after `reset`; a wrong row
/// count, an index outside its head and a step past the last are refused
/// without recording anything.
#[test]
fn anchor_labels_sit_beside_the_policys_actions_and_refuse_bad_input() {
    let (mut buffer, _) = filled();
    let before = buffer.finish().expect("finish");
    assert!(before.anchor.is_none());
    let wait = tamiyo::heads::FactoredAction {
        slot: 0,
        blueprint: leyline::BlueprintAction::Noop,
        style: leyline::GerminationStyle::SigmoidAdd,
        tempo: leyline::TempoAction::Standard,
        alpha_target: leyline::AlphaTargetAction::Full,
        alpha_speed: leyline::AlphaSpeedAction::Instant,
        alpha_curve: leyline::AlphaCurveAction::Linear,
        op: leyline::LifecycleOp::Wait,
    }
    .indices();
    let rows = [
        None,
        Some(Demonstration::Imitate(wait)),
        Some(Demonstration::Skip),
    ];
    let mut bad = wait;
    bad[tamiyo::heads::OP] = 99;
    for refused in [
        buffer.record_anchor(2, &rows[..2]),
        buffer.record_anchor(2, &[None, Some(Demonstration::Imitate(bad)), None]),
        buffer.record_anchor(STEPS, &rows),
    ] {
        assert!(refused.is_err());
    }
    assert!(buffer.finish().expect("finish").anchor.is_none());

    buffer.record_anchor(2, &rows).expect("labels");
    let after = buffer.finish().expect("finish");
    assert!(
        after.actions.equal(&before.actions),
        "the policy's actions stay"
    );
    let anchor = after.anchor.expect("labels recorded");
    assert_eq!(
        anchor.actions.size(),
        [ENVS as i64, STEPS as i64, NUM_ACTION_HEADS as i64]
    );
    let weights = |env: i64, step: i64| {
        Vec::<f32>::try_from(anchor.relevance.select(0, env).select(0, step)).expect("weights")
    };
    let op_only: Vec<f32> = tamiyo::heads::relevance(leyline::LifecycleOp::Wait)
        .iter()
        .map(|&relevant| f32::from(u8::from(relevant)))
        .collect();
    assert_eq!(weights(1, 2), op_only);
    assert!(
        anchor
            .actions
            .select(0, 1)
            .select(0, 2)
            .equal(&Tensor::from_slice(&wait))
    );
    // No label elsewhere: the unlabelled and skipped rows, the other steps.
    let total = anchor.relevance.sum(Kind::Float).double_value(&[]);
    assert_eq!(total, 1.0, "WAIT's one head at one row and step");

    buffer.reset().expect("reset");
    assert!(buffer.finish().expect("finish").anchor.is_none());
}
