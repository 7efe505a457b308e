//! Seed slots: one seed's lifecycle, forward pass and optimizer.
//!
//! A [`SeedSlot`] sits at one host boundary. It is empty, or holds a
//! [`SeedState`] (lifecycle bookkeeping, kept through prune and cooldown)
//! and, while the seed is alive, its [`SeedModule`] (own `VarStore`, optional
//! [`GatedBlend`], lazily created SGD). Semantics follow reference §1.4/§2.4:
//!
//! - [`SeedSlot::germinate`] builds and probes the module (output shape must
//!   equal input shape), creates the state at DORMANT and passes G0 to reach
//!   GERMINATED (probe `[1, C, H, W]` on CNN slots, `[2, 8, C]` on
//!   transformer slots). A slot holding any state, cooldown stages included,
//!   refuses.
//! - [`SeedSlot::advance_stage`] evaluates the target's gate; on success it
//!   transitions and runs the entry hooks: TRAINING turns gradient isolation
//!   on; BLENDING schedules alpha to the germination target over the blend
//!   tempo (CNN keeps isolation, transformers drop it); HOLDING forces alpha
//!   to 1 in HOLD. Failure stages cannot be targets.
//! - [`SeedSlot::step_epoch`] (once per epoch, after the action): counts the
//!   epoch, keeps the blend-out freeze on exactly while alpha ramps DOWN, auto-advances
//!   through G1/G2/G3 when configured, ticks the alpha controller in BLENDING
//!   (a schedule that reaches alpha 0 prunes), and walks the cooldown PRUNED
//!   -> EMBARGOED (5 ticks) -> RESETTING -> empty: 7 ticks after a prune the
//!   slot is free again. HOLDING never times out.
//! - [`SeedSlot::prune`] frees the module at once and keeps the state; a
//!   FOSSILIZED seed cannot be pruned.
//! - [`SeedSlot::forward`]: identity without an active seed; the seed sees a
//!   detached copy of the host features when isolation is on; TRAINING at
//!   alpha 0 is the straight-through incubator; otherwise ADD / MULTIPLY /
//!   GATE (see [`crate::blend`]).
//!
//! Bad input (issue 9): the slot configuration and injection spec are
//! checked by [`SeedSlot::new`], the germination options by germination, and
//! every measurement (accuracies, gradient norms, counterfactual
//! contribution, alpha values, targets and steepness) by the call that
//! records it; a refused value is a typed error and the call changes
//! nothing, so no lifecycle move is ever decided by a non-finite number.
//! The checks live in `slot_checks`.

use std::collections::VecDeque;

use leyline::gate::thresholds;
use leyline::{
    AlphaAlgorithm, AlphaCurve, AlphaMode, ContractError, GateLevel, GerminationStyle, SeedStage,
    TempoAction,
};
use tch::{Device, Tensor};

use crate::alpha::AlphaController;
use crate::blend::{BlendAlpha, GatedBlend, blend_add, blend_gate, blend_multiply, incubator};
use crate::blueprint::{Blueprint, SeedModule};
use crate::gate::{GateInputs, GateOutcome, QualityGates};
use crate::host::{InjectionSpec, SlotId, Topology};
use crate::masks::trainable_parameters;
use crate::optim::{SEED_LR, SEED_MOMENTUM, Sgd, zero_grads};
use crate::slot_checks;
use crate::telemetry::LifecycleTelemetry;
use crate::{Error, Result};

/// Sequence length of the germination probe on transformer slots (`[2, 8, C]`).
pub const TRANSFORMER_PROBE_TOKENS: i64 = 8;
/// Default blend tempo (epochs), the reference's STANDARD.
pub const DEFAULT_TEMPO_EPOCHS: u32 = 5;
/// Seed gradient norm under which gradients count as vanishing.
pub const GRADIENT_VANISHING_NORM: f64 = 1e-7;
/// Seed gradient norm over which gradients count as exploding.
pub const GRADIENT_EXPLODING_NORM: f64 = 100.0;

/// Per-slot behaviour (checked by [`SlotConfig::validate`] when a slot is
/// built).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SlotConfig {
    /// Gate mode and thresholds.
    pub gates: QualityGates,
    /// `step_epoch` advances GERMINATED -> TRAINING through G1.
    pub auto_forward_g1: bool,
    /// `step_epoch` advances TRAINING -> BLENDING through G2.
    pub auto_forward_g2: bool,
    /// `step_epoch` advances BLENDING -> HOLDING through G3.
    pub auto_forward_g3: bool,
    /// Seed SGD learning rate.
    pub seed_learning_rate: f64,
    /// Seed SGD momentum.
    pub seed_momentum: f64,
    /// Ticks spent EMBARGOED after a prune.
    pub embargo_epochs: u32,
}

