//! Blend algorithms: how a seed's output `s` is mixed into host features `h`.
//!
//! With `a = clamp(alpha, 0, 1)` (reference §2.4):
//! - ADD: `y = h + a (s - h)` (lerp; `h` at 0, `s` at 1);
//! - MULTIPLY ("valve"): `y = h (1 + a tanh(s - x))` where `x` is the seed's
//!   input; identity at `a = 0` or when `s = x`; the multiplier stays in
//!   `[1 - a, 1 + a]`;
//! - GATE: `a_eff = clamp(a g(x), 0, 1)` with the learned [`GatedBlend`]
//!   `g`, then `y = lerp(h, s, a_eff)` (a convex mix per sample).
//!
//! The incubator ([`incubator`]) is the straight-through form used in
//! TRAINING at alpha 0: `y = h + (s - stopgrad(s))`, equal to `h` in value but
//! passing gradients to the seed.
//!
//! A per-sample alpha (a device tensor, what a captured step replays with a
//! new value) blends through [`torch_ext::nn::blend_lerp`]: fused kernels on
//! CUDA where they apply, libtorch's `lerp` otherwise.
//!
//! `mix` chooses among them for a seed's state (a slot's forward),
//! `replicate_batch` copies a batch for the counterfactual configurations,
//! and `mix_replicated` blends a seed into those copies without making them
//! where the algorithm is a lerp.
//!
//! Alpha is either one scalar or a per-sample tensor `[N, 1, 1, 1]` (CNN) /
//! `[N, 1, 1]` (transformer) ([`BlendAlpha::PerSample`]), the override used
//! to evaluate several alpha configurations in one batch.
//!
//! Bad input: a scalar alpha must be finite ([`Error::NonFinite`]);
//! finite values outside `[0, 1]` are clamped as in the reference. Operand
//! shapes are checked before libtorch sees them ([`Error::ShapeMismatch`]):
//! seed output and seed input equal the host features, gate values and
//! per-sample alphas are `[B or 1, 1, ..., 1]` of the host's rank. A
//! per-sample alpha tensor on the CPU is checked value by value (a NaN or an
//! infinity is [`Error::NonFinite`], field `per-sample alpha`). On a device its
//! values are not read back (that would synchronise the stream at every
//! forward and cannot run under CUDA-graph capture): they are checked where
//! they enter, as host numbers, by whoever builds the tensor (the trainer's
//! step from the slots' checked alphas, simic's counterfactual configurations,
//! [`crate::attribution`] from the slots' alphas). A non-finite value that
//! still reaches the device makes the output non-finite, which the governor's
//! NaN check on the loss catches (reference: NaN/Inf loss -> `governor_nan`
//! panic and rollback).

#![warn(clippy::arithmetic_side_effects)]

use leyline::{AlphaAlgorithm, SeedStage};
use tch::{Tensor, nn};

use crate::host::Topology;
use crate::layers::Linear;
use crate::validate::{MAX_CHANNELS, finite, shape, size_in};
use crate::{Error, Result};

/// Hidden width floor of the gated-blend network.
pub const GATE_MIN_HIDDEN: i64 = 8;

/// The blend amplitude.
#[derive(Debug)]
pub enum BlendAlpha<'a> {
    /// One amplitude for the whole batch.
    Scalar(f64),
    /// One amplitude per sample, shape `[N, 1, ..., 1]` broadcastable to `h`.
    PerSample(&'a Tensor),
}

impl BlendAlpha<'_> {
    /// Checks the alpha against host features `host`: a finite scalar, or a
    /// per-sample tensor of shape `[B or 1, 1, ..., 1]` with the host's rank.
    pub fn check(&self, host: &Tensor) -> Result<()> {
        match self {
            BlendAlpha::Scalar(a) => finite("alpha", *a).map(|_| ()),
            BlendAlpha::PerSample(tensor) => {
                check_per_sample("per-sample alpha", tensor, host)?;
                check_host_values_finite("per-sample alpha", tensor)
            }
        }
    }

    /// The scalar clamped to `[0, 1]` (checked finite by [`BlendAlpha::check`]).
    fn clamped_scalar(a: f64) -> Result<f64> {
        Ok(finite("alpha", a)?.clamp(0.0, 1.0))
    }

    fn clamped_tensor(&self, like: &Tensor) -> Result<Tensor> {
        match self {
            BlendAlpha::Scalar(a) => Ok(Tensor::f_full(
                [1i64].as_slice(),
                BlendAlpha::clamped_scalar(*a)?,
                (like.kind(), like.device()),
            )?),
            BlendAlpha::PerSample(tensor) => Ok(tensor
                .f_to_kind(like.kind())?
                .f_to_device(like.device())?
                .f_clamp(0.0, 1.0)?),
        }
    }
}

