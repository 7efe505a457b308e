//! The epoch's reduced seed metrics and the reduction of the readback (see
//! the parent module's docs for the definitions).

use kasmina::groups::GroupKey;
use kasmina::lifecycle::measure::{
    GRADIENT_EXPLODING_NORM, GRADIENT_VANISHING_NORM, gradient_ratio,
};
use leyline::codec::Contract;
use leyline::proto::SeedMetricSet;

use super::{GroupAccumulator, metrics_error};
use crate::error::Result;

/// One group's metrics for an epoch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupGradientMetrics {
    /// The group.
    pub key: GroupKey,
    /// Observed steps of this group this epoch.
    pub samples: u64,
    /// Elements over the group's tensors.
    pub param_count: i64,
    /// Mean over observed steps of the group's gradient L2 norm; `None`
    /// without a sample.
    pub gradient_norm: Option<f64>,
    /// `sqrt(mean over observed steps of the squared group norm)`; `None`
    /// without a sample.
    pub rms_gradient_norm: Option<f64>,
    /// `(tensor name, mean gradient L2 norm)` per tensor, in layout order;
    /// empty without a sample.
    pub layers: Vec<(String, f64)>,
}

/// One seed's metrics for an epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedGradientMetrics {
    /// The seed's group.
    pub group: GroupGradientMetrics,
    /// The epoch's gradient ratio against the host (Kasmina's formula on the
    /// epoch means); `None` when the seed or the host has no sample.
    pub gradient_ratio: Option<f64>,
    /// The gradient fields as a validated leyline message; `None` when the
    /// seed or the host has no sample.
    pub metric_set: Option<SeedMetricSet>,
    /// `(seed_norm, host_norm, host_params)` for Kasmina's
    /// `record_gradient_norms`; `None` when there is nothing to record.
    host: Option<(f64, i64)>,
}

impl SeedGradientMetrics {
    /// The arguments of Kasmina's `record_gradient_norms(seed_norm,
    /// host_norm, host_params)` for this seed, `None` when the seed or the
    /// host had no observed step.
    pub fn record_arguments(&self) -> Option<(f64, f64, i64)> {
        let seed_norm = self.group.gradient_norm?;
        let (host_norm, host_params) = self.host?;
        Some((seed_norm, host_norm, host_params))
    }
}

/// The epoch's reduced gradient metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochSeedMetrics {
    /// The stride the epoch was observed with.
    pub stride: u64,
    /// The host's metrics, if the layout holds the host.
    pub host: Option<GroupGradientMetrics>,
    /// Each seed's, in layout order.
    pub seeds: Vec<SeedGradientMetrics>,
}

impl EpochSeedMetrics {
    /// The metrics of the seed group `key`, if it was held this epoch.
    pub fn seed(&self, key: GroupKey) -> Option<&SeedGradientMetrics> {
        self.seeds.iter().find(|seed| seed.group.key == key)
    }
}

/// One group's slice of the readback: `[layer sums.., norm sum, squared sum,
/// samples]`.
pub(super) fn reduce(group: &GroupAccumulator, values: &[f64]) -> Result<GroupGradientMetrics> {
    let key = group.key;
    if let Some(bad) = values.iter().find(|value| !value.is_finite()) {
        return Err(metrics_error(
            "gradient_norm",
            format!("group {key}: accumulated gradient norm is {bad}, not finite"),
        ));
    }
    let (layers, tail) = values
        .split_at_checked(group.shapes.len())
        .ok_or_else(|| metrics_error("readback", format!("group {key}: short readback")))?;
    let [norm_sum, squared_sum, samples] = tail else {
        return Err(metrics_error(
            "readback",
            format!("group {key}: {} tail values", tail.len()),
        ));
    };
    let samples = *samples;
    if samples < 0.0 || samples.fract() != 0.0 || samples > 2f64.powi(53) {
        return Err(metrics_error(
            "samples",
            format!("group {key}: sample count {samples} is not a count"),
        ));
    }
    let mut metrics = GroupGradientMetrics {
        key,
        // In [0, 2^53] and integral: exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        samples: samples as u64,
        param_count: group.param_count,
        gradient_norm: None,
        rms_gradient_norm: None,
        layers: Vec::new(),
    };
    if samples > 0.0 {
        metrics.gradient_norm = Some(norm_sum / samples);
        metrics.rms_gradient_norm = Some((squared_sum / samples).sqrt());
        metrics.layers = group
            .names
            .iter()
            .zip(layers)
            .map(|(name, sum)| (name.clone(), sum / samples))
            .collect();
    }
    Ok(metrics)
}

pub(super) fn seed_metrics(
    group: GroupGradientMetrics,
    host: Option<(f64, i64)>,
) -> Result<SeedGradientMetrics> {
    let (Some(seed_norm), Some((host_norm, host_params))) = (group.gradient_norm, host) else {
        return Ok(SeedGradientMetrics {
            group,
            gradient_ratio: None,
            metric_set: None,
            host: None,
        });
    };
    let ratio = gradient_ratio(seed_norm, group.param_count, host_norm, host_params);
    let metric_set = SeedMetricSet {
        schema_version: leyline::SCHEMA_VERSION,
        gradient_norm: seed_norm,
        gradient_ratio: Some(ratio),
        param_count: u64::try_from(group.param_count).unwrap_or(0),
        gradients_vanishing: group.param_count > 0 && seed_norm < GRADIENT_VANISHING_NORM,
        gradients_exploding: seed_norm > GRADIENT_EXPLODING_NORM,
        ..SeedMetricSet::default()
    };
    metric_set
        .validate()
        .map_err(|error| metrics_error("SeedMetricSet", format!("group {}: {error}", group.key)))?;
    Ok(SeedGradientMetrics {
        group,
        gradient_ratio: Some(ratio),
        metric_set: Some(metric_set),
        host: Some((host_norm, host_params)),
    })
}