impl Default for SlotConfig {
    fn default() -> Self {
        SlotConfig {
            gates: QualityGates::permissive(),
            auto_forward_g1: false,
            auto_forward_g2: false,
            auto_forward_g3: false,
            seed_learning_rate: SEED_LR,
            seed_momentum: SEED_MOMENTUM,
            embargo_epochs: thresholds::EMBARGO_EPOCHS_AFTER_PRUNE,
        }
    }
}

/// How a seed is germinated (the style, tempo and alpha-target heads);
/// checked by [`GerminationOptions::validate`] at germination.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GerminationOptions {
    /// Seed id (G0 needs it non-empty).
    pub seed_id: String,
    /// Blend algorithm.
    pub algorithm: AlphaAlgorithm,
    /// Curve of the blend-in schedule.
    pub blend_curve: AlphaCurve,
    /// Sigmoid steepness of the blend-in schedule.
    pub blend_steepness: f64,
    /// Blend-in length in epochs.
    pub tempo_epochs: u32,
    /// Alpha reached at the end of blending.
    pub alpha_target: f64,
}

impl GerminationOptions {
    /// ADD blend, linear curve, 5-epoch tempo, target 1.0.
    pub fn new(seed_id: impl Into<String>) -> GerminationOptions {
        GerminationOptions {
            seed_id: seed_id.into(),
            algorithm: AlphaAlgorithm::Add,
            blend_curve: AlphaCurve::Linear,
            blend_steepness: leyline::alpha::DEFAULT_SIGMOID_STEEPNESS,
            tempo_epochs: DEFAULT_TEMPO_EPOCHS,
            alpha_target: 1.0,
        }
    }

    /// Curve and algorithm from a germination style.
    pub fn with_style(mut self, style: GerminationStyle) -> GerminationOptions {
        let (curve, algorithm) = style.curve_and_algorithm();
        self.blend_curve = curve;
        self.algorithm = algorithm;
        self
    }

    /// Blend tempo from the tempo head.
    pub fn with_tempo(mut self, tempo: TempoAction) -> GerminationOptions {
        self.tempo_epochs = tempo.epochs();
        self
    }

    /// Blend algorithm.
    pub fn with_algorithm(mut self, algorithm: AlphaAlgorithm) -> GerminationOptions {
        self.algorithm = algorithm;
        self
    }
}

/// Who asked for a prune.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum PruneInitiator {
    /// The controller's action.
    Policy,
    /// The governor (rollback, NaN, divergence).
    Governor,
    /// The slot itself (a scheduled prune reaching alpha 0).
    Auto,
}

impl PruneInitiator {
    /// `policy`, `governor` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            PruneInitiator::Policy => "policy",
            PruneInitiator::Governor => "governor",
            PruneInitiator::Auto => "auto",
        }
    }
}

/// What [`SeedSlot::schedule_prune`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneSchedule {
    /// Pruned at once (no ramp possible or asked for).
    PrunedNow,
    /// Alpha ramps down; the slot prunes when it reaches 0.
    Scheduled,
    /// Nothing done (FOSSILIZED, or already in a failure stage).
    Refused,
}

/// One completed transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageRecord {
    /// Stage left.
    pub from: SeedStage,
    /// Stage entered.
    pub to: SeedStage,
    /// Epochs spent in `from`.
    pub epochs_in_from: u32,
}

/// Measured quantities of a seed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeedMetrics {
    /// Epochs since germination.
    pub epochs_total: u32,
    /// Epochs in the current stage.
    pub epochs_in_stage: u32,
    /// Last training accuracy, percent.
    pub train_accuracy: f64,
    /// Last validation accuracy, percent.
    pub val_accuracy: f64,
    /// Validation accuracy when the current stage began.
    pub accuracy_at_stage_start: f64,
    /// Validation accuracy when blending began.
    pub accuracy_at_blending_start: Option<f64>,
    /// Last seed gradient L2 norm.
    pub gradient_norm: f64,
    /// Gradient ratio EMA, `None` until measured.
    pub gradient_ratio: Option<f64>,
    /// Gradient health in `[0, 1]`, `None` until measured.
    pub gradient_health: Option<f64>,
    /// Last gradients vanishing.
    pub gradients_vanishing: bool,
    /// Last gradients exploding.
    pub gradients_exploding: bool,
    /// Counterfactual contribution, percentage points.
    pub counterfactual_contribution: Option<f64>,
}

impl SeedMetrics {
    /// Validation accuracy change since the stage began, percentage points.
    pub fn improvement_since_stage_start(&self) -> f64 {
        self.val_accuracy - self.accuracy_at_stage_start
    }
}

/// Lifecycle state of one seed (kept while the slot is in cooldown).
#[derive(Debug, Clone, PartialEq)]
pub struct SeedState {
    seed_id: String,
    blueprint: Blueprint,
    stage: SeedStage,
    previous_stage: SeedStage,
    epochs_in_previous_stage: u32,
    history: VecDeque<StageRecord>,
    alpha: AlphaController,
    algorithm: AlphaAlgorithm,
    blend_curve: AlphaCurve,
    blend_steepness: f64,
    tempo_epochs: u32,
    blend_alpha_target: f64,
    isolate_gradients: bool,
    blend_out_freeze: bool,
    is_healthy: bool,
    metrics: SeedMetrics,
    cooldown_epochs: u32,
    prune_reason: Option<String>,
    param_count: i64,
}

