//! `simic-learning`: a protocol, not one run. On an impaired host (few
//! channels, three slots: room for seeds), at the reference HEAD's episode
//! length (150 unless told otherwise):
//!
//! 1. The baselines, once, on the shared evaluation environments
//!    ([`EVAL_ROUNDS`] rounds of 4 environments unless
//!    [`super::SimicBenchOptions::eval_environments`] says otherwise, seeded from
//!    [`EVAL_ENV_SEED`], never trained on): no growth, the reference's
//!    heuristic, germinate-once-and-hold and max growth
//!    ([`super::baseline`]). Max growth against no growth comes first: it
//!    is the room a controller can take.
//! 2. For each of the independent training seeds (policy initialisation,
//!    sampling and training environments all derive from it): the PPO
//!    rounds (a learning curve per seed: reward, live seeds,
//!    fossilizations, germinations, accuracy and the chosen ops per round),
//!    then the learned policy evaluated without learning on the same
//!    evaluation environments ([`Simic::evaluate_on`]: same model seeds,
//!    same data shards) twice: greedily (the most likely option of every
//!    head, the protocol's headline) and sampled as it acts in training
//!    (a policy whose growth rests on sampling grows only there). With
//!    [`super::SimicBenchOptions::greedy_every`], the policy is also
//!    evaluated greedily while it trains, every so many rounds, on
//!    environments of its own ([`GREEDY_CURVE_ENV_SEED`]): the greedy
//!    learning curve, in the rounds' entries, with the training trajectory
//!    unchanged; the state at its best point ([`Selected`]) is evaluated
//!    greedily on the shared environments beside the final policy.
//! 3. The comparisons ([`super::stats::paired`]), per training seed and
//!    pooled over them, one pair per (seed, environment): the learned
//!    policy against each baseline, and max growth against no growth: mean
//!    difference of the final accuracy with its 95% confidence interval,
//!    wins, losses and ties, the exact sign test and the paired
//!    permutation test; and the fraction of max growth's gain over no
//!    growth the learned policy recovers; for the greedy and the sampled
//!    evaluation each.
//!
//! The evaluation environments are common to every training seed, so the
//! baselines run once; pooled pairs of different seeds on one environment
//! share its baseline figure.

mod baseline_key;
mod evaluate;
mod outcome;
mod pool;
mod room;
mod selected;
mod summary;
use baseline_key::without_policy_only;
pub use outcome::{Evaluation, SeedOutcome};
pub use room::room_blueprints;
use selected::check_selected;
pub use selected::{AfterRound, SELECTED_PREFIX, Selected, Trained};
use summary::{insert_chosen_fractions, round_summary};

use leyline::Telemetry;
use leyline::baseline::ResultEntry;
use tolaria::ExecutionMode;
use tolaria::amp::Precision;

use super::baseline::{Baseline, run_baseline, run_rounds};
use super::{SLOTS, SimicBenchOptions, SimicBenchRun, amp_name, load, mean, simic_config};
use crate::Result;
use crate::vectorized::{EnvSpec, Simic, SimicConfig};

/// Greedy evaluation rounds of each learned policy, and of the baselines,
/// on the shared environments unless
/// [`super::SimicBenchOptions::eval_environments`] says otherwise: 3
/// rounds of 4, 12 environments.
pub const EVAL_ROUNDS: u64 = 3;

/// The seed the shared evaluation environments derive from (no training
/// seed's environments are built from it: training seeds are small).
pub const EVAL_ENV_SEED: u64 = 0x00E5_A100_0000_0000;

/// The seed the greedy learning curve's environments derive from
/// ([`super::SimicBenchOptions::greedy_every`]): neither the shared
/// evaluation environments nor any training seed's, so the curve does not
/// look at the environments the protocol's comparisons are made on.
pub const GREEDY_CURVE_ENV_SEED: u64 = 0x00E5_C0DE_0000_0000;

/// Rounds of 4 environments of each point of the greedy learning curve.
pub const GREEDY_CURVE_ROUNDS: u64 = 1;

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

/// A result entry of this implementation with `metrics`.
fn rust_entry(
    mode: String,
    metrics: std::collections::BTreeMap<String, f64>,
    precision: Precision,
) -> ResultEntry {
    ResultEntry {
        implementation: "rust".to_owned(),
        mode,
        metrics,
        error: None,
        amp: Some(amp_name(precision).to_owned()),
    }
}

/// The root seed of training seed `index`.
pub fn training_seed(index: usize) -> u64 {
    (index as u64).wrapping_mul(1_000_003).wrapping_add(1)
}

/// One baseline's figures on the shared evaluation environments.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Decisions that missed the deadline or failed (WAIT applied).
    #[serde(default)]
    missed: u64,
    /// Decisions Kasmina refused (WAIT applied).
    #[serde(default)]
    refused: u64,
}

