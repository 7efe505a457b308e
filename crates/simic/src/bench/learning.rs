//! `simic-learning`: PPO rounds on Fashion-MNIST with an impaired host,
//! beside the heuristic controller, the host grown by nobody and the
//! max-growth ceiling on the same environment seeds
//! ([`super::baseline`]).
//!
//! Two comparisons: the last training rounds (stochastic actions with the
//! probability floors, as PPO samples them: `ppo-last-rounds`), and, after
//! training, greedy evaluation rounds of the learned policy without
//! learning (`ppo-greedy-eval-rounds`), each beside the baselines on the
//! same environments (`*-last-rounds`, `*-eval-rounds`).

use leyline::Telemetry;
use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use tolaria::ExecutionMode;
use tolaria::amp::Precision;

use super::baseline::{Baseline, run_baseline};
use super::{SLOTS, SimicBenchOptions, SimicBenchRun, amp_name, load, mean, simic_config};
use crate::Result;
use crate::vectorized::{EnvSpec, Simic};
use tamiyo::policy::SampleMode;

/// Rounds at the end of `simic-learning` whose accuracies are compared.
const LAST_ROUNDS: usize = 3;

/// Greedy evaluation rounds of the learned policy after the training rounds.
const EVAL_ROUNDS: usize = 3;

/// Passes over each round's rollout per PPO update unless
/// [`super::SimicBenchOptions::ppo_epochs`] says otherwise. The reference's
/// default (`recurrent_n_epochs`) is 1; with it, 60 rounds left the greedy
/// policy waiting every epoch (record `h200-2026-11-26l`), with 4, twelve
/// rounds taught it to grow (`h100-2026-11-26n-ppo-epochs-4`). The KL early
/// stop still ends an update early.
pub const LEARNING_PPO_EPOCHS: usize = 4;

/// Training rounds `esper bench simic-learning` runs unless told otherwise
/// (2 with `--quick`).
pub const LEARNING_ROUNDS: usize = 12;

