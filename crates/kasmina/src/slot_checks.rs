//! Checks of what enters a seed slot's tensor side: its injection spec and
//! the host features it is applied to.
//!
//! Kept apart from [`crate::slot`] so that the slot's code stays readable;
//! every check here runs once, where the value enters (slot construction,
//! the forward call's shape check), never per element. The lifecycle's
//! configuration, germination options and measurements are checked in
//! [`crate::lifecycle`]. Bounds come from [`crate::validate`].

#![warn(clippy::arithmetic_side_effects)]

use crate::Result;
use crate::host::{InjectionSpec, Topology};
use crate::slot::TRANSFORMER_PROBE_TOKENS;
use crate::validate::{
    MAX_CHANNELS, MAX_PROBE_ELEMENTS, MAX_SPATIAL, checked_product, shape, size_in,
};
use tch::Tensor;

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
