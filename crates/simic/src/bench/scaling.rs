//! `simic-throughput` across GPUs: one rank's share of a data-parallel run
//! ([`run_rank`]) and the record entry that sums the ranks
//! ([`scaling_entry`]). `esper bench simic-throughput --gpus 1,2` launches
//! the ranks (one process per GPU) and writes one record with every count.
//!
//! Each rank runs the workload's 4 environments on its own GPU; the group
//! trains one policy (gradients averaged every minibatch). With
//! [`Driver::MaxGrowth`] (`simic-growth`) the max-growth controller takes
//! every action and nothing learns, so the ranks share no update: each
//! drives its own environments. Each rank first pays its process's
//! one-time costs in an unmeasured warm-up round, as the single-process
//! bench does. The group's eps is the ranks' environment-epochs over the
//! slowest rank's wall time, from a barrier after joining to the end of
//! the last round. [`concurrent_entry`] and [`group_ratios`] separate what
//! the group costs from what sharing the host costs.

use std::collections::BTreeMap;
use std::time::Instant;

use leyline::Telemetry;
use leyline::baseline::ResultEntry;
use serde::{Deserialize, Serialize};
use torch_ext::dist::ProcessGroup;

use super::{Driver, SLOTS, SimicBenchOptions, ThroughputTask, amp_name, load, mean, variant};
use crate::vectorized::{EnvSpec, Simic};
use crate::{Error, Result};

mod concurrent;
pub use concurrent::{concurrent_entry, group_ratios};

/// What one rank measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankFigures {
    /// The rank.
    pub rank: usize,
    /// The group's size.
    pub world_size: usize,
    /// Where it ran.
    pub device: String,
    /// Environment-epochs it trained.
    pub env_epochs: u64,
    /// Seconds from the barrier after joining to the end of its last round.
    pub wall_s: f64,
    /// Environment-epochs per second of the rounds after the first.
    pub eps_steady: Option<f64>,
    /// Live seeds per environment, averaged over steps and rounds.
    pub active_seeds_per_env: f64,
    /// Mean final validation accuracy (%).
    pub final_accuracy_pct: f64,
    /// Mean PPO update time (ms), all-reduces included.
    pub update_ms: f64,
    /// Of `update_ms`: the mean wait for the other ranks' rollouts before
    /// the update (ms; 0 alone).
    #[serde(default)]
    pub update_wait_ms: f64,
    /// Of `update_ms`: the mean host time inside the group's collective
    /// calls after the wait (ms; 0 alone; see
    /// [`crate::vectorized::RoundTimings::update_collective_ms`]).
    #[serde(default)]
    pub update_collective_ms: f64,
    /// Mean time of a round outside the update (ms): the rollout, which
    /// the slowest rank's sets the group's pace.
    #[serde(default)]
    pub rollout_ms: f64,
    /// Mean time per round of each part of the rollout (ms), by the names
    /// of [`ROLLOUT_PARTS`]: where a longer rollout goes. The parts are
    /// [`crate::vectorized::RoundTimings`]'s and overlap as they do there
    /// (the launches and captures are inside the training epochs).
    #[serde(default)]
    pub rollout_parts_ms: BTreeMap<String, f64>,
    /// Peak device memory (MiB; 0 on the CPU).
    pub peak_memory_mb: f64,
    /// Seconds of the rank's process warm-up before joining, not measured
    /// (0 on the CPU): what the single-process bench pays before its
    /// measured rounds too.
    #[serde(default)]
    pub process_warmup_s: f64,
}

/// The parts of a rollout a rank reports ([`RankFigures::rollout_parts_ms`];
/// the entry's `rollout_{part}_ms`).
pub const ROLLOUT_PARTS: [&str; 8] = [
    "setup",
    "launch",
    "capture",
    "train",
    "counterfactual",
    "observe",
    "policy",
    "boundary",
];

/// A round's rollout parts, named as in [`ROLLOUT_PARTS`].
fn rollout_parts(t: &crate::vectorized::RoundTimings) -> impl Iterator<Item = (&'static str, f64)> {
    ROLLOUT_PARTS.into_iter().zip([
        t.setup_ms,
        t.launch_ms,
        t.capture_ms,
        t.train_ms,
        t.counterfactual_ms,
        t.observe_ms,
        t.policy_ms,
        t.boundary_ms,
    ])
}

