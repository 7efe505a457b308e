//! What drives a slot's lifecycle: the slot configuration (gates,
//! auto-forward flags, embargo length), the germination options (the style,
//! tempo and alpha-target heads), and who asked for a prune.
//!
//! Both configurations are checked where they enter ([`SlotConfig::validate`]
//! when a slot or model is built, [`GerminationOptions::validate`] at
//! germination). The optimizer settings of a seed (learning rate, momentum)
//! are not here: the trainer owns every optimizer (`tolaria::optim`).

use leyline::gate::thresholds;
use leyline::{AlphaAlgorithm, AlphaCurve, GerminationStyle, TempoAction};

use crate::Result;
use crate::alpha::check_steepness;
use crate::gate::QualityGates;
use crate::validate::unit_interval;

/// Default blend tempo (epochs), the reference's STANDARD.
pub const DEFAULT_TEMPO_EPOCHS: u32 = 5;

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
            embargo_epochs: thresholds::EMBARGO_EPOCHS_AFTER_PRUNE,
        }
    }
}

impl SlotConfig {
    /// Checks the configuration: the gate thresholds
    /// ([`crate::gate::GateThresholds::validate`]). Every `embargo_epochs`
    /// is allowed.
    pub fn validate(&self) -> Result<()> {
        self.gates.validate()
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

    /// Checks the options: `alpha_target` finite and in `[0, 1]` (a NaN
    /// target would otherwise read as 0 and prune the seed at the end of
    /// blending), `blend_steepness` finite and at least
    /// `MIN_SIGMOID_STEEPNESS`. The seed id is judged by G0.
    pub fn validate(&self) -> Result<()> {
        unit_interval("GerminationOptions.alpha_target", self.alpha_target)?;
        check_steepness("GerminationOptions.blend_steepness", self.blend_steepness)?;
        Ok(())
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

/// What a scheduled prune did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneSchedule {
    /// Pruned at once (no ramp possible or asked for).
    PrunedNow,
    /// Alpha ramps down; the slot prunes when it reaches 0.
    Scheduled,
    /// Nothing done (FOSSILIZED, or already in a failure stage).
    Refused,
}
