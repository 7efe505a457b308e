//! `simic-learning`: a protocol, not one run. On an impaired host (few
//! channels, three slots: room for seeds), at the reference HEAD's episode
//! length (150 unless told otherwise):
//!
//! 1. The baselines, once, on the shared evaluation environments
//!    ([`EVAL_ROUNDS`] rounds of 4 environments, seeded from
//!    [`EVAL_ENV_SEED`], never trained on): no growth, the reference's
//!    heuristic, germinate-once-and-hold and max growth
//!    ([`super::baseline`]). Max growth against no growth comes first: it
//!    is the room a controller can take.
//! 2. For each of the independent training seeds (policy initialisation,
//!    sampling and training environments all derive from it): the PPO
//!    rounds (a learning curve per seed: reward, live seeds,
//!    fossilizations, germinations, accuracy and the chosen ops per round),
//!    then the learned policy evaluated greedily, without learning, on the
//!    same evaluation environments ([`Simic::evaluate_on`]: same model
//!    seeds, same data shards).
//! 3. The comparisons ([`super::stats::paired`]), per training seed and
//!    pooled over them, one pair per (seed, environment): the learned
//!    policy against each baseline, and max growth against no growth: mean
//!    difference of the final accuracy with its 95% confidence interval,
//!    wins, losses and ties, the exact sign test and the paired
//!    permutation test; and the fraction of max growth's gain over no
//!    growth the learned policy recovers.
//!
//! The evaluation environments are common to every training seed, so the
//! baselines run once; pooled pairs of different seeds on one environment
//! share its baseline figure.

use leyline::Telemetry;
use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use tolaria::ExecutionMode;
use tolaria::amp::Precision;

use super::baseline::{Baseline, run_baseline};
use super::stats::{Paired, paired};
use super::{SLOTS, SimicBenchOptions, SimicBenchRun, amp_name, load, mean, simic_config};
use crate::Result;
use crate::vectorized::{EnvSpec, Simic, SimicConfig};
use tamiyo::policy::SampleMode;

/// Greedy evaluation rounds of each learned policy, and of the baselines,
/// on the shared environments: 3 rounds of 4, 12 environments.
pub const EVAL_ROUNDS: u64 = 3;

/// The seed the shared evaluation environments derive from (no training
/// seed's environments are built from it: training seeds are small).
pub const EVAL_ENV_SEED: u64 = 0x00E5_A100_0000_0000;

/// Independent training seeds unless told otherwise (1 with `--quick`).
pub const LEARNING_SEEDS: usize = 3;

/// Passes over each round's rollout per PPO update unless
/// [`super::SimicBenchOptions::ppo_epochs`] says otherwise. The reference's
/// default (`recurrent_n_epochs`) is 1; with it, 60 rounds of 25-epoch
/// episodes left the greedy policy waiting every epoch (record
/// `h200-2026-11-26l`), with 4, twelve rounds taught it to grow
/// (`h100-2026-11-26n-ppo-epochs-4`). The KL early stop still ends an
/// update early.
pub const LEARNING_PPO_EPOCHS: usize = 4;

/// Training rounds per seed `esper bench simic-learning` runs unless told
/// otherwise (2 with `--quick`).
pub const LEARNING_ROUNDS: usize = 12;

/// The root seed of training seed `index`.
pub fn training_seed(index: usize) -> u64 {
    (index as u64).wrapping_mul(1_000_003).wrapping_add(1)
}

/// A round's reward, accuracies, seeds and lifecycle counts, for progress.
fn round_summary(report: &crate::vectorized::RoundReport) -> String {
    format!(
        "reward {:.2}, acc {:?}, seeds {:.2}, germ {} foss {} prune {}",
        report.mean_episode_reward,
        report.final_accuracies,
        report.mean_active_seeds,
        report.germinations,
        report.fossilizations,
        report.prunes
    )
}

/// A result entry of the mean final accuracy and mean active seeds.
fn accuracy_entry(
    mode: String,
    accuracies: &[f64],
    active_seeds: &[f64],
    precision: Precision,
) -> ResultEntry {
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert(
        "final_accuracy_pct".to_owned(),
        mean(accuracies.iter().copied()),
    );
    metrics.insert(
        "active_seeds_per_env".to_owned(),
        mean(active_seeds.iter().copied()),
    );
    ResultEntry {
        implementation: "rust".to_owned(),
        mode,
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    }
}

