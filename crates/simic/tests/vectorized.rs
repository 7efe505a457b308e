//! Vectorized PPO end to end on the CPU: a short round of two environments
//! on a small synthetic image task trains, acts, rewards, updates, and two
//! runs with one seed are identical (reference §9 item 18).

use kasmina::host::CnnHostConfig;
use leyline::Telemetry;
use simic::vectorized::{EnvSpec, RoundReport, Simic, SimicConfig};
use tamiyo::policy::{PolicyConfig, PolicyPrecision};
use tch::{Device, Tensor};
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::trainer::ModelTrainerConfig;

fn spec(n_envs: usize) -> EnvSpec {
    let train = image_task(&ImageTaskOptions::fashion_like(256, 11)).expect("train data");
    let validation = image_task(&ImageTaskOptions::fashion_like(128, 12)).expect("validation");
    EnvSpec::sharded(
        CnnHostConfig::fashion_mnist(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        n_envs,
    )
    .expect("spec")
}

fn config(seed: u64) -> SimicConfig {
    let mut config = SimicConfig::reference(4);
    config.n_envs = 2;
    config.seed = seed;
    config.trainer = ModelTrainerConfig {
        batch_size: 64,
        ..ModelTrainerConfig::default()
    };
    config.policy = PolicyConfig {
        feature_dim: 32,
        hidden_dim: 32,
        ..PolicyConfig::default()
    };
    config
}

/// libtorch's generator is process-wide and the test harness runs tests on
/// several threads: runs take turns so each sees only its own seeding.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(seed: u64, rounds: usize) -> (Vec<RoundReport>, Vec<Tensor>) {
    run_profiled(seed, rounds, false)
}