/// Runs `variant_name` (see [`SimicBenchOptions::variants`]) for
/// `options.rounds` rounds as the rank `group` says (single-process when
/// `None`), on the group's device, the actions taken as
/// [`SimicBenchOptions::driver`] says.
pub fn run_rank(
    task: ThroughputTask,
    options: &SimicBenchOptions,
    variant_name: &str,
    group: Option<ProcessGroup>,
    progress: &mut dyn FnMut(&str),
) -> Result<RankFigures> {
    options.validate()?;
    if let Driver::Learned(_) = &options.driver {
        return Err(Error::InvalidConfig {
            field: "SimicBenchOptions.driver",
            reason: "a trained policy drives one process; the data-parallel bench measures the \
                     learning policy or max growth"
                .to_owned(),
        });
    }
    let device = match &group {
        Some(group) => group.device(),
        None => torch_ext::device::select(options.device)?,
    };
    let (train, test) = load(task.task(), options)?;
    let host = task.task().host();
    let spec = EnvSpec::sharded(
        host,
        SLOTS.iter().map(|s| (*s).to_owned()).collect(),
        &train,
        test,
        4,
    )?;
    // What a process pays once (run-time kernel compiles, CUDA modules,
    // library handles), paid before the clock starts as the single-process
    // bench pays it, so that a group of one measures what one process does.
    let (process_warmup_s, _) = super::throughput::process_warmup(
        task,
        &spec,
        std::slice::from_ref(&variant_name.to_owned()),
        device,
        options,
    )?;
    if process_warmup_s > 0.0 {
        progress(&format!(
            "  process warm-up (not measured): {process_warmup_s:.1} s"
        ));
    }
    // The single-process bench's variant settings, suffixes included.
    let (_, config) =
        super::throughput::variant_config(task, variant_name, options.episode(), options.quick)?;
    let controllers_config = config.clone();
    let mut simic = Simic::new(config, SLOTS.len(), device, Telemetry::disabled())?;
    if let Some(group) = group {
        simic.join(group)?;
    }
    let (rank, world_size) = simic.rank_and_world();
    if let tch::Device::Cuda(index) = device {
        torch_ext::cuda::synchronize(index)?;
        torch_ext::cuda::reset_peak_memory_stats(index)?;
    }
    simic.barrier()?;
    let started = Instant::now();
    let mut reports = Vec::with_capacity(options.rounds);
    for round in 0..options.rounds {
        let report = match &options.driver {
            Driver::Policy => simic.run_round(&spec, true)?,
            // A learned driver was refused above.
            Driver::MaxGrowth | Driver::Learned(_) => {
                let mut controllers = crate::vectorized::Demonstrator::MaxGrowth
                    .controllers(&spec, &controllers_config);
                simic.drive_round(&spec, &mut controllers)?
            }
        };
        progress(&format!(
            "  rank {rank}/{world_size} round {round}: {} env-epochs in {:.1} s (rollout {:.0} \
             ms), seeds {:.2}, update {:.0} ms ({:.0} waiting for the other ranks, {:.1} in \
             collectives)",
            report.env_epochs,
            report.timings.total_ms / 1000.0,
            report.timings.total_ms - report.timings.update_ms,
            report.mean_active_seeds,
            report.timings.update_ms,
            report.timings.update_wait_ms,
            report.timings.update_collective_ms
        ));
        reports.push(report);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let mut rollout_parts_ms: BTreeMap<String, f64> = BTreeMap::new();
    for report in &reports {
        for (name, ms) in rollout_parts(&report.timings) {
            *rollout_parts_ms.entry(name.to_owned()).or_default() += ms;
        }
    }
    let rounds_run = reports.len().max(1) as f64;
    for ms in rollout_parts_ms.values_mut() {
        *ms /= rounds_run;
    }
    let parts: Vec<String> = rollout_parts_ms
        .iter()
        .map(|(name, ms)| format!("{name} {ms:.0}"))
        .collect();
    progress(&format!(
        "  rank {rank}/{world_size} rollout per round (ms, parts overlap): {}",
        parts.join(", ")
    ));
    let steady_epochs: u64 = reports.iter().skip(1).map(|r| r.env_epochs).sum();
    let steady_s: f64 = reports
        .iter()
        .skip(1)
        .map(|r| r.timings.total_ms / 1000.0)
        .sum();
    let peak_memory_mb = match device {
        tch::Device::Cuda(index) => {
            torch_ext::cuda::max_memory_allocated(index)? as f64 / 1_048_576.0
        }
        _ => 0.0,
    };
    Ok(RankFigures {
        rank,
        world_size,
        device: format!("{device:?}"),
        env_epochs: reports.iter().map(|r| r.env_epochs).sum(),
        wall_s,
        eps_steady: (steady_s > 0.0).then(|| steady_epochs as f64 / steady_s),
        active_seeds_per_env: mean(reports.iter().map(|r| r.mean_active_seeds)),
        final_accuracy_pct: mean(reports.iter().flat_map(|r| r.final_accuracies.clone())),
        update_ms: mean(reports.iter().map(|r| r.timings.update_ms)),
        update_wait_ms: mean(reports.iter().map(|r| r.timings.update_wait_ms)),
        update_collective_ms: mean(reports.iter().map(|r| r.timings.update_collective_ms)),
        rollout_ms: mean(
            reports
                .iter()
                .map(|r| r.timings.total_ms - r.timings.update_ms),
        ),
        rollout_parts_ms,
        peak_memory_mb,
        process_warmup_s,
    })
}

/// The group's eps: every rank's environment-epochs over the slowest rank's
/// wall time.
pub fn group_eps(ranks: &[RankFigures]) -> Result<f64> {
    let wall = ranks.iter().map(|r| r.wall_s).fold(0.0, f64::max);
    if ranks.is_empty() || wall <= 0.0 {
        return Err(Error::InvalidInput {
            field: "RankFigures",
            reason: "no rank measured anything".to_owned(),
        });
    }
    Ok(ranks.iter().map(|r| r.env_epochs as f64).sum::<f64>() / wall)
}

/// The one-GPU entry of the same run that efficiencies are computed from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OneGpu {
    /// Its whole-run eps.
    pub eps: f64,
    /// Its eps over the rounds after the first, when it ran more than one.
    pub eps_steady: Option<f64>,
}

