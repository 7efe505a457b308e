//! The epoch-boundary controller: what Tolaria asks, once per epoch, which
//! lifecycle operation to carry out next.
//!
//! Asked by the general trainer at every epoch boundary
//! ([`crate::engine::trainer::ModelTrainer::with_controller`]).
//!
//! - [`Controller`]: the trait Tamiyo will implement; it reads an
//!   [`EpochObservation`] (built at the epoch boundary from Kasmina's exported
//!   seed states, the epoch's losses and accuracies, the epoch index and the
//!   enabled slots) and answers a [`Decision`] in leyline's vocabulary
//!   ([`LifecycleOp`], [`BlueprintAction`]). [`Decision::wait`] is the safe
//!   default.
//!   Tamiyo implements it: its heuristic controller (the reference's
//!   `HeuristicTamiyo`) and its policy controller.
//! - [`deadline::DecisionDeadline`]: runs a controller on one long-lived
//!   worker thread and waits for it with a deadline; a missed deadline, an
//!   error or a panic yields WAIT plus telemetry, never a crash.
//! - [`apply`]: carries a decision out through Kasmina's public lifecycle
//!   API; Kasmina's typed errors refuse illegal ones.
//!
//! Everything here runs once per epoch on the host, outside any captured
//! CUDA graph; nothing reads device tensors.

pub mod deadline;

use kasmina::export::export_seed_states;
use kasmina::host::SlotId;
use kasmina::lifecycle::{GerminationOptions, PruneInitiator};
use kasmina::model::MorphogeneticModel;
use leyline::proto::SeedState;
use leyline::{BlueprintAction, LifecycleOp, SeedStage};

use crate::{Error, Result};

pub use deadline::{DeadlineOutcome, DeadlineStats, DecisionDeadline};

/// The epoch's training and validation figures the controller sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochMetrics {
    /// Mean training loss (finite).
    pub train_loss: f64,
    /// Training accuracy in percent, `[0, 100]`.
    pub train_accuracy: f64,
    /// Validation loss (finite).
    pub val_loss: f64,
    /// Validation accuracy in percent, `[0, 100]`.
    pub val_accuracy: f64,
}

impl EpochMetrics {
    /// Checks that losses are finite and accuracies lie in `[0, 100]`.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("observation.train_loss", self.train_loss),
            ("observation.val_loss", self.val_loss),
        ] {
            if !value.is_finite() {
                return Err(Error::Controller {
                    field,
                    reason: format!("{value} is not finite"),
                });
            }
        }
        for (field, value) in [
            ("observation.train_accuracy", self.train_accuracy),
            ("observation.val_accuracy", self.val_accuracy),
        ] {
            if !(0.0..=100.0).contains(&value) {
                return Err(Error::Controller {
                    field,
                    reason: format!("{value} is not a percentage in [0, 100]"),
                });
            }
        }
        Ok(())
    }
}

/// What a controller sees at an epoch boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochObservation {
    /// Zero-based epoch index (the epoch just finished).
    pub epoch: u32,
    /// The epoch's losses and accuracies.
    pub metrics: EpochMetrics,
    /// Kasmina's exported seed states (`export_seed_states`): one per slot
    /// holding a state, live or in cooldown, in slot execution order.
    pub seeds: Vec<SeedState>,
    /// The enabled slots in execution order.
    pub slots: Vec<SlotId>,
}

impl EpochObservation {
    /// An observation from explicit parts; `metrics` is validated.
    pub fn new(
        epoch: u32,
        metrics: EpochMetrics,
        seeds: Vec<SeedState>,
        slots: Vec<SlotId>,
    ) -> Result<EpochObservation> {
        metrics.validate()?;
        Ok(EpochObservation {
            epoch,
            metrics,
            seeds,
            slots,
        })
    }

    /// The observation of `model` after `epoch`: its exported seed states
    /// and enabled slots, with the epoch's `metrics`.
    pub fn from_model(
        model: &MorphogeneticModel,
        epoch: u32,
        metrics: EpochMetrics,
    ) -> Result<EpochObservation> {
        let seeds = export_seed_states(model).map_err(|source| Error::Lifecycle {
            op: "export_seed_states",
            source,
        })?;
        EpochObservation::new(epoch, metrics, seeds, model.slot_ids())
    }

    /// Enabled slots holding no seed state (germination candidates), in
    /// execution order.
    pub fn available_slots(&self) -> Vec<SlotId> {
        self.slots
            .iter()
            .copied()
            .filter(|slot| {
                let name = slot.to_string();
                !self.seeds.iter().any(|seed| seed.slot_id == name)
            })
            .collect()
    }
}

/// A seed's stage as leyline's enum, `None` for a value outside the contract.
pub fn seed_stage(seed: &SeedState) -> Option<SeedStage> {
    SeedStage::try_from(seed.stage).ok()
}

/// A controller's answer: one lifecycle operation, in leyline's vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The operation.
    pub op: LifecycleOp,
    /// Target slot (every op but WAIT).
    pub slot: Option<SlotId>,
    /// Blueprint to germinate (GERMINATE only).
    pub blueprint: Option<BlueprintAction>,
    /// Confidence in `[0, 1]` (informational).
    pub confidence: f64,
    /// Why (informational, e.g. `plateau`).
    pub reason: &'static str,
}

impl Decision {
    /// WAIT: do nothing this epoch (the safe default).
    pub fn wait() -> Decision {
        Decision::with_reason(LifecycleOp::Wait, None, "wait")
    }

    /// GERMINATE `blueprint` in `slot`.
    pub fn germinate(slot: SlotId, blueprint: BlueprintAction) -> Decision {
        Decision {
            blueprint: Some(blueprint),
            ..Decision::with_reason(LifecycleOp::Germinate, Some(slot), "germinate")
        }
    }

