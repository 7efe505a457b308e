//! The controller of a heuristic or baseline run ([`RunController`]) and its
//! handle shared with the epoch loop ([`SharedController`]).

use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use tamiyo::growth::{GerminateOnceController, MaxGrowthController, NoGrowthController};
use tamiyo::heuristic::HeuristicController;
use tolaria::controller::{Controller, Decision, EpochObservation};

use super::args::ControllerKind;
use super::checkpoint::{ControllerState, ScriptedState};
use super::config::RunConfig;

/// The controller of a heuristic or baseline run (`--controller heuristic`,
/// `no-growth`, `max-growth`, `germinate-once`).
#[derive(Debug)]
pub(super) enum RunController {
    /// The reference's heuristic.
    Heuristic(HeuristicController),
    /// WAIT every epoch.
    NoGrowth(NoGrowthController),
    /// The ceiling.
    MaxGrowth(MaxGrowthController),
    /// One seed, then hold.
    GerminateOnce(GerminateOnceController),
}

impl RunController {
    /// The controller `config` names, restored from `saved` when resuming
    /// (refused when the state is another controller's).
    pub(super) fn build(
        config: &RunConfig,
        saved: Option<&ControllerState>,
        telemetry: leyline::Telemetry,
    ) -> Result<RunController> {
        let topology = config.task.task().host().topology();
        let masks = tamiyo::masks::MaskConfig {
            max_seeds: config.max_seeds,
            topology,
            ..tamiyo::masks::MaskConfig::default()
        };
        let scripted = |name: &str| -> Result<bool> {
            match saved {
                None => Ok(false),
                Some(ControllerState::Scripted(state)) if state.scripted == name => {
                    Ok(state.germinated)
                }
                Some(_) => bail!("resume: the checkpoint's controller state is not {name}'s"),
            }
        };
        Ok(match config.controller {
            ControllerKind::Heuristic => RunController::Heuristic(
                match saved {
                    None => HeuristicController::new(),
                    Some(ControllerState::Heuristic(state)) => {
                        HeuristicController::from_state(state)
                            .context("resume: the controller's state")?
                    }
                    Some(ControllerState::Scripted(state)) => bail!(
                        "resume: the checkpoint holds the state of {}, not the heuristic's",
                        state.scripted
                    ),
                }
                .with_rotation(tamiyo::heuristic::rotation_for(topology))
                .with_telemetry(telemetry),
            ),
            ControllerKind::NoGrowth => {
                scripted(ControllerKind::NoGrowth.name())?;
                RunController::NoGrowth(NoGrowthController)
            }
            ControllerKind::MaxGrowth => {
                scripted(ControllerKind::MaxGrowth.name())?;
                RunController::MaxGrowth(MaxGrowthController::new(masks))
            }
            ControllerKind::GerminateOnce => RunController::GerminateOnce(
                GerminateOnceController::new(masks)
                    .with_germinated(scripted(ControllerKind::GerminateOnce.name())?),
            ),
            ControllerKind::Ppo => bail!("a PPO run has no per-run controller"),
        })
    }

    /// Its state for a checkpoint.
    fn state(&self) -> ControllerState {
        let scripted = |kind: ControllerKind, germinated: bool| {
            ControllerState::Scripted(ScriptedState {
                scripted: kind.name().to_owned(),
                germinated,
            })
        };
        match self {
            RunController::Heuristic(heuristic) => {
                ControllerState::Heuristic(heuristic.export_state())
            }
            RunController::NoGrowth(_) => scripted(ControllerKind::NoGrowth, false),
            RunController::MaxGrowth(_) => scripted(ControllerKind::MaxGrowth, false),
            RunController::GerminateOnce(once) => {
                scripted(ControllerKind::GerminateOnce, once.has_germinated())
            }
        }
    }
}

impl Controller for RunController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        match self {
            RunController::Heuristic(controller) => controller.decide(observation),
            RunController::NoGrowth(controller) => controller.decide(observation),
            RunController::MaxGrowth(controller) => controller.decide(observation),
            RunController::GerminateOnce(controller) => controller.decide(observation),
        }
    }
}

/// The run's controller, shared with the epoch loop so that its state can
/// be checkpointed between epochs (the trainer asks it on the deadline's
/// worker thread; the loop only reads it at the boundary, when it is idle).
#[derive(Debug, Clone)]
pub(super) struct SharedController(pub(super) Arc<Mutex<RunController>>);

impl SharedController {
    pub(super) fn state(&self) -> ControllerState {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state()
    }
}

impl Controller for SharedController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .decide(observation)
    }
}