impl OneGpu {
    /// The figures of a record entry (a one-GPU scaling entry, or the
    /// single-process bench's entry of the same variant): its `eps`, and
    /// its `eps_steady` where it has one. `None` without a positive `eps`.
    pub fn of(entry: &ResultEntry) -> Option<OneGpu> {
        let eps = entry.metrics.get("eps").copied().filter(|eps| *eps > 0.0)?;
        Some(OneGpu {
            eps,
            eps_steady: entry.metrics.get("eps_steady").copied(),
        })
    }
}

/// How the one-GPU entry of a scaling run compares with the single-process
/// bench of the same variant from the same run: `single_process_ratio` is
/// the entry's eps over the single process's (1.0: the group of one costs
/// nothing), and `single_process_ratio_steady` the same over the rounds
/// after the first, where both have them. The bar is a ratio
/// within 5% of 1.
pub fn single_process_ratios(one_gpu: OneGpu, single: OneGpu) -> BTreeMap<String, f64> {
    ratios("single_process_ratio", one_gpu, single)
}

/// `name` = `of.eps / over.eps`, and `{name}_steady` the same of their
/// steady figures where both have them (no ratio over a figure that is not
/// positive).
fn ratios(name: &str, of: OneGpu, over: OneGpu) -> BTreeMap<String, f64> {
    let mut ratios = BTreeMap::new();
    if over.eps > 0.0 {
        ratios.insert(name.to_owned(), of.eps / over.eps);
    }
    if let (Some(of), Some(over)) = (of.eps_steady, over.eps_steady)
        && over > 0.0
    {
        ratios.insert(format!("{name}_steady"), of / over);
    }
    ratios
}