/// The shared evaluation environments' seeds and the baselines' figures on
/// them.
fn run_baselines(
    spec: &EnvSpec,
    config: &SimicConfig,
    device: tch::Device,
    eval_rounds: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<BaselineFigures>> {
    // No twin beside the baselines: it is trained beside its host and
    // changes nothing of it (`tests/twin.rs`), and it pays only a reward the
    // baselines do not report.
    let mut eval_config = SimicConfig {
        seed: EVAL_ENV_SEED,
        ..config.clone()
    };
    eval_config.reward.twin_delta_weight = 0.0;
    let mut figures = Vec::new();
    for baseline in [
        Baseline::NoGrowth,
        Baseline::Heuristic,
        Baseline::GerminateOnce,
        Baseline::MaxGrowth,
    ] {
        let totals = run_rounds(baseline.name(), eval_rounds, progress, |round| {
            run_baseline(spec, &eval_config, device, round, baseline)
        })?;
        figures.push(BaselineFigures {
            baseline,
            accuracies: totals.accuracies,
            active: totals.active,
            germinations: totals.germinations,
            fossilizations: totals.fossilizations,
            missed: totals.missed,
            refused: totals.refused,
        });
    }
    Ok(figures)
}

/// The baselines' figures on the shared evaluation environments (see
/// [`LearningSetup::baselines`]), with the run they belong to; JSON through
/// serde, so a run in parts (`esper bench simic-learning --jobs`) keeps
/// them and does not measure them again.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baselines {
    /// [`LearningSetup::baselines_setup`] of the run that measured them.
    setup: String,
    figures: Vec<BaselineFigures>,
}

impl Baselines {
    /// The run they were measured for ([`LearningSetup::baselines_setup`]).
    pub fn setup(&self) -> &str {
        &self.setup
    }
}

/// Everything a protocol run shares: the device, the task's environments,
/// the configuration with its settings applied, and the sizes.
pub struct LearningSetup {
    device: tch::Device,
    task: tolaria::task::Task,
    spec: EnvSpec,
    config: SimicConfig,
    precision: Precision,
    episode_length: u32,
    seeds: usize,
    rounds: usize,
    greedy_every: Option<usize>,
    /// Rounds of 4 shared evaluation environments.
    eval_rounds: u64,
    settings: Vec<String>,
    quick: bool,
}