/// [`run`] with the step profiling on or off (on the CPU it trains and
/// validates the first step of each live-seed count apart, unprofiled).
fn run_profiled(seed: u64, rounds: usize, profiling: bool) -> (Vec<RoundReport>, Vec<Tensor>) {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let spec = spec(2);
    let mut simic = Simic::new(config(seed), 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    simic.set_step_profiling(profiling);
    let reports = (0..rounds)
        .map(|_| simic.run_round(&spec, true).expect("round"))
        .collect();
    let parameters = simic
        .policy()
        .var_store()
        .trainable_variables()
        .iter()
        .map(Tensor::copy)
        .collect();
    (reports, parameters)
}

#[test]
fn a_round_trains_every_environment_and_updates_the_policy() {
    let (reports, _) = run(3, 1);
    let report = &reports[0];
    assert!(report.env_epochs >= 2, "{report:?}");
    // On the CPU every step is eager (two batches of 64 per 128-sample
    // shard) and nothing is captured.
    assert_eq!(report.captures, 0);
    assert_eq!(report.timings.capture_ms, 0.0);
    assert_eq!(
        report.eager_steps as u64,
        report.env_epochs * 2,
        "{report:?}"
    );
    assert!(
        report.env_epochs + 4 * report.rollbacks as u64 >= 8,
        "{report:?}"
    );
    assert_eq!(report.final_accuracies.len(), 2);
    for accuracy in &report.final_accuracies {
        assert!((0.0..=100.0).contains(accuracy), "accuracy {accuracy}");
    }
    let ppo = report.ppo.as_ref().expect("the round was learned from");
    assert!(ppo.total_loss.is_finite(), "{ppo:?}");
    assert!(ppo.steps >= 1, "{ppo:?}");
    assert!(report.mean_episode_reward.is_finite());
    assert!(report.inference_ms > 0.0);
    // The policy step's parts add up to (at most) the step's host time,
    // and the step itself takes some.
    let parts: f64 = report.policy_parts_ms.iter().sum();
    assert!(
        report.policy_parts_ms.iter().all(|part| *part >= 0.0),
        "{:?}",
        report.policy_parts_ms
    );
    assert!(
        parts <= report.inference_ms * (1.0 + 1e-9),
        "{parts} > {}",
        report.inference_ms
    );
    assert!(
        report.policy_parts_ms[2] > 0.0,
        "{:?}",
        report.policy_parts_ms
    );

    // The decision analytics agree with the round's own counts.
    assert_eq!(report.outcomes.len(), 2);
    let steps: u64 = report.outcomes.iter().map(|o| o.steps).sum();
    // One decision per environment-epoch, except the epoch a rollback ends.
    assert_eq!(steps + report.rollbacks as u64, report.env_epochs);
    let rolled_back = report
        .outcomes
        .iter()
        .filter(|o| o.kind == simic::vectorized::OutcomeKind::Rollback);
    assert_eq!(rolled_back.count(), report.rollbacks);
    assert_eq!(report.actions.steps, steps);
    assert_eq!(report.actions.chosen.total(), steps);
    assert_eq!(report.actions.executed.total(), steps);
    assert_eq!(
        report.actions.executed.get(leyline::LifecycleOp::Germinate),
        report.germinations
    );
    let germinated: u64 = report.actions.germinated.values().sum();
    assert_eq!(germinated, report.germinations);
    assert_eq!(
        report.outcomes.iter().map(|o| o.prunes).sum::<u64>(),
        report.prunes
    );
    for (outcome, accuracy) in report.outcomes.iter().zip(&report.final_accuracies) {
        assert_eq!(outcome.final_accuracy, *accuracy);
        assert!(outcome.param_ratio >= 1.0, "{outcome:?}");
        assert!(outcome.forced_steps <= outcome.steps, "{outcome:?}");
    }
    let labelled: u64 = report.actions.outcomes.values().sum();
    assert_eq!(labelled, 2);
    // At the default thresholds nothing in a healthy first update is
    // non-finite.
    assert!(
        !report
            .anomalies
            .iter()
            .any(|a| matches!(a, simic::ppo::PpoAnomaly::NumericalInstability { .. })),
        "{:?}",
        report.anomalies
    );
    // The Q head's estimate per op after the update: one per op, finite,
    // and not one value for all (the head reads the op).
    let q = report.q_per_op.as_ref().expect("Q per op");
    assert_eq!(q.len(), leyline::LifecycleOp::ALL.len());
    assert!(q.iter().all(|v| v.is_finite()), "{q:?}");
    assert!(q.iter().any(|v| (v - q[0]).abs() > 1e-9), "{q:?}");
    // The recurrent state after the episodes: finite, and not all zero.
    let lstm = report.lstm.expect("LSTM health");
    assert!(lstm.finite, "{lstm:?}");
    assert!(lstm.h_norm > 0.0 && lstm.c_norm > 0.0, "{lstm:?}");
    // |h| <= 1 (a tanh) and |c| grows by at most 1 a step: 4 steps.
    assert!(lstm.max_abs <= 4.0 + 1e-6, "{lstm:?}");
}

/// The policy runs under bf16 autocast exactly when the environments train
/// in bf16 (reference §4.6); fp16 and fp32 training keep it in fp32; a
/// chosen `policy_precision` overrides the rule.
#[test]
fn the_policy_precision_follows_the_training_precision() {
    use tolaria::amp::Precision;
    // Simic::new seeds libtorch's process-wide generator.
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (training, expected) in [
        (Some(Precision::Bf16), PolicyPrecision::Bf16),
        (Some(Precision::Fp16), PolicyPrecision::Fp32),
        (Some(Precision::Fp32), PolicyPrecision::Fp32),
        // Auto on the CPU is fp32.
        (None, PolicyPrecision::Fp32),
    ] {
        let mut config = config(3);
        config.trainer.precision = training;
        let simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
        assert_eq!(simic.policy_precision(), expected, "{training:?}");
    }
    // A chosen policy precision wins over the rule.
    let mut config = config(3);
    config.trainer.precision = Some(Precision::Bf16);
    config.policy_precision = Some(PolicyPrecision::Fp32);
    let simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    assert_eq!(simic.policy_precision(), PolicyPrecision::Fp32);
}

/// A bf16 policy on the CPU says once, through telemetry, when its LSTM runs
/// outside bf16 (a CPU without oneDNN's bf16 LSTM, e.g. under
/// `ONEDNN_MAX_CPU_ISA=AVX2`), and says nothing where the CPU has one.
#[test]
fn a_bf16_policy_reports_the_cpu_lstm_fallback_exactly_when_it_applies() {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let collector = leyline::Collector::new();
    let mut config = config(3);
    config.policy_precision = Some(PolicyPrecision::Bf16);
    let simic =
        Simic::new(config, 3, Device::Cpu, Telemetry::new(collector.clone())).expect("simic");
    assert_eq!(simic.policy_precision(), PolicyPrecision::Bf16);
    let fallbacks = collector.events_named(leyline::telemetry::TAMIYO_PRECISION_FALLBACK);
    if tamiyo::policy::cpu_bf16_lstm_supported() {
        assert!(fallbacks.is_empty(), "{fallbacks:?}");
    } else {
        assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
        eprintln!("this CPU has no bf16 LSTM: the fallback was reported");
    }
}

#[test]
fn a_round_reports_through_telemetry_with_leyline_names() {
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let collector = leyline::Collector::new();
    let spec = spec(2);
    let mut simic =
        Simic::new(config(4), 3, Device::Cpu, Telemetry::new(collector.clone())).expect("simic");
    // A ratio "explosion" threshold below 1: the update's largest ratio (at
    // least 1) crosses it, so the anomaly's event must come out.
    simic
        .set_anomaly_thresholds(simic::ppo::AnomalyThresholds {
            ratio_explosion: 0.5,
            ..simic::ppo::AnomalyThresholds::default()
        })
        .expect("thresholds");
    let report = simic.run_round(&spec, true).expect("round");
    assert!(
        report
            .anomalies
            .iter()
            .any(|a| matches!(a, simic::ppo::PpoAnomaly::RatioExplosion { .. })),
        "{:?}",
        report.anomalies
    );
    let explosions = collector.events_named(leyline::telemetry::SIMIC_PPO_RATIO_EXPLOSION);
    assert_eq!(explosions.len(), 1);
    assert!(explosions[0].attributes.contains_key("ratio_max"));
    for name in [
        leyline::telemetry::SIMIC_EPISODE_REWARD,
        leyline::telemetry::SIMIC_ENV_EPOCHS_PER_S,
        leyline::telemetry::SIMIC_POLICY_INFERENCE_MS,
        leyline::telemetry::SIMIC_PPO_UPDATE_MS,
        leyline::telemetry::SIMIC_PPO_APPROX_KL,
        leyline::telemetry::SIMIC_PPO_CLIP_FRACTION,
    ] {
        assert!(
            !collector.metric_values(name).is_empty(),
            "no `{name}` metric"
        );
    }
    assert_eq!(
        collector
            .metric_values(leyline::telemetry::SIMIC_POLICY_INFERENCE_MS)
            .len(),
        4,
        "one inference time per step"
    );
    let updates = collector.events_named(leyline::telemetry::SIMIC_PPO_UPDATE_COMPLETED);
    assert_eq!(updates.len(), 1);
    let attributes = &updates[0].attributes;
    for key in [
        "policy_loss",
        "value_loss",
        "q_loss",
        "contribution_loss",
        "anchor_loss",
        "anchor_coef",
        "grad_norm",
        "rollbacks",
        "lstm_h_norm",
        "lstm_c_norm",
        "lstm_max_abs",
        "memory_peak_mb",
    ] {
        let value: f64 = attributes
            .get(key)
            .unwrap_or_else(|| panic!("no `{key}` attribute"))
            .parse()
            .expect("a number");
        assert!(value.is_finite(), "{key} = {value}");
    }
    let q_per_op = attributes.get("q_per_op").expect("Q per op");
    assert_eq!(q_per_op.split(',').count(), leyline::LifecycleOp::ALL.len());
    assert!(q_per_op.starts_with("WAIT="), "{q_per_op}");
    let entropies = attributes.get("head_entropies").expect("head entropies");
    assert_eq!(entropies.split(',').count(), leyline::NUM_ACTION_HEADS);
    assert!(entropies.contains("op="), "{entropies}");

    // Decision analytics: one outcome per environment, one distribution.
    let outcomes = collector.events_named(leyline::telemetry::SIMIC_EPISODE_OUTCOME);
    assert_eq!(outcomes.len(), 2);
    let mut envs: Vec<&str> = outcomes
        .iter()
        .map(|event| event.attributes.get("env").expect("env").as_str())
        .collect();
    envs.sort_unstable();
    assert_eq!(envs, ["0", "1"]);
    for event in &outcomes {
        let outcome = event.attributes.get("outcome").expect("outcome");
        assert!(
            ["success", "timeout", "rollback"].contains(&outcome.as_str()),
            "{outcome}"
        );
        let chosen = event.attributes.get("chosen_ops").expect("chosen ops");
        assert_eq!(chosen.split(',').count(), leyline::LifecycleOp::ALL.len());
    }
    let distribution = collector.events_named(leyline::telemetry::SIMIC_ACTION_DISTRIBUTION);
    assert_eq!(distribution.len(), 1);
    let attributes = &distribution[0].attributes;
    let counted: u64 = attributes
        .get("chosen_ops")
        .expect("chosen ops")
        .split(',')
        .map(|pair| {
            pair.split_once('=')
                .expect("op=count")
                .1
                .parse::<u64>()
                .expect("count")
        })
        .sum();
    assert_eq!(
        counted.to_string(),
        *attributes.get("steps").expect("steps"),
        "every decided step is counted once"
    );
}

#[test]
fn two_runs_with_one_seed_are_identical() {
    let (first, first_params) = run(5, 2);
    let (second, second_params) = run(5, 2);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.final_accuracies, b.final_accuracies);
        assert_eq!(a.mean_episode_reward, b.mean_episode_reward);
        assert_eq!(a.germinations, b.germinations);
        assert_eq!(
            a.ppo.as_ref().map(|p| p.total_loss),
            b.ppo.as_ref().map(|p| p.total_loss)
        );
    }
    for (a, b) in first_params.iter().zip(&second_params) {
        assert!(
            a.equal(b),
            "policy parameters differ between identical runs"
        );
    }
    let (third, _) = run(6, 1);
    assert_ne!(
        (
            first[0].final_accuracies.clone(),
            first[0].mean_episode_reward
        ),
        (
            third[0].final_accuracies.clone(),
            third[0].mean_episode_reward
        ),
        "a different seed should give a different run"
    );
}