impl SeedState {
    /// A DORMANT state for a seed about to germinate. The options must pass
    /// [`GerminationOptions::validate`] and `param_count` be `>= 0`.
    pub fn new(
        blueprint: Blueprint,
        options: &GerminationOptions,
        param_count: i64,
    ) -> Result<SeedState> {
        options.validate()?;
        let param_count = slot_checks::param_count(param_count)?;
        Ok(SeedState {
            seed_id: options.seed_id.clone(),
            blueprint,
            stage: SeedStage::Dormant,
            previous_stage: SeedStage::Unknown,
            epochs_in_previous_stage: 0,
            history: VecDeque::new(),
            alpha: AlphaController::default(),
            algorithm: options.algorithm,
            blend_curve: options.blend_curve,
            blend_steepness: options.blend_steepness,
            tempo_epochs: options.tempo_epochs,
            blend_alpha_target: options.alpha_target,
            isolate_gradients: false,
            blend_out_freeze: false,
            is_healthy: true,
            metrics: SeedMetrics::default(),
            cooldown_epochs: 0,
            prune_reason: None,
            param_count,
        })
    }

    /// Moves to `to` if the leyline table allows it: records the previous
    /// stage and its epochs, appends to the bounded history (100 entries),
    /// resets the epochs-in-stage counter and the stage-start accuracy.
    pub fn transition(&mut self, to: SeedStage) -> std::result::Result<(), ContractError> {
        leyline::stage::validate_transition(self.stage, to)?;
        let record = StageRecord {
            from: self.stage,
            to,
            epochs_in_from: self.metrics.epochs_in_stage,
        };
        self.previous_stage = self.stage;
        self.epochs_in_previous_stage = self.metrics.epochs_in_stage;
        if self.history.len() == thresholds::STAGE_HISTORY_LEN {
            self.history.pop_front();
        }
        self.history.push_back(record);
        self.stage = to;
        self.metrics.epochs_in_stage = 0;
        self.metrics.accuracy_at_stage_start = self.metrics.val_accuracy;
        Ok(())
    }

    /// Seed id.
    pub fn seed_id(&self) -> &str {
        &self.seed_id
    }

    /// Blueprint.
    pub fn blueprint(&self) -> Blueprint {
        self.blueprint
    }

    /// Current stage.
    pub fn stage(&self) -> SeedStage {
        self.stage
    }

    /// Stage before the last transition.
    pub fn previous_stage(&self) -> SeedStage {
        self.previous_stage
    }

    /// Epochs spent in the previous stage.
    pub fn epochs_in_previous_stage(&self) -> u32 {
        self.epochs_in_previous_stage
    }

    /// Transition history, oldest first (at most 100).
    pub fn history(&self) -> &VecDeque<StageRecord> {
        &self.history
    }

    /// The alpha controller.
    pub fn alpha_controller(&self) -> &AlphaController {
        &self.alpha
    }

    /// Current alpha.
    pub fn alpha(&self) -> f64 {
        self.alpha.alpha()
    }

    /// Blend algorithm.
    pub fn algorithm(&self) -> AlphaAlgorithm {
        self.algorithm
    }

    /// Blend-in tempo, epochs.
    pub fn tempo_epochs(&self) -> u32 {
        self.tempo_epochs
    }

    /// Whether the seed sees detached host features.
    pub fn isolate_gradients(&self) -> bool {
        self.isolate_gradients
    }

    /// Whether seed parameters are frozen for a blend-out.
    pub fn blend_out_freeze(&self) -> bool {
        self.blend_out_freeze
    }

    /// Health flag (G5).
    pub fn is_healthy(&self) -> bool {
        self.is_healthy
    }

    /// Metrics.
    pub fn metrics(&self) -> &SeedMetrics {
        &self.metrics
    }

    /// Cooldown ticks counted in EMBARGOED.
    pub fn cooldown_epochs(&self) -> u32 {
        self.cooldown_epochs
    }

    /// Why the seed was pruned, once it was.
    pub fn prune_reason(&self) -> Option<&str> {
        self.prune_reason.as_deref()
    }

    /// Trainable parameters of the seed (module plus gate) at germination.
    pub fn param_count(&self) -> i64 {
        self.param_count
    }

    fn gate_inputs(&self) -> GateInputs<'_> {
        GateInputs {
            seed_id: &self.seed_id,
            blueprint_id: self.blueprint.name(),
            stage: self.stage,
            epochs_in_stage: self.metrics.epochs_in_stage,
            improvement: self.metrics.improvement_since_stage_start(),
            gradient_ratio: self.metrics.gradient_ratio,
            gradient_health: self.metrics.gradient_health,
            gradients_exploding: self.metrics.gradients_exploding,
            alpha: self.alpha.alpha(),
            alpha_target: self.alpha.alpha_target(),
            alpha_mode: self.alpha.mode(),
            counterfactual: self.metrics.counterfactual_contribution,
            is_healthy: self.is_healthy,
        }
    }
}