/// The share of the round's decisions on which the policy chose each op
/// (`chosen_wait_fraction`, `chosen_germinate_fraction`, …): what it has
/// learned to do, beside what that did to the accuracy.
fn insert_chosen_fractions(
    report: &crate::vectorized::RoundReport,
    metrics: &mut std::collections::BTreeMap<String, f64>,
) {
    for &op in leyline::LifecycleOp::ALL {
        metrics.insert(
            format!("chosen_{}_fraction", op.name().to_ascii_lowercase()),
            report.actions.chosen_fraction(op),
        );
    }
}

/// One baseline's figures on the shared evaluation environments.
struct BaselineFigures {
    baseline: Baseline,
    /// Final accuracy per environment, in evaluation order.
    accuracies: Vec<f64>,
    /// Mean active seeds per evaluation round.
    active: Vec<f64>,
    /// Seeds germinated over every evaluation environment.
    germinations: u64,
    /// Seeds fossilized over every evaluation environment.
    fossilizations: u64,
}

/// A comparison's result entry (`compare-{a}-vs-{b}{suffix}`).
fn comparison_entry(name: String, result: &Paired, precision: Precision) -> ResultEntry {
    let mut metrics = std::collections::BTreeMap::new();
    let mut put = |key: &str, value: f64| {
        if value.is_finite() {
            metrics.insert(key.to_owned(), value);
        }
    };
    put("pairs", result.n as f64);
    put("mean_diff_pct", result.mean);
    put("sd_diff_pct", result.sd);
    put("ci95_low_pct", result.ci95.0);
    put("ci95_high_pct", result.ci95.1);
    put("wins", result.wins as f64);
    put("losses", result.losses as f64);
    put("ties", result.ties as f64);
    put("sign_test_p", result.sign_p);
    put("permutation_p", result.permutation_p);
    put(
        "permutation_exact",
        if result.permutation_exact { 1.0 } else { 0.0 },
    );
    ResultEntry {
        implementation: "rust".to_owned(),
        mode: name,
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    }
}

/// The fraction of max growth's mean gain over no growth that `policy`'s
/// mean gain recovers (NaN when max growth gains nothing).
fn recovered(policy: &[f64], none: &[f64], max: &[f64]) -> f64 {
    let gain = |a: &[f64]| mean(a.iter().zip(none).map(|(x, y)| x - y));
    let room = gain(max);
    if room.abs() < 1e-12 {
        f64::NAN
    } else {
        gain(policy) / room
    }
}

