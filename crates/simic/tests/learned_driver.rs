//! A trained policy driving the growth bench (`simic-growth --policy`,
//! [`simic::bench::Driver::Learned`]) on the CPU: a policy that imitated max
//! growth, handed over as its exported state with the settings it was
//! trained under, acts greedily in the bench's environments and grows in
//! them, the record names it, and nothing learns; a policy trained on
//! other episodes, of another shape, or with a setting that does not parse
//! is refused before anything is measured.

mod common;

use common::fashion_mnist_missing;
use leyline::Telemetry;
use simic::bench::{Driver, LearnedPolicy, SimicBenchOptions, ThroughputTask, run_throughput};
use simic::vectorized::{EnvSpec, Simic, SimicConfig, settings};
use tch::Device;
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use torch_ext::DeviceChoice;

/// Epochs of the training and the bench's episodes.
const EPISODE: u32 = 6;

/// The settings the policy trains under: the auto-forward gates, and every
/// update an imitation of max growth.
const SETTINGS: [&str; 4] = [
    "slot.auto_forward_g1=true",
    "slot.auto_forward_g2=true",
    "slot.auto_forward_g3=true",
    "imitation.updates=3",
];

fn settings_list() -> Vec<String> {
    SETTINGS.iter().map(|s| (*s).to_owned()).collect()
}

/// A policy of the bench's shape after three imitation updates of max
/// growth on a small synthetic task (two environments).
fn trained(config: SimicConfig) -> LearnedPolicy {
    let train = image_task(&ImageTaskOptions::fashion_like(256, 41)).expect("train data");
    let validation = image_task(&ImageTaskOptions::fashion_like(128, 42)).expect("validation");
    let spec = EnvSpec::sharded(
        tolaria::task::Task::Fmnist.host(),
        vec!["r0c0".into(), "r0c1".into(), "r0c2".into()],
        &train,
        validation,
        2,
    )
    .expect("spec");
    let mut simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    for _ in 0..3 {
        let report = simic.run_round(&spec, true).expect("an imitation round");
        assert!(report.imitation.is_some(), "the round imitates");
    }
    let (state, tensors) = simic.export_state().expect("state");
    LearnedPolicy::new("imitated".into(), EPISODE, state, tensors, settings_list())
        .expect("a learned policy")
}

fn training_config() -> SimicConfig {
    let mut config = SimicConfig::reference(EPISODE);
    config.n_envs = 2;
    config.seed = 5;
    config.trainer.batch_size = 64;
    settings::apply_all(&mut config, &settings_list()).expect("settings");
    config
}

fn options(driver: Driver) -> SimicBenchOptions {
    let mut options = SimicBenchOptions::new(DeviceChoice::Cpu, true);
    options.episode_length = Some(EPISODE);
    options.rounds = 1;
    options.driver = driver;
    options
}

#[test]
fn a_trained_policy_drives_the_growth_bench_greedily_and_grows() {
    if fashion_mnist_missing() {
        return;
    }
    let policy = std::rc::Rc::new(trained(training_config()));
    let run = run_throughput(
        ThroughputTask::FashionMnist,
        &options(Driver::Learned(policy)),
        &mut |_| {},
    )
    .expect("runs");
    let entry = &run.measurements.results[0];
    assert!(entry.error.is_none(), "{:?}", entry.error);
    let metrics = &entry.metrics;
    // The imitated policy germinates at the first epoch in every
    // environment, as max growth does, and its seed lives through the
    // episode: one live seed at every step, the most six epochs allow (G2
    // holds a seed ten TRAINING epochs, and none germinates beside it). The
    // policy as built, untrained, keeps 0.67 here: what acts is the import.
    assert_eq!(metrics["active_seeds_per_env"], 1.0, "{metrics:?}");
    // Counted before each step's action: none at the first step, one after.
    assert_eq!(metrics["steps_live_seeds_0"], 1.0, "{metrics:?}");
    assert_eq!(
        metrics["steps_live_seeds_1"],
        f64::from(EPISODE - 1),
        "{metrics:?}"
    );
    // The growth figures of a driven run are there.
    let steps: f64 = (0..4)
        .map(|live| metrics[&format!("steps_live_seeds_{live}")])
        .sum();
    assert_eq!(steps, f64::from(EPISODE), "{metrics:?}");
    let driver = run.measurements.params["driver"]
        .as_str()
        .expect("the driver is named");
    assert!(
        driver.starts_with("learned") && driver.contains("imitated"),
        "{driver}"
    );
    assert!(driver.contains("slot.auto_forward_g1=true"), "{driver}");
}

#[test]
fn a_policy_that_does_not_fit_is_refused_before_anything_runs() {
    // Trained on episodes of another length.
    let config = training_config();
    let simic = Simic::new(config, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let (state, tensors) = simic.export_state().expect("state");
    let policy = LearnedPolicy::new("other".into(), EPISODE + 1, state, tensors, Vec::new())
        .expect("a learned policy");
    let error = options(Driver::Learned(std::rc::Rc::new(policy)))
        .validate()
        .expect_err("another episode length");
    assert!(
        error
            .to_string()
            .contains(&format!("trained on episodes of {}", EPISODE + 1)),
        "{error}"
    );

    // A setting that does not parse.
    let (state, tensors) = simic.export_state().expect("state");
    let error = LearnedPolicy::new(
        "bad".into(),
        EPISODE,
        state,
        tensors,
        vec!["slot.no_such_field=1".to_owned()],
    )
    .expect_err("a bad setting");
    assert!(error.to_string().contains("no_such_field"), "{error}");

    // A policy of another shape (a smaller network): refused by the import
    // before the bench measures anything.
    if fashion_mnist_missing() {
        return;
    }
    let mut small = training_config();
    small.policy.hidden_dim = 32;
    let simic = Simic::new(small, 3, Device::Cpu, Telemetry::disabled()).expect("simic");
    let (state, tensors) = simic.export_state().expect("state");
    let policy =
        LearnedPolicy::new("small".into(), EPISODE, state, tensors, Vec::new()).expect("policy");
    let error = run_throughput(
        ThroughputTask::FashionMnist,
        &options(Driver::Learned(std::rc::Rc::new(policy))),
        &mut |_| {},
    )
    .expect_err("another shape");
    assert!(error.to_string().contains("shape"), "{error}");
}
