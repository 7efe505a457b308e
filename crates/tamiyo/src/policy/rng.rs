//! [`PolicyRng`]: a seeded counter-based generator of uniform and Gumbel
//! noise on the device, for sampling actions.
//!
//! Draw `d` of generator seed `s` hashes `(s, d, element index)` with the
//! SplitMix64 finaliser in device integer ops (`torch_ext::rng`; its base
//! from [`leyline::rng::mix64`] on the host) and keeps the top 24 bits:
//! the same numbers on the CPU and CUDA, no dependence on libtorch's global
//! generator, nothing read back, and one controller's draws never disturb
//! another's.

use tch::{Device, Kind, Tensor};

use leyline::rng::mix64;

use crate::error::{TorchResultExt, shape_mismatch};
use crate::{Error, Result};

/// A torch-ext error of the device hash as [`Error::Device`] naming `op`.
fn hash_failed(op: &'static str) -> impl FnOnce(torch_ext::Error) -> Error {
    move |source| Error::Device { op, source }
}

/// A seeded counter-based generator of uniform noise on the device (see
/// the module docs). Each draw advances a counter; the same seed and
/// sequence of draws give the same numbers on any device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyRng {
    seed: u64,
    draws: u64,
}

impl PolicyRng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> PolicyRng {
        PolicyRng { seed, draws: 0 }
    }

    /// Draws made so far.
    pub fn draws(&self) -> u64 {
        self.draws
    }

    /// The seed it was made from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The generator of `seed` after `draws` draws (what [`PolicyRng::seed`]
    /// and [`PolicyRng::draws`] read back): the same numbers from there on.
    pub fn from_parts(seed: u64, draws: u64) -> PolicyRng {
        PolicyRng { seed, draws }
    }

    /// The base of draw `draw`: the hash offset every element of that draw
    /// adds to its index.
    pub fn base_of(&self, draw: u64) -> i64 {
        mix64(self.seed ^ mix64(draw.wrapping_add(0x5EED_0F7A_u64))) as i64
    }

    /// The bases of the next `count` draws, advancing the generator past
    /// them: a captured CUDA graph reads them from a device tensor instead
    /// of drawing (the same numbers as [`PolicyRng::uniform`] would give).
    pub fn next_bases(&mut self, count: usize) -> Vec<i64> {
        (0..count)
            .map(|_| {
                let base = self.base_of(self.draws);
                self.draws = self.draws.wrapping_add(1);
                base
            })
            .collect()
    }

    /// Uniform numbers in the open interval `(0, 1)`, `f32`, of `shape` on
    /// `device` (24 random bits each).
    /// A refused shape leaves the generator where it was.
    pub fn uniform(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let base = self.base_of(self.draws);
        let noise = hashed_uniform(shape, device, |x| x.f_add_scalar(base).op("rng hash"))?;
        self.draws = self.draws.wrapping_add(1);
        Ok(noise)
    }

    /// [`PolicyRng::uniform`] of the draw whose base is the one-element i64
    /// tensor `base` (on `device`): no host value enters the computation, so
    /// it can be captured in a CUDA graph and fed a new base per replay.
    pub fn uniform_from_base(base: &Tensor, shape: &[i64], device: Device) -> Result<Tensor> {
        if base.numel() != 1 || base.kind() != Kind::Int64 || base.device() != device {
            return Err(shape_mismatch(
                "PolicyRng.uniform_from_base",
                format!("one Int64 value on {device:?}"),
                (base.kind(), base.size(), base.device()),
            ));
        }
        let base = base.f_reshape([1]).op("rng base")?;
        hashed_uniform(shape, device, |x| x.f_add(&base).op("rng hash"))
    }

    /// Gumbel noise from a device-held `base` (see
    /// [`PolicyRng::uniform_from_base`]).
    pub fn gumbel_from_base(base: &Tensor, shape: &[i64], device: Device) -> Result<Tensor> {
        to_gumbel(PolicyRng::uniform_from_base(base, shape, device)?)
    }

    /// Standard Gumbel noise `−ln(−ln u)` of `shape` on `device`.
    pub fn gumbel(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        to_gumbel(self.uniform(shape, device)?)
    }
}

/// `−ln(−ln u)`.
fn to_gumbel(uniform: Tensor) -> Result<Tensor> {
    uniform
        .f_log()
        .op("gumbel")?
        .f_neg()
        .op("gumbel")?
        .f_log()
        .op("gumbel")?
        .f_neg()
        .op("gumbel")
}

/// The hash of every element index of `shape`, offset by `add_base`, as
/// uniform `f32` numbers in `(0, 1)`.
fn hashed_uniform(
    shape: &[i64],
    device: Device,
    add_base: impl FnOnce(Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let count = shape
        .iter()
        .try_fold(1_i64, |total, dim| {
            (*dim >= 0).then(|| total.checked_mul(*dim)).flatten()
        })
        .ok_or_else(|| shape_mismatch("PolicyRng.uniform", "a valid shape", shape))?;
    let index = Tensor::f_arange(count, (Kind::Int64, device)).op("rng arange")?;
    let x = torch_ext::rng::golden_steps(&index).map_err(hash_failed("rng hash"))?;
    let x = torch_ext::rng::mix64(&add_base(x)?).map_err(hash_failed("rng hash"))?;
    // The top 24 bits, centred in their bucket: (k + 0.5) / 2^24.
    torch_ext::rng::logical_shift_right(&x, 40)
        .map_err(hash_failed("rng float"))?
        .f_to_kind(Kind::Float)
        .op("rng float")?
        .f_add_scalar(0.5)
        .op("rng float")?
        .f_mul_scalar(1.0 / f64::from(1_u32 << 24))
        .op("rng float")?
        .f_view(shape)
        .op("rng view")
}