/// The step profiling's split step (training read back, then the fused
/// validation passes queued) is the same step: a profiled run equals a
/// plain one to the bit. On the CPU nothing is profiled.
#[test]
fn a_profiled_run_trains_and_validates_as_a_plain_one() {
    let (plain, plain_params) = run(5, 2);
    let (profiled, profiled_params) = run_profiled(5, 2, true);
    for (a, b) in plain.iter().zip(&profiled) {
        assert_eq!(a.final_accuracies, b.final_accuracies);
        assert_eq!(a.mean_episode_reward, b.mean_episode_reward);
        assert_eq!(a.germinations, b.germinations);
        assert_eq!(a.env_epochs, b.env_epochs);
        assert!(b.step_profiles.is_empty(), "no kernel profile on the CPU");
    }
    for (a, b) in plain_params.iter().zip(&profiled_params) {
        assert!(a.equal(b), "policy parameters differ with profiling on");
    }
}

/// On CUDA: a round of two environments replaying step graphs on their own
/// streams (each in its own graph-pool lane) trains, measures, acts and
/// updates, with finite figures; and a second round runs on the same
/// trainer. Skips without CUDA.
#[test]
fn a_round_runs_on_cuda_with_graphs_on_every_environment_stream() {
    if !torch_ext::cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let spec = spec(2);
    for precision in [tolaria::amp::Precision::Fp32, tolaria::amp::Precision::Bf16] {
        cuda_rounds(&spec, precision);
    }
}