/// The live seed: module, optional gate network, lazily created optimizer.
#[derive(Debug)]
struct LiveSeed {
    module: SeedModule,
    gate: Option<GatedBlend>,
    optimizer: Option<Sgd>,
}

/// One injection point and the seed it holds.
#[derive(Debug)]
pub struct SeedSlot {
    spec: InjectionSpec,
    topology: Topology,
    config: SlotConfig,
    probe_shape: Vec<i64>,
    state: Option<SeedState>,
    seed: Option<LiveSeed>,
    telemetry: LifecycleTelemetry,
    source: String,
}

impl SeedSlot {
    /// An empty slot at `spec` of a host with `topology`. The config must
    /// pass [`SlotConfig::validate`] and the spec
    /// [`InjectionSpec::validate`].
    pub fn new(
        spec: InjectionSpec,
        topology: Topology,
        config: SlotConfig,
        telemetry: LifecycleTelemetry,
    ) -> Result<SeedSlot> {
        config.validate()?;
        let probe_shape = spec.validate(topology)?;
        let source = format!("kasmina.{}", spec.slot_id);
        Ok(SeedSlot {
            spec,
            topology,
            config,
            probe_shape,
            state: None,
            seed: None,
            telemetry,
            source,
        })
    }

    /// Slot id.
    pub fn id(&self) -> SlotId {
        self.spec.slot_id
    }

    /// Injection spec.
    pub fn spec(&self) -> &InjectionSpec {
        &self.spec
    }

    /// Slot configuration.
    pub fn config(&self) -> &SlotConfig {
        &self.config
    }

    /// Host topology the slot lives in.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// Lifecycle state, if the slot holds any.
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

    /// Whether the seed is on the forward path (TRAINING..FOSSILIZED).
    pub fn is_active(&self) -> bool {
        self.seed.is_some() && self.stage().is_some_and(SeedStage::is_active)
    }

    /// The live seed module, if any.
    pub fn seed_module(&self) -> Option<&SeedModule> {
        self.seed.as_ref().map(|seed| &seed.module)
    }

    /// Whether the seed's optimizer has been created.
    pub fn has_optimizer(&self) -> bool {
        self.seed
            .as_ref()
            .is_some_and(|seed| seed.optimizer.is_some())
    }

    /// Current alpha (0 without a state).
    pub fn alpha(&self) -> f64 {
        self.state.as_ref().map_or(0.0, SeedState::alpha)
    }

    fn no_seed(&self) -> Error {
        Error::NoSeed {
            slot: self.id().to_string(),
        }
    }

    fn state_mut(&mut self) -> Result<&mut SeedState> {
        let slot = self.id().to_string();
        self.state.as_mut().ok_or(Error::NoSeed { slot })
    }