/// The shared evaluation environments' seeds and the baselines' figures on
/// them.
fn run_baselines(
    spec: &EnvSpec,
    config: &SimicConfig,
    device: tch::Device,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<BaselineFigures>> {
    let eval_config = SimicConfig {
        seed: EVAL_ENV_SEED,
        ..config.clone()
    };
    let mut figures = Vec::new();
    for baseline in [
        Baseline::NoGrowth,
        Baseline::Heuristic,
        Baseline::GerminateOnce,
        Baseline::MaxGrowth,
    ] {
        let mut accuracies = Vec::new();
        let mut active = Vec::new();
        let mut germinations = 0_u64;
        let mut fossilizations = 0_u64;
        for round in 0..EVAL_ROUNDS {
            let run = run_baseline(spec, &eval_config, device, round, baseline)?;
            germinations = germinations.saturating_add(run.germinations);
            fossilizations = fossilizations.saturating_add(run.fossilizations);
            progress(&format!(
                "  {} (evaluation round {round}): acc {:?}, seeds {:.2}, germ {} foss {}",
                baseline.name(),
                run.accuracies,
                run.mean_active_seeds,
                run.germinations,
                run.fossilizations
            ));
            accuracies.extend(run.accuracies);
            active.push(run.mean_active_seeds);
        }
        figures.push(BaselineFigures {
            baseline,
            accuracies,
            active,
            germinations,
            fossilizations,
        });
    }
    Ok(figures)
}

/// `simic-learning` (see the module docs): `rounds` training rounds per
/// training seed.
pub fn run_learning(
    options: &SimicBenchOptions,
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<SimicBenchRun> {
    options.validate()?;
    let device = torch_ext::device::select(options.device)?;
    let task = options.learning_task;
    let (train, test) = load(task, options)?;
    let spec = EnvSpec::sharded(
        task.host_config(),
        SLOTS.iter().map(|s| (*s).to_owned()).collect(),
        &train,
        test,
        4,
    )?;
    let episode_length = options.episode();
    let (precision, mode) = if device.is_cuda() {
        (Precision::Bf16, ExecutionMode::GraphStep)
    } else {
        (Precision::Fp32, ExecutionMode::Eager)
    };
    let mut config = simic_config(precision, mode, episode_length, options.quick);
    let epochs = options.ppo_epochs.unwrap_or(LEARNING_PPO_EPOCHS);
    if !(1..=crate::ppo::config::MAX_EPOCHS).contains(&epochs) {
        return Err(crate::Error::InvalidConfig {
            field: "SimicBenchOptions.ppo_epochs",
            reason: format!(
                "{epochs} is outside [1, {}]",
                crate::ppo::config::MAX_EPOCHS
            ),
        });
    }
    config.ppo.epochs = epochs;
    let seeds = options.seeds;
    let mut results = Vec::new();

    progress(&format!(
        "baselines on the {} shared evaluation environments ({} epochs each)",
        EVAL_ROUNDS * 4,
        episode_length
    ));
    let baselines = run_baselines(&spec, &config, device, progress)?;
    for figures in &baselines {
        let mut entry = accuracy_entry(
            format!("{}-eval", figures.baseline.name()),
            &figures.accuracies,
            &figures.active,
            precision,
        );
        entry
            .metrics
            .insert("germinations".to_owned(), figures.germinations as f64);
        entry
            .metrics
            .insert("fossilizations".to_owned(), figures.fossilizations as f64);
        results.push(entry);
    }
    let of = |baseline: Baseline| -> &[f64] {
        baselines
            .iter()
            .find(|f| f.baseline == baseline)
            .map_or(&[], |f| f.accuracies.as_slice())
    };
    let none = of(Baseline::NoGrowth).to_vec();
    let max = of(Baseline::MaxGrowth).to_vec();
    let room = paired(&max, &none);
    progress(&format!(
        "  the room: max growth - no growth = {:+.2} points (95% CI {:+.2} to {:+.2}, \
         sign p {:.3}, permutation p {:.3})",
        room.mean, room.ci95.0, room.ci95.1, room.sign_p, room.permutation_p
    ));
    results.push(comparison_entry(
        "compare-max-growth-vs-no-growth".to_owned(),
        &room,
        precision,
    ));

    // Pooled over the training seeds: the policy's accuracy per (seed,
    // environment), and each baseline's on the same environment.
    let mut pooled_policy = Vec::new();
    let mut pooled: Vec<(Baseline, Vec<f64>)> =
        baselines.iter().map(|f| (f.baseline, Vec::new())).collect();
    let mut pooled_seeds = Vec::new();
    for seed_index in 0..seeds {
        let seed = training_seed(seed_index);
        let seed_config = SimicConfig {
            seed,
            ..config.clone()
        };
        let mut simic = Simic::new(seed_config, SLOTS.len(), device, Telemetry::disabled())?;
        for round in 0..rounds {
            let report = simic.run_round(&spec, true)?;
            progress(&format!(
                "  seed {seed_index} ppo round {round}: {}",
                round_summary(&report)
            ));
            let mut metrics = std::collections::BTreeMap::new();
            metrics.insert("seed".to_owned(), seed_index as f64);
            metrics.insert("round".to_owned(), round as f64);
            metrics.insert("mean_episode_reward".to_owned(), report.mean_episode_reward);
            metrics.insert(
                "final_accuracy_pct".to_owned(),
                mean(report.final_accuracies.iter().copied()),
            );
            metrics.insert("active_seeds_per_env".to_owned(), report.mean_active_seeds);
            metrics.insert("fossilizations".to_owned(), report.fossilizations as f64);
            metrics.insert("germinations".to_owned(), report.germinations as f64);
            metrics.insert("prunes".to_owned(), report.prunes as f64);
            insert_chosen_fractions(&report, &mut metrics);
            results.push(ResultEntry {
                implementation: "rust".to_owned(),
                mode: format!("ppo-seed{seed_index}-round-{round}"),
                metrics,
                error: None,
                amp: Some(amp_name(precision).to_owned()),
            });
        }
        simic.set_sample_mode(SampleMode::Greedy);
        let mut greedy = Vec::new();
        let mut greedy_seeds = Vec::new();
        for round in 0..EVAL_ROUNDS {
            let report = simic.evaluate_on(&spec, EVAL_ENV_SEED, round)?;
            progress(&format!(
                "  seed {seed_index} greedy evaluation round {round}: {}",
                round_summary(&report)
            ));
            greedy.extend(report.final_accuracies.iter().copied());
            greedy_seeds.push(report.mean_active_seeds);
        }
        results.push(accuracy_entry(
            format!("ppo-seed{seed_index}-greedy-eval"),
            &greedy,
            &greedy_seeds,
            precision,
        ));
        let against_none = paired(&greedy, &none);
        results.push(comparison_entry(
            format!("compare-ppo-vs-no-growth-seed{seed_index}"),
            &against_none,
            precision,
        ));
        let mut fraction = std::collections::BTreeMap::new();
        fraction.insert(
            "recovered_fraction".to_owned(),
            recovered(&greedy, &none, &max),
        );
        fraction.retain(|_, value| value.is_finite());
        results.push(ResultEntry {
            implementation: "rust".to_owned(),
            mode: format!("ppo-recovered-fraction-seed{seed_index}"),
            metrics: fraction,
            error: None,
            amp: Some(amp_name(precision).to_owned()),
        });
        pooled_policy.extend(greedy.iter().copied());
        pooled_seeds.extend(greedy_seeds);
        for (baseline, values) in &mut pooled {
            values.extend_from_slice(of(*baseline));
        }
    }
    results.push(accuracy_entry(
        "ppo-greedy-eval".to_owned(),
        &pooled_policy,
        &pooled_seeds,
        precision,
    ));
    for (baseline, values) in &pooled {
        let comparison = paired(&pooled_policy, values);
        progress(&format!(
            "  learned (greedy) - {} = {:+.2} points (95% CI {:+.2} to {:+.2}, {}/{}/{} \
             wins/losses/ties, sign p {:.3}, permutation p {:.3})",
            baseline.name(),
            comparison.mean,
            comparison.ci95.0,
            comparison.ci95.1,
            comparison.wins,
            comparison.losses,
            comparison.ties,
            comparison.sign_p,
            comparison.permutation_p
        ));
        results.push(comparison_entry(
            format!("compare-ppo-vs-{}", baseline.name()),
            &comparison,
            precision,
        ));
    }
    let pooled_none = pooled
        .iter()
        .find(|(b, _)| *b == Baseline::NoGrowth)
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let pooled_max = pooled
        .iter()
        .find(|(b, _)| *b == Baseline::MaxGrowth)
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let fraction = recovered(&pooled_policy, &pooled_none, &pooled_max);
    progress(&format!(
        "  the learned policy recovers {:.0}% of max growth's gain",
        fraction * 100.0
    ));
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert("recovered_fraction".to_owned(), fraction);
    metrics.retain(|_, value| value.is_finite());
    results.push(ResultEntry {
        implementation: "rust".to_owned(),
        mode: "ppo-recovered-fraction".to_owned(),
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    });
    Ok(SimicBenchRun {
        device,
        measurements: Measurements {
            params: json!({
                "task": task.name(),
                "host_base_channels": task.host_config().base_channels,
                "n_envs": 4,
                "slots": SLOTS,
                "episode_length": episode_length,
                "active_seed_ceiling": crate::vectorized::Episode::active_seed_ceiling(episode_length),
                "rounds_per_seed": rounds,
                "training_seeds": (0..seeds).map(training_seed).collect::<Vec<_>>(),
                "eval_env_seed": EVAL_ENV_SEED,
                "eval_environments": EVAL_ROUNDS * 4,
                "ppo_epochs": config.ppo.epochs,
                "quick": options.quick,
                "statistics": "paired per environment; 95% CI from Student's t; exact sign \
                               test (ties dropped); paired permutation test (exact up to 20 \
                               pairs, else 200,000 seeded sign flips)",
            }),
            results,
            telemetry_names: Vec::new(),
        },
    })
}
