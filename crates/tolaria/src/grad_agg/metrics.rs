//! The epoch statistics of gradient aggregation: the device accumulator's
//! fields, their one readback per epoch and the `tolaria.grad_agg.*`
//! telemetry.

use leyline::metric;
use leyline::proto::TelemetryMetric;
use leyline::telemetry as names;

use crate::error::{Error, Result};

/// Accumulator fields, in order.
pub(super) const STEPS: i64 = 0;
pub(super) const PASS_THROUGH: i64 = 1;
pub(super) const SINGLE_SEED: i64 = 2;
pub(super) const GENERAL: i64 = 3;
pub(super) const PAIRS: i64 = 4;
pub(super) const CONFLICTS: i64 = 5;
pub(super) const PROJECTIONS: i64 = 6;
pub(super) const SHARE: i64 = 7;
pub(super) const FIELDS: i64 = 8;
/// Largest count an `f64` accumulator holds exactly.
pub(super) const MAX_EXACT_COUNT: f64 = 9_007_199_254_740_992.0;

/// One epoch of aggregation statistics, read back by
/// [`super::GradAggregator::take_epoch_metrics`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradAggMetrics {
    /// Steps aggregated.
    pub steps: u64,
    /// Steps that passed the teacher gradient through (no seed).
    pub pass_through_steps: u64,
    /// Steps on the single-seed fast path.
    pub single_seed_steps: u64,
    /// Steps on the general (PCGrad) path.
    pub pcgrad_steps: u64,
    /// Seed pairs compared, summed over the epoch's steps.
    pub seed_pairs: u64,
    /// Seed pairs whose original gradients conflicted (negative dot product).
    pub conflicts: u64,
    /// Projections applied (ordered pairs `(i, j)` where `g_i'` was
    /// projected off `g_j`).
    pub projections: u64,
    /// `conflicts / seed_pairs`, 0 without pairs.
    pub conflict_ratio: f64,
    /// Mean teacher share over the epoch's steps, 0 without steps.
    pub teacher_share: f64,
    /// Elements in the current flattened layout (0 before the first step).
    pub flat_params: u64,
}

impl GradAggMetrics {
    /// The epoch's `tolaria.grad_agg.*` metrics (conflicts, projections,
    /// conflict ratio, teacher share, flattened parameters).
    pub fn telemetry(&self) -> Vec<TelemetryMetric> {
        vec![
            metric(names::TOLARIA_GRAD_AGG_CONFLICTS, self.conflicts as f64),
            metric(names::TOLARIA_GRAD_AGG_PROJECTIONS, self.projections as f64),
            metric(names::TOLARIA_GRAD_AGG_CONFLICT_RATIO, self.conflict_ratio),
            metric(names::TOLARIA_GRAD_AGG_TEACHER_SHARE, self.teacher_share),
            metric(names::TOLARIA_GRAD_AGG_FLAT_PARAMS, self.flat_params as f64),
        ]
    }

    /// The metrics from the accumulator's values read back (`values` in
    /// field order) and the current layout's element count. A non-finite or
    /// impossible value is [`Error::InvalidMetric`].
    pub(super) fn from_accumulator(values: &[f64], flat_params: u64) -> Result<Self> {
        let field = |index: i64| {
            usize::try_from(index)
                .ok()
                .and_then(|index| values.get(index))
                .copied()
                .unwrap_or(f64::NAN)
        };
        let count = |index: i64, what: &'static str| -> Result<u64> {
            let value = field(index);
            if (0.0..=MAX_EXACT_COUNT).contains(&value) && value.fract() == 0.0 {
                Ok(value as u64)
            } else {
                Err(Error::InvalidMetric { what, value })
            }
        };
        let steps = count(STEPS, "aggregated steps")?;
        let seed_pairs = count(PAIRS, "seed pairs")?;
        let conflicts = count(CONFLICTS, names::TOLARIA_GRAD_AGG_CONFLICTS)?;
        let share_sum = field(SHARE);
        if !share_sum.is_finite() || share_sum < 0.0 || share_sum > steps as f64 + 1e-6 {
            return Err(Error::InvalidMetric {
                what: names::TOLARIA_GRAD_AGG_TEACHER_SHARE,
                value: share_sum,
            });
        }
        if conflicts > seed_pairs {
            return Err(Error::InvalidMetric {
                what: names::TOLARIA_GRAD_AGG_CONFLICTS,
                value: conflicts as f64,
            });
        }
        Ok(Self {
            steps,
            pass_through_steps: count(PASS_THROUGH, "pass-through steps")?,
            single_seed_steps: count(SINGLE_SEED, "single-seed steps")?,
            pcgrad_steps: count(GENERAL, "PCGrad steps")?,
            seed_pairs,
            conflicts,
            projections: count(PROJECTIONS, names::TOLARIA_GRAD_AGG_PROJECTIONS)?,
            conflict_ratio: if seed_pairs == 0 {
                0.0
            } else {
                conflicts as f64 / seed_pairs as f64
            },
            teacher_share: if steps == 0 {
                0.0
            } else {
                (share_sum / steps as f64).min(1.0)
            },
            flat_params,
        })
    }
}
