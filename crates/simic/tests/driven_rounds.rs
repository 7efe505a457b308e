//! Rounds driven by a scripted controller (`Simic::drive_round`, the
//! `simic-growth` workload) on the CPU: the max-growth controller's seeds
//! live in the environments, each step's time and live seeds are in the
//! report, nothing learns, and a controller list of the wrong length is
//! refused before anything runs; on a GPU, the extra round profiles its
//! replayed steps (on the CPU nothing is profiled).

mod common;

use common::fashion_mnist_missing;
use simic::bench::{Driver, SimicBenchOptions, ThroughputTask, run_throughput};
use torch_ext::DeviceChoice;

#[test]
fn max_growth_drives_the_environments_and_seeds_live() {
    if fashion_mnist_missing() {
        return;
    }
    let mut options = SimicBenchOptions::new(DeviceChoice::Cpu, true);
    options.episode_length = Some(4);
    options.rounds = 2;
    options.driver = Driver::MaxGrowth;
    let run = run_throughput(ThroughputTask::FashionMnist, &options, &mut |_| {}).expect("runs");
    let entry = &run.measurements.results[0];
    assert_eq!(entry.mode, "fp32-eager");
    assert!(entry.error.is_none(), "{:?}", entry.error);
    let metrics = &entry.metrics;
    // Max growth germinates at the first epoch the masks allow: seeds live
    // from the first step on, in every environment.
    assert!(metrics["active_seeds_per_env"] > 0.5, "{metrics:?}");
    assert_eq!(metrics["refused_decisions"], 0.0);
    // The main configuration every epoch; a solo-off one per seed only
    // once it blends (alpha above 0), which four epochs do not reach.
    let configs = metrics["counterfactual_configs_per_env_epoch"];
    assert_eq!(configs, 1.0, "{metrics:?}");
    let steps: f64 = (0..4)
        .map(|live| metrics[&format!("steps_live_seeds_{live}")])
        .sum();
    assert_eq!(
        steps, 4.0,
        "the steady round's four steps, bucketed once each"
    );
    // The first steps train the host alone (the seed germinated after the
    // first epoch counts as active from TRAINING on); then a seed lives.
    assert!(metrics["steps_live_seeds_0"] <= 2.0, "{metrics:?}");
    assert!(metrics["steps_live_seeds_1"] >= 2.0, "{metrics:?}");
    assert!(metrics["eps_live_seeds_1"] > 0.0, "{metrics:?}");
    let params = &run.measurements.params;
    assert!(
        params["driver"]
            .as_str()
            .is_some_and(|d| d.starts_with("max-growth"))
    );
}

#[test]
fn a_controller_list_of_the_wrong_length_is_refused() {
    use simic::vectorized::{EnvSpec, Simic, SimicConfig};
    use tolaria::data::Dataset;
    let images = tch::Tensor::zeros([8, 1, 28, 28], (tch::Kind::Float, tch::Device::Cpu));
    let labels = tch::Tensor::zeros([8], (tch::Kind::Int64, tch::Device::Cpu));
    let data = Dataset::new("tiny", images, labels, 10).expect("a data set");
    let config = SimicConfig {
        n_envs: 2,
        ..SimicConfig::reference(2)
    };
    let spec = EnvSpec::sharded(
        tolaria::task::Task::Fmnist.host(),
        vec!["r0c1".to_owned()],
        &data,
        data.shallow_clone(),
        2,
    )
    .expect("a spec");
    let mut simic =
        Simic::new(config, 1, tch::Device::Cpu, leyline::Telemetry::disabled()).expect("simic");
    let mut one: Vec<Box<dyn tolaria::controller::Controller>> =
        vec![Box::new(tamiyo::growth::NoGrowthController)];
    let error = simic.drive_round(&spec, &mut one).expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("1 controllers for 2 environments"),
        "{error}"
    );
}

#[test]
fn the_growth_bench_profiles_replayed_steps_on_the_gpu_only() {
    if fashion_mnist_missing() {
        return;
    }
    let cuda = torch_ext::cuda::is_available();
    let device = if cuda {
        DeviceChoice::Cuda(0)
    } else {
        DeviceChoice::Cpu
    };
    let mut options = SimicBenchOptions::new(device, true);
    options.episode_length = Some(12);
    options.rounds = 1;
    options.driver = Driver::MaxGrowth;
    if cuda {
        options.variants = vec!["fp32-graph-step".to_owned()];
    }
    let run = run_throughput(ThroughputTask::FashionMnist, &options, &mut |_| {}).expect("runs");
    let entry = &run.measurements.results[0];
    assert!(entry.error.is_none(), "{:?}", entry.error);
    let profiled: Vec<(&String, &f64)> = entry
        .metrics
        .iter()
        .filter(|(name, _)| name.starts_with("profiled_"))
        .collect();
    if !cuda {
        assert!(profiled.is_empty(), "profiled on the CPU: {profiled:?}");
        eprintln!("the GPU half skipped: no CUDA device");
        return;
    }
    // A seed lives from the third epoch on and its step shape repeats for
    // ten epochs in TRAINING: at least that step is replayed and profiled.
    let kernels: Vec<f64> = (0..4)
        .filter_map(|live| {
            entry
                .metrics
                .get(&format!("profiled_kernels_per_env_epoch_live_seeds_{live}"))
                .copied()
        })
        .collect();
    assert!(!kernels.is_empty(), "no step profiled: {:?}", entry.metrics);
    assert!(kernels.iter().all(|k| *k > 0.0), "{kernels:?}");
    for (name, value) in profiled {
        assert!(value.is_finite() && *value >= 0.0, "{name} = {value}");
    }
}
