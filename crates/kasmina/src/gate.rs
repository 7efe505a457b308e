//! Quality gates G0-G5: whether a seed may enter its next stage.
//!
//! The target stage selects the gate (`leyline::GateLevel::for_target`).
//! Checks, reference HEAD (§1.3), with thresholds from
//! `leyline::gate::thresholds` ([`GateThresholds`] lets tests shorten them):
//! - G0 (-> GERMINATED): seed id and blueprint id present.
//! - G1 (-> TRAINING): the seed is GERMINATED.
//! - G2 (-> BLENDING): strict: improvement since stage start of at least
//!   0.5 pp, at least 10 epochs in TRAINING, gradient ratio at least 0.10
//!   (unmeasured fails). Permissive: at least 10 epochs, gradients measured,
//!   not exploding, gradient health at least 0.7. Score
//!   `min(1, improvement / 5)`.
//! - G3 (-> HOLDING), both modes: alpha target >= 1 - 1e-6, controller in
//!   HOLD, |alpha - target| <= 1e-6; strict also >= 10 epochs in BLENDING.
//!   Score = alpha.
//! - G5 (-> FOSSILIZED): a counterfactual contribution exists (else
//!   `counterfactual_not_available`), the seed is healthy; strict also
//!   contribution >= 1.0 pp. Score `min(1, contribution / 10)`.
//!
//! Bad input fails closed: every numeric input a gate reads must
//! be finite, else a `<field>_finite` check fails (the slot refuses such
//! values where they enter, so this only guards hand-built [`GateInputs`]),
//! and scores are always finite and in `[0, 1]`. [`GateThresholds::validate`]
//! refuses non-finite and out-of-range thresholds.

use leyline::gate::thresholds;
use leyline::proto::GateResult;
use leyline::{AlphaMode, GateLevel, SeedStage};

use crate::Result;
use crate::validate::{finite, non_negative, unit_interval};

/// Strict (bare `QualityGates()`) or permissive (the training default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum GateMode {
    /// All checks.
    Strict,
    /// Training default: G2 on gradient health, G3 without the epoch floor,
    /// G5 without the contribution floor.
    #[default]
    Permissive,
}

/// Numeric thresholds of the gates (defaults: the reference constants).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GateThresholds {
    /// G2 strict: improvement since stage start, percentage points.
    pub min_training_improvement: f64,
    /// G2: epochs in TRAINING; G3 strict: epochs in BLENDING.
    pub min_stage_epochs: u32,
    /// G2 strict: gradient ratio floor.
    pub gradient_ratio_threshold: f64,
    /// G2 permissive: gradient health floor.
    pub min_gradient_health: f64,
    /// G5 strict: contribution floor, percentage points.
    pub min_fossilize_contribution: f64,
}

impl Default for GateThresholds {
    fn default() -> Self {
        GateThresholds {
            min_training_improvement: thresholds::MIN_TRAINING_IMPROVEMENT,
            min_stage_epochs: thresholds::MIN_BLENDING_EPOCHS,
            gradient_ratio_threshold: thresholds::GRADIENT_RATIO_THRESHOLD,
            min_gradient_health: thresholds::MIN_GRADIENT_HEALTH_FOR_BLENDING,
            min_fossilize_contribution: thresholds::MIN_FOSSILIZE_CONTRIBUTION,
        }
    }
}

impl GateThresholds {
    /// Checks every threshold: all finite; the gradient ratio threshold
    /// `>= 0`; the gradient health floor in `[0, 1]`. Any `min_stage_epochs`
    /// is allowed.
    pub fn validate(&self) -> Result<()> {
        finite(
            "GateThresholds.min_training_improvement",
            self.min_training_improvement,
        )?;
        non_negative(
            "GateThresholds.gradient_ratio_threshold",
            self.gradient_ratio_threshold,
        )?;
        unit_interval(
            "GateThresholds.min_gradient_health",
            self.min_gradient_health,
        )?;
        finite(
            "GateThresholds.min_fossilize_contribution",
            self.min_fossilize_contribution,
        )?;
        Ok(())
    }
}

/// What a gate looks at (a snapshot of the seed).
#[derive(Debug, Clone, PartialEq)]
pub struct GateInputs<'a> {
    /// Seed id.
    pub seed_id: &'a str,
    /// Blueprint id.
    pub blueprint_id: &'a str,
    /// Current stage.
    pub stage: SeedStage,
    /// Epochs in the current stage.
    pub epochs_in_stage: u32,
    /// Accuracy change since the stage started, percentage points.
    pub improvement: f64,
    /// Gradient ratio EMA, `None` when never measured.
    pub gradient_ratio: Option<f64>,
    /// Gradient health in `[0, 1]`, `None` when never measured.
    pub gradient_health: Option<f64>,
    /// Whether gradients were last seen exploding.
    pub gradients_exploding: bool,
    /// Current alpha.
    pub alpha: f64,
    /// Alpha controller target.
    pub alpha_target: f64,
    /// Alpha controller mode.
    pub alpha_mode: AlphaMode,
    /// Counterfactual contribution, percentage points, if measured.
    pub counterfactual: Option<f64>,
    /// Health flag.
    pub is_healthy: bool,
}

/// The outcome of one gate evaluation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GateOutcome {
    /// The gate.
    pub gate: GateLevel,
    /// Whether every check passed.
    pub passed: bool,
    /// Score in `[0, 1]`.
    pub score: f64,
    /// Names of the checks that passed.
    pub checks_passed: Vec<String>,
    /// Names of the checks that failed.
    pub checks_failed: Vec<String>,
    /// Human-readable summary.
    pub message: String,
}

