//! The seed lifecycle of one slot, as a state machine without tensors.
//!
//! A [`Lifecycle`] is empty or holds a [`SeedState`]: the seed's stage, its
//! transition history, alpha controller, blend settings and measured
//! [`SeedMetrics`]. Every stage change goes through
//! [`SeedState::transition`], which asks leyline's transition table first,
//! and every voluntary move passes its gate ([`crate::gate`]). Nothing here
//! touches a tensor: the slot ([`crate::slot::SeedSlot`]) owns the seed
//! module and follows the state ([`SeedState::holds_module`],
//! [`SeedState::blend_out_freeze`]) after each call, so the whole lifecycle
//! can be read, and property-tested, on plain numbers. Semantics follow
//! reference §1.4/§2.4:
//!
//! - [`Lifecycle::germinate`] creates the state at DORMANT for a module the
//!   slot has built and probed, and passes G0 to reach GERMINATED. A slot
//!   holding any state, cooldown stages included, refuses.
//! - [`Lifecycle::advance_stage`] evaluates the target's gate; on success it
//!   transitions and runs the entry hooks: TRAINING turns gradient
//!   isolation on; BLENDING schedules alpha to the germination target over
//!   the blend tempo (CNN keeps isolation, transformers drop it); HOLDING
//!   forces alpha to 1 in HOLD. Failure stages cannot be targets.
//! - [`Lifecycle::step_epoch`] (once per epoch, after the action): counts
//!   the epoch, keeps the blend-out freeze on exactly while alpha ramps DOWN,
//!   auto-advances through G1/G2/G3 when configured, ticks the alpha
//!   controller in BLENDING (a schedule that reaches alpha 0 prunes), and
//!   walks the cooldown PRUNED -> EMBARGOED (5 ticks) -> RESETTING -> empty:
//!   7 ticks after a prune the slot is free again. HOLDING never times out.
//! - [`Lifecycle::prune`] moves to PRUNED at once (the slot frees the
//!   module) and keeps the state; a FOSSILIZED seed cannot be pruned.
//!   [`Lifecycle::schedule_prune`] ramps alpha down first.
//!
//! Bad input: the configuration is checked by [`Lifecycle::new`]
//! ([`SlotConfig::validate`]), the germination options at germination, and
//! every measurement (accuracies, gradient norms, counterfactual
//! contribution, alpha values, targets and steepness) by the call that
//! records it ([`measure`]); a refused value is a typed error and the call
//! changes nothing, so no lifecycle move is ever decided by a non-finite
//! number.

use leyline::{AlphaCurve, AlphaMode, GateLevel, SeedStage};

use crate::blueprint::Blueprint;
use crate::gate::GateOutcome;
use crate::host::{SlotId, Topology};
use crate::{Error, Result};
use leyline::Telemetry;

mod config;
mod events;
pub mod measure;
mod state;

pub use config::{
    DEFAULT_TEMPO_EPOCHS, GerminationOptions, PruneInitiator, PruneSchedule, SlotConfig,
};
pub use state::{SeedMetrics, SeedState, StageRecord};

/// The lifecycle of the seed in one slot (see the module docs).
#[derive(Debug, Clone)]
pub struct Lifecycle {
    slot: SlotId,
    topology: Topology,
    config: SlotConfig,
    state: Option<SeedState>,
    telemetry: Telemetry,
    source: String,
}

impl Lifecycle {
    /// An empty lifecycle for `slot` of a host with `topology`; the config
    /// must pass [`SlotConfig::validate`]. Events go to `telemetry` with
    /// source `kasmina.<slot>`.
    pub fn new(
        slot: SlotId,
        topology: Topology,
        config: SlotConfig,
        telemetry: Telemetry,
    ) -> Result<Lifecycle> {
        config.validate()?;
        Ok(Lifecycle {
            slot,
            topology,
            config,
            state: None,
            telemetry,
            source: crate::telemetry::slot_source(slot),
        })
    }

    /// The slot this lifecycle runs in.
    pub fn slot(&self) -> SlotId {
        self.slot
    }

    /// Host topology (decides whether isolation survives BLENDING).
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// Slot configuration.
    pub fn config(&self) -> &SlotConfig {
        &self.config
    }

    /// The seed's state, if the slot holds any (live seed or cooldown).
    pub fn state(&self) -> Option<&SeedState> {
        self.state.as_ref()
    }