/// Per-sample values (alpha or gate) for host features `host`: the host's
/// rank, batch `B` or 1 in front, 1 everywhere else.
fn check_per_sample(op: &'static str, values: &Tensor, host: &Tensor) -> Result<()> {
    check_per_sample_of(op, values, &host.size())
}

/// [`check_per_sample`] for host features of shape `host_size`.
fn check_per_sample_of(op: &'static str, values: &Tensor, host_size: &[i64]) -> Result<()> {
    let got = values.size();
    let batch = host_size.first().copied().unwrap_or(0);
    let mut expected = vec![1; host_size.len()];
    if let (Some(first), Some(&leading)) = (expected.first_mut(), got.first())
        && leading == batch
    {
        *first = batch;
    }
    shape(op, &got, &expected)
}

/// Every value of a floating-point tensor on the CPU finite (the first
/// non-finite one is [`Error::NonFinite`]); tensors on a device are not read
/// back (see the module docs).
fn check_host_values_finite(field: &'static str, values: &Tensor) -> Result<()> {
    if values.device() != tch::Device::Cpu || !values.is_floating_point() || values.numel() == 0 {
        return Ok(());
    }
    let flat = values.f_flatten(0, -1)?;
    let bad = flat.f_isfinite()?.f_logical_not()?;
    if bad.f_any()?.f_int64_value(&[])? == 0 {
        return Ok(());
    }
    let first = bad.f_to_kind(tch::Kind::Uint8)?.f_argmax(0, false)?;
    let value = flat.f_double_value(&[first.f_int64_value(&[])?])?;
    Err(Error::NonFinite { field, value })
}

fn check_same_shape(op: &'static str, host: &Tensor, seed: &Tensor) -> Result<()> {
    if host.size() != seed.size() {
        return Err(Error::ShapeMismatch {
            op,
            expected: host.size(),
            got: seed.size(),
        });
    }
    Ok(())
}

/// ADD: `h + a (s - h)`.
///
/// # Shapes
/// `h`, `s`: `[B, ...]` (equal) -> `[B, ...]`.
pub fn blend_add(host: &Tensor, seed: &Tensor, alpha: &BlendAlpha<'_>) -> Result<Tensor> {
    check_same_shape("blend add", host, seed)?;
    alpha.check(host)?;
    match alpha {
        BlendAlpha::Scalar(a) => {
            let seed = seed.f_to_kind(host.kind())?;
            Ok(host.f_lerp(&seed, BlendAlpha::clamped_scalar(*a)?)?)
        }
        BlendAlpha::PerSample(tensor) => {
            let (seed, weight) = lerp_operands(host, seed, tensor)?;
            Ok(torch_ext::nn::blend_lerp_clamped(host, &seed, &weight)?)
        }
    }
}

/// ADD with a per-sample alpha, then the 2x2 max-pool: what
/// `max_pool2x2(blend_add(h, s, PerSample(alpha)))` computes, as one node
/// where the fused kernels run.
///
/// # Shapes
/// `h`, `s`: `[B, C, H, W]` (equal); `alpha`: `[B or 1, 1, 1, 1]` ->
/// `[B, C, H / 2, W / 2]`.
fn blend_add_pooled(host: &Tensor, seed: &Tensor, alpha: &Tensor) -> Result<Tensor> {
    check_same_shape("blend add", host, seed)?;
    BlendAlpha::PerSample(alpha).check(host)?;
    let (seed, weight) = lerp_operands(host, seed, alpha)?;
    Ok(torch_ext::nn::blend_lerp_clamped_pool2x2(
        host, &seed, &weight,
    )?)
}

/// The seed's output in the host's dtype and a per-sample alpha as the
/// lerp's weight (the host's dtype and device; the blend's kernels clamp it
/// to `[0, 1]`).
fn lerp_operands(host: &Tensor, seed: &Tensor, alpha: &Tensor) -> Result<(Tensor, Tensor)> {
    let seed = seed.f_to_kind(host.kind())?;
    let weight = alpha.f_to_kind(host.kind())?.f_to_device(host.device())?;
    Ok((seed, weight))
}

/// MULTIPLY: `h (1 + a tanh(s - x))` with `x` the seed's input.
///
/// # Shapes
/// `h`, `s`, `x`: `[B, ...]` (equal) -> `[B, ...]`.
pub fn blend_multiply(
    host: &Tensor,
    seed: &Tensor,
    seed_input: &Tensor,
    alpha: &BlendAlpha<'_>,
) -> Result<Tensor> {
    check_same_shape("blend multiply", host, seed)?;
    check_same_shape("blend multiply (seed input)", host, seed_input)?;
    alpha.check(host)?;
    let seed = seed.f_to_kind(host.kind())?;
    let valve = seed.f_sub(&seed_input.f_to_kind(host.kind())?)?.f_tanh()?;
    let scaled = match alpha {
        BlendAlpha::Scalar(a) => valve.f_mul_scalar(BlendAlpha::clamped_scalar(*a)?)?,
        BlendAlpha::PerSample(_) => valve.f_mul(&alpha.clamped_tensor(host)?)?,
    };
    Ok(host.f_mul(&scaled.f_add_scalar(1.0)?)?)
}

