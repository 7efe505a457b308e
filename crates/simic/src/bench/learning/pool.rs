//! The protocol's record: the parts checked against the run
//! (`LearningSetup::report_of`, for a record and for a partial report),
//! then the baselines and the training seeds' outcomes pooled into result
//! entries, with the paired comparisons, per training
//! seed and over them (the environments of every seed as pairs; the
//! training seeds as pairs: `-over-seeds`; the environments as pairs with
//! the seeds averaged: `-over-environments`), for the greedy and the
//! sampled evaluation and, with
//! a greedy learning curve, the greedy evaluation of its best point's
//! policy.

use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use tolaria::amp::Precision;

use crate::Result;

use super::super::baseline::Baseline;
use super::super::stats::{Paired, paired};
use super::super::{SLOTS, SimicBenchRun, mean};
use super::{
    BaselineFigures, Baselines, EVAL_ENV_SEED, Evaluation, GREEDY_CURVE_ENV_SEED,
    GREEDY_CURVE_ROUNDS, LearningSetup, SeedOutcome, rust_entry, training_seed,
};

/// How the protocol's records compare (their `params.statistics`).
pub(super) const STATISTICS: &str = "paired per environment; 95% CI from Student's t; exact \
                                     sign test (ties dropped); paired permutation test (exact \
                                     up to 20 pairs, else 200,000 seeded sign flips)";

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
    rust_entry(mode, metrics, precision)
}

/// A scripted controller's entry: [`accuracy_entry`] with its germinations
/// and fossilizations over every evaluation environment.
pub(super) fn controller_entry(
    mode: String,
    accuracies: &[f64],
    active_seeds: &[f64],
    (germinations, fossilizations): (u64, u64),
    precision: Precision,
) -> ResultEntry {
    let mut entry = accuracy_entry(mode, accuracies, active_seeds, precision);
    entry
        .metrics
        .insert("germinations".to_owned(), germinations as f64);
    entry
        .metrics
        .insert("fossilizations".to_owned(), fossilizations as f64);
    entry
}

/// What an evaluated policy grew, into its entry: germinations (in all and
/// `germinated_<blueprint>`), fossilizations and prunes over every
/// evaluation environment.
fn growth_metrics(entry: &mut ResultEntry, evaluation: &Evaluation) {
    let metrics = &mut entry.metrics;
    let total: u64 = evaluation.germinated.values().sum();
    metrics.insert("germinations".to_owned(), total as f64);
    for (blueprint, count) in &evaluation.germinated {
        metrics.insert(format!("germinated_{blueprint}"), *count as f64);
    }
    metrics.insert(
        "fossilizations".to_owned(),
        evaluation.fossilizations as f64,
    );
    metrics.insert("prunes".to_owned(), evaluation.prunes as f64);
}

