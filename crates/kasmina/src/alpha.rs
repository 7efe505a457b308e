//! The alpha controller: a scalar amplitude schedule advanced once per epoch.
//!
//! Contract (reference §2.5): [`AlphaController::retarget`] is allowed only in
//! HOLD and schedules `start -> target` over `steps` ticks along a curve;
//! `steps = 0` snaps at once. [`AlphaController::step`] advances one tick: on
//! the last tick it snaps exactly to the target and returns to HOLD; before
//! that `alpha = start + (target - start) curve(t)` with `t = done / total`,
//! clamped so it never passes the target, never goes back past the start and
//! never moves against its direction (monotone). Values live in `[0, 1]`.
//!
//! Bad input: an alpha, start or target that is non-finite or
//! outside `[0, 1]`, and a steepness that is non-finite or below
//! `MIN_SIGMOID_STEEPNESS`, are refused with [`Error::NonFinite`] /
//! [`Error::OutOfRange`] and leave the controller unchanged. (The reference
//! clamps alpha into `[0, 1]`, which turns a NaN target into 0, a scheduled
//! prune; this crate refuses instead.) Deserialised controllers (checkpoints)
//! are checked the same way.

use leyline::alpha::{DEFAULT_SIGMOID_STEEPNESS, MIN_SIGMOID_STEEPNESS};
use leyline::{AlphaCurve, AlphaMode};

use crate::validate::{finite, in_range, unit_interval};
use crate::{Error, Result};

/// Progress `curve(t)` in `[0, 1]` for `t` in `[0, 1]` (clamped).
///
/// Linear `t`; cosine `(1 - cos(pi t)) / 2`; sigmoid the logistic curve of
/// steepness `k` rescaled so that `curve(0) = 0` and `curve(1) = 1`. A
/// non-finite `t`, or a steepness that is non-finite or below
/// `MIN_SIGMOID_STEEPNESS`, is an error.
pub fn curve_progress(t: f64, curve: AlphaCurve, steepness: f64) -> Result<f64> {
    let t = finite("curve_progress.t", t)?;
    let steepness = check_steepness("curve_progress.steepness", steepness)?;
    Ok(progress(t, curve, steepness))
}

/// `steepness` if it is finite and at least `MIN_SIGMOID_STEEPNESS`.
pub(crate) fn check_steepness(field: &'static str, steepness: f64) -> Result<f64> {
    in_range(field, steepness, MIN_SIGMOID_STEEPNESS, f64::MAX)
}

/// [`curve_progress`] on values already checked (finite `t`, valid `k`).
fn progress(t: f64, curve: AlphaCurve, steepness: f64) -> f64 {
    let t = t.clamp(0.0, 1.0);
    match curve {
        AlphaCurve::Linear => t,
        AlphaCurve::Cosine => 0.5 * (1.0 - (std::f64::consts::PI * t).cos()),
        AlphaCurve::Sigmoid => {
            let k = steepness;
            let logistic = |x: f64| 1.0 / (1.0 + (-k * (x - 0.5)).exp());
            let (low, high) = (logistic(0.0), logistic(1.0));
            let value = (logistic(t) - low) / (high - low);
            if high > low && value.is_finite() {
                value.clamp(0.0, 1.0)
            } else {
                t
            }
        }
    }
}

/// The schedule state (serialisable for checkpoints; a round trip reproduces
/// the same trajectory).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "AlphaControllerRecord")]
pub struct AlphaController {
    alpha: f64,
    alpha_start: f64,
    alpha_target: f64,
    mode: AlphaMode,
    curve: AlphaCurve,
    steepness: f64,
    steps_total: u32,
    steps_done: u32,
}

/// The serialised fields, checked by `TryFrom` before they become a
/// controller.
#[derive(serde::Deserialize)]
struct AlphaControllerRecord {
    alpha: f64,
    alpha_start: f64,
    alpha_target: f64,
    mode: AlphaMode,
    curve: AlphaCurve,
    steepness: f64,
    steps_total: u32,
    steps_done: u32,
}

impl TryFrom<AlphaControllerRecord> for AlphaController {
    type Error = Error;

    fn try_from(record: AlphaControllerRecord) -> Result<AlphaController> {
        unit_interval("AlphaController.alpha", record.alpha)?;
        unit_interval("AlphaController.alpha_start", record.alpha_start)?;
        unit_interval("AlphaController.alpha_target", record.alpha_target)?;
        check_steepness("AlphaController.steepness", record.steepness)?;
        crate::validate::size_in(
            "AlphaController.steps_done",
            record.steps_done,
            0,
            record.steps_total,
        )?;
        Ok(AlphaController {
            alpha: record.alpha,
            alpha_start: record.alpha_start,
            alpha_target: record.alpha_target,
            mode: record.mode,
            curve: record.curve,
            steepness: record.steepness,
            steps_total: record.steps_total,
            steps_done: record.steps_done,
        })
    }
}

impl Default for AlphaController {
    /// Holding at alpha 0, linear curve.
    fn default() -> Self {
        AlphaController::holding(0.0)
    }
}