fn cuda_rounds(spec: &EnvSpec, precision: tolaria::amp::Precision) {
    let mut config = config(9);
    config.trainer.mode = tolaria::ExecutionMode::GraphStep;
    config.trainer.precision = Some(precision);
    // As the reference settings: capture after one eager step, so that the
    // first epoch (two batches, no seed yet) of every environment captures.
    config.trainer.graph_warmup_steps = 1;
    let mut simic = Simic::new(config, 3, Device::Cuda(0), Telemetry::disabled()).expect("simic");
    assert_eq!(
        simic.policy_precision(),
        PolicyPrecision::for_training(precision)
    );
    for round in 0..2 {
        let report = simic.run_round(spec, true).expect("round");
        assert!(report.env_epochs >= 2, "round {round}: {report:?}");
        for accuracy in &report.final_accuracies {
            assert!((0.0..=100.0).contains(accuracy), "accuracy {accuracy}");
        }
        let ppo = report.ppo.as_ref().expect("learned");
        assert!(ppo.total_loss.is_finite(), "{ppo:?}");
        assert_eq!(report.inference_samples.len(), 4);
        // Every step replays the captured policy step and times it.
        assert_eq!(report.replay_samples.len(), 4, "{report:?}");
        assert!(report.replay_samples.iter().all(|ms| *ms > 0.0));
        // Each environment's trainer is new each round: its first training
        // shape is captured after one eager warm-up step.
        assert!(
            report.captures >= 2,
            "round {round}: {} captures",
            report.captures
        );
        assert!(report.eager_steps >= report.captures);
        assert!(report.timings.capture_ms > 0.0);
    }
    // The blueprint warm-up ran once, before the first round: every
    // blueprint but noop at each of the three slots, one batch shape
    // (the shards divide into whole batches).
    let prewarm = simic.prewarm().expect("prewarm on by default");
    let blueprints = kasmina::blueprint::Blueprint::for_topology(kasmina::host::Topology::Cnn)
        .iter()
        .filter(|&&b| b != kasmina::blueprint::Blueprint::Noop)
        .count();
    assert_eq!(prewarm.per_blueprint.len(), blueprints);
    assert_eq!(prewarm.runs % (3 * blueprints), 0, "{prewarm:?}");
    assert!(prewarm.runs > 0);
    assert!(simic.eps().is_some_and(|eps| eps > 0.0));
    assert_eq!(
        simic.policy_fallback(),
        None,
        "the policy step should replay a graph"
    );
}