impl LearningSetup {
    /// Loads the task and builds the configuration of `options` (its
    /// [`SimicBenchOptions::settings`] applied over the reference's
    /// defaults) with `rounds` training rounds per seed.
    pub fn new(options: &SimicBenchOptions, rounds: usize) -> Result<LearningSetup> {
        options.validate()?;
        let device = torch_ext::device::select(options.device)?;
        let task = options.learning_task;
        let (train, test) = load(task, options)?;
        let spec = EnvSpec::sharded(
            task.host_config()?,
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
        let mut config = simic_config(task, precision, mode, episode_length, options.quick);
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
        crate::vectorized::settings::apply_all(&mut config, &options.settings)?;
        config.validate()?;
        Ok(LearningSetup {
            device,
            task,
            spec,
            config,
            precision,
            episode_length,
            seeds: options.seeds,
            rounds,
            greedy_every: options.greedy_every,
            eval_rounds: options
                .eval_environments
                .map_or(EVAL_ROUNDS, |environments| {
                    u64::try_from(environments / 4).unwrap_or(EVAL_ROUNDS)
                }),
            settings: options.settings.clone(),
            quick: options.quick,
        })
    }

    /// The device the run measures on.
    pub fn device(&self) -> tch::Device {
        self.device
    }

    /// Independent training seeds of the run.
    pub fn seeds(&self) -> usize {
        self.seeds
    }

    /// The shared evaluation environments of the run (12 unless
    /// [`SimicBenchOptions::eval_environments`] said otherwise).
    pub fn eval_environments(&self) -> u64 {
        self.eval_rounds.saturating_mul(4)
    }

    /// What the run is: task, episode, rounds, PPO epochs, the greedy
    /// curve's period (when there is one), the evaluation environments
    /// (when not the default 12, so the setups of earlier runs read as
    /// they did), quick, settings.
    pub fn describe(&self) -> String {
        let greedy = self
            .greedy_every
            .map(|every| format!(" greedy-every {every}"))
            .unwrap_or_default();
        let environments = if self.eval_rounds == EVAL_ROUNDS {
            String::new()
        } else {
            format!(" eval-environments {}", self.eval_environments())
        };
        format!(
            "task {} episode {} rounds {} ppo-epochs {}{greedy}{environments} quick {} settings [{}]",
            self.task.name(),
            self.episode_length,
            self.rounds,
            self.config.ppo.epochs,
            self.quick,
            self.settings.join(" ")
        )
    }

    /// What the baselines depend on: [`LearningSetup::describe`] without
    /// what changes no baseline's figure: the training's rounds, PPO epochs
    /// and greedy curve, PPO's settings and the heads' entropy floors
    /// (`ppo.*`, `floor.*`), the twin term's weight
    /// (`reward.twin_delta_weight`) and the blueprints taken out of the
    /// learned policy's masks (`blueprint.*`). The baselines run without a
    /// twin, train no policy, and their controllers do not use its masks.
    pub fn baselines_setup(&self) -> String {
        without_policy_only(&self.describe())
    }

    /// Whether `baselines` were measured for this run: their setup is this
    /// run's, what no baseline depends on aside
    /// ([`LearningSetup::baselines_setup`]; baselines written before those
    /// were left out of their setup name them, and fit as well).
    pub fn fits(&self, baselines: &Baselines) -> bool {
        without_policy_only(&baselines.setup) == self.baselines_setup()
    }

    /// The baselines, once, on the shared evaluation environments.
    pub fn baselines(&self, progress: &mut dyn FnMut(&str)) -> Result<Baselines> {
        progress(&format!(
            "baselines on the {} shared evaluation environments ({} epochs each)",
            self.eval_environments(),
            self.episode_length
        ));
        let figures = run_baselines(
            &self.spec,
            &self.config,
            self.device,
            self.eval_rounds,
            progress,
        )?;
        Ok(Baselines {
            setup: self.baselines_setup(),
            figures,
        })
    }

    /// Trains the policy of training seed `seed_index` for the run's rounds
    /// and evaluates it greedily on the shared evaluation environments
    /// ([`LearningSetup::train_policy`], then
    /// [`LearningSetup::evaluate_policy`]).
    pub fn train_seed(
        &self,
        seed_index: usize,
        progress: &mut dyn FnMut(&str),
    ) -> Result<SeedOutcome> {
        let mut trained = self.train_policy(seed_index, progress)?;
        self.evaluate_policy(
            &mut trained.simic,
            seed_index,
            trained.curve,
            trained.selected.as_ref(),
            progress,
        )
    }

    /// Trains the policy of training seed `seed_index` for the run's rounds;
    /// returns the trainer, one entry per round (the learning curve) and,
    /// with a greedy curve, the state at its best point.
    pub fn train_policy(
        &self,
        seed_index: usize,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Trained> {
        self.continue_policy(seed_index, None, progress, &mut |_, _, _| Ok(()))
    }

    /// [`LearningSetup::train_policy`] taken up where an earlier process
    /// stopped: `resume` is a checkpoint of this seed's trainer written
    /// after round `k` ([`Simic::save_checkpoint`], its `round` is `k`)
    /// with the learning curve of those `k` rounds. The rounds go on from
    /// `k` (a round's environments derive from the seed and the round
    /// alone, so the trajectory is the one of a run never stopped). After
    /// every round, `after_round` sees the trainer, the curve so far and
    /// the selected state (the greedy curve's best point so far, which the
    /// checkpoint keeps too: [`Selected::to_checkpoint`]), to save them; its
    /// error stops the training. Refused when the checkpoint's round and the
    /// curve disagree or exceed the run's rounds, when its state does not
    /// fit this seed's trainer, or when its selected point is not the
    /// curve's best.
    pub fn continue_policy(
        &self,
        seed_index: usize,
        resume: Option<(&crate::checkpoint::PpoCheckpoint, Vec<ResultEntry>)>,
        progress: &mut dyn FnMut(&str),
        after_round: &mut AfterRound<'_>,
    ) -> Result<Trained> {
        let precision = self.precision;
        let mut simic = self.simic(seed_index)?;
        let mut rounds = Vec::with_capacity(self.rounds);
        let mut selected: Option<Selected> = None;
        if let Some((checkpoint, curve)) = resume {
            let done = usize::try_from(checkpoint.round).unwrap_or(usize::MAX);
            if done != curve.len() || done > self.rounds {
                return Err(crate::Error::Checkpoint {
                    field: "round",
                    reason: format!(
                        "the checkpoint is after round {} with a learning curve of {} \
                         rounds; this run trains {} rounds",
                        checkpoint.round,
                        curve.len(),
                        self.rounds
                    ),
                });
            }
            simic.import_state(&checkpoint.state, &checkpoint.tensors)?;
            selected = Selected::from_checkpoint(checkpoint)?;
            check_selected(&curve, selected.as_ref())?;
            rounds = curve;
        }
        for round in rounds.len()..self.rounds {
            let report = simic.run_round(&self.spec, true)?;
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
            if let Some(figures) = report.imitation {
                // The round's decisions were the demonstrator's.
                metrics.insert("imitated_decisions".to_owned(), figures.imitated as f64);
                metrics.insert(
                    "advances_imitated_as_wait".to_owned(),
                    figures.advances_as_wait as f64,
                );
                metrics.insert(
                    "not_imitable_decisions".to_owned(),
                    figures.not_imitable as f64,
                );
            }
            if let (Some(_), Some(ppo)) = (report.anchor, report.ppo.as_ref()) {
                // The anchor's term in this update.
                metrics.insert("anchor_loss".to_owned(), ppo.anchor_loss);
                metrics.insert("anchor_coef".to_owned(), ppo.anchor_coef);
            }
            insert_chosen_fractions(&report, &mut metrics);
            // What the sampled policy grows, round by round: whether it
            // learns to tell a blueprint that pays from one that costs.
            for (blueprint, count) in &report.actions.germinated {
                metrics.insert(format!("germinated_{blueprint}"), *count as f64);
            }
            let last = round.saturating_add(1) == self.rounds;
            if let Some(every) = self.greedy_every
                && (round.saturating_add(1).checked_rem(every) == Some(0) || last)
            {
                let (accuracy, state, tensors) =
                    self.greedy_point(&mut simic, seed_index, round, progress, &mut metrics)?;
                // At least as good as every earlier point: a later policy
                // of the same greedy figure has trained longer.
                if selected
                    .as_ref()
                    .is_none_or(|best| accuracy >= best.accuracy)
                {
                    selected = Some(Selected::take(round, accuracy, state, &tensors)?);
                    progress(&format!(
                        "  seed {seed_index}: the greedy point after round {round} \
                         ({accuracy:.2}%) is the best so far: selected"
                    ));
                }
            }
            rounds.push(rust_entry(
                format!("ppo-seed{seed_index}-round-{round}"),
                metrics,
                precision,
            ));
            after_round(&simic, &rounds, selected.as_ref())?;
        }
        Ok(Trained {
            simic,
            curve: rounds,
            selected,
        })
    }

    /// A trainer of training seed `seed_index` in the state of `checkpoint`
    /// (written by [`Simic::save_checkpoint`] after
    /// [`LearningSetup::train_policy`], in another process).
    pub fn restore_policy(
        &self,
        seed_index: usize,
        checkpoint: &crate::checkpoint::PpoCheckpoint,
    ) -> Result<Simic> {
        let mut simic = self.simic(seed_index)?;
        simic.import_state(&checkpoint.state, &checkpoint.tensors)?;
        Ok(simic)
    }

    /// A fresh trainer of training seed `seed_index`.
    fn simic(&self, seed_index: usize) -> Result<Simic> {
        let seed_config = SimicConfig {
            seed: training_seed(seed_index),
            ..self.config.clone()
        };
        Simic::new(seed_config, SLOTS.len(), self.device, Telemetry::disabled())
    }

    /// Pools the baselines and the training seeds' outcomes into the
    /// record's measurements. Refuses outcomes of another run (another
    /// [`LearningSetup::describe`]), a seed given twice, a missing seed, or
    /// evaluation figures of the wrong length.
    pub fn report(
        &self,
        baselines: &Baselines,
        outcomes: &[SeedOutcome],
        progress: &mut dyn FnMut(&str),
    ) -> Result<SimicBenchRun> {
        self.report_of(baselines, outcomes, false, progress)
    }

    /// [`LearningSetup::report`] of the seeds evaluated so far: the same
    /// pooling and the same refusals, except that any non-empty set of the
    /// run's seeds is taken (each at most once). The measurements say which
    /// seeds they pool (`evaluated_seeds`) and `partial: true` when that is
    /// not every seed of the run: what a run stopped between sessions
    /// (`--only-seeds`) can say before its record exists. It is not the
    /// protocol's record.
    pub fn report_partial(
        &self,
        baselines: &Baselines,
        outcomes: &[SeedOutcome],
        progress: &mut dyn FnMut(&str),
    ) -> Result<SimicBenchRun> {
        self.report_of(baselines, outcomes, true, progress)
    }
}

/// `simic-learning` (see the module docs): `rounds` training rounds per
/// training seed, the seeds one after another in this process.
pub fn run_learning(
    options: &SimicBenchOptions,
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<SimicBenchRun> {
    let setup = LearningSetup::new(options, rounds)?;
    let baselines = setup.baselines(progress)?;
    let mut outcomes = Vec::with_capacity(setup.seeds);
    for seed_index in 0..setup.seeds {
        outcomes.push(setup.train_seed(seed_index, progress)?);
    }
    setup.report(&baselines, &outcomes, progress)
}

#[cfg(test)]
mod tests;