    fn emit(&self, name: &str, message: &str, mut extra: Vec<(&'static str, String)>) {
        if !self.telemetry.is_enabled() {
            return;
        }
        let mut attributes = vec![("slot_id", self.id().to_string())];
        if let Some(state) = &self.state {
            attributes.push(("seed_id", state.seed_id.clone()));
            attributes.push(("blueprint_id", state.blueprint.name().to_owned()));
            attributes.push(("alpha", format!("{}", state.alpha())));
            attributes.push(("epochs_in_stage", state.metrics.epochs_in_stage.to_string()));
            attributes.push(("stage", state.stage.name().to_owned()));
        }
        attributes.append(&mut extra);
        self.telemetry
            .emit_event(&self.source, name, message, attributes);
    }

    fn emit_stage_changed(&self, from: SeedStage, to: SeedStage) {
        self.emit(
            leyline::telemetry::KASMINA_SEED_STAGE_CHANGED,
            &format!("{from} -> {to}"),
            vec![
                ("from", from.name().to_owned()),
                ("to", to.name().to_owned()),
            ],
        );
    }

    fn emit_gate(&self, outcome: &GateOutcome, target: SeedStage) {
        self.emit(
            leyline::telemetry::KASMINA_SEED_GATE_EVALUATED,
            &outcome.message,
            vec![
                ("gate", outcome.gate.name().to_owned()),
                ("passed", outcome.passed.to_string()),
                ("target_stage", target.name().to_owned()),
                ("score", format!("{}", outcome.score)),
                ("checks_passed", outcome.checks_passed.join(",")),
                ("checks_failed", outcome.checks_failed.join(",")),
            ],
        );
    }

    /// Builds `blueprint` (a registry name) at the slot's channel count on
    /// `device` and germinates it. See [`SeedSlot::germinate_module`].
    pub fn germinate(
        &mut self,
        blueprint: &str,
        options: GerminationOptions,
        device: Device,
    ) -> Result<()> {
        self.check_available()?;
        options.validate()?;
        let blueprint = Blueprint::from_name(self.topology, blueprint)?;
        let module = blueprint.build(self.topology, self.spec.channels, device)?;
        self.germinate_module(module, options)
    }

    fn check_available(&self) -> Result<()> {
        match &self.state {
            Some(state) => Err(Error::SlotOccupied {
                slot: self.id().to_string(),
                stage: state.stage,
            }),
            None => Ok(()),
        }
    }

    /// Germinates an already built module (e.g. from the prefetcher): checks
    /// that the slot is empty and the channels match, probes the module with
    /// a zero input `[1, C, H, W]` of the slot's spatial size (output shape
    /// must equal input shape), zero-initialises the final affine layer for
    /// the MULTIPLY blend, creates the gate network for GATE, and passes G0
    /// to reach GERMINATED. A G0 failure is [`Error::GerminationRefused`].
    pub fn germinate_module(
        &mut self,
        mut module: SeedModule,
        options: GerminationOptions,
    ) -> Result<()> {
        self.check_available()?;
        if module.topology() != self.topology {
            return Err(Error::UnknownBlueprint {
                name: module.blueprint().name().to_owned(),
                known: format!(
                    "a {:?} module cannot grow in a {:?} slot",
                    module.topology(),
                    self.topology
                ),
            });
        }
        if module.channels() != self.spec.channels {
            return Err(Error::ShapeMismatch {
                op: "germinate (seed channels)",
                expected: vec![self.spec.channels],
                got: vec![module.channels()],
            });
        }
        options.validate()?;
        let probe_shape = self.probe_shape.clone();
        let probe = Tensor::f_zeros(probe_shape.as_slice(), (tch::Kind::Float, module.device()))?;
        let probe_out = tch::no_grad(|| module.forward(&probe))?;
        if probe_out.size() != probe_shape {
            return Err(Error::ShapeMismatch {
                op: "germination probe",
                expected: probe_shape,
                got: probe_out.size(),
            });
        }
        if options.algorithm == AlphaAlgorithm::Multiply {
            module.zero_init_final_affine()?;
        }
        let gate = if options.algorithm == AlphaAlgorithm::Gate {
            let root = module.var_store().root();
            Some(GatedBlend::new(
                &root.sub("gate"),
                self.spec.channels,
                self.topology,
            )?)
        } else {
            None
        };
        let param_count = module.param_count();
        let mut state = SeedState::new(module.blueprint(), &options, param_count)?;
        let outcome = self
            .config
            .gates
            .evaluate(GateLevel::G0, &state.gate_inputs());
        if !outcome.passed {
            return Err(Error::GerminationRefused {
                slot: self.id().to_string(),
                reason: outcome.checks_failed.join(", "),
            });
        }
        state
            .transition(SeedStage::Germinated)
            .map_err(|source| Error::IllegalTransition {
                slot: self.id().to_string(),
                source,
            })?;
        self.state = Some(state);
        self.seed = Some(LiveSeed {
            module,
            gate,
            optimizer: None,
        });
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
    /// [`Error::InvalidTarget`] (use [`SeedSlot::prune`]).
    pub fn advance_stage(&mut self, target: Option<SeedStage>) -> Result<GateOutcome> {
        let slot = self.id().to_string();
        let state = self.state.as_ref().ok_or_else(|| self.no_seed())?;
        let from = state.stage;
        let target = match target {
            Some(target) => target,
            None => from
                .advance_target()
                .ok_or_else(|| Error::IllegalTransition {
                    slot: slot.clone(),
                    source: ContractError::IllegalTransition { from, to: from },
                })?,
        };
        let gate = match GateLevel::for_target(target) {
            Some(gate) if !target.is_failure() => gate,
            _ => return Err(Error::InvalidTarget { slot, target }),
        };
        leyline::stage::validate_transition(from, target)
            .map_err(|source| Error::IllegalTransition { slot, source })?;
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
        let slot = self.id().to_string();
        let topology = self.topology;
        let state = self.state_mut()?;
        let from = state.stage;
        state
            .transition(target)
            .map_err(|source| Error::IllegalTransition { slot, source })?;
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
            let improvement = self
                .state
                .as_ref()
                .map_or(0.0, |s| s.metrics.improvement_since_stage_start());
            let params = self.state.as_ref().map_or(0, |s| s.param_count);
            let counterfactual = self
                .state
                .as_ref()
                .and_then(|s| s.metrics.counterfactual_contribution)
                .unwrap_or(0.0);
            self.emit(
                leyline::telemetry::KASMINA_SEED_FOSSILIZED,
                "seed fossilized",
                vec![
                    ("improvement", format!("{improvement}")),
                    ("params_added", params.to_string()),
                    ("counterfactual", format!("{counterfactual}")),
                ],
            );
        }
        Ok(())
    }

    /// Prunes now: frees the module (and its optimizer) at once, keeps the
    /// state in PRUNED for the cooldown. Returns `false` (and does nothing)
    /// for a FOSSILIZED seed or one already pruned.
    pub fn prune(&mut self, reason: &str, initiator: PruneInitiator) -> Result<bool> {
        let slot = self.id().to_string();
        let state = self
            .state
            .as_mut()
            .ok_or(Error::NoSeed { slot: slot.clone() })?;
        let from = state.stage;
        if from == SeedStage::Fossilized || from.is_failure() {
            return Ok(false);
        }
        state
            .transition(SeedStage::Pruned)
            .map_err(|source| Error::IllegalTransition { slot, source })?;
        state.prune_reason = Some(reason.to_owned());
        state.cooldown_epochs = 0;
        self.seed = None;
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
            let slot = self.id().to_string();
            self.state_mut()?
                .transition(SeedStage::Blending)
                .map_err(|source| Error::IllegalTransition { slot, source })?;
            self.emit_stage_changed(SeedStage::Holding, SeedStage::Blending);
        }
        let state = self.state_mut()?;
        state
            .alpha
            .retarget(0.0, steps, Some(curve), Some(steepness))?;
        self.apply_freeze()?;
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
        let slot = self.id().to_string();
        let stage = self.state.as_ref().ok_or_else(|| self.no_seed())?.stage;
        match stage {
            SeedStage::Blending => {}
            SeedStage::Holding => {
                let state = self.state_mut()?;
                if state.alpha.mode() != AlphaMode::Hold {
                    return Err(Error::AlphaNotHold {
                        mode: state.alpha.mode(),
                    });
                }
                state
                    .transition(SeedStage::Blending)
                    .map_err(|source| Error::IllegalTransition { slot, source })?;
                self.emit_stage_changed(SeedStage::Holding, SeedStage::Blending);
            }
            other => {
                return Err(Error::IllegalTransition {
                    slot,
                    source: ContractError::IllegalTransition {
                        from: other,
                        to: SeedStage::Blending,
                    },
                });
            }
        }
        let state = self.state_mut()?;
        state
            .alpha
            .retarget(target, steps, Some(curve), Some(steepness))?;
        self.apply_freeze()
    }