/// GATE: `lerp(h, s, clamp(a g, 0, 1))` with gate values `g` `[B, 1, 1, 1]`.
///
/// # Shapes
/// `h`, `s`: `[B, ...]`; `gate`: `[B, 1, ..., 1]` -> `[B, ...]`.
pub fn blend_gate(
    host: &Tensor,
    seed: &Tensor,
    gate: &Tensor,
    alpha: &BlendAlpha<'_>,
) -> Result<Tensor> {
    check_same_shape("blend gate", host, seed)?;
    check_per_sample("blend gate (gate values)", gate, host)?;
    alpha.check(host)?;
    let seed = seed.f_to_kind(host.kind())?;
    let effective = gate
        .f_to_kind(host.kind())?
        .f_mul(&alpha.clamped_tensor(host)?)?
        .f_clamp(0.0, 1.0)?;
    Ok(torch_ext::nn::blend_lerp(host, &seed, &effective)?)
}

/// The straight-through incubator: `h + (s - stopgrad(s))`.
///
/// # Shapes
/// `h`, `s`: `[B, ...]` (equal) -> `[B, ...]`.
pub fn incubator(host: &Tensor, seed: &Tensor) -> Result<Tensor> {
    check_same_shape("incubator", host, seed)?;
    let seed = seed.f_to_kind(host.kind())?;
    let zero_valued = seed.f_sub(&seed.f_detach()?)?;
    Ok(host.f_add(&zero_valued)?)
}

/// The learned per-sample gate of the GATE algorithm: mean-pool to `[B, C]`
/// (over `H, W` on CNN features, over `T` on transformer features),
/// `Linear(C -> max(8, C/4))`, ReLU, `Linear(-> 1)`, sigmoid.
#[derive(Debug)]
pub struct GatedBlend {
    hidden: Linear,
    output: Linear,
    topology: Topology,
    channels: i64,
}

impl GatedBlend {
    /// A gate for `channels` channels (in `[1, MAX_CHANNELS]`) of
    /// `topology` features, its parameters under `path`.
    pub fn new(path: &nn::Path<'_>, channels: i64, topology: Topology) -> Result<GatedBlend> {
        let channels = size_in("GatedBlend.channels", channels, 1, MAX_CHANNELS)?;
        let width = (channels / 4).max(GATE_MIN_HIDDEN);
        Ok(GatedBlend {
            hidden: Linear::new(&path.sub("fc1"), channels, width, true)?,
            output: Linear::new(&path.sub("fc2"), width, 1, true)?,
            topology,
            channels,
        })
    }

    /// Number of parameters.
    pub fn param_count(&self) -> i64 {
        self.hidden
            .param_count()
            .saturating_add(self.output.param_count())
    }

    /// # Shapes
    /// CNN `[B, C, H, W] -> [B, 1, 1, 1]`; transformer `[B, T, C] -> [B, 1, 1]`
    /// (values in `(0, 1)`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        let c = self.channels;
        let (expected, pooled_dims): (Vec<i64>, &[i64]) = match self.topology {
            Topology::Cnn => (vec![-1, c, -1, -1], &[2, 3]),
            Topology::Transformer => (vec![-1, -1, c], &[1]),
        };
        shape("gated blend", &size, &expected)?;
        let batch = size.first().copied().unwrap_or(0);
        let pooled = x.f_mean_dim(pooled_dims, false, None)?; // [B, C]
        let hidden = self.hidden.forward(&pooled)?.f_relu()?; // [B, width]
        let gate = self.output.forward(&hidden)?.f_sigmoid()?; // [B, 1]
        let mut out_shape = vec![batch];
        out_shape.extend(std::iter::repeat_n(1, size.len().saturating_sub(1)));
        Ok(gate.f_reshape(out_shape.as_slice())?)
    }
}

/// `replicas` copies of `x` stacked along its first dimension (block `k`
/// is copy `k`) in `x`'s layout ([`torch_ext::memory::repeat_batch`]: the
/// copies of a channels-last batch stay channels-last, which the fused
/// convolution after a seed needs); `replicas` must be at least 1.
pub fn replicate_batch(x: &Tensor, replicas: i64) -> Result<Tensor> {
    if replicas < 1 {
        return Err(Error::OutOfRange {
            field: "replicas",
            value: replicas.to_string(),
            allowed: "at least 1".to_owned(),
        });
    }
    Ok(torch_ext::memory::repeat_batch(x, replicas)?)
}

