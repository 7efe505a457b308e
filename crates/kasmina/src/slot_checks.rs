//! Checks of what enters a seed slot: its configuration, its injection spec,
//! the germination options and the measurements recorded on it.
//!
//! Kept apart from [`crate::slot`] so that the slot's lifecycle code stays
//! readable; every check here runs once, where the value enters (slot
//! construction, germination, the `record_*` / `set_*` calls), never inside
//! the forward pass. Bounds come from [`crate::validate`].

#![warn(clippy::arithmetic_side_effects)]

use crate::Result;
use crate::alpha::check_steepness;
use crate::host::{InjectionSpec, Topology};
use crate::slot::{GerminationOptions, SlotConfig, TRANSFORMER_PROBE_TOKENS};
use crate::validate::{
    MAX_ACCURACY_PERCENT, MAX_CHANNELS, MAX_CONTRIBUTION_POINTS, MAX_LEARNING_RATE,
    MAX_PROBE_ELEMENTS, MAX_SPATIAL, checked_product, in_range, non_negative, positive_at_most,
    shape, size_in, unit_interval,
};
use tch::Tensor;

impl SlotConfig {
    /// Checks the configuration: the gate thresholds
    /// ([`crate::gate::GateThresholds::validate`]), a seed learning rate that
    /// is finite and in `(0, MAX_LEARNING_RATE]`, a seed momentum that is
    /// finite and in `[0, 1]`. Every `embargo_epochs` is allowed.
    pub fn validate(&self) -> Result<()> {
        self.gates.validate()?;
        positive_at_most(
            "SlotConfig.seed_learning_rate",
            self.seed_learning_rate,
            MAX_LEARNING_RATE,
        )?;
        in_range("SlotConfig.seed_momentum", self.seed_momentum, 0.0, 1.0)?;
        Ok(())
    }
}

impl GerminationOptions {
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

impl InjectionSpec {
    /// Checks the spec for a slot of `topology`: channels in
    /// `[1, MAX_CHANNELS]`, both spatial sides in `[1, MAX_SPATIAL]`, and a
    /// germination probe (`[1, C, H, W]` or `[2, 8, C]`) of at most
    /// `MAX_PROBE_ELEMENTS` elements. Returns the probe shape.
    pub fn validate(&self, topology: Topology) -> Result<Vec<i64>> {
        let channels = size_in("InjectionSpec.channels", self.channels, 1, MAX_CHANNELS)?;
        let (height, width) = self.spatial;
        size_in("InjectionSpec.spatial.0", height, 1, MAX_SPATIAL)?;
        size_in("InjectionSpec.spatial.1", width, 1, MAX_SPATIAL)?;
        let probe = match topology {
            Topology::Cnn => vec![1, channels, height, width],
            Topology::Transformer => vec![2, TRANSFORMER_PROBE_TOKENS, channels],
        };
        checked_product("InjectionSpec (probe elements)", &probe, MAX_PROBE_ELEMENTS)?;
        Ok(probe)
    }
}

/// Host features at a slot: `[N, C, H, W]` (CNN) or `[N, T, C]`
/// (transformer) with the slot's `C`.
pub(crate) fn features(topology: Topology, spec: &InjectionSpec, host: &Tensor) -> Result<()> {
    let c = spec.channels;
    let expected = match topology {
        Topology::Cnn => vec![-1, c, -1, -1],
        Topology::Transformer => vec![-1, -1, c],
    };
    shape("slot forward (host features)", &host.size(), &expected)
}

/// Train and validation accuracies, percent: finite and in `[0, 100]`.
pub(crate) fn accuracies(train: f64, val: f64) -> Result<(f64, f64)> {
    Ok((
        in_range("train_accuracy", train, 0.0, MAX_ACCURACY_PERCENT)?,
        in_range("val_accuracy", val, 0.0, MAX_ACCURACY_PERCENT)?,
    ))
}

/// A gradient measurement: finite, non-negative norms and a non-negative
/// host parameter count.
pub(crate) fn gradient_measurement(seed_norm: f64, host_norm: f64, host_params: i64) -> Result<()> {
    non_negative("seed_norm", seed_norm)?;
    non_negative("host_norm", host_norm)?;
    size_in("host_params", host_params, 0, i64::MAX)?;
    Ok(())
}

/// A counterfactual contribution, percentage points: finite and in
/// `[-100, 100]`.
pub(crate) fn contribution(value: f64) -> Result<f64> {
    in_range(
        "counterfactual_contribution",
        value,
        -MAX_CONTRIBUTION_POINTS,
        MAX_CONTRIBUTION_POINTS,
    )
}

/// A seed's parameter count at germination: `>= 0`.
pub(crate) fn param_count(value: i64) -> Result<i64> {
    size_in("SeedState.param_count", value, 0, i64::MAX)
}