/// The baselines' rows `{name}-{suffix}` on the environments of `rounds`.
#[allow(clippy::too_many_arguments)]
fn baselines(
    spec: &EnvSpec,
    config: &crate::vectorized::SimicConfig,
    device: tch::Device,
    rounds: &[u64],
    suffix: &str,
    precision: Precision,
    results: &mut Vec<ResultEntry>,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    for baseline in [Baseline::Heuristic, Baseline::NoGrowth, Baseline::MaxGrowth] {
        let name = baseline.name();
        let mut accuracies = Vec::new();
        let mut active = Vec::new();
        for &round in rounds {
            let run = run_baseline(spec, config, device, round, baseline)?;
            progress(&format!(
                "  {name} (round {round} seeds): acc {:?}, seeds {:.2}",
                run.accuracies, run.mean_active_seeds
            ));
            accuracies.extend(run.accuracies);
            active.push(run.mean_active_seeds);
        }
        results.push(accuracy_entry(
            format!("{name}-{suffix}"),
            &accuracies,
            &active,
            precision,
        ));
    }
    Ok(())
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

/// `simic-learning`.
pub fn run_learning(
    options: &SimicBenchOptions,
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<SimicBenchRun> {
    options.validate()?;
    let device = torch_ext::device::select(options.device)?;
    let task = tolaria::task::Task::FmnistImpaired;
    let (train, test) = load(task, options)?;
    let host = task.host_config();
    let spec = EnvSpec::sharded(
        host,
        SLOTS.iter().map(|s| (*s).to_owned()).collect(),
        &train,
        test,
        4,
    )?;
    let episode_length = if options.quick { 5 } else { 25 };
    let (precision, mode) = if device.is_cuda() {
        (Precision::Bf16, ExecutionMode::GraphStep)
    } else {
        (Precision::Fp32, ExecutionMode::Eager)
    };
    let mut config = simic_config(precision, mode, episode_length, options.quick);
    let epochs = options.ppo_epochs.unwrap_or(LEARNING_PPO_EPOCHS);
    if epochs == 0 {
        return Err(crate::Error::InvalidConfig {
            field: "ppo_epochs",
            reason: "0 passes over the rollout; an update needs at least 1".to_owned(),
        });
    }
    config.ppo.epochs = epochs;
    let mut simic = Simic::new(config.clone(), SLOTS.len(), device, Telemetry::disabled())?;
    let mut results = Vec::new();
    let mut last_ppo = Vec::new();
    for round in 0..rounds {
        let report = simic.run_round(&spec, true)?;
        progress(&format!("  ppo round {round}: {}", round_summary(&report)));
        let mut metrics = std::collections::BTreeMap::new();
        metrics.insert("round".to_owned(), round as f64);
        metrics.insert("mean_episode_reward".to_owned(), report.mean_episode_reward);
        let accuracy = mean(report.final_accuracies.iter().copied());
        metrics.insert("final_accuracy_pct".to_owned(), accuracy);
        metrics.insert("active_seeds_per_env".to_owned(), report.mean_active_seeds);
        metrics.insert("fossilizations".to_owned(), report.fossilizations as f64);
        insert_chosen_fractions(&report, &mut metrics);
        if round.saturating_add(LAST_ROUNDS) >= rounds {
            last_ppo.push(accuracy);
        }
        results.push(ResultEntry {
            implementation: "rust".to_owned(),
            mode: format!("ppo-round-{round}"),
            metrics,
            error: None,
            amp: Some(amp_name(precision).to_owned()),
        });
    }
    // The baselines on the same environment seeds as the last rounds.
    let last_rounds: Vec<u64> = (rounds.saturating_sub(LAST_ROUNDS)..rounds)
        .map(|round| u64::try_from(round).unwrap_or(0))
        .collect();
    baselines(
        &spec,
        &config,
        device,
        &last_rounds,
        "last-rounds",
        precision,
        &mut results,
        progress,
    )?;

    // The learned policy evaluated: greedy actions, no learning, on the
    // environments of the next rounds, and the baselines on the same ones.
    simic.set_sample_mode(SampleMode::Greedy);
    let mut greedy = Vec::new();
    let mut greedy_seeds = Vec::new();
    let eval_rounds: Vec<u64> = (rounds..rounds.saturating_add(EVAL_ROUNDS))
        .map(|round| u64::try_from(round).unwrap_or(0))
        .collect();
    for &round in &eval_rounds {
        let report = simic.run_round(&spec, false)?;
        progress(&format!(
            "  greedy evaluation (round {round} seeds): {}",
            round_summary(&report)
        ));
        greedy.extend(report.final_accuracies.iter().copied());
        greedy_seeds.push(report.mean_active_seeds);
    }
    simic.set_sample_mode(SampleMode::Stochastic);
    results.push(accuracy_entry(
        "ppo-greedy-eval-rounds".to_owned(),
        &greedy,
        &greedy_seeds,
        precision,
    ));
    baselines(
        &spec,
        &config,
        device,
        &eval_rounds,
        "eval-rounds",
        precision,
        &mut results,
        progress,
    )?;
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert(
        "final_accuracy_pct".to_owned(),
        mean(last_ppo.iter().copied()),
    );
    results.push(ResultEntry {
        implementation: "rust".to_owned(),
        mode: "ppo-last-rounds".to_owned(),
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    });
    Ok(SimicBenchRun {
        device,
        measurements: Measurements {
            params: json!({
                "task": "fashion-mnist (impaired host, channels 4/8/16)",
                "n_envs": 4,
                "slots": SLOTS,
                "episode_length": episode_length,
                "rounds": rounds,
                "ppo_epochs": config.ppo.epochs,
                "quick": options.quick,
            }),
            results,
            telemetry_names: Vec::new(),
        },
    })
}
