//! The controllers the Simic benches measure beside the learned policy, on
//! the same environments (model seeds, data shards, trainer settings):
//! nobody (the host grown by no one), the reference's heuristic,
//! germinate-once-and-hold ([`tamiyo::growth::GerminateOnceController`])
//! and the max-growth ceiling ([`tamiyo::growth::MaxGrowthController`]: as
//! many seeds as the masks allow, never a prune).
//!
//! Each environment is one Tolaria trainer driven through its controller
//! deadline, one episode long, one environment after another.

use leyline::Telemetry;
use leyline::action::BlueprintAction;
use tamiyo::growth::{GerminateOnceController, MaxGrowthController};
use tamiyo::heuristic::HeuristicController;
use tamiyo::masks::MaskConfig;
use tch::Device;
use tolaria::controller::Applied;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

use crate::vectorized::{EnvSpec, SimicConfig};
use crate::{Error, Result};

/// Which controller drives the baseline environments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Baseline {
    /// No controller: the host alone.
    NoGrowth,
    /// The reference's heuristic (reference §3.5).
    Heuristic,
    /// Germinates one seed, takes it to FOSSILIZED, then holds.
    GerminateOnce,
    /// Grows as fast as the masks allow and never prunes.
    MaxGrowth,
}

impl Baseline {
    /// The name used in result modes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Baseline::NoGrowth => "no-growth",
            Baseline::Heuristic => "heuristic",
            Baseline::GerminateOnce => "germinate-once",
            Baseline::MaxGrowth => "max-growth",
        }
    }
}

/// What one baseline episode per environment gave.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BaselineRun {
    /// Final validation accuracy per environment, percent.
    pub(crate) accuracies: Vec<f64>,
    /// Active seeds (TRAINING to FOSSILIZED) per environment and epoch,
    /// after each epoch's decision: what a round's `mean_active_seeds`
    /// counts.
    pub(crate) mean_active_seeds: f64,
    /// Seeds germinated, over every environment.
    pub(crate) germinations: u64,
    /// Seeds germinated by blueprint (registry name), over every
    /// environment.
    pub(crate) germinated: std::collections::BTreeMap<&'static str, u64>,
    /// Seeds fossilized, over every environment.
    pub(crate) fossilizations: u64,
    /// Decisions that did not arrive (missed deadline or failed
    /// controller; WAIT applied), over every environment.
    pub(crate) missed: u64,
    /// Decisions Kasmina refused (WAIT applied), over every environment.
    pub(crate) refused: u64,
}

/// A controller's [`BaselineRun`]s over several evaluation rounds, summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BaselineTotals {
    /// Final accuracy per environment, percent, in round order.
    pub(crate) accuracies: Vec<f64>,
    /// Mean active seeds per round.
    pub(crate) active: Vec<f64>,
    /// Seeds germinated, in all and by blueprint.
    pub(crate) germinations: u64,
    pub(crate) germinated: std::collections::BTreeMap<&'static str, u64>,
    /// Seeds fossilized.
    pub(crate) fossilizations: u64,
    /// Decisions missed (WAIT applied) and refused (WAIT applied).
    pub(crate) missed: u64,
    pub(crate) refused: u64,
}

/// `rounds` evaluation rounds of one controller (`run` gives a round's
/// episodes), each round's figures said on `progress` under `name`, summed.
pub(crate) fn run_rounds(
    name: &str,
    rounds: u64,
    progress: &mut dyn FnMut(&str),
    mut run: impl FnMut(u64) -> Result<BaselineRun>,
) -> Result<BaselineTotals> {
    let mut totals = BaselineTotals::default();
    for round in 0..rounds {
        let run = run(round)?;
        progress(&format!(
            "  {name} (evaluation round {round}): acc {:?}, seeds {:.2}, germ {} foss {}, \
             decisions missed {} refused {}",
            run.accuracies,
            run.mean_active_seeds,
            run.germinations,
            run.fossilizations,
            run.missed,
            run.refused
        ));
        totals.germinations = totals.germinations.saturating_add(run.germinations);
        for (blueprint, count) in run.germinated {
            let total = totals.germinated.entry(blueprint).or_insert(0);
            *total = total.saturating_add(count);
        }
        totals.fossilizations = totals.fossilizations.saturating_add(run.fossilizations);
        totals.missed = totals.missed.saturating_add(run.missed);
        totals.refused = totals.refused.saturating_add(run.refused);
        totals.accuracies.extend(run.accuracies);
        totals.active.push(run.mean_active_seeds);
    }
    Ok(totals)
}