    /// The blend-out freeze follows the alpha controller: while alpha ramps
    /// DOWN, seed and gate parameters stop requiring gradients (the forward
    /// graph is kept); once the controller leaves DOWN they train again.
    fn apply_freeze(&mut self) -> Result<()> {
        let Some(state) = self.state.as_mut() else {
            return Ok(());
        };
        let frozen = state.alpha.mode() == AlphaMode::Down;
        if frozen != state.blend_out_freeze {
            state.blend_out_freeze = frozen;
            if let Some(seed) = &self.seed {
                for (_, parameter) in trainable_parameters(seed.module.var_store()) {
                    let _ = parameter.f_set_requires_grad(!frozen)?;
                }
            }
        }
        Ok(())
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
            self.apply_freeze()?;
        }
        let slot = self.spec.slot_id.to_string();
        let Some(state) = self.state.as_mut() else {
            return Ok(());
        };
        match stage {
            SeedStage::Pruned => {
                state
                    .transition(SeedStage::Embargoed)
                    .map_err(|source| Error::IllegalTransition { slot, source })?;
                state.cooldown_epochs = 0;
                self.emit_stage_changed(SeedStage::Pruned, SeedStage::Embargoed);
            }
            SeedStage::Embargoed => {
                state.cooldown_epochs = state.cooldown_epochs.saturating_add(1);
                if state.cooldown_epochs >= embargo_epochs {
                    state
                        .transition(SeedStage::Resetting)
                        .map_err(|source| Error::IllegalTransition { slot, source })?;
                    self.emit_stage_changed(SeedStage::Embargoed, SeedStage::Resetting);
                }
            }
            SeedStage::Resetting => {
                // The DORMANT step exists only as telemetry: the slot empties.
                self.emit_stage_changed(SeedStage::Resetting, SeedStage::Dormant);
                self.state = None;
                self.seed = None;
            }
            SeedStage::Germinated => {
                if self.config.auto_forward_g1 {
                    self.advance_stage(Some(SeedStage::Training))?;
                }
            }
            SeedStage::Training => {
                if self.config.auto_forward_g2
                    && state.metrics.epochs_in_stage
                        >= self.config.gates.thresholds.min_stage_epochs
                {
                    self.advance_stage(Some(SeedStage::Blending))?;
                }
            }
            SeedStage::Blending => {
                let Some(state) = self.state.as_mut() else {
                    return Ok(());
                };
                state.alpha.step();
                let settled = state.alpha.is_settled();
                if settled && state.alpha.alpha_target() <= thresholds::ALPHA_TOLERANCE {
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

    /// Emits the seed's gauges (alpha, stage, epochs in stage, gradient norm
    /// and ratio, accuracy change, parameters) as one packet; nothing for an
    /// empty slot.
    pub fn emit_metrics(&self) {
        use crate::telemetry::metric;
        use leyline::telemetry as names;
        let Some(state) = &self.state else {
            return;
        };
        if !self.telemetry.is_enabled() {
            return;
        }
        let metrics = &state.metrics;
        let mut values = vec![
            metric(names::KASMINA_SEED_ALPHA, state.alpha()),
            metric(names::KASMINA_SEED_STAGE, f64::from(state.stage.value())),
            metric(
                names::KASMINA_SEED_EPOCHS_IN_STAGE,
                f64::from(metrics.epochs_in_stage),
            ),
            metric(names::KASMINA_SEED_GRADIENT_NORM, metrics.gradient_norm),
            metric(
                names::KASMINA_SEED_ACCURACY_DELTA,
                metrics.improvement_since_stage_start(),
            ),
            metric(names::KASMINA_SEED_PARAMS, state.param_count as f64),
        ];
        if let Some(ratio) = metrics.gradient_ratio {
            values.push(metric(names::KASMINA_SEED_GRADIENT_RATIO, ratio));
        }
        let mut packet =
            leyline::proto::TelemetryPacket::new(&self.source, leyline::TelemetryLevel::Debug);
        for mut value in values {
            value
                .attributes
                .insert("slot_id".to_owned(), self.id().to_string());
            value
                .attributes
                .insert("seed_id".to_owned(), state.seed_id.clone());
            packet = packet.with_metric(value);
        }
        self.telemetry.emit_packet(packet);
    }

    /// Records the epoch's accuracies (percent, finite, in `[0, 100]`).
    pub fn record_accuracy(&mut self, train_accuracy: f64, val_accuracy: f64) -> Result<()> {
        let (train_accuracy, val_accuracy) = slot_checks::accuracies(train_accuracy, val_accuracy)?;
        let state = self.state_mut()?;
        state.metrics.train_accuracy = train_accuracy;
        state.metrics.val_accuracy = val_accuracy;
        Ok(())
    }

    /// Records a gradient measurement: the seed's and the host's gradient L2
    /// norms and the host's parameter count. The ratio is
    /// `(seed / host) sqrt(host_params / seed_params)`, clamped to 10, 0 when
    /// the host norm is below 1e-8 or the seed has no parameters; the stored
    /// value is an EMA (`0.9 old + 0.1 new`, the first measurement taken
    /// as is). Health is this project's summary: 0 for exploding (> 100)
    /// norms, 0.5 for vanishing (< 1e-7) ones, else 1.
    ///
    /// Norms must be finite and `>= 0`, `host_params >= 0`; anything else is
    /// refused and nothing is recorded (a NaN norm once read as the best
    /// possible ratio and opened G2). A non-finite gradient means the step
    /// diverged: that is the governor's call (reference: NaN/Inf ->
    /// `governor_nan` panic and rollback), not a gate input.
    pub fn record_gradient_norms(
        &mut self,
        seed_norm: f64,
        host_norm: f64,
        host_params: i64,
    ) -> Result<()> {
        slot_checks::gradient_measurement(seed_norm, host_norm, host_params)?;
        let state = self.state_mut()?;
        let seed_params = state.param_count;
        let ratio = if host_norm < thresholds::MIN_HOST_GRAD_NORM || seed_params <= 0 {
            0.0
        } else {
            ((seed_norm / host_norm) * (host_params as f64 / seed_params as f64).sqrt())
                .min(thresholds::MAX_GRADIENT_RATIO)
        };
        let ratio = if ratio.is_finite() { ratio } else { 0.0 };
        let decay = thresholds::GRADIENT_RATIO_EMA_DECAY;
        state.metrics.gradient_ratio = Some(match state.metrics.gradient_ratio {
            None => ratio,
            Some(previous) => decay * previous + (1.0 - decay) * ratio,
        });
        let exploding = seed_norm > GRADIENT_EXPLODING_NORM;
        let vanishing = seed_params > 0 && seed_norm < GRADIENT_VANISHING_NORM;
        state.metrics.gradient_norm = seed_norm;
        state.metrics.gradients_exploding = exploding;
        state.metrics.gradients_vanishing = vanishing;
        state.metrics.gradient_health = Some(if exploding {
            0.0
        } else if vanishing {
            0.5
        } else {
            1.0
        });
        Ok(())
    }

    /// L2 norm of the seed's current gradients (0 without gradients or seed).
    pub fn seed_gradient_norm(&self) -> Result<f64> {
        let Some(seed) = &self.seed else {
            return Ok(0.0);
        };
        let parameters: Vec<Tensor> = trainable_parameters(seed.module.var_store())
            .into_iter()
            .map(|(_, tensor)| tensor)
            .collect();
        gradient_norm(&parameters)
    }

    /// Sets the counterfactual contribution (percentage points, finite, in
    /// `[-100, 100]`) G5 reads; a refused value leaves the old one.
    pub fn set_counterfactual_contribution(&mut self, contribution: f64) -> Result<()> {
        let contribution = slot_checks::contribution(contribution)?;
        self.state_mut()?.metrics.counterfactual_contribution = Some(contribution);
        Ok(())
    }

    /// Sets the health flag G5 reads.
    pub fn set_healthy(&mut self, healthy: bool) -> Result<()> {
        self.state_mut()?.is_healthy = healthy;
        Ok(())
    }

    /// The seed's trainable parameters (module and gate), sorted by name;
    /// empty without a live seed.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.seed
            .as_ref()
            .map(|seed| trainable_parameters(seed.module.var_store()))
            .unwrap_or_default()
    }

    /// Applies one step of the seed's own SGD (created on first use with the
    /// slot's lr and momentum, dropped with the seed). No-op without a seed.
    pub fn optimizer_step(&mut self) -> Result<()> {
        let (learning_rate, momentum) = (self.config.seed_learning_rate, self.config.seed_momentum);
        let Some(seed) = self.seed.as_mut() else {
            return Ok(());
        };
        if seed.optimizer.is_none() {
            let parameters = trainable_parameters(seed.module.var_store())
                .into_iter()
                .map(|(_, tensor)| tensor)
                .collect();
            seed.optimizer = Some(Sgd::new(parameters, learning_rate, momentum)?);
        }
        match seed.optimizer.as_mut() {
            Some(optimizer) => optimizer.step(),
            None => Ok(()),
        }
    }

    /// Zeroes the seed's gradients.
    pub fn zero_grad(&mut self) -> Result<()> {
        let parameters: Vec<Tensor> = self.parameters().into_iter().map(|(_, t)| t).collect();
        zero_grads(&parameters)
    }

    /// Forgets the seed optimizer's momentum (after a rollback).
    pub fn reset_optimizer_state(&mut self) {
        if let Some(optimizer) = self.seed.as_mut().and_then(|seed| seed.optimizer.as_mut()) {
            optimizer.reset_state();
        }
    }

    /// Applies the slot to host features at its boundary.
    ///
    /// `alpha_override` (`[N, 1, 1, 1]` on CNN slots, `[N, 1, 1]` on
    /// transformer slots, or anything broadcastable) replaces the
    /// controller's alpha per sample: counterfactual evaluation, or a static
    /// device tensor for a captured graph. It bypasses the incubator, which
    /// gives the same value at alpha 0 but no seed gradient: pass `None` for
    /// TRAINING seeds while training.
    ///
    /// # Shapes
    /// `[N, C, H, W] -> [N, C, H, W]` (CNN), `[N, T, C] -> [N, T, C]`
    /// (transformer).
    pub fn forward(&self, host: &Tensor, alpha_override: Option<&Tensor>) -> Result<Tensor> {
        slot_checks::features(self.topology, &self.spec, host)?;
        if let Some(tensor) = alpha_override {
            BlendAlpha::PerSample(tensor).check(host)?;
        }
        let (Some(state), Some(seed)) = (&self.state, &self.seed) else {
            return Ok(host.shallow_clone());
        };
        if !state.stage.is_active() {
            return Ok(host.shallow_clone());
        }
        let seed_input = if state.isolate_gradients {
            host.f_detach()?.f_contiguous()?
        } else {
            host.shallow_clone()
        };
        let seed_output = seed.module.forward(&seed_input)?;
        let alpha = state.alpha.alpha();
        if alpha_override.is_none() && state.stage == SeedStage::Training && alpha == 0.0 {
            return incubator(host, &seed_output);
        }
        let blend_alpha = match alpha_override {
            Some(tensor) => BlendAlpha::PerSample(tensor),
            None => BlendAlpha::Scalar(alpha),
        };
        match (state.algorithm, &seed.gate) {
            (AlphaAlgorithm::Multiply, _) => {
                blend_multiply(host, &seed_output, &seed_input, &blend_alpha)
            }
            (AlphaAlgorithm::Gate, Some(gate)) => {
                let gate_values = gate.forward(&seed_input)?;
                blend_gate(host, &seed_output, &gate_values, &blend_alpha)
            }
            (AlphaAlgorithm::Add, _) | (AlphaAlgorithm::Gate, None) => {
                blend_add(host, &seed_output, &blend_alpha)
            }
        }
    }
}

/// L2 norm over the gradients of `parameters` (those that have one).
pub fn gradient_norm(parameters: &[Tensor]) -> Result<f64> {
    let mut squared = 0.0;
    for parameter in parameters {
        let grad = parameter.f_grad()?;
        if grad.defined() {
            let norm = grad
                .f_detach()?
                .f_to_kind(tch::Kind::Double)?
                .f_square()?
                .f_sum(tch::Kind::Double)?;
            squared += f64::try_from(&norm)?;
        }
    }
    Ok(squared.sqrt())
}