    /// Current stage, if the slot holds a state.
    pub fn stage(&self) -> Option<SeedStage> {
        self.state.as_ref().map(SeedState::stage)
    }

    /// Whether the slot holds no state at all (germination possible).
    pub fn is_empty(&self) -> bool {
        self.state.is_none()
    }

    /// Whether a seed module should exist now ([`SeedState::holds_module`]).
    pub fn holds_module(&self) -> bool {
        self.state.as_ref().is_some_and(SeedState::holds_module)
    }

    /// Current alpha (0 without a state).
    pub fn alpha(&self) -> f64 {
        self.state.as_ref().map_or(0.0, SeedState::alpha)
    }

    fn no_seed(&self) -> Error {
        Error::NoSeed {
            slot: self.slot.to_string(),
        }
    }

    fn illegal(&self, source: leyline::Error) -> Error {
        Error::IllegalTransition {
            slot: self.slot.to_string(),
            source,
        }
    }

    fn state_mut(&mut self) -> Result<&mut SeedState> {
        let slot = self.slot.to_string();
        self.state.as_mut().ok_or(Error::NoSeed { slot })
    }

    /// Moves the held state to `to` through the transition table.
    fn transition(&mut self, to: SeedStage) -> Result<()> {
        let result = self.state_mut()?.transition(to);
        result.map_err(|source| self.illegal(source))
    }

    /// Puts `state` (e.g. deserialised from a checkpoint) into this empty
    /// lifecycle as it is, without a transition and without telemetry (the
    /// events happened in the run that wrote the checkpoint).
    /// [`Error::SlotOccupied`] while the slot holds a state.
    pub(crate) fn restore(&mut self, state: SeedState) -> Result<()> {
        self.check_available()?;
        self.state = Some(state);
        Ok(())
    }

    /// [`Error::SlotOccupied`] while the slot holds any state.
    pub fn check_available(&self) -> Result<()> {
        match &self.state {
            Some(state) => Err(Error::SlotOccupied {
                slot: self.slot.to_string(),
                stage: state.stage,
            }),
            None => Ok(()),
        }
    }

    /// Germinates a seed of `blueprint` with `param_count` trainable
    /// parameters (the module the slot built and probed): checks that the
    /// slot is empty and the options valid, creates the state at DORMANT and
    /// passes G0 to reach GERMINATED. A G0 failure is
    /// [`Error::GerminationRefused`] and leaves the slot empty.
    pub fn germinate(
        &mut self,
        blueprint: Blueprint,
        options: &GerminationOptions,
        param_count: i64,
    ) -> Result<()> {
        self.check_available()?;
        let mut state = SeedState::new(blueprint, options, param_count)?;
        let outcome = self
            .config
            .gates
            .evaluate(GateLevel::G0, &state.gate_inputs());
        if !outcome.passed {
            return Err(Error::GerminationRefused {
                slot: self.slot.to_string(),
                reason: outcome.checks_failed.join(", "),
            });
        }
        state
            .transition(SeedStage::Germinated)
            .map_err(|source| self.illegal(source))?;
        let param_count = state.param_count;
        self.state = Some(state);
        self.emit_gate(&outcome, SeedStage::Germinated);
        self.emit(
            leyline::telemetry::KASMINA_SEED_GERMINATED,
            "seed germinated",
            vec![
                ("params", param_count.to_string()),
                ("tempo", options.tempo_epochs.to_string()),
                ("alpha_algorithm", options.algorithm.name().to_owned()),
            ],
        );
        Ok(())
    }

    /// Evaluates the gate of `target` (default: the first non-failure
    /// successor) and, when it passes, transitions and runs the entry hooks.
    /// A failed gate is `Ok` with `passed = false`; a move the table forbids
    /// is [`Error::IllegalTransition`]; failure stages are
    /// [`Error::InvalidTarget`] (use [`Lifecycle::prune`]).
    pub fn advance_stage(&mut self, target: Option<SeedStage>) -> Result<GateOutcome> {
        let state = self.state.as_ref().ok_or_else(|| self.no_seed())?;
        let from = state.stage;
        let target = match target {
            Some(target) => target,
            None => from.advance_target().ok_or_else(|| {
                self.illegal(leyline::Error::IllegalTransition { from, to: from })
            })?,
        };
        let gate = match GateLevel::for_target(target) {
            Some(gate) if !target.is_failure() => gate,
            _ => {
                return Err(Error::InvalidTarget {
                    slot: self.slot.to_string(),
                    target,
                });
            }
        };
        leyline::stage::validate_transition(from, target).map_err(|source| self.illegal(source))?;
        let outcome = self.config.gates.evaluate(gate, &state.gate_inputs());
        self.emit_gate(&outcome, target);
        if outcome.passed {
            self.enter_stage(target)?;
        }
        Ok(outcome)
    }

