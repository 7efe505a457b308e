//! The lifecycle state of one seed: stage, transition history, alpha
//! controller, blend settings and measured metrics. Plain data, no tensors.
//!
//! [`SeedState::transition`] is the one place a stage changes; it asks
//! leyline's transition table first (`leyline::stage::validate_transition`),
//! so a state can only ever walk a path of that table.
//!
//! A state serialises (serde) whole, for checkpoints; deserialising checks
//! every field as the recording calls would ([`SeedState`]'s `TryFrom`
//! record), so a damaged or edited checkpoint cannot put an impossible
//! state into a slot.

use std::collections::VecDeque;

use leyline::gate::thresholds;
use leyline::{AlphaAlgorithm, AlphaCurve, SeedStage};

use super::config::GerminationOptions;
use super::measure;
use crate::Result;
use crate::alpha::AlphaController;
use crate::blueprint::Blueprint;
use crate::gate::GateInputs;

/// One completed transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageRecord {
    /// Stage left.
    pub from: SeedStage,
    /// Stage entered.
    pub to: SeedStage,
    /// Epochs spent in `from`.
    pub epochs_in_from: u32,
}

/// Measured quantities of a seed.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "SeedStateRecord")]
pub struct SeedState {
    pub(super) seed_id: String,
    pub(super) blueprint: Blueprint,
    pub(super) stage: SeedStage,
    pub(super) previous_stage: SeedStage,
    pub(super) epochs_in_previous_stage: u32,
    pub(super) history: VecDeque<StageRecord>,
    pub(super) alpha: AlphaController,
    pub(super) algorithm: AlphaAlgorithm,
    pub(super) blend_curve: AlphaCurve,
    pub(super) blend_steepness: f64,
    pub(super) tempo_epochs: u32,
    pub(super) blend_alpha_target: f64,
    pub(super) isolate_gradients: bool,
    pub(super) blend_out_freeze: bool,
    pub(super) is_healthy: bool,
    pub(super) metrics: SeedMetrics,
    pub(super) cooldown_epochs: u32,
    pub(super) prune_reason: Option<String>,
    pub(super) param_count: i64,
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
        let param_count = measure::param_count(param_count)?;
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
    pub fn transition(&mut self, to: SeedStage) -> std::result::Result<(), leyline::Error> {
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

    /// Whether the seed's module should exist: a state in GERMINATED
    /// through FOSSILIZED. PRUNED, EMBARGOED and RESETTING keep the state
    /// for the cooldown but free the module (reference §1.4).
    pub fn holds_module(&self) -> bool {
        !self.stage.is_failure() && !matches!(self.stage, SeedStage::Dormant | SeedStage::Unknown)
    }

    pub(super) fn gate_inputs(&self) -> GateInputs<'_> {
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

/// The serialised fields of a [`SeedState`], checked by `TryFrom` before
/// they become a state.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedStateRecord {
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

/// Checks `metrics` as the recording calls do.
fn check_metrics(metrics: &SeedMetrics) -> Result<()> {
    use crate::validate::{in_range, non_negative, unit_interval};
    use leyline::codec::{MAX_ABS_PERCENTAGE_POINTS, MAX_ACCURACY_PERCENT};
    measure::accuracies(metrics.train_accuracy, metrics.val_accuracy)?;
    in_range(
        "SeedMetrics.accuracy_at_stage_start",
        metrics.accuracy_at_stage_start,
        0.0,
        MAX_ACCURACY_PERCENT,
    )?;
    if let Some(value) = metrics.accuracy_at_blending_start {
        in_range(
            "SeedMetrics.accuracy_at_blending_start",
            value,
            0.0,
            MAX_ACCURACY_PERCENT,
        )?;
    }
    non_negative("SeedMetrics.gradient_norm", metrics.gradient_norm)?;
    if let Some(value) = metrics.gradient_ratio {
        non_negative("SeedMetrics.gradient_ratio", value)?;
    }
    if let Some(value) = metrics.gradient_health {
        unit_interval("SeedMetrics.gradient_health", value)?;
    }
    if let Some(value) = metrics.counterfactual_contribution {
        in_range(
            "SeedMetrics.counterfactual_contribution",
            value,
            -MAX_ABS_PERCENTAGE_POINTS,
            MAX_ABS_PERCENTAGE_POINTS,
        )?;
    }
    Ok(())
}

impl TryFrom<SeedStateRecord> for SeedState {
    type Error = crate::Error;

    fn try_from(record: SeedStateRecord) -> Result<SeedState> {
        crate::validate::size_in(
            "SeedState.history",
            record.history.len(),
            0,
            thresholds::STAGE_HISTORY_LEN,
        )?;
        if record.seed_id.is_empty() {
            return Err(crate::Error::OutOfRange {
                field: "SeedState.seed_id",
                value: "\"\"".to_owned(),
                allowed: "a non-empty id".to_owned(),
            });
        }
        crate::alpha::check_steepness("SeedState.blend_steepness", record.blend_steepness)?;
        crate::validate::unit_interval("SeedState.blend_alpha_target", record.blend_alpha_target)?;
        check_metrics(&record.metrics)?;
        let param_count = measure::param_count(record.param_count)?;
        Ok(SeedState {
            seed_id: record.seed_id,
            blueprint: record.blueprint,
            stage: record.stage,
            previous_stage: record.previous_stage,
            epochs_in_previous_stage: record.epochs_in_previous_stage,
            history: record.history,
            alpha: record.alpha,
            algorithm: record.algorithm,
            blend_curve: record.blend_curve,
            blend_steepness: record.blend_steepness,
            tempo_epochs: record.tempo_epochs,
            blend_alpha_target: record.blend_alpha_target,
            isolate_gradients: record.isolate_gradients,
            blend_out_freeze: record.blend_out_freeze,
            is_healthy: record.is_healthy,
            metrics: record.metrics,
            cooldown_epochs: record.cooldown_epochs,
            prune_reason: record.prune_reason,
            param_count,
        })
    }
}
