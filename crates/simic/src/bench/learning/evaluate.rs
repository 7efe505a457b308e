//! The learned policy's evaluations: on the shared evaluation
//! environments after training ([`LearningSetup::evaluate_policy`]) and,
//! while it trains, the points of the greedy learning curve on
//! environments of their own ([`super::GREEDY_CURVE_ENV_SEED`]).

use leyline::baseline::ResultEntry;
use tamiyo::policy::SampleMode;

use super::{
    EVAL_ENV_SEED, Evaluation, GREEDY_CURVE_ENV_SEED, GREEDY_CURVE_ROUNDS, LearningSetup,
    SeedOutcome, Selected, round_summary,
};
use crate::Result;
use crate::bench::mean;
use crate::vectorized::{Simic, SimicState};

/// A greedy curve's point: its accuracy and the state it was measured in
/// (the trainer's tensors as handles, as [`Simic::export_state`] gives them).
pub(super) type GreedyPoint = (f64, SimicState, Vec<(String, tch::Tensor)>);

impl LearningSetup {
    /// One point of the greedy learning curve after training round `round`
    /// (see [`super::SimicBenchOptions::greedy_every`]): the policy
    /// evaluated greedily on [`GREEDY_CURVE_ROUNDS`] rounds of the curve's
    /// own environments, its figures put into the round's `metrics`. The
    /// trainer's state is exported before and put back after, so the
    /// training goes on as if the point had not been measured (the
    /// sampler's generator, the counters and the normalisers included).
    /// The metrics also count the germinations of each blueprint
    /// (`greedy_germinated_<blueprint>`). Returns the point's accuracy and
    /// the state it was measured in (the trainer's tensors as handles).
    pub(super) fn greedy_point(
        &self,
        simic: &mut Simic,
        seed_index: usize,
        round: usize,
        progress: &mut dyn FnMut(&str),
        metrics: &mut std::collections::BTreeMap<String, f64>,
    ) -> Result<GreedyPoint> {
        let (state, tensors) = simic.export_state()?;
        simic.set_sample_mode(SampleMode::Greedy);
        let name = format!("greedy curve after round {round},");
        let evaluation = self.evaluate(
            simic,
            GREEDY_CURVE_ENV_SEED,
            GREEDY_CURVE_ROUNDS,
            seed_index,
            &name,
            progress,
        );
        simic.set_sample_mode(SampleMode::Stochastic);
        simic.import_state(&state, &tensors)?;
        let evaluation = evaluation?;
        let accuracy = mean(evaluation.accuracies.iter().copied());
        metrics.insert("greedy_accuracy_pct".to_owned(), accuracy);
        metrics.insert(
            "greedy_active_seeds_per_env".to_owned(),
            mean(evaluation.active_seeds.iter().copied()),
        );
        let germinations: u64 = evaluation.germinated.values().sum();
        metrics.insert("greedy_germinations".to_owned(), germinations as f64);
        metrics.insert(
            "greedy_fossilizations".to_owned(),
            evaluation.fossilizations as f64,
        );
        metrics.insert("greedy_prunes".to_owned(), evaluation.prunes as f64);
        // Which blueprints the point grew: a seed's greedy policy can move
        // between a strong and a weak blueprint from one point to the next.
        for (blueprint, count) in &evaluation.germinated {
            metrics.insert(format!("greedy_germinated_{blueprint}"), *count as f64);
        }
        if !evaluation.germinated.is_empty() {
            let grown: Vec<String> = evaluation
                .germinated
                .iter()
                .map(|(blueprint, count)| format!("{blueprint} {count}"))
                .collect();
            progress(&format!(
                "  seed {seed_index} greedy point of round {round} grew: {}",
                grown.join(", ")
            ));
        }
        Ok((accuracy, state, tensors))
    }

    /// `simic`'s policy, in its current sample mode and without learning,
    /// on `rounds` rounds of the environments of `env_seed`.
    fn evaluate(
        &self,
        simic: &mut Simic,
        env_seed: u64,
        rounds: u64,
        seed_index: usize,
        name: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Evaluation> {
        let mut evaluation = Evaluation::default();
        for round in 0..rounds {
            let report = simic.evaluate_on(&self.spec, env_seed, round)?;
            progress(&format!(
                "  seed {seed_index} {name} evaluation round {round}: {}",
                round_summary(&report)
            ));
            evaluation
                .accuracies
                .extend(report.final_accuracies.iter().copied());
            evaluation.active_seeds.push(report.mean_active_seeds);
            evaluation.fossilizations = evaluation
                .fossilizations
                .saturating_add(report.fossilizations);
            evaluation.prunes = evaluation.prunes.saturating_add(report.prunes);
            for outcome in &report.outcomes {
                for (blueprint, count) in &outcome.germinated {
                    let total = evaluation
                        .germinated
                        .entry((*blueprint).to_owned())
                        .or_default();
                    *total = total.saturating_add(*count);
                }
            }
        }
        Ok(evaluation)
    }

    /// Evaluates `simic`'s policy, without learning, on the shared
    /// evaluation environments, greedily and sampled; `rounds` is its
    /// learning curve. With `selected` (the greedy curve's best point),
    /// that state is then put into `simic` and evaluated greedily too.
    pub fn evaluate_policy(
        &self,
        simic: &mut Simic,
        seed_index: usize,
        rounds: Vec<ResultEntry>,
        selected: Option<&Selected>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<SeedOutcome> {
        let mut evaluate = |simic: &mut Simic, mode: SampleMode, name: &str| {
            simic.set_sample_mode(mode);
            self.evaluate(
                simic,
                EVAL_ENV_SEED,
                self.eval_rounds,
                seed_index,
                name,
                progress,
            )
        };
        let greedy = evaluate(simic, SampleMode::Greedy, "greedy");
        let sampled = greedy.and_then(|greedy| {
            evaluate(simic, SampleMode::Stochastic, "sampled").map(|sampled| (greedy, sampled))
        });
        let evaluated = sampled.and_then(|(greedy, sampled)| match selected {
            Some(selected) => {
                selected.apply(simic)?;
                let name = format!("selected (round {}) greedy", selected.round);
                let evaluation = evaluate(simic, SampleMode::Greedy, &name)?;
                Ok((greedy, sampled, Some(evaluation)))
            }
            None => Ok((greedy, sampled, None)),
        });
        simic.set_sample_mode(SampleMode::Stochastic);
        let (greedy, sampled, selected_evaluation) = evaluated?;
        Ok(SeedOutcome {
            seed_index,
            setup: self.describe(),
            rounds,
            greedy,
            sampled,
            selected_round: selected.map(|selected| selected.round),
            selected: selected_evaluation,
        })
    }
}
