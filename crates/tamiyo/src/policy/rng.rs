//! [`PolicyRng`]: a seeded counter-based generator of uniform and Gumbel
//! noise on the device, for sampling actions.
//!
//! Draw `d` of generator seed `s` hashes `(s, d, element index)` with the
//! SplitMix64 finaliser in device integer ops and keeps the top 24 bits:
//! the same numbers on the CPU and CUDA, no dependence on libtorch's global
//! generator, nothing read back, and one controller's draws never disturb
//! another's.

use tch::{Device, Kind, Tensor};

use crate::Result;
use crate::error::{TorchResultExt, shape_mismatch};

const GOLDEN: i64 = 0x9E37_79B9_7F4A_7C15_u64 as i64;
const MIX1: i64 = 0xBF58_476D_1CE4_E5B9_u64 as i64;
const MIX2: i64 = 0x94D0_49BB_1331_11EB_u64 as i64;

/// The SplitMix64 finaliser on the host.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `x >>> shift` on `i64` tensors (arithmetic shift, sign bits cleared).
fn logical_shift_right(x: &Tensor, shift: i64) -> Result<Tensor> {
    let mask = i64::MAX >> shift.saturating_sub(1).clamp(0, 63);
    x.f_bitwise_right_shift_tensor_scalar(shift)
        .op("rng shift")?
        .f_bitwise_and(mask)
        .op("rng mask")
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

    /// Uniform numbers in the open interval `(0, 1)`, `f32`, of `shape` on
    /// `device` (24 random bits each).
    pub fn uniform(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        let draw = self.draws;
        self.draws = self.draws.wrapping_add(1);
        let count = shape
            .iter()
            .try_fold(1_i64, |total, dim| {
                (*dim >= 0).then(|| total.checked_mul(*dim)).flatten()
            })
            .ok_or_else(|| shape_mismatch("PolicyRng.uniform", "a valid shape", shape))?;
        let base = mix(self.seed ^ mix(draw.wrapping_add(0x5EED_0F7A_u64))) as i64;
        let mut x = Tensor::f_arange(count, (Kind::Int64, device))
            .op("rng arange")?
            .f_add_scalar(1)
            .op("rng hash")?
            .f_mul_scalar(GOLDEN)
            .op("rng hash")?
            .f_add_scalar(base)
            .op("rng hash")?;
        for (shift, multiplier) in [(30, Some(MIX1)), (27, Some(MIX2)), (31, None)] {
            let shifted = logical_shift_right(&x, shift)?;
            x = x.f_bitwise_xor_tensor(&shifted).op("rng xor")?;
            if let Some(multiplier) = multiplier {
                x = x.f_mul_scalar(multiplier).op("rng mul")?;
            }
        }
        // The top 24 bits, centred in their bucket: (k + 0.5) / 2^24.
        logical_shift_right(&x, 40)?
            .f_to_kind(Kind::Float)
            .op("rng float")?
            .f_add_scalar(0.5)
            .op("rng float")?
            .f_mul_scalar(1.0 / f64::from(1_u32 << 24))
            .op("rng float")?
            .f_view(shape)
            .op("rng view")
    }

    /// Standard Gumbel noise `−ln(−ln u)` of `shape` on `device`.
    pub fn gumbel(&mut self, shape: &[i64], device: Device) -> Result<Tensor> {
        self.uniform(shape, device)?
            .f_log()
            .op("gumbel")?
            .f_neg()
            .op("gumbel")?
            .f_log()
            .op("gumbel")?
            .f_neg()
            .op("gumbel")
    }
}