/// Whether a seed's state takes the straight-through incubator: TRAINING at
/// alpha 0 with no override.
fn incubates(state: &crate::lifecycle::SeedState, alpha_override: Option<&Tensor>) -> bool {
    alpha_override.is_none() && state.stage() == SeedStage::Training && state.alpha() == 0.0
}

/// The blend of a seed's output (and gate values) for `host` into
/// `replicas` copies of `host`, each with its own rows of `alpha_override`
/// (`[replicas·B or 1, 1, ...]`), without copying the batch first
/// ([`torch_ext::nn::blend_lerp_replicated`]), where `state`'s algorithm is
/// a lerp: ADD, and GATE. `None` where the copies are needed (MULTIPLY, whose
/// valve reads the seed's input, and the incubator).
pub(crate) fn mix_replicated(
    host: &Tensor,
    seed_output: &Tensor,
    gate_values: Option<&Tensor>,
    state: &crate::lifecycle::SeedState,
    alpha_override: Option<&Tensor>,
    replicas: i64,
) -> Result<Option<Tensor>> {
    let alpha = state.alpha();
    if incubates(state, alpha_override) {
        return Ok(None);
    }
    let gate = match (state.algorithm(), gate_values) {
        (AlphaAlgorithm::Multiply, _) => return Ok(None),
        (AlphaAlgorithm::Gate, Some(gate)) => Some(gate),
        (AlphaAlgorithm::Add, _) | (AlphaAlgorithm::Gate, None) => None,
    };
    check_same_shape("blend add", host, seed_output)?;
    let mut copies = host.size();
    if let Some(batch) = copies.first_mut() {
        *batch = batch.saturating_mul(replicas);
    }
    let weight = match alpha_override {
        Some(tensor) => {
            check_per_sample_of("per-sample alpha", tensor, &copies)?;
            check_host_values_finite("per-sample alpha", tensor)?;
            BlendAlpha::PerSample(tensor).clamped_tensor(host)?
        }
        None => Tensor::f_full(
            vec![1_i64; copies.len()].as_slice(),
            BlendAlpha::clamped_scalar(alpha)?,
            (host.kind(), host.device()),
        )?,
    };
    let weight = match gate {
        Some(gate) => {
            check_per_sample("blend gate (gate values)", gate, host)?;
            replicate_batch(&gate.f_to_kind(host.kind())?, replicas)?
                .f_mul(&weight)?
                .f_clamp(0.0, 1.0)?
        }
        None => weight,
    };
    let seed = seed_output.f_to_kind(host.kind())?;
    Ok(Some(torch_ext::nn::blend_lerp_replicated(
        host, &seed, &weight, replicas,
    )?))
}

/// The blend of a seed's output (`seed_output`, and `gate_values` for a
/// gated seed) into `host` under `state`'s algorithm and alpha, or
/// `alpha_override` per sample (see [`crate::slot::SeedSlot::forward`]);
/// where `pool`, its 2x2 max-pool ([`torch_ext::nn::max_pool2x2`]), which
/// an ADD blend with a per-sample alpha takes in
/// ([`torch_ext::nn::blend_lerp_clamped_pool2x2`]).
pub(crate) fn mix(
    host: &Tensor,
    seed_input: &Tensor,
    seed_output: &Tensor,
    gate_values: Option<&Tensor>,
    state: &crate::lifecycle::SeedState,
    alpha_override: Option<&Tensor>,
    pool: bool,
) -> Result<Tensor> {
    if pool {
        let add = matches!(
            (state.algorithm(), gate_values),
            (AlphaAlgorithm::Add, _) | (AlphaAlgorithm::Gate, None)
        );
        // An override never incubates.
        if let (true, Some(tensor)) = (add, alpha_override) {
            return blend_add_pooled(host, seed_output, tensor);
        }
        let blended = mix(
            host,
            seed_input,
            seed_output,
            gate_values,
            state,
            alpha_override,
            false,
        )?;
        return Ok(torch_ext::nn::max_pool2x2(&blended)?);
    }
    let alpha = state.alpha();
    if incubates(state, alpha_override) {
        return incubator(host, seed_output);
    }
    let blend_alpha = match alpha_override {
        Some(tensor) => BlendAlpha::PerSample(tensor),
        None => BlendAlpha::Scalar(alpha),
    };
    match (state.algorithm(), gate_values) {
        (AlphaAlgorithm::Multiply, _) => {
            blend_multiply(host, seed_output, seed_input, &blend_alpha)
        }
        (AlphaAlgorithm::Gate, Some(gate_values)) => {
            blend_gate(host, seed_output, gate_values, &blend_alpha)
        }
        (AlphaAlgorithm::Add, _) | (AlphaAlgorithm::Gate, None) => {
            blend_add(host, seed_output, &blend_alpha)
        }
    }
}