    /// ADVANCE the seed in `slot` one stage through its gate.
    pub fn advance(slot: SlotId) -> Decision {
        Decision::with_reason(LifecycleOp::Advance, Some(slot), "advance")
    }

    /// FOSSILIZE the HOLDING seed in `slot`.
    pub fn fossilize(slot: SlotId) -> Decision {
        Decision::with_reason(LifecycleOp::Fossilize, Some(slot), "fossilize")
    }

    /// PRUNE the seed in `slot` now.
    pub fn prune(slot: SlotId) -> Decision {
        Decision::with_reason(LifecycleOp::Prune, Some(slot), "prune")
    }

    /// The same decision with `reason` and `confidence`.
    pub fn because(mut self, reason: &'static str, confidence: f64) -> Decision {
        self.reason = reason;
        self.confidence = confidence;
        self
    }

    fn with_reason(op: LifecycleOp, slot: Option<SlotId>, reason: &'static str) -> Decision {
        Decision {
            op,
            slot,
            blueprint: None,
            confidence: 1.0,
            reason,
        }
    }

    /// Whether this is WAIT.
    pub fn is_wait(&self) -> bool {
        self.op == LifecycleOp::Wait
    }
}

/// The epoch-boundary decision maker (Tamiyo implements it: its heuristic
/// and policy controllers). `Send`: it runs on the deadline's worker
/// thread.
pub trait Controller: Send {
    /// The decision for the epoch described by `observation`. An error is
    /// turned into WAIT by [`DecisionDeadline`].
    fn decide(&mut self, observation: &EpochObservation) -> Result<Decision>;
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// WAIT: nothing.
    Waited,
    /// A seed was germinated.
    Germinated {
        /// Where.
        slot: SlotId,
        /// Registry name of the blueprint.
        blueprint: &'static str,
    },
    /// A gate was evaluated (ADVANCE or FOSSILIZE).
    GateEvaluated {
        /// Where.
        slot: SlotId,
        /// The operation (ADVANCE or FOSSILIZE).
        op: LifecycleOp,
        /// Whether the gate passed (the seed moved on).
        passed: bool,
        /// Kasmina's summary of the gate.
        message: String,
    },
    /// PRUNE: `pruned` is `false` when Kasmina left the seed alone
    /// (fossilized or already pruned).
    Pruned {
        /// Where.
        slot: SlotId,
        /// Whether the seed was pruned.
        pruned: bool,
    },
    /// The decision was refused (by Kasmina, or because it lacked a slot or
    /// a blueprint) and nothing changed: the epoch went on as WAIT. Only
    /// [`crate::engine::trainer::ModelTrainer::train_epoch`] reports this
    /// (with the event `tolaria.decision.refused`); [`apply`] returns the
    /// error itself.
    Refused {
        /// The operation asked for.
        op: LifecycleOp,
        /// Why it was refused.
        reason: String,
    },
}

/// Carries `decision` out on `model` through Kasmina's lifecycle API:
/// GERMINATE builds the blueprint from Kasmina's registry with default
/// germination options and seed id `seed_id`; ADVANCE and FOSSILIZE run the
/// gate; PRUNE prunes at once with reason `policy` and initiator
/// [`PruneInitiator::Policy`]. A decision missing its slot or blueprint is
/// [`Error::Controller`]; anything Kasmina refuses (unknown slot, occupied
/// slot, no seed, illegal transition) is [`Error::Lifecycle`] with Kasmina's
/// typed error. SET_ALPHA_TARGET is not carried out yet
/// ([`Error::Controller`]).
pub fn apply(
    decision: &Decision,
    model: &mut MorphogeneticModel,
    seed_id: &str,
) -> Result<Applied> {
    let slot_of = |decision: &Decision| {
        decision.slot.ok_or_else(|| Error::Controller {
            field: "decision.slot",
            reason: format!("{} needs a slot", decision.op.name()),
        })
    };
    let refused = |op: &'static str| move |source: kasmina::Error| Error::Lifecycle { op, source };
    match decision.op {
        LifecycleOp::Wait => Ok(Applied::Waited),
        LifecycleOp::Germinate => {
            let slot = slot_of(decision)?;
            let blueprint = decision.blueprint.ok_or_else(|| Error::Controller {
                field: "decision.blueprint",
                reason: "GERMINATE needs a blueprint".to_owned(),
            })?;
            let name = blueprint.blueprint_id();
            model
                .germinate(slot, name, GerminationOptions::new(seed_id))
                .map_err(refused("germinate"))?;
            Ok(Applied::Germinated {
                slot,
                blueprint: name,
            })
        }
        LifecycleOp::Advance | LifecycleOp::Fossilize => {
            let slot = slot_of(decision)?;
            let outcome = if decision.op == LifecycleOp::Advance {
                model
                    .advance_stage(slot, None)
                    .map_err(refused("advance"))?
            } else {
                model.fossilize(slot).map_err(refused("fossilize"))?
            };
            Ok(Applied::GateEvaluated {
                slot,
                op: decision.op,
                passed: outcome.passed,
                message: outcome.message,
            })
        }
        LifecycleOp::Prune => {
            let slot = slot_of(decision)?;
            let pruned = model
                .prune(slot, "policy", PruneInitiator::Policy)
                .map_err(refused("prune"))?;
            Ok(Applied::Pruned { slot, pruned })
        }
        LifecycleOp::SetAlphaTarget => Err(Error::Controller {
            field: "decision.op",
            reason: "SET_ALPHA_TARGET is not carried out by apply yet".to_owned(),
        }),
    }
}
