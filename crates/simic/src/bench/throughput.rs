//! The `simic-throughput` and `simic-cifar` workloads: the variants by
//! name (read in `variants`), one unmeasured process warm-up, each variant's rounds and figures,
//! and the `max-growth-ceiling` entry (see the module above for what they
//! measure).

use std::time::Instant;

use leyline::Telemetry;
use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use tch::Device;
use tolaria::ExecutionMode;
use tolaria::amp::Precision;
use tolaria::data::Dataset;

use super::{
    Driver, SLOTS, SimicBenchOptions, SimicBenchRun, ThroughputTask, amp_name, baseline, load,
    mean, simic_config,
};
use crate::Result;
use crate::vectorized::{Demonstrator, EnvSpec, RoundReport, Simic, SimicConfig};

mod growth;
mod variants;
use growth::{live_seed_figures, profile_figures, profile_line};
pub(super) use variants::{split_variant, variant_config};

/// Runs `rounds` rounds and the figures of one variant, the actions taken
/// by `driver`.
fn throughput_variant(
    spec: &EnvSpec,
    config: SimicConfig,
    device: Device,
    rounds: usize,
    driver: &Driver,
    progress: &mut dyn FnMut(&str),
) -> Result<Variant> {
    let started = Instant::now();
    let config = match driver {
        Driver::Learned(policy) => policy.configure(config)?,
        Driver::Policy | Driver::MaxGrowth => config,
    };
    let controllers_config = config.clone();
    let env_seed = config.seed;
    let mut simic = Simic::new(config, SLOTS.len(), device, Telemetry::disabled())?;
    if let Driver::Learned(policy) = driver {
        policy.install(&mut simic)?;
    }
    // After the policy's first allocation: the caching allocator refuses a
    // reset on a device it has not initialised.
    if let Device::Cuda(index) = device {
        torch_ext::cuda::synchronize(index)?;
        torch_ext::cuda::reset_peak_memory_stats(index)?;
    }
    let mut reports = Vec::with_capacity(rounds);
    // A driven round: max growth's controllers, or the trained policy on
    // the environments max growth's round `round` runs on.
    let driven = |simic: &mut Simic, round: usize| match driver {
        Driver::Learned(_) => simic.evaluate_on(spec, env_seed, round as u64),
        Driver::Policy | Driver::MaxGrowth => {
            let mut controllers = Demonstrator::MaxGrowth.controllers(spec, &controllers_config);
            simic.drive_round(spec, &mut controllers)
        }
    };
    for round in 0..rounds {
        let report = match driver {
            Driver::Policy => simic.run_round(spec, true)?,
            Driver::MaxGrowth | Driver::Learned(_) => driven(&mut simic, round)?,
        };
        let t = &report.timings;
        progress(&format!(
            "  round {round}: {} env-epochs in {:.1} s (setup {:.0} ms, launch {:.0} with {} \
             captures in {:.0} and {} eager steps, train {:.0}, counterfactual {:.0}, policy {:.0}, \
             boundary {:.0}, update {:.0}), reward {:.2}, seeds {:.2}, acc {:?}",
            report.env_epochs,
            t.total_ms / 1000.0,
            t.setup_ms,
            t.launch_ms,
            report.captures,
            t.capture_ms,
            report.eager_steps,
            t.train_ms,
            t.counterfactual_ms,
            t.policy_ms,
            t.boundary_ms,
            t.update_ms,
            report.mean_episode_reward,
            report.mean_active_seeds,
            report.final_accuracies
        ));
        reports.push(report);
    }
    let wall = started.elapsed().as_secs_f64();
    if let Some(prewarm) = simic.prewarm() {
        progress(&prewarm_line("in round 0", prewarm));
    }
    // One more driven round, after the measured ones and not counted in
    // them, with a step profiled for each number of live seeds.
    let mut profiles = Vec::new();
    if driver.drives() && device.is_cuda() {
        simic.set_step_profiling(true);
        let profiled = driven(&mut simic, rounds);
        simic.set_step_profiling(false);
        profiles = profiled?.step_profiles;
        for step in &profiles {
            progress(&profile_line(step));
        }
    }
    let steady: Vec<&RoundReport> = reports.iter().skip(1).collect();
    if !steady.is_empty() {
        let parts: Vec<String> = crate::vectorized::POLICY_PARTS
            .iter()
            .enumerate()
            .map(|(index, part)| {
                let total: f64 = steady
                    .iter()
                    .map(|r| r.policy_parts_ms.get(index).copied().unwrap_or(0.0))
                    .sum();
                format!("{part} {:.3}", total / steady.len() as f64)
            })
            .collect();
        progress(&format!(
            "  policy step host ms, rounds after the first: {}",
            parts.join(", ")
        ));
    }
    progress(&format!(
        "  policy step: {} in {}; sampling: {}",
        simic.policy_fallback().map_or_else(
            || "captured graph".to_owned(),
            |why| format!("eager ({why})")
        ),
        simic.policy_precision().name(),
        simic.sampler().fused_fallback(SLOTS.len()).map_or_else(
            || "fused CUDA kernel".to_owned(),
            |why| format!("libtorch ({why})")
        ),
    ));
    let peak_mb = match device {
        Device::Cuda(index) => torch_ext::cuda::max_memory_allocated(index)? as f64 / 1_048_576.0,
        _ => 0.0,
    };
    Ok(Variant {
        reports,
        wall,
        peak_mb,
        prewarm: simic.prewarm().cloned(),
        profiles,
    })
}

