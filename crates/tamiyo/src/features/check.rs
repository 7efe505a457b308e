//! [`check_observation`]: every number of a Tolaria
//! [`EpochObservation`] checked before a controller or the tracker reads
//! it.
//!
//! `EpochObservation`'s fields are public, so an observation need not have
//! passed `EpochObservation::new`; and its seed states are Kasmina's
//! exports, whose numbers leyline's contract bounds. Every controller of
//! this crate (the policy controller through its
//! [`super::ObservationTracker`], the heuristic, the max-growth ceiling)
//! calls this first and changes nothing when it fails: no decision is ever
//! taken on a NaN or an infinity. The ranges are leyline's
//! ([`leyline::codec::MAX_ACCURACY_PERCENT`],
//! [`leyline::codec::MAX_ABS_PERCENTAGE_POINTS`],
//! [`leyline::gate::thresholds::MAX_GRADIENT_RATIO`]); contract enum values
//! (stage, alpha mode) are left to the readers that need them.

use leyline::codec::{MAX_ABS_PERCENTAGE_POINTS, MAX_ACCURACY_PERCENT};
use leyline::gate::thresholds::MAX_GRADIENT_RATIO;
use leyline::proto::SeedState;
use tolaria::controller::EpochObservation;

use crate::Result;
use crate::error::{finite, in_range};

/// Checks the observation's numbers: losses finite, accuracies in
/// `[0, 100]`, and for every seed state alpha and alpha target in `[0, 1]`,
/// accuracies in `[0, 100]`, the improvement and the counterfactual
/// contribution within ±100 percentage points, the gradient norm finite and
/// ≥ 0, the gradient ratio in `[0, MAX_GRADIENT_RATIO]`.
/// [`crate::Error::NonFinite`] names a NaN or infinite field (e.g.
/// `seed.metrics.counterfactual_contribution`),
/// [`crate::Error::InvalidInput`] a finite one out of range.
pub fn check_observation(observation: &EpochObservation) -> Result<()> {
    let metrics = &observation.metrics;
    finite("observation.train_loss", metrics.train_loss)?;
    finite("observation.val_loss", metrics.val_loss)?;
    in_range(
        "observation.train_accuracy",
        metrics.train_accuracy,
        0.0,
        MAX_ACCURACY_PERCENT,
    )?;
    in_range(
        "observation.val_accuracy",
        metrics.val_accuracy,
        0.0,
        MAX_ACCURACY_PERCENT,
    )?;
    observation.seeds.iter().try_for_each(check_seed)
}

/// The numbers of one seed state (see [`check_observation`]).
pub fn check_seed(seed: &SeedState) -> Result<()> {
    in_range("seed.alpha", seed.alpha, 0.0, 1.0)?;
    in_range("seed.alpha_target", seed.alpha_target, 0.0, 1.0)?;
    let Some(metrics) = seed.metrics.as_ref() else {
        return Ok(());
    };
    for (field, value) in [
        ("seed.metrics.train_accuracy", metrics.train_accuracy),
        ("seed.metrics.val_accuracy", metrics.val_accuracy),
        (
            "seed.metrics.accuracy_at_stage_start",
            metrics.accuracy_at_stage_start,
        ),
    ] {
        in_range(field, value, 0.0, MAX_ACCURACY_PERCENT)?;
    }
    let points = MAX_ABS_PERCENTAGE_POINTS;
    in_range(
        "seed.metrics.improvement_since_stage_start",
        metrics.improvement_since_stage_start,
        -points,
        points,
    )?;
    in_range(
        "seed.metrics.gradient_norm",
        metrics.gradient_norm,
        0.0,
        f64::MAX,
    )?;
    if let Some(ratio) = metrics.gradient_ratio {
        in_range(
            "seed.metrics.gradient_ratio",
            ratio,
            0.0,
            MAX_GRADIENT_RATIO,
        )?;
    }
    if let Some(contribution) = metrics.counterfactual_contribution {
        in_range(
            "seed.metrics.counterfactual_contribution",
            contribution,
            -points,
            points,
        )?;
    }
    Ok(())
}