    /// Advances HOLDING -> FOSSILIZED through G5.
    pub fn fossilize(&mut self) -> Result<GateOutcome> {
        self.advance_stage(Some(SeedStage::Fossilized))
    }

    fn enter_stage(&mut self, target: SeedStage) -> Result<()> {
        let topology = self.topology;
        let from = self.state.as_ref().ok_or_else(|| self.no_seed())?.stage;
        self.transition(target)?;
        let state = self.state_mut()?;
        match (from, target) {
            (_, SeedStage::Training) => state.isolate_gradients = true,
            (SeedStage::Training, SeedStage::Blending) => {
                state.isolate_gradients = topology == Topology::Cnn;
                state.metrics.accuracy_at_blending_start = Some(state.metrics.val_accuracy);
                let current = state.alpha.alpha();
                state.alpha.snap(current);
                state.alpha.retarget(
                    state.blend_alpha_target,
                    state.tempo_epochs,
                    Some(state.blend_curve),
                    Some(state.blend_steepness),
                )?;
            }
            (_, SeedStage::Holding) => state.alpha.snap(1.0),
            _ => {}
        }
        self.emit_stage_changed(from, target);
        if target == SeedStage::Fossilized {
            self.emit_fossilized();
        }
        Ok(())
    }

    /// Prunes now: moves to PRUNED and keeps the state for the cooldown (the
    /// slot frees the module). Returns `false` (and does nothing) for a
    /// FOSSILIZED seed or one already pruned.
    pub fn prune(&mut self, reason: &str, initiator: PruneInitiator) -> Result<bool> {
        let from = self.state.as_ref().ok_or_else(|| self.no_seed())?.stage;
        if from == SeedStage::Fossilized || from.is_failure() {
            return Ok(false);
        }
        self.transition(SeedStage::Pruned)?;
        let state = self.state_mut()?;
        state.prune_reason = Some(reason.to_owned());
        state.cooldown_epochs = 0;
        self.emit_stage_changed(from, SeedStage::Pruned);
        self.emit(
            leyline::telemetry::KASMINA_SEED_PRUNED,
            &format!("seed pruned: {reason}"),
            vec![
                ("reason", reason.to_owned()),
                ("initiator", initiator.name().to_owned()),
                (
                    "auto_pruned",
                    (initiator == PruneInitiator::Auto).to_string(),
                ),
            ],
        );
        Ok(true)
    }

    /// Ramps alpha down to 0 over `steps` ticks and prunes when it arrives
    /// (reference `schedule_prune`). `steps == 0` or alpha already 0, or a
    /// stage other than BLENDING/HOLDING, prunes at once. Needs the
    /// controller in HOLD. From HOLDING the seed first returns to BLENDING.
    /// The blend-out freeze goes on for the ramp.
    pub fn schedule_prune(
        &mut self,
        steps: u32,
        curve: AlphaCurve,
        steepness: f64,
    ) -> Result<PruneSchedule> {
        crate::alpha::check_steepness("steepness", steepness)?;
        let state = self.state.as_ref().ok_or_else(|| self.no_seed())?;
        let stage = state.stage;
        if stage == SeedStage::Fossilized || stage.is_failure() {
            return Ok(PruneSchedule::Refused);
        }
        let ramp_possible = matches!(stage, SeedStage::Blending | SeedStage::Holding);
        if steps == 0 || state.alpha() <= 0.0 || !ramp_possible {
            self.prune("scheduled_prune", PruneInitiator::Policy)?;
            return Ok(PruneSchedule::PrunedNow);
        }
        if state.alpha.mode() != AlphaMode::Hold {
            return Err(Error::AlphaNotHold {
                mode: state.alpha.mode(),
            });
        }
        if stage == SeedStage::Holding {
            self.transition(SeedStage::Blending)?;
            self.emit_stage_changed(SeedStage::Holding, SeedStage::Blending);
        }
        let state = self.state_mut()?;
        state
            .alpha
            .retarget(0.0, steps, Some(curve), Some(steepness))?;
        self.update_freeze();
        Ok(PruneSchedule::Scheduled)
    }

