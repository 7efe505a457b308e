//! The measurements a lifecycle decides on: accuracies, gradient norms, the
//! counterfactual contribution and the health flag, each checked where it
//! is recorded.
//!
//! Every value is checked before anything is stored (finite, and within the
//! contract's ranges: accuracies in `[0, leyline::codec::MAX_ACCURACY_PERCENT]`,
//! contributions within `±leyline::codec::MAX_ABS_PERCENTAGE_POINTS`, norms
//! `>= 0`); a refused value is a typed error and the call changes nothing,
//! so no stage move is ever decided by a non-finite number.

#![warn(clippy::arithmetic_side_effects)]

use leyline::codec::{MAX_ABS_PERCENTAGE_POINTS, MAX_ACCURACY_PERCENT};
use leyline::gate::thresholds;

use super::Lifecycle;
use crate::Result;
use crate::validate::{in_range, non_negative, size_in};

/// Seed gradient norm under which gradients count as vanishing.
pub const GRADIENT_VANISHING_NORM: f64 = 1e-7;
/// Seed gradient norm over which gradients count as exploding.
pub const GRADIENT_EXPLODING_NORM: f64 = 100.0;

/// Train and validation accuracies, percent: finite and in `[0, 100]`.
pub(crate) fn accuracies(train: f64, val: f64) -> Result<(f64, f64)> {
    Ok((
        in_range("train_accuracy", train, 0.0, MAX_ACCURACY_PERCENT)?,
        in_range("val_accuracy", val, 0.0, MAX_ACCURACY_PERCENT)?,
    ))
}

/// A gradient measurement: finite, non-negative norms and a non-negative
/// host parameter count.
fn gradient_measurement(seed_norm: f64, host_norm: f64, host_params: i64) -> Result<()> {
    non_negative("seed_norm", seed_norm)?;
    non_negative("host_norm", host_norm)?;
    size_in("host_params", host_params, 0, i64::MAX)?;
    Ok(())
}

/// A counterfactual contribution, percentage points: finite and in
/// `[-100, 100]`.
fn contribution(value: f64) -> Result<f64> {
    in_range(
        "counterfactual_contribution",
        value,
        -MAX_ABS_PERCENTAGE_POINTS,
        MAX_ABS_PERCENTAGE_POINTS,
    )
}

/// A seed's parameter count at germination: `>= 0`.
pub(super) fn param_count(value: i64) -> Result<i64> {
    size_in("SeedState.param_count", value, 0, i64::MAX)
}

impl Lifecycle {
    /// Records the epoch's accuracies (percent, finite, in `[0, 100]`).
    pub fn record_accuracy(&mut self, train_accuracy: f64, val_accuracy: f64) -> Result<()> {
        let (train_accuracy, val_accuracy) = accuracies(train_accuracy, val_accuracy)?;
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
        gradient_measurement(seed_norm, host_norm, host_params)?;
        let state = self.state_mut()?;
        let seed_params = state.param_count;
        let ratio = gradient_ratio(seed_norm, seed_params, host_norm, host_params);
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

    /// Sets the counterfactual contribution (percentage points, finite, in
    /// `[-100, 100]`) G5 reads; a refused value leaves the old one.
    pub fn set_counterfactual_contribution(&mut self, contribution_points: f64) -> Result<()> {
        let value = contribution(contribution_points)?;
        self.state_mut()?.metrics.counterfactual_contribution = Some(value);
        Ok(())
    }

    /// Sets the health flag G5 reads.
    pub fn set_healthy(&mut self, healthy: bool) -> Result<()> {
        self.state_mut()?.is_healthy = healthy;
        Ok(())
    }
}

/// The gradient ratio of one measurement, before the EMA:
/// `(seed / host) sqrt(host_params / seed_params)`, clamped to
/// [`thresholds::MAX_GRADIENT_RATIO`], 0 when the host norm is below
/// [`thresholds::MIN_HOST_GRAD_NORM`], the seed has no parameters or the
/// result is not finite. The one definition: the trainer's deferred seed
/// metrics report the same quantity on epoch means.
pub fn gradient_ratio(seed_norm: f64, seed_params: i64, host_norm: f64, host_params: i64) -> f64 {
    if host_norm < thresholds::MIN_HOST_GRAD_NORM || seed_params <= 0 {
        return 0.0;
    }
    let ratio = ((seed_norm / host_norm) * (host_params as f64 / seed_params as f64).sqrt())
        .min(thresholds::MAX_GRADIENT_RATIO);
    if ratio.is_finite() { ratio } else { 0.0 }
}