/// A comparison's result entry (`compare-{a}-vs-{b}{suffix}`).
pub(super) fn comparison_entry(name: String, result: &Paired, precision: Precision) -> ResultEntry {
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
    rust_entry(name, metrics, precision)
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

/// A `recovered_fraction` entry (empty when the fraction is not finite).
fn fraction_entry(mode: String, fraction: f64, precision: Precision) -> ResultEntry {
    let mut metrics = std::collections::BTreeMap::new();
    if fraction.is_finite() {
        metrics.insert("recovered_fraction".to_owned(), fraction);
    }
    rust_entry(mode, metrics, precision)
}

/// The record's entries from validated parts (see [`LearningSetup::report`]).
pub(super) fn pool(
    setup: &LearningSetup,
    baselines: &[BaselineFigures],
    outcomes: &[&SeedOutcome],
    progress: &mut dyn FnMut(&str),
) -> SimicBenchRun {
    let precision = setup.precision;
    let mut results = Vec::new();
    for figures in baselines {
        let mut entry = controller_entry(
            format!("{}-eval", figures.baseline.name()),
            &figures.accuracies,
            &figures.active,
            (figures.germinations, figures.fossilizations),
            precision,
        );
        entry
            .metrics
            .insert("decisions_missed".to_owned(), figures.missed as f64);
        entry
            .metrics
            .insert("decisions_refused".to_owned(), figures.refused as f64);
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
    // Each scripted controller measured against no growth on the same
    // environments, max growth (the room a controller can take) first and
    // always.
    let measured = |b: Baseline| baselines.iter().any(|f| f.baseline == b);
    for baseline in [
        Baseline::MaxGrowth,
        Baseline::Heuristic,
        Baseline::GerminateOnce,
    ]
    .into_iter()
    .filter(|&b| b == Baseline::MaxGrowth || measured(b))
    {
        let gain = paired(of(baseline), &none);
        let room = if baseline == Baseline::MaxGrowth {
            "the room: "
        } else {
            ""
        };
        progress(&format!("  {room}{} - no growth = {gain}", baseline.name()));
        results.push(comparison_entry(
            format!("compare-{}-vs-no-growth", baseline.name()),
            &gain,
            precision,
        ));
    }

    for outcome in outcomes {
        results.extend(outcome.rounds.iter().cloned());
    }
    // Each evaluation mode pooled over the training seeds: the policy's
    // accuracy per (seed, environment), and each baseline's on the same
    // environment. The greedy entries keep their names (`ppo-greedy-eval`,
    // `compare-ppo-vs-*`, `ppo-recovered-fraction`); the sampled ones say
    // `sampled`.
    // With a greedy curve, the policy of its best point too
    // (`ppo-selected-eval`, `compare-ppo-selected-vs-*`): `report` checked
    // that every seed has it then.
    let selected = outcomes.iter().all(|outcome| outcome.selected.is_some());
    let modes = [
        ("greedy", ""),
        ("sampled", "-sampled"),
        ("selected", "-selected"),
    ];
    for (mode, tag) in modes
        .into_iter()
        .filter(|(mode, _)| *mode != "selected" || selected)
    {
        let of_mode = |outcome: &SeedOutcome| -> Evaluation {
            match mode {
                "greedy" => outcome.greedy.clone(),
                "sampled" => outcome.sampled.clone(),
                _ => outcome.selected.clone().unwrap_or_default(),
            }
        };
        let mut pooled_policy = Vec::new();
        let mut pooled: Vec<(Baseline, Vec<f64>)> =
            baselines.iter().map(|f| (f.baseline, Vec::new())).collect();
        let mut pooled_seeds = Vec::new();
        // Per training seed: the policy's mean accuracy and each baseline's
        // over the same environments (the over-seeds comparison below).
        let mut seed_means = Vec::new();
        let mut baseline_means: Vec<Vec<f64>> = vec![Vec::new(); pooled.len()];
        for (position, outcome) in outcomes.iter().enumerate() {
            let seed_index = outcome.seed_index;
            let evaluation = of_mode(outcome);
            let mut entry = accuracy_entry(
                format!("ppo-seed{seed_index}-{mode}-eval"),
                &evaluation.accuracies,
                &evaluation.active_seeds,
                precision,
            );
            growth_metrics(&mut entry, &evaluation);
            // Two training seeds whose policies reach the same accuracy on
            // every environment acted alike there: the pooled pairs then
            // count one outcome twice, and their interval is too narrow.
            if let Some(twin) = outcomes
                .get(..position)
                .unwrap_or_default()
                .iter()
                .find(|earlier| of_mode(earlier).accuracies == evaluation.accuracies)
            {
                progress(&format!(
                    "  seeds {} and {seed_index}: the same {mode} accuracy on every environment \
                     (the policies acted alike); the pooled pairs count that outcome twice",
                    twin.seed_index
                ));
                entry
                    .metrics
                    .insert("same_outcome_as_seed".to_owned(), twin.seed_index as f64);
            }
            if mode == "selected"
                && let Some(round) = outcome.selected_round
            {
                entry
                    .metrics
                    .insert("selected_round".to_owned(), round as f64);
            }
            results.push(entry);
            results.push(comparison_entry(
                format!("compare-ppo{tag}-vs-no-growth-seed{seed_index}"),
                &paired(&evaluation.accuracies, &none),
                precision,
            ));
            results.push(fraction_entry(
                format!("ppo{tag}-recovered-fraction-seed{seed_index}"),
                recovered(&evaluation.accuracies, &none, &max),
                precision,
            ));
            pooled_policy.extend(evaluation.accuracies.iter().copied());
            pooled_seeds.extend(evaluation.active_seeds.iter().copied());
            seed_means.push(mean(evaluation.accuracies.iter().copied()));
            for ((baseline, values), means) in pooled.iter_mut().zip(&mut baseline_means) {
                values.extend_from_slice(of(*baseline));
                means.push(mean(of(*baseline).iter().copied()));
            }
        }
        results.push(accuracy_entry(
            format!("ppo-{mode}-eval"),
            &pooled_policy,
            &pooled_seeds,
            precision,
        ));
        for (baseline, values) in &pooled {
            let comparison = paired(&pooled_policy, values);
            progress(&format!(
                "  learned ({mode}) - {} = {comparison}",
                baseline.name()
            ));
            results.push(comparison_entry(
                format!("compare-ppo{tag}-vs-{}", baseline.name()),
                &comparison,
                precision,
            ));
        }
        // The same comparisons with the training seed as the unit: one pair
        // per seed (its policy's mean over the environments against the
        // baseline's over the same ones). The pooled pairs above take the
        // environments as independent, which holds for the policies trained
        // but not for what training gives from seed to seed; this asks the
        // second question (with 4 seeds the exact tests cannot go below
        // p = 0.125).
        for ((baseline, _), means) in pooled.iter().zip(&baseline_means) {
            let comparison = paired(&seed_means, means);
            progress(&format!(
                "  learned ({mode}) - {}, over the {} training seeds = {comparison}",
                baseline.name(),
                comparison.n
            ));
            results.push(comparison_entry(
                format!("compare-ppo{tag}-vs-{}-over-seeds", baseline.name()),
                &comparison,
                precision,
            ));
        }
        // And with the environment as the unit: one pair per environment
        // (the policy's accuracy there averaged over the training seeds,
        // against the baseline's). Twin seeds cannot narrow it, since
        // every environment is counted once whatever the seeds did.
        let environment_means = per_environment_means(outcomes.iter().copied().map(&of_mode));
        for (baseline, _) in &pooled {
            let comparison = paired(&environment_means, of(*baseline));
            progress(&format!(
                "  learned ({mode}) - {}, over the {} environments (seeds averaged) = {comparison}",
                baseline.name(),
                comparison.n
            ));
            results.push(comparison_entry(
                format!("compare-ppo{tag}-vs-{}-over-environments", baseline.name()),
                &comparison,
                precision,
            ));
        }
        let pooled_of = |wanted: Baseline| {
            pooled
                .iter()
                .find(|(b, _)| *b == wanted)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let fraction = recovered(
            &pooled_policy,
            &pooled_of(Baseline::NoGrowth),
            &pooled_of(Baseline::MaxGrowth),
        );
        progress(&format!(
            "  the learned policy ({mode}) recovers {:.0}% of max growth's gain",
            fraction * 100.0
        ));
        results.push(fraction_entry(
            format!("ppo{tag}-recovered-fraction"),
            fraction,
            precision,
        ));
    }
    let task = setup.task;
    SimicBenchRun {
        device: setup.device,
        measurements: Measurements {
            params: json!({
                "task": task.name(),
                "host_base_channels": task.host_config().ok().map(|host| host.base_channels),
                "n_envs": 4,
                "slots": SLOTS,
                "episode_length": setup.episode_length,
                "active_seed_ceiling": crate::vectorized::Episode::active_seed_ceiling(setup.episode_length),
                "rounds_per_seed": setup.rounds,
                "training_seeds": (0..setup.seeds).map(training_seed).collect::<Vec<_>>(),
                "evaluated_seeds": outcomes.iter().map(|o| o.seed_index).collect::<Vec<_>>(),
                "partial": outcomes.len() != setup.seeds,
                "eval_env_seed": EVAL_ENV_SEED,
                "eval_environments": setup.eval_environments(),
                "ppo_epochs": setup.config.ppo.epochs,
                "greedy_curve": setup.greedy_every.map(|every| json!({
                    "every_rounds": every,
                    "env_seed": GREEDY_CURVE_ENV_SEED,
                    "environments": GREEDY_CURVE_ROUNDS * 4,
                })),
                "settings": setup.settings,
                "quick": setup.quick,
                "statistics": STATISTICS,
            }),
            results,
            telemetry_names: Vec::new(),
        },
    }
}

/// Each environment's accuracy averaged over the evaluations (one per
/// training seed), in the environments' order. `report_of` checked that
/// every evaluation covers the same environments.
fn per_environment_means(evaluations: impl Iterator<Item = Evaluation>) -> Vec<f64> {
    let mut sums: Vec<f64> = Vec::new();
    let mut count = 0.0_f64;
    for evaluation in evaluations {
        if sums.is_empty() {
            sums = vec![0.0; evaluation.accuracies.len()];
        }
        for (sum, accuracy) in sums.iter_mut().zip(&evaluation.accuracies) {
            *sum += accuracy;
        }
        count += 1.0;
    }
    let count = count.max(1.0);
    sums.into_iter().map(|sum| sum / count).collect()
}

impl LearningSetup {
    /// [`LearningSetup::report`] and [`LearningSetup::report_partial`]:
    /// the parts checked, then pooled.
    pub(super) fn report_of(
        &self,
        baselines: &Baselines,
        outcomes: &[SeedOutcome],
        partial: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<SimicBenchRun> {
        let refuse = |reason: String| crate::Error::InvalidInput {
            field: "SeedOutcome",
            reason,
        };
        let expected = self.describe();
        let evaluated = usize::try_from(self.eval_environments()).unwrap_or(usize::MAX);
        let mut ordered: Vec<&SeedOutcome> = outcomes.iter().collect();
        ordered.sort_by_key(|outcome| outcome.seed_index);
        if ordered.is_empty() {
            return Err(refuse("no training seed's outcome to pool".to_owned()));
        }
        for (index, outcome) in ordered.iter().enumerate() {
            if partial {
                if outcome.seed_index >= self.seeds {
                    return Err(refuse(format!(
                        "seed {} is not one of the run's {} training seeds",
                        outcome.seed_index, self.seeds
                    )));
                }
                let previous = index.checked_sub(1).and_then(|before| ordered.get(before));
                if previous.is_some_and(|before| before.seed_index == outcome.seed_index) {
                    return Err(refuse(format!("seed {} given twice", outcome.seed_index)));
                }
            } else if outcome.seed_index != index {
                return Err(refuse(format!(
                    "the outcomes are not seeds 0 to {}: seed {} where {index} belongs",
                    self.seeds.saturating_sub(1),
                    outcome.seed_index
                )));
            }
            let index = outcome.seed_index;
            if outcome.setup != expected {
                return Err(refuse(format!(
                    "seed {index} is of another run ({:?}, this run is {expected:?})",
                    outcome.setup
                )));
            }
            if outcome.selected.is_some() != self.greedy_every.is_some()
                || outcome.selected.is_some() != outcome.selected_round.is_some()
            {
                return Err(refuse(format!(
                    "seed {index} has {} selected policy's evaluation; this run {} a greedy curve",
                    if outcome.selected.is_some() {
                        "a"
                    } else {
                        "no"
                    },
                    if self.greedy_every.is_some() {
                        "has"
                    } else {
                        "has no"
                    }
                )));
            }
            for (name, evaluation) in [("greedy", &outcome.greedy), ("sampled", &outcome.sampled)]
                .into_iter()
                .chain(
                    outcome
                        .selected
                        .as_ref()
                        .map(|selected| ("selected", selected)),
                )
            {
                if evaluation.accuracies.len() != evaluated
                    || evaluation.accuracies.iter().any(|a| !a.is_finite())
                {
                    return Err(refuse(format!(
                        "seed {index} has {} {name} accuracies; {evaluated} finite ones expected",
                        evaluation.accuracies.len()
                    )));
                }
            }
        }
        if !partial && ordered.len() != self.seeds {
            return Err(refuse(format!(
                "{} outcomes for {} training seeds",
                ordered.len(),
                self.seeds
            )));
        }
        if !self.fits(baselines) {
            return Err(refuse(format!(
                "the baselines are of another run ({:?}, this run's are {:?})",
                baselines.setup,
                self.baselines_setup()
            )));
        }
        Ok(pool(self, &baselines.figures, &ordered, progress))
    }
}