/// What [`throughput_variant`] measured.
struct Variant {
    reports: Vec<RoundReport>,
    /// Seconds, the whole run.
    wall: f64,
    peak_mb: f64,
    prewarm: Option<tolaria::engine::prewarm::Prewarm>,
    /// The profiled steps of the extra round (a driven run on CUDA only).
    profiles: Vec<crate::vectorized::StepProfile>,
}

/// One short round (two steps, PPO update included) with the first
/// variant's settings before any variant is measured, on CUDA: what a
/// process pays once (compiling the run-time CUDA kernels, loading CUDA
/// modules, creating the cuBLAS and cuDNN handles) then falls on no
/// variant in particular. Returns its wall time, s (0 on the CPU).
pub(super) fn process_warmup(
    task: ThroughputTask,
    spec: &EnvSpec,
    names: &[String],
    device: Device,
    options: &SimicBenchOptions,
) -> Result<(f64, Option<tolaria::engine::prewarm::Prewarm>)> {
    if !device.is_cuda() {
        return Ok((0.0, None));
    }
    let started = Instant::now();
    let first = names.first().map_or("bf16-graph-step", String::as_str);
    let (_, config) = variant_config(task, first, 2, options.quick)?;
    let mut simic = Simic::new(config, SLOTS.len(), device, Telemetry::disabled())?;
    simic.run_round(spec, true)?;
    Ok((started.elapsed().as_secs_f64(), simic.prewarm().cloned()))
}

/// The progress line of a blueprint warm-up: passes, time, time per
/// blueprint.
fn prewarm_line(when: &str, prewarm: &tolaria::engine::prewarm::Prewarm) -> String {
    let each: Vec<String> = prewarm
        .per_blueprint
        .iter()
        .map(|(blueprint, ms)| format!("{blueprint} {ms:.0}"))
        .collect();
    format!(
        "  blueprint warm-up ({when}): {} passes in {:.0} ms ({})",
        prewarm.runs,
        prewarm.ms,
        each.join(", ")
    )
}

