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
//! Alpha is either one scalar or a per-sample tensor `[N, 1, 1, 1]` (CNN) /
//! `[N, 1, 1]` (transformer) ([`BlendAlpha::PerSample`]), the override used
//! to evaluate several alpha configurations in one batch.

use tch::{Tensor, nn};

use crate::host::Topology;
use crate::layers::Linear;
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
    fn clamped_tensor(&self, like: &Tensor) -> Result<Tensor> {
        match self {
            BlendAlpha::Scalar(a) => Ok(Tensor::f_full(
                [1i64].as_slice(),
                a.clamp(0.0, 1.0),
                (like.kind(), like.device()),
            )?),
            BlendAlpha::PerSample(tensor) => Ok(tensor
                .f_to_kind(like.kind())?
                .f_to_device(like.device())?
                .f_clamp(0.0, 1.0)?),
        }
    }
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
    let seed = seed.f_to_kind(host.kind())?;
    match alpha {
        BlendAlpha::Scalar(a) => Ok(host.f_lerp(&seed, a.clamp(0.0, 1.0))?),
        BlendAlpha::PerSample(_) => {
            let weight = alpha.clamped_tensor(host)?;
            Ok(host.f_lerp_tensor(&seed, &weight)?)
        }
    }
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
    let seed = seed.f_to_kind(host.kind())?;
    let valve = seed.f_sub(&seed_input.f_to_kind(host.kind())?)?.f_tanh()?;
    let scaled = match alpha {
        BlendAlpha::Scalar(a) => valve.f_mul_scalar(a.clamp(0.0, 1.0))?,
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
    let seed = seed.f_to_kind(host.kind())?;
    let effective = gate
        .f_to_kind(host.kind())?
        .f_mul(&alpha.clamped_tensor(host)?)?
        .f_clamp(0.0, 1.0)?;
    Ok(host.f_lerp_tensor(&seed, &effective)?)
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
}

impl GatedBlend {
    /// A gate for `channels` channels of `topology` features, its parameters
    /// under `path`.
    pub fn new(path: &nn::Path<'_>, channels: i64, topology: Topology) -> Result<GatedBlend> {
        let width = (channels / 4).max(GATE_MIN_HIDDEN);
        Ok(GatedBlend {
            hidden: Linear::new(&path.sub("fc1"), channels, width, true)?,
            output: Linear::new(&path.sub("fc2"), width, 1, true)?,
            topology,
        })
    }

    /// Number of parameters.
    pub fn param_count(&self) -> i64 {
        self.hidden.param_count() + self.output.param_count()
    }

    /// # Shapes
    /// CNN `[B, C, H, W] -> [B, 1, 1, 1]`; transformer `[B, T, C] -> [B, 1, 1]`
    /// (values in `(0, 1)`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        let (rank, pooled_dims): (usize, &[i64]) = match self.topology {
            Topology::Cnn => (4, &[2, 3]),
            Topology::Transformer => (3, &[1]),
        };
        if size.len() != rank {
            return Err(Error::ShapeMismatch {
                op: "gated blend",
                expected: vec![-1; rank],
                got: size,
            });
        }
        let pooled = x.f_mean_dim(pooled_dims, false, None)?; // [B, C]
        let hidden = self.hidden.forward(&pooled)?.f_relu()?; // [B, width]
        let gate = self.output.forward(&hidden)?.f_sigmoid()?; // [B, 1]
        let mut shape = vec![size[0]];
        shape.extend(std::iter::repeat_n(1, size.len() - 1));
        Ok(gate.f_reshape(shape.as_slice())?)
    }
}