    /// Sets alpha directly (finite, in `[0, 1]`), holding there.
    pub fn set_alpha(&mut self, alpha: f64) -> Result<()> {
        self.state_mut()?.alpha.set_alpha(alpha)
    }

    /// Retargets a BLENDING or HOLDING seed's alpha (the SET_ALPHA_TARGET
    /// op); HOLDING first returns to BLENDING. Needs the controller in HOLD,
    /// a target in `[0, 1]` and a valid steepness (checked before anything
    /// changes).
    pub fn retarget_alpha(
        &mut self,
        target: f64,
        steps: u32,
        curve: AlphaCurve,
        steepness: f64,
    ) -> Result<()> {
        crate::validate::unit_interval("alpha_target", target)?;
        crate::alpha::check_steepness("steepness", steepness)?;
        let state = self.state.as_ref().ok_or_else(|| self.no_seed())?;
        match state.stage {
            SeedStage::Blending => {}
            SeedStage::Holding => {
                if state.alpha.mode() != AlphaMode::Hold {
                    return Err(Error::AlphaNotHold {
                        mode: state.alpha.mode(),
                    });
                }
                self.transition(SeedStage::Blending)?;
                self.emit_stage_changed(SeedStage::Holding, SeedStage::Blending);
            }
            other => {
                return Err(self.illegal(leyline::Error::IllegalTransition {
                    from: other,
                    to: SeedStage::Blending,
                }));
            }
        }
        let state = self.state_mut()?;
        state
            .alpha
            .retarget(target, steps, Some(curve), Some(steepness))?;
        self.update_freeze();
        Ok(())
    }

    /// The blend-out freeze follows the alpha controller: on while alpha
    /// ramps DOWN (the slot then stops gradients to the seed's parameters,
    /// keeping the forward graph), off once the controller leaves DOWN.
    fn update_freeze(&mut self) {
        if let Some(state) = self.state.as_mut() {
            state.blend_out_freeze = state.alpha.mode() == AlphaMode::Down;
        }
    }

    /// Once per epoch, after the controller's action (see the module docs).
    pub fn step_epoch(&mut self) -> Result<()> {
        let embargo_epochs = self.config.embargo_epochs;
        let Some(state) = self.state.as_mut() else {
            return Ok(());
        };
        state.metrics.epochs_in_stage = state.metrics.epochs_in_stage.saturating_add(1);
        state.metrics.epochs_total = state.metrics.epochs_total.saturating_add(1);
        let stage = state.stage;
        if !stage.is_failure() {
            self.update_freeze();
        }
        match stage {
            SeedStage::Pruned => {
                self.transition(SeedStage::Embargoed)?;
                self.state_mut()?.cooldown_epochs = 0;
                self.emit_stage_changed(SeedStage::Pruned, SeedStage::Embargoed);
            }
            SeedStage::Embargoed => {
                let state = self.state_mut()?;
                state.cooldown_epochs = state.cooldown_epochs.saturating_add(1);
                if state.cooldown_epochs >= embargo_epochs {
                    self.transition(SeedStage::Resetting)?;
                    self.emit_stage_changed(SeedStage::Embargoed, SeedStage::Resetting);
                }
            }
            SeedStage::Resetting => {
                // The DORMANT step exists only as telemetry: the slot empties.
                self.emit_stage_changed(SeedStage::Resetting, SeedStage::Dormant);
                self.state = None;
            }
            SeedStage::Germinated => {
                if self.config.auto_forward_g1 {
                    self.advance_stage(Some(SeedStage::Training))?;
                }
            }
            SeedStage::Training => {
                let epochs = self.state_mut()?.metrics.epochs_in_stage;
                if self.config.auto_forward_g2
                    && epochs >= self.config.gates.thresholds.min_stage_epochs
                {
                    self.advance_stage(Some(SeedStage::Blending))?;
                }
            }
            SeedStage::Blending => {
                let state = self.state_mut()?;
                state.alpha.step();
                let settled = state.alpha.is_settled();
                let target = state.alpha.alpha_target();
                if settled && target <= leyline::gate::thresholds::ALPHA_TOLERANCE {
                    self.prune("scheduled_prune", PruneInitiator::Auto)?;
                } else if settled && self.config.auto_forward_g3 {
                    self.advance_stage(Some(SeedStage::Holding))?;
                }
            }
            SeedStage::Holding
            | SeedStage::Fossilized
            | SeedStage::Dormant
            | SeedStage::Unknown => {}
        }
        Ok(())
    }
}