/// The `max-growth-ceiling` entry: the active seeds per environment and
/// epoch that a controller growing as fast as the masks allow keeps, on the
/// environments of the learned policy's first round, in the first variant's
/// precision and mode. No controller can keep more under these masks,
/// gates and episode length; the learned policy's count is read against it.
fn growth_ceiling(
    task: ThroughputTask,
    spec: &EnvSpec,
    names: &[String],
    device: Device,
    episode_length: u32,
    options: &SimicBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> ResultEntry {
    let first = names.first().map_or("fp32-eager", String::as_str);
    let (precision, config) = variant_config(task, first, episode_length, options.quick)
        .unwrap_or_else(|_| {
            let fallback = simic_config(
                task.task(),
                Precision::Fp32,
                ExecutionMode::Eager,
                episode_length,
                options.quick,
            );
            (Precision::Fp32, fallback)
        });
    let mode_name = "max-growth-ceiling".to_owned();
    match baseline::run_baseline(spec, &config, device, 0, baseline::Baseline::MaxGrowth) {
        Ok(run) => {
            progress(&format!(
                "{mode_name}: {:.2} active seeds per env, acc {:?}",
                run.mean_active_seeds, run.accuracies
            ));
            let mut metrics = std::collections::BTreeMap::new();
            metrics.insert("active_seeds_per_env".to_owned(), run.mean_active_seeds);
            metrics.insert(
                "final_accuracy_pct".to_owned(),
                mean(run.accuracies.iter().copied()),
            );
            ResultEntry {
                implementation: "rust".to_owned(),
                mode: mode_name,
                metrics,
                error: None,
                amp: Some(amp_name(precision).to_owned()),
            }
        }
        Err(error) => ResultEntry {
            implementation: "rust".to_owned(),
            mode: mode_name,
            metrics: std::collections::BTreeMap::new(),
            error: Some(error.to_string()),
            amp: Some(amp_name(precision).to_owned()),
        },
    }
}

/// `simic-throughput`, `simic-cifar` or `simic-lm`.
pub fn run_throughput(
    task: ThroughputTask,
    options: &SimicBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<SimicBenchRun> {
    run_throughput_reporting(task, options, progress, &mut |_| {})
}

/// [`run_throughput`], handing `entries` every result entry measured so
/// far each time a variant ends (the growth ceiling last), so that a
/// caller can keep what a run stopped by a time limit measured.
pub fn run_throughput_reporting(
    task: ThroughputTask,
    options: &SimicBenchOptions,
    progress: &mut dyn FnMut(&str),
    entries: &mut dyn FnMut(&[ResultEntry]),
) -> Result<SimicBenchRun> {
    options.validate()?;
    let device = torch_ext::device::select(options.device)?;
    let (train, test) = match load(task.task(), options) {
        Ok(data) => data,
        // A missing data set (CIFAR-10 is not on every machine) is a record
        // that says so, not a stopped `cargo xtask bench`.
        Err(error) => {
            return Ok(SimicBenchRun {
                device,
                measurements: Measurements {
                    params: json!({ "quick": options.quick }),
                    results: vec![ResultEntry {
                        implementation: "rust".to_owned(),
                        mode: "data".to_owned(),
                        metrics: std::collections::BTreeMap::new(),
                        error: Some(format!("no data set: {error}")),
                        amp: None,
                    }],
                    telemetry_names: Vec::new(),
                },
            });
        }
    };
    let host = task.task().host();
    let n_envs = 4;
    let spec = EnvSpec::sharded(
        host,
        SLOTS.iter().map(|s| (*s).to_owned()).collect(),
        &train,
        test,
        n_envs,
    )?;
    let episode_length = options.episode();
    let names: Vec<String> = if !options.variants.is_empty() {
        options.variants.clone()
    } else if device.is_cuda() {
        vec![
            "fp32-graph-step".to_owned(),
            "bf16-graph-step".to_owned(),
            "bf16-graph-step-fp32-policy".to_owned(),
        ]
    } else {
        vec!["fp32-eager".to_owned()]
    };
    if let Driver::Learned(policy) = &options.driver {
        // A policy that does not fit these variants (another shape, a value
        // that is not finite) stops the run before anything is measured.
        let first = names.first().map_or("fp32-eager", String::as_str);
        let (_, config) = variant_config(task, first, episode_length, options.quick)?;
        let mut trial = Simic::new(
            policy.configure(config)?,
            SLOTS.len(),
            device,
            Telemetry::disabled(),
        )?;
        policy.install(&mut trial)?;
    }
    let (warmup_s, warmup_prewarm) = process_warmup(task, &spec, &names, device, options)?;
    progress(&format!("process warm-up (not measured): {warmup_s:.1} s"));
    if let Some(prewarm) = &warmup_prewarm {
        progress(&prewarm_line("in the process warm-up", prewarm));
    }
    let mut results = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let (precision, config) = variant_config(task, name, episode_length, options.quick)?;
        progress(&format!("{name}: {} rounds", options.rounds));
        let entry = match throughput_variant(
            &spec,
            config,
            device,
            options.rounds,
            &options.driver,
            progress,
        ) {
            Ok(Variant {
                reports,
                wall,
                peak_mb,
                prewarm,
                profiles,
            }) => {
                let env_epochs: u64 = reports.iter().map(|r| r.env_epochs).sum();
                let steady: Vec<&RoundReport> = reports.iter().skip(1).collect();
                let steady_epochs: u64 = steady.iter().map(|r| r.env_epochs).sum();
                let steady_s: f64 = steady.iter().map(|r| r.timings.total_ms / 1000.0).sum();
                let per_env_epoch = |pick: fn(&RoundReport) -> f64| {
                    let total: f64 = reports.iter().map(pick).sum();
                    total / env_epochs.max(1) as f64
                };
                let mut metrics = std::collections::BTreeMap::new();
                metrics.insert("eps".to_owned(), env_epochs as f64 / wall);
                // The first variant's figure with the process warm-up's
                // seconds counted too: the whole process, cold.
                if index == 0 {
                    metrics.insert(
                        "eps_with_process_warmup".to_owned(),
                        env_epochs as f64 / (wall + warmup_s),
                    );
                }
                if steady_s > 0.0 {
                    metrics.insert("eps_steady".to_owned(), steady_epochs as f64 / steady_s);
                }
                // Steady figures leave out the first round (captures,
                // autotuning, lazy kernel loading).
                let steady_or_all: Vec<&RoundReport> = if steady.is_empty() {
                    reports.iter().collect()
                } else {
                    steady.clone()
                };
                for (name, samples) in [
                    (
                        "policy_inference_ms",
                        (|r: &RoundReport| &r.inference_samples) as fn(&RoundReport) -> &Vec<f64>,
                    ),
                    ("policy_replay_device_ms", |r| &r.replay_samples),
                ] {
                    let mut all: Vec<f64> = steady_or_all
                        .iter()
                        .flat_map(|r| samples(r).iter().copied())
                        .collect();
                    all.sort_by(f64::total_cmp);
                    if let Some(p50) = all.get(all.len() / 2) {
                        metrics.insert(name.to_owned(), *p50);
                    }
                }
                // Where the policy step's host time goes (means per step
                // over the steady rounds).
                for (index, part) in crate::vectorized::POLICY_PARTS.iter().enumerate() {
                    metrics.insert(
                        format!("policy_part_{part}_ms"),
                        mean(
                            steady_or_all
                                .iter()
                                .map(|r| r.policy_parts_ms.get(index).copied().unwrap_or(0.0)),
                        ),
                    );
                }
                metrics.insert(
                    "policy_inference_ms_mean_all".to_owned(),
                    mean(reports.iter().map(|r| r.inference_ms)),
                );
                let steady_epochs_f = steady_or_all
                    .iter()
                    .map(|r| r.env_epochs as f64)
                    .sum::<f64>()
                    .max(1.0);
                for (name, pick) in [
                    (
                        "steady_launch_ms_per_env_epoch",
                        (|r: &RoundReport| r.timings.launch_ms) as fn(&RoundReport) -> f64,
                    ),
                    ("steady_train_ms_per_env_epoch", |r| r.timings.train_ms),
                    ("steady_counterfactual_ms_per_env_epoch", |r| {
                        r.timings.counterfactual_ms
                    }),
                    ("steady_policy_ms_per_env_epoch", |r| r.timings.policy_ms),
                    ("steady_observe_ms_per_env_epoch", |r| r.timings.observe_ms),
                    ("steady_boundary_ms_per_env_epoch", |r| {
                        r.timings.boundary_ms
                    }),
                    ("steady_setup_ms_per_env_epoch", |r| r.timings.setup_ms),
                    ("steady_update_ms_per_env_epoch", |r| r.timings.update_ms),
                ] {
                    let total: f64 = steady_or_all.iter().map(|r| pick(r)).sum();
                    metrics.insert(name.to_owned(), total / steady_epochs_f);
                }
                metrics.insert(
                    "captures".to_owned(),
                    reports.iter().map(|r| r.captures as f64).sum(),
                );
                metrics.insert(
                    "capture_ms".to_owned(),
                    reports.iter().map(|r| r.timings.capture_ms).sum(),
                );
                if let Some(prewarm) = &prewarm {
                    metrics.insert("blueprint_prewarm_ms".to_owned(), prewarm.ms);
                }
                metrics.insert(
                    "update_ms".to_owned(),
                    mean(reports.iter().map(|r| r.timings.update_ms)),
                );
                metrics.insert(
                    "counterfactual_ms_per_env_epoch".to_owned(),
                    per_env_epoch(|r| r.timings.counterfactual_ms),
                );
                metrics.insert(
                    "counterfactual_configs_per_env_epoch".to_owned(),
                    per_env_epoch(|r| r.counterfactual_configs as f64),
                );
                metrics.insert(
                    "train_ms_per_env_epoch".to_owned(),
                    per_env_epoch(|r| r.timings.train_ms),
                );
                metrics.insert(
                    "observe_ms_per_step".to_owned(),
                    per_env_epoch(|r| r.timings.observe_ms) * n_envs as f64,
                );
                metrics.insert(
                    "boundary_ms_per_env_epoch".to_owned(),
                    per_env_epoch(|r| r.timings.boundary_ms),
                );
                metrics.insert(
                    "setup_ms_per_round".to_owned(),
                    mean(reports.iter().map(|r| r.timings.setup_ms)),
                );
                metrics.insert(
                    "active_seeds_per_env".to_owned(),
                    mean(reports.iter().map(|r| r.mean_active_seeds)),
                );
                metrics.insert(
                    "final_accuracy_pct".to_owned(),
                    mean(reports.iter().flat_map(|r| r.final_accuracies.clone())),
                );
                if options.driver.drives() {
                    live_seed_figures(&steady_or_all, n_envs, &mut metrics);
                    profile_figures(&profiles, &mut metrics);
                }
                metrics.insert("peak_memory_mb".to_owned(), peak_mb);
                metrics.insert("env_epochs".to_owned(), env_epochs as f64);
                metrics.insert("wall_s".to_owned(), wall);
                ResultEntry {
                    implementation: "rust".to_owned(),
                    mode: name.clone(),
                    metrics,
                    error: None,
                    amp: Some(amp_name(precision).to_owned()),
                }
            }
            Err(error) => ResultEntry {
                implementation: "rust".to_owned(),
                mode: name.clone(),
                metrics: std::collections::BTreeMap::new(),
                error: Some(error.to_string()),
                amp: Some(amp_name(precision).to_owned()),
            },
        };
        results.push(entry);
        entries(&results);
    }
    results.push(growth_ceiling(
        task,
        &spec,
        &names,
        device,
        episode_length,
        options,
        progress,
    ));
    Ok(SimicBenchRun {
        device,
        measurements: Measurements {
            params: json!({
                "task": match task { ThroughputTask::FashionMnist => "fashion-mnist", ThroughputTask::Cifar10 => "cifar10", ThroughputTask::LanguageModel => "lm-fortunes" },
                "n_envs": n_envs,
                "slots": SLOTS,
                "max_seeds": 3,
                "episode_length": episode_length,
                "rounds": options.rounds,
                "batch_size_per_env": simic_config(task.task(), Precision::Fp32, ExecutionMode::Eager, episode_length, options.quick).trainer.batch_size,
                "train_samples_per_env": spec.train.first().map_or(0, Dataset::len),
                "validation_samples": spec.validation.len(),
                "process_warmup_s": warmup_s,
                // The blueprint warm-up inside the process warm-up: the
                // blueprints' first use, paid once per process.
                "process_warmup_blueprints_ms": warmup_prewarm.as_ref().map(|p| p.ms),
                "quick": options.quick,
                "driver": options.driver.describe(),
            }),
            results,
            telemetry_names: Vec::new(),
        },
    })
}
