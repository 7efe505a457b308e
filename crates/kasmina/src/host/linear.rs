//! The `tolaria-reference` host: a single `Linear(16 -> 4)`.
//!
//! It has one segment and no injection points: it exists so that the trainer's
//! fast path and the Python Phase-0 workload share one definition. Sizes are
//! bounded ([`LinearHost::new`]) and inputs shape-checked before libtorch sees
//! them.

#![warn(clippy::arithmetic_side_effects)]

use tch::{Device, Tensor, nn};

use super::{Host, InjectionSpec, Topology, check_boundaries};
use crate::Result;
use crate::layers::Linear;
use crate::validate::{MAX_FEATURES, MAX_PARAMETERS, checked_product, checked_sum, shape, size_in};

/// Input features of the reference workload.
pub const REFERENCE_IN_FEATURES: i64 = 16;
/// Classes of the reference workload.
pub const REFERENCE_CLASSES: i64 = 4;

/// A one-layer linear classifier.
#[derive(Debug)]
pub struct LinearHost {
    var_store: nn::VarStore,
    linear: Linear,
    in_features: i64,
    out_features: i64,
    name: String,
}

impl LinearHost {
    /// `Linear(in_features -> out_features)` with bias, PyTorch default init.
    /// Both sizes in `[1, MAX_FEATURES]`, at most `MAX_PARAMETERS` weights.
    pub fn new(in_features: i64, out_features: i64, device: Device) -> Result<LinearHost> {
        size_in("LinearHost.in_features", in_features, 1, MAX_FEATURES)?;
        size_in("LinearHost.out_features", out_features, 1, MAX_FEATURES)?;
        let weights = checked_product(
            "LinearHost (weights)",
            &[in_features, out_features],
            MAX_PARAMETERS,
        )?;
        checked_sum(
            "LinearHost (parameters)",
            &[weights, out_features],
            MAX_PARAMETERS,
        )?;
        let var_store = nn::VarStore::new(device);
        let linear = Linear::new(
            &var_store.root().sub("linear"),
            in_features,
            out_features,
            true,
        )?;
        Ok(LinearHost {
            var_store,
            linear,
            in_features,
            out_features,
            name: format!("linear-{in_features}x{out_features}"),
        })
    }

    /// The `tolaria-reference` host, `Linear(16 -> 4)`.
    pub fn reference(device: Device) -> Result<LinearHost> {
        LinearHost::new(REFERENCE_IN_FEATURES, REFERENCE_CLASSES, device)
    }

    /// The layer (weight `[out, in]`, bias `[out]`).
    pub fn linear(&self) -> &Linear {
        &self.linear
    }
}

impl Host for LinearHost {
    fn name(&self) -> &str {
        &self.name
    }

    fn topology(&self) -> Topology {
        Topology::Cnn
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.var_store
    }

    fn injection_specs(&self) -> &[InjectionSpec] {
        &[]
    }

    fn num_segments(&self) -> usize {
        1
    }

    fn input_shape(&self) -> Vec<i64> {
        vec![self.in_features]
    }

    /// # Shapes
    /// `[B, in] -> [B, out]` for `0 -> 1`; identity when `from == to`.
    fn forward_segment(&self, x: &Tensor, from: usize, to: usize, _train: bool) -> Result<Tensor> {
        check_boundaries(self, from, to)?;
        let features = if from == 0 {
            self.in_features
        } else {
            self.out_features
        };
        shape(
            "linear host (activation at the start boundary)",
            &x.size(),
            &[-1, features],
        )?;
        if from == to {
            return Ok(x.shallow_clone());
        }
        self.linear.forward(x)
    }
}