/// The record entry `dp{gpus}-{variant}` for one GPU count: the group's
/// eps, eps per GPU, and — given the one-GPU entry of the same run — the
/// scaling efficiency `eps / (gpus · eps_one)` over the whole run and, when
/// both ran rounds after the first, `scaling_efficiency_steady` over those
/// rounds (the first round captures graphs and loads kernels).
pub fn scaling_entry(
    variant_name: &str,
    gpus: usize,
    ranks: &[RankFigures],
    one_gpu: Option<OneGpu>,
) -> Result<ResultEntry> {
    let (precision, _) = variant(super::throughput::split_variant(variant_name).0)?;
    let eps = group_eps(ranks)?;
    let mut metrics = BTreeMap::new();
    metrics.insert("gpus".to_owned(), gpus as f64);
    metrics.insert("eps".to_owned(), eps);
    metrics.insert("eps_per_gpu".to_owned(), eps / gpus.max(1) as f64);
    if let Some(one) = one_gpu.map(|one| one.eps).filter(|one| *one > 0.0) {
        metrics.insert("scaling_efficiency".to_owned(), eps / (gpus as f64 * one));
    }
    let steady: Vec<f64> = ranks.iter().filter_map(|r| r.eps_steady).collect();
    if steady.len() == ranks.len() {
        let eps_steady: f64 = steady.iter().sum();
        metrics.insert("eps_steady".to_owned(), eps_steady);
        if let Some(one) = one_gpu
            .and_then(|one| one.eps_steady)
            .filter(|one| *one > 0.0)
        {
            metrics.insert(
                "scaling_efficiency_steady".to_owned(),
                eps_steady / (gpus as f64 * one),
            );
        }
    }
    metrics.insert(
        "wall_s".to_owned(),
        ranks.iter().map(|r| r.wall_s).fold(0.0, f64::max),
    );
    metrics.insert(
        "env_epochs".to_owned(),
        ranks.iter().map(|r| r.env_epochs as f64).sum(),
    );
    metrics.insert(
        "active_seeds_per_env".to_owned(),
        mean(ranks.iter().map(|r| r.active_seeds_per_env)),
    );
    metrics.insert(
        "final_accuracy_pct".to_owned(),
        mean(ranks.iter().map(|r| r.final_accuracy_pct)),
    );
    metrics.insert(
        "update_ms".to_owned(),
        mean(ranks.iter().map(|r| r.update_ms)),
    );
    // Where a group loses time to its slowest rank: the wait before each
    // update, and the spread of the ranks' rollouts.
    metrics.insert(
        "update_wait_ms".to_owned(),
        mean(ranks.iter().map(|r| r.update_wait_ms)),
    );
    metrics.insert(
        "update_collective_ms".to_owned(),
        mean(ranks.iter().map(|r| r.update_collective_ms)),
    );
    metrics.insert(
        "rollout_ms_slowest_rank".to_owned(),
        ranks.iter().map(|r| r.rollout_ms).fold(0.0, f64::max),
    );
    let fastest = ranks
        .iter()
        .map(|r| r.rollout_ms)
        .fold(f64::INFINITY, f64::min);
    metrics.insert(
        "rollout_ms_fastest_rank".to_owned(),
        if fastest.is_finite() { fastest } else { 0.0 },
    );
    for name in ROLLOUT_PARTS {
        let parts: Vec<f64> = ranks
            .iter()
            .filter_map(|r| r.rollout_parts_ms.get(name).copied())
            .collect();
        if parts.len() == ranks.len() {
            metrics.insert(format!("rollout_{name}_ms"), mean(parts.into_iter()));
        }
    }
    metrics.insert(
        "process_warmup_s".to_owned(),
        ranks.iter().map(|r| r.process_warmup_s).fold(0.0, f64::max),
    );
    metrics.insert(
        "peak_memory_mb".to_owned(),
        ranks.iter().map(|r| r.peak_memory_mb).fold(0.0, f64::max),
    );
    Ok(ResultEntry {
        implementation: "rust".to_owned(),
        mode: format!("dp{gpus}-{variant_name}"),
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, env_epochs: u64, wall_s: f64, eps_steady: Option<f64>) -> RankFigures {
        RankFigures {
            rank,
            world_size: 2,
            device: "Cuda(0)".to_owned(),
            env_epochs,
            wall_s,
            eps_steady,
            active_seeds_per_env: 1.0,
            final_accuracy_pct: 80.0,
            update_ms: 10.0,
            update_wait_ms: 2.0 * rank as f64,
            update_collective_ms: 3.0 + rank as f64,
            rollout_parts_ms: ROLLOUT_PARTS
                .iter()
                .map(|name| ((*name).to_owned(), 10.0 * (rank + 1) as f64))
                .collect(),
            rollout_ms: 1000.0 + 100.0 * rank as f64,
            peak_memory_mb: 0.0,
            process_warmup_s: 0.5 * rank as f64,
        }
    }

    #[test]
    fn efficiencies_divide_by_the_one_gpu_entry_whole_and_steady() {
        // Two ranks of 100 env-epochs, the slower in 5 s: 40 eps; steady 9 + 8.
        let ranks = [rank(0, 100, 4.0, Some(9.0)), rank(1, 100, 5.0, Some(8.0))];
        let one = OneGpu {
            eps: 25.0,
            eps_steady: Some(10.0),
        };
        let entry = scaling_entry("fp32-eager-fp32-policy", 2, &ranks, Some(one)).unwrap();
        assert_eq!(entry.mode, "dp2-fp32-eager-fp32-policy");
        let metric = |name: &str| entry.metrics[name];
        assert!((metric("eps") - 40.0).abs() < 1e-12);
        assert!((metric("scaling_efficiency") - 0.8).abs() < 1e-12);
        assert!((metric("eps_steady") - 17.0).abs() < 1e-12);
        assert!((metric("scaling_efficiency_steady") - 0.85).abs() < 1e-12);
        // The wait before the updates, and the ranks' rollouts apart.
        assert!((metric("update_wait_ms") - 1.0).abs() < 1e-12);
        assert!((metric("update_collective_ms") - 3.5).abs() < 1e-12);
        // Each rollout part, the ranks' mean.
        for name in ROLLOUT_PARTS {
            assert_eq!(metric(&format!("rollout_{name}_ms")), 15.0, "{name}");
        }
        assert_eq!(metric("rollout_ms_slowest_rank"), 1100.0);
        assert_eq!(metric("rollout_ms_fastest_rank"), 1000.0);
        // The longest warm-up of any rank, outside the clock.
        assert_eq!(metric("process_warmup_s"), 0.5);
        // Without a steady figure on every rank (or for the one-GPU entry),
        // no steady efficiency.
        let partial = [rank(0, 100, 4.0, Some(9.0)), rank(1, 100, 5.0, None)];
        let entry = scaling_entry("fp32-eager", 2, &partial, Some(one)).unwrap();
        assert!(!entry.metrics.contains_key("scaling_efficiency_steady"));
        let cold = OneGpu {
            eps: 25.0,
            eps_steady: None,
        };
        let entry = scaling_entry("fp32-eager", 2, &ranks, Some(cold)).unwrap();
        assert!(!entry.metrics.contains_key("scaling_efficiency_steady"));
        assert!(entry.metrics.contains_key("scaling_efficiency"));
        // An unknown variant is refused.
        assert!(scaling_entry("fp64-eager", 2, &ranks, None).is_err());
    }

    #[test]
    fn the_one_gpu_entry_is_compared_with_the_single_process_whole_and_steady() {
        let entry = ResultEntry {
            implementation: "rust".to_owned(),
            mode: "dp1-fp32-eager".to_owned(),
            metrics: BTreeMap::from([("eps".to_owned(), 19.0), ("eps_steady".to_owned(), 24.0)]),
            error: None,
            amp: None,
        };
        let one = OneGpu::of(&entry).expect("figures");
        assert_eq!(one.eps_steady, Some(24.0));
        let single = OneGpu {
            eps: 20.0,
            eps_steady: Some(25.0),
        };
        let ratios = single_process_ratios(one, single);
        assert!((ratios["single_process_ratio"] - 0.95).abs() < 1e-12);
        assert!((ratios["single_process_ratio_steady"] - 0.96).abs() < 1e-12);
        // No steady figure on one side: no steady ratio.
        let ratios = single_process_ratios(
            one,
            OneGpu {
                eps_steady: None,
                ..single
            },
        );
        assert!(ratios.contains_key("single_process_ratio"));
        assert!(!ratios.contains_key("single_process_ratio_steady"));
        // An entry without a positive eps (a failed run) gives no figures.
        let failed = ResultEntry {
            metrics: BTreeMap::from([("eps".to_owned(), 0.0)]),
            ..entry
        };
        assert_eq!(OneGpu::of(&failed), None);
    }
}