impl GateOutcome {
    /// The leyline message (stamped with the current time).
    pub fn to_proto(&self) -> GateResult {
        GateResult {
            schema_version: leyline::SCHEMA_VERSION,
            gate: self.gate.value(),
            passed: self.passed,
            score: self.score,
            checks_passed: self.checks_passed.clone(),
            checks_failed: self.checks_failed.clone(),
            message: self.message.clone(),
            timestamp_unix_ns: unix_now_ns(),
        }
    }
}

pub(crate) fn unix_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The gate evaluator.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct QualityGates {
    /// Strict or permissive.
    pub mode: GateMode,
    /// Numeric thresholds.
    pub thresholds: GateThresholds,
}

struct Checks {
    passed: Vec<String>,
    failed: Vec<String>,
}

impl Checks {
    fn new() -> Checks {
        Checks {
            passed: Vec::new(),
            failed: Vec::new(),
        }
    }

    fn check(&mut self, ok: bool, name: &str) {
        if ok {
            self.passed.push(name.to_owned());
        } else {
            self.failed.push(name.to_owned());
        }
    }

    /// Fails `name` when `value` is present and not finite (an absent value
    /// is judged by the gate's own checks).
    fn require_finite(&mut self, value: Option<f64>, name: &str) {
        if value.is_some_and(|v| !v.is_finite()) {
            self.failed.push(name.to_owned());
        }
    }
}

/// `value` clamped to `[0, 1]`, 0 when it is not finite.
fn unit_score(value: f64) -> f64 {
    if value.is_finite() {
        value.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

impl QualityGates {
    /// Gates in `mode` with the reference thresholds.
    pub fn new(mode: GateMode) -> QualityGates {
        QualityGates {
            mode,
            thresholds: GateThresholds::default(),
        }
    }

    /// Strict gates (the reference's bare `QualityGates()`).
    pub fn strict() -> QualityGates {
        QualityGates::new(GateMode::Strict)
    }

    /// Permissive gates (the training default).
    pub fn permissive() -> QualityGates {
        QualityGates::new(GateMode::Permissive)
    }

    /// Checks the thresholds ([`GateThresholds::validate`]).
    pub fn validate(&self) -> Result<()> {
        self.thresholds.validate()
    }

    /// Evaluates `gate` on `inputs`. Non-finite inputs fail their
    /// `<field>_finite` check (see the module docs).
    pub fn evaluate(&self, gate: GateLevel, inputs: &GateInputs<'_>) -> GateOutcome {
        let strict = self.mode == GateMode::Strict;
        let limits = &self.thresholds;
        let mut checks = Checks::new();
        let score = match gate {
            GateLevel::G0 => {
                checks.check(!inputs.seed_id.is_empty(), "seed_id_present");
                checks.check(!inputs.blueprint_id.is_empty(), "blueprint_id_present");
                if checks.failed.is_empty() { 1.0 } else { 0.0 }
            }
            GateLevel::G1 => {
                let ok = inputs.stage == SeedStage::Germinated;
                checks.check(ok, "stage_is_germinated");
                if ok { 1.0 } else { 0.0 }
            }
            GateLevel::G2 => {
                checks.check(
                    inputs.epochs_in_stage >= limits.min_stage_epochs,
                    "min_training_epochs",
                );
                checks.require_finite(Some(inputs.improvement), "improvement_finite");
                checks.require_finite(inputs.gradient_ratio, "gradient_ratio_finite");
                checks.require_finite(inputs.gradient_health, "gradient_health_finite");
                if strict {
                    checks.check(
                        inputs.improvement >= limits.min_training_improvement,
                        "min_training_improvement",
                    );
                    checks.check(
                        inputs
                            .gradient_ratio
                            .is_some_and(|ratio| ratio >= limits.gradient_ratio_threshold),
                        "gradient_ratio",
                    );
                } else {
                    checks.check(inputs.gradient_health.is_some(), "gradients_measured");
                    checks.check(!inputs.gradients_exploding, "gradients_not_exploding");
                    checks.check(
                        inputs
                            .gradient_health
                            .is_some_and(|health| health >= limits.min_gradient_health),
                        "gradient_health",
                    );
                }
                unit_score(inputs.improvement / 5.0)
            }
            GateLevel::G3 => {
                let tolerance = thresholds::ALPHA_TOLERANCE;
                checks.require_finite(Some(inputs.alpha), "alpha_finite");
                checks.require_finite(Some(inputs.alpha_target), "alpha_target_finite");
                checks.check(inputs.alpha_target >= 1.0 - tolerance, "alpha_target_full");
                checks.check(inputs.alpha_mode == AlphaMode::Hold, "alpha_mode_hold");
                checks.check(
                    (inputs.alpha - inputs.alpha_target).abs() <= tolerance,
                    "alpha_reached_target",
                );
                if strict {
                    checks.check(
                        inputs.epochs_in_stage >= limits.min_stage_epochs,
                        "min_blending_epochs",
                    );
                }
                unit_score(inputs.alpha)
            }
            GateLevel::G5 => match inputs.counterfactual {
                None => {
                    checks.check(false, "counterfactual_not_available");
                    0.0
                }
                Some(contribution) => {
                    checks.check(true, "counterfactual_available");
                    checks.require_finite(Some(contribution), "counterfactual_finite");
                    checks.check(inputs.is_healthy, "seed_healthy");
                    if strict {
                        checks.check(
                            contribution >= limits.min_fossilize_contribution,
                            "min_contribution",
                        );
                    }
                    unit_score(contribution / 10.0)
                }
            },
        };
        let passed = checks.failed.is_empty();
        let message = if passed {
            format!("{gate} passed")
        } else {
            format!("{gate} failed: {}", checks.failed.join(", "))
        };
        GateOutcome {
            gate,
            passed,
            score,
            checks_passed: checks.passed,
            checks_failed: checks.failed,
            message,
        }
    }
}