/// One episode per environment of `spec` under `baseline`, on the seeds the
/// learned policy's round `round` used.
pub(crate) fn run_baseline(
    spec: &EnvSpec,
    config: &SimicConfig,
    device: Device,
    round: u64,
    baseline: Baseline,
) -> Result<BaselineRun> {
    run_driven(spec, config, device, round, baseline, None)
}

/// [`run_baseline`] for max growth germinating `blueprint` instead of the
/// topology's scripted one ([`tamiyo::growth::scripted_blueprint`]): the
/// room one blueprint leaves.
pub(crate) fn run_max_growth_of(
    spec: &EnvSpec,
    config: &SimicConfig,
    device: Device,
    round: u64,
    blueprint: BlueprintAction,
) -> Result<BaselineRun> {
    run_driven(
        spec,
        config,
        device,
        round,
        Baseline::MaxGrowth,
        Some(blueprint),
    )
}

fn run_driven(
    spec: &EnvSpec,
    config: &SimicConfig,
    device: Device,
    round: u64,
    baseline: Baseline,
    blueprint: Option<BlueprintAction>,
) -> Result<BaselineRun> {
    let n = config.n_envs;
    let mut accuracies = Vec::with_capacity(n);
    let mut active = 0_u64;
    let mut epochs = 0_u64;
    let mut germinations = 0_u64;
    let mut germinated = std::collections::BTreeMap::new();
    let mut fossilizations = 0_u64;
    let mut missed = 0_u64;
    let mut refused = 0_u64;
    for env in 0..n {
        let seed = config.seed.wrapping_add(
            round
                .saturating_mul(n as u64)
                .saturating_add(env as u64)
                .saturating_mul(config.env_seed_stride),
        );
        tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
        let model = spec.model(device, config.slot, Telemetry::disabled())?;
        let train = spec.train.get(env).ok_or_else(|| Error::InvalidConfig {
            field: "EnvSpec.train",
            reason: format!("no shard {env}"),
        })?;
        let trainer_config = ModelTrainerConfig {
            seed,
            ..config.trainer.clone()
        };
        let mut trainer = ModelTrainer::new(
            model,
            train,
            Some(&spec.validation),
            trainer_config,
            Telemetry::disabled(),
        )?;
        let deadline = std::time::Duration::from_secs(5);
        let topology = spec.host.topology();
        let masks = MaskConfig {
            max_seeds: config.max_seeds,
            topology,
            ..MaskConfig::default()
        };
        trainer = match baseline {
            Baseline::NoGrowth => trainer,
            Baseline::Heuristic => trainer.with_controller(
                HeuristicController::new().with_rotation(tamiyo::heuristic::rotation_for(topology)),
                deadline,
            )?,
            Baseline::GerminateOnce => {
                trainer.with_controller(GerminateOnceController::new(masks), deadline)?
            }
            Baseline::MaxGrowth => {
                let controller = MaxGrowthController::new(masks);
                let controller = match blueprint {
                    Some(blueprint) => controller.with_blueprint(blueprint),
                    None => controller,
                };
                trainer.with_controller(controller, deadline)?
            }
        };
        let mut last = 0.0;
        for _ in 0..config.episode_length {
            let report = trainer.train_epoch()?;
            if let Some(validation) = report.validation {
                last = validation.accuracy;
            }
            if let Some((outcome, _)) = &report.decision
                && !matches!(outcome, tolaria::controller::DeadlineOutcome::Decided(_))
            {
                missed = missed.saturating_add(1);
            }
            match &report.decision {
                Some((_, Applied::Refused { .. })) => refused = refused.saturating_add(1),
                Some((_, Applied::Germinated { blueprint, .. })) => {
                    germinations = germinations.saturating_add(1);
                    let count = germinated.entry(*blueprint).or_insert(0_u64);
                    *count = count.saturating_add(1);
                }
                Some((
                    _,
                    Applied::GateEvaluated {
                        op: leyline::LifecycleOp::Fossilize,
                        passed: true,
                        ..
                    },
                )) => fossilizations = fossilizations.saturating_add(1),
                _ => {}
            }
            active = active.saturating_add(trainer.model().active_seed_count() as u64);
            epochs = epochs.saturating_add(1);
        }
        accuracies.push(last);
    }
    Ok(BaselineRun {
        accuracies,
        mean_active_seeds: active as f64 / epochs.max(1) as f64,
        germinations,
        germinated,
        fossilizations,
        missed,
        refused,
    })
}