impl AlphaController {
    /// A controller holding at `alpha` (finite, in `[0, 1]`), linear curve.
    pub fn new(alpha: f64) -> Result<AlphaController> {
        let alpha = unit_interval("AlphaController.alpha", alpha)?;
        Ok(AlphaController::holding(alpha))
    }

    /// A controller holding at an alpha already known to be in `[0, 1]`.
    fn holding(alpha: f64) -> AlphaController {
        AlphaController {
            alpha,
            alpha_start: alpha,
            alpha_target: alpha,
            mode: AlphaMode::Hold,
            curve: AlphaCurve::Linear,
            steepness: DEFAULT_SIGMOID_STEEPNESS,
            steps_total: 0,
            steps_done: 0,
        }
    }

    /// Current amplitude.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Amplitude at the start of the current schedule.
    pub fn alpha_start(&self) -> f64 {
        self.alpha_start
    }

    /// Amplitude the schedule is heading to.
    pub fn alpha_target(&self) -> f64 {
        self.alpha_target
    }

    /// HOLD, UP or DOWN.
    pub fn mode(&self) -> AlphaMode {
        self.mode
    }

    /// Schedule curve.
    pub fn curve(&self) -> AlphaCurve {
        self.curve
    }

    /// Sigmoid steepness.
    pub fn steepness(&self) -> f64 {
        self.steepness
    }

    /// Ticks in the current schedule.
    pub fn steps_total(&self) -> u32 {
        self.steps_total
    }

    /// Ticks done in the current schedule.
    pub fn steps_done(&self) -> u32 {
        self.steps_done
    }

    /// Snaps to `alpha` (finite, in `[0, 1]`) and holds there; a refused
    /// value changes nothing.
    pub fn set_alpha(&mut self, alpha: f64) -> Result<()> {
        let alpha = unit_interval("alpha", alpha)?;
        self.snap(alpha);
        Ok(())
    }

    /// Snaps to an alpha already known to be in `[0, 1]`.
    pub(crate) fn snap(&mut self, alpha: f64) {
        self.alpha = alpha;
        self.alpha_start = alpha;
        self.alpha_target = alpha;
        self.mode = AlphaMode::Hold;
        self.steps_total = 0;
        self.steps_done = 0;
    }

    /// Schedules `alpha -> target` over `steps` ticks. Only allowed from
    /// HOLD ([`Error::AlphaNotHold`] otherwise). `curve` and `steepness`
    /// replace the current ones when given. `target` must be finite and in
    /// `[0, 1]`, `steepness` finite and at least `MIN_SIGMOID_STEEPNESS`
    /// (0.1); a refused call changes nothing.
    pub fn retarget(
        &mut self,
        target: f64,
        steps: u32,
        curve: Option<AlphaCurve>,
        steepness: Option<f64>,
    ) -> Result<()> {
        if self.mode != AlphaMode::Hold {
            return Err(Error::AlphaNotHold { mode: self.mode });
        }
        let target = unit_interval("alpha_target", target)?;
        let steepness = steepness
            .map(|k| check_steepness("steepness", k))
            .transpose()?;
        if let Some(curve) = curve {
            self.curve = curve;
        }
        if let Some(steepness) = steepness {
            self.steepness = steepness;
        }
        self.alpha_start = self.alpha;
        self.alpha_target = target;
        self.steps_total = steps;
        self.steps_done = 0;
        self.mode = if target > self.alpha {
            AlphaMode::Up
        } else if target < self.alpha {
            AlphaMode::Down
        } else {
            AlphaMode::Hold
        };
        if steps == 0 || self.mode == AlphaMode::Hold {
            self.alpha = target;
            self.mode = AlphaMode::Hold;
        }
        Ok(())
    }

    /// Advances one tick. Returns `true` when this tick reached the target
    /// (snap applied, mode back to HOLD); `false` otherwise, including in HOLD.
    pub fn step(&mut self) -> bool {
        if self.mode == AlphaMode::Hold || self.steps_total == 0 {
            return false;
        }
        self.steps_done = self.steps_done.saturating_add(1);
        if self.steps_done >= self.steps_total {
            self.steps_done = self.steps_total;
            self.alpha = self.alpha_target;
            self.mode = AlphaMode::Hold;
            return true;
        }
        let t = f64::from(self.steps_done) / f64::from(self.steps_total);
        let progress = progress(t, self.curve, self.steepness);
        // start, target and progress are in [0, 1]: the value is too.
        let value =
            (self.alpha_start + (self.alpha_target - self.alpha_start) * progress).clamp(0.0, 1.0);
        let previous = self.alpha;
        self.alpha = match self.mode {
            AlphaMode::Up => value.max(previous).min(self.alpha_target),
            AlphaMode::Down => value.min(previous).max(self.alpha_target),
            AlphaMode::Hold => previous,
        };
        false
    }

    /// Whether the controller holds at its target.
    pub fn is_settled(&self) -> bool {
        self.mode == AlphaMode::Hold
            && (self.alpha - self.alpha_target).abs() <= leyline::gate::thresholds::ALPHA_TOLERANCE
    }
}
