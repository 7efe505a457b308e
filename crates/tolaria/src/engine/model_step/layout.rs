//! The step's per-epoch layout: the key naming the step's kernel sequence
//! ([`ModelStep`]'s part of its [`StepKey`](crate::engine::StepKey)), the
//! device tensors holding the blending seeds' alphas (refilled in place
//! while the key holds), and the parameter lists and scratch gradients
//! rebuilt when it changes.

use std::fmt::Write as _;

use kasmina::groups::{GroupKey, ParamGroup};
use kasmina::host::Topology;
use leyline::SeedStage;
use tch::{Device, Kind, Tensor};

use super::ModelStep;
use crate::error::{Error, Result, TorchResultExt};

/// Per-epoch layout: what the forward and the update touch.
#[derive(Debug, Default)]
pub(super) struct Layout {
    /// Alpha override per enabled slot (execution order).
    pub(super) overrides: Vec<Option<Tensor>>,
    /// Every trainable parameter group (host first).
    pub(super) groups: Vec<ParamGroup>,
    /// The host's parameters.
    pub(super) host: Vec<Tensor>,
    /// Seeds' trainable parameters (requires_grad).
    pub(super) seeds: Vec<Tensor>,
    /// Aggregation path when seeds feed the host gradient.
    pub(super) tap_seeds: usize,
    pub(super) confirmed_single: bool,
    /// Per-microbatch scratch gradients of the host (tap path).
    pub(super) scratch: Vec<Tensor>,
    /// Every parameter that requires a gradient (host and seeds).
    pub(super) trainable: Vec<Tensor>,
    /// bf16 shadows of the f32 weights the layers cast (bf16 only): one
    /// launch casts them all at each forward.
    pub(super) shadows: torch_ext::nn::Bf16Shadows,
}

impl ModelStep {
    /// The shape of one alpha override: `[1, 1, 1, 1]` (CNN) or `[1, 1, 1]`
    /// (transformer).
    fn alpha_shape(&self) -> Vec<i64> {
        match self.model.host().topology() {
            Topology::Cnn => vec![1, 1, 1, 1],
            Topology::Transformer => vec![1, 1, 1],
        }
    }

    /// The step's key for the model as it is now, and each enabled slot's
    /// alpha when it blends through an override (execution order).
    pub(super) fn describe(&self) -> (String, Vec<Option<f64>>, usize) {
        let mut key = String::from(self.model.host().name());
        let mut alphas = Vec::with_capacity(self.model.slots().len());
        let mut tap_seeds = 0_usize;
        for slot in self.model.slots() {
            let _ = write!(key, "|{}:", slot.id());
            let Some(state) = slot.state().filter(|state| state.stage().is_active()) else {
                alphas.push(None);
                key.push('-');
                continue;
            };
            let incubating = state.stage() == SeedStage::Training && state.alpha() == 0.0;
            let _ = write!(
                key,
                "{}/{}/{:?}/{:?}/iso{}/frz{}/inc{}",
                state.seed_id(),
                state.blueprint().name(),
                state.stage(),
                state.algorithm(),
                state.isolate_gradients(),
                state.blend_out_freeze(),
                incubating
            );
            if !state.isolate_gradients() {
                tap_seeds = tap_seeds.saturating_add(1);
            }
            alphas.push((!incubating).then(|| state.alpha()));
        }
        let _ = write!(
            key,
            "|taps{tap_seeds}|{}|mb{}|clip{:?}|gen{}",
            self.config.precision,
            self.config.microbatches,
            self.config.clip_grad_norm,
            self.generation
        );
        (key, alphas, tap_seeds)
    }

    /// Refills the alpha tensors in place (same key: a captured graph reads
    /// them).
    pub(super) fn refill_alphas(&self, alphas: &[Option<f64>]) -> Result<()> {
        for (tensor, alpha) in self.layout.overrides.iter().zip(alphas) {
            if let (Some(tensor), Some(alpha)) = (tensor, alpha) {
                let _ = tensor.shallow_clone().f_fill_(*alpha).op("alpha fill")?;
            }
        }
        Ok(())
    }

    /// Builds the layout for a new key.
    pub(super) fn rebuild_layout(
        &mut self,
        alphas: &[Option<f64>],
        tap_seeds: usize,
    ) -> Result<bool> {
        let shape = self.alpha_shape();
        let overrides = alphas
            .iter()
            .map(|alpha| {
                alpha
                    .map(|alpha| {
                        Tensor::f_full(shape.as_slice(), alpha, (Kind::Float, self.device))
                            .op("alpha tensor")
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let groups = self.model.parameter_groups();
        let host = self
            .model
            .host_parameters()
            .into_iter()
            .map(|(_, tensor)| tensor)
            .collect::<Vec<_>>();
        let seeds = groups
            .iter()
            .filter(|group| group.key != GroupKey::Host)
            .flat_map(|group| group.tensors.iter())
            .filter(|tensor| tensor.requires_grad())
            .map(Tensor::shallow_clone)
            .collect::<Vec<_>>();
        let confirmed_single = tap_seeds == 1 && self.confirm_single_seed()?;
        let scratch = if tap_seeds > 0 {
            host.iter()
                .map(|tensor| tensor.f_zeros_like().op("scratch grad"))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let trainable = groups
            .iter()
            .flat_map(|group| group.tensors.iter())
            .filter(|tensor| tensor.requires_grad())
            .map(Tensor::shallow_clone)
            .collect();
        self.layout = Layout {
            overrides,
            groups,
            host,
            seeds,
            tap_seeds,
            confirmed_single,
            scratch,
            trainable,
            shadows: torch_ext::nn::Bf16Shadows::new(),
        };
        Ok(confirmed_single)
    }

    /// Whether attribution on the probe batch sees exactly one seed with
    /// influence (no probe: not confirmed).
    fn confirm_single_seed(&self) -> Result<bool> {
        let Some(probe) = &self.probe else {
            return Ok(false);
        };
        let attribution =
            kasmina::attribution::attribute_batch(&self.model, probe).map_err(|source| {
                Error::Lifecycle {
                    op: "attribute_batch",
                    source,
                }
            })?;
        let per_seed = attribution
            .influence
            .f_sum_dim_intlist(0, false, Kind::Float)
            .op("influence sum")?
            .f_to_device(Device::Cpu)
            .op("influence readback")?;
        let per_seed = Vec::<f32>::try_from(&per_seed).op("influence to vec")?;
        Ok(per_seed.iter().filter(|value| **value > 0.0).count() == 1)
    }

    /// Makes sure every trainable parameter has a (zero) gradient tensor, so
    /// zeroing, unscaling and the update see a fixed set of tensors (and a
    /// captured graph accumulates into buffers that outlive it).
    pub(super) fn materialise_grads(&self) -> Result<()> {
        let mut missing = Vec::new();
        for group in &self.layout.groups {
            for tensor in &group.tensors {
                if tensor.requires_grad() && !tensor.f_grad().op("grad")?.defined() {
                    missing.push(
                        tensor
                            .f_sum(Kind::Float)
                            .op("sum")?
                            .f_mul_scalar(0.0)
                            .op("mul")?,
                    );
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let total = Tensor::f_stack(&missing, 0)
            .op("stack")?
            .f_sum(Kind::Float)
            .op("sum")?;
        total.f_backward().op("materialise grads")?;
        Ok(())
    }
}