/// On two GPUs in one process: environments spread round-robin over cuda:0
/// and cuda:1 (models, data, streams and graphs on their device), the policy
/// on cuda:0; two rounds train, act and update. Skips without two GPUs.
#[test]
fn a_round_spreads_its_environments_over_two_gpus() {
    let count = torch_ext::cuda::device_count();
    if count < 2 {
        eprintln!("skipped: needs 2 CUDA devices, found {count}");
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let spec = spec(4);
    let mut config = config(13);
    config.n_envs = 4;
    config.trainer.mode = tolaria::ExecutionMode::GraphStep;
    config.trainer.precision = Some(tolaria::amp::Precision::Fp32);
    config.env_devices = vec![Device::Cuda(0), Device::Cuda(1)];
    let mut simic = Simic::new(config, 3, Device::Cuda(0), Telemetry::disabled()).expect("simic");
    for round in 0..2 {
        let report = simic.run_round(&spec, true).expect("round");
        assert!(report.env_epochs >= 4, "round {round}: {report:?}");
        assert_eq!(report.final_accuracies.len(), 4);
        let ppo = report.ppo.as_ref().expect("learned");
        assert!(ppo.total_loss.is_finite(), "{ppo:?}");
    }
    // Both GPUs did work.
    for device in 0..2 {
        let peak = torch_ext::cuda::max_memory_allocated(device).expect("memory stats");
        assert!(peak > 0, "nothing allocated on cuda:{device}");
    }
}

/// A run stopped after round 2, whose state is exported and put into a new
/// trainer, ends round 3 with the same policy, bit for bit, as the run that
/// never stopped (what `esper train --resume` relies on).
#[test]
fn a_run_resumed_from_its_state_matches_the_uninterrupted_run() {
    let (_, uninterrupted) = run(21, 3);
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let spec = spec(2);
    let mut first = Simic::new(config(21), 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    for _ in 0..2 {
        first.run_round(&spec, true).expect("round");
    }
    let (state, tensors) = first.export_state().expect("export");
    let saved: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(name, tensor)| (name.clone(), tensor.copy()))
        .collect();
    drop(first);
    let json = serde_json::to_string(&state).expect("state to JSON");
    let state: simic::vectorized::SimicState = serde_json::from_str(&json).expect("state back");
    let mut second = Simic::new(config(21), 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    second.import_state(&state, &saved).expect("import");
    assert_eq!(second.rounds(), 2);
    second.run_round(&spec, true).expect("round 3");
    let resumed: Vec<Tensor> = second
        .policy()
        .var_store()
        .trainable_variables()
        .iter()
        .map(Tensor::copy)
        .collect();
    assert_eq!(resumed.len(), uninterrupted.len());
    for (a, b) in resumed.iter().zip(&uninterrupted) {
        assert!(a.equal(b), "a parameter differs after the resume");
    }
    // A missing tensor is refused, naming it.
    let mut third = Simic::new(config(21), 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let error = third
        .import_state(&state, &saved[1..])
        .expect_err("one tensor missing");
    assert!(error.to_string().contains(&saved[0].0), "{error}");
}
