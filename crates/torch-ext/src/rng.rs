//! Random numbers on the device: leyline's integer hash
//! ([`leyline::rng::mix64`], the SplitMix64 finaliser) computed with tensor
//! integer ops on `i64` tensors (two's complement, so the bits equal the
//! host's `u64` arithmetic).
//!
//! A counter-based draw hashes `base + (index + 1) · GOLDEN` for every
//! element index ([`golden_steps`], then [`mix64`]): the same numbers on the
//! CPU and on CUDA, no dependence on libtorch's global generator, nothing
//! read back, and a base that can live in a device tensor so a captured
//! graph draws fresh numbers per replay. Its users: the device-side epoch
//! shuffle (`tolaria::engine::staging`) and the policy's noise
//! (`tamiyo::policy::PolicyRng`). The host-side generator and finaliser are
//! [`leyline::rng`].

use tch::Tensor;

use crate::error::{Error, Result};

/// [`leyline::rng::GOLDEN`] as two's-complement `i64`.
const GOLDEN: i64 = leyline::rng::GOLDEN as i64;
/// [`leyline::rng::MIX1`] as two's-complement `i64`.
const MIX1: i64 = leyline::rng::MIX1 as i64;
/// [`leyline::rng::MIX2`] as two's-complement `i64`.
const MIX2: i64 = leyline::rng::MIX2 as i64;

/// A tch error as [`Error::Cpp`] naming `op`.
fn torch(op: &'static str) -> impl FnOnce(tch::TchError) -> Error {
    move |error| Error::Cpp {
        op,
        message: error.to_string(),
    }
}

/// `x >>> shift` on an `i64` tensor: the arithmetic shift, then the sign
/// bits cleared (`shift` in `1..=63`).
///
/// # Errors
/// [`Error::Cpp`] when libtorch refuses the tensor.
pub fn logical_shift_right(x: &Tensor, shift: i64) -> Result<Tensor> {
    let mask = i64::MAX >> shift.saturating_sub(1).clamp(0, 63);
    x.f_bitwise_right_shift_tensor_scalar(shift)
        .map_err(torch("rng shift"))?
        .f_bitwise_and(mask)
        .map_err(torch("rng mask"))
}

/// `(index + 1) · GOLDEN` for every element of the `i64` tensor `index`
/// (wrapping): the SplitMix64 counter of each element, before its base is
/// added.
///
/// # Errors
/// [`Error::Cpp`] when libtorch refuses the tensor.
pub fn golden_steps(index: &Tensor) -> Result<Tensor> {
    index
        .f_add_scalar(1)
        .map_err(torch("rng hash"))?
        .f_mul_scalar(GOLDEN)
        .map_err(torch("rng hash"))
}

/// [`leyline::rng::mix64`] of every element of the `i64` tensor `x`.
///
/// # Errors
/// [`Error::Cpp`] when libtorch refuses the tensor.
pub fn mix64(x: &Tensor) -> Result<Tensor> {
    let mut x = x.shallow_clone();
    for (shift, multiplier) in [(30, Some(MIX1)), (27, Some(MIX2)), (31, None)] {
        let shifted = logical_shift_right(&x, shift)?;
        x = x.f_bitwise_xor_tensor(&shifted).map_err(torch("rng xor"))?;
        if let Some(multiplier) = multiplier {
            x = x.f_mul_scalar(multiplier).map_err(torch("rng mul"))?;
        }
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn the_device_hash_equals_the_host_finaliser() {
        let base: u64 = 0x1234_5678_9ABC_DEF0;
        let index = Tensor::arange(64, (Kind::Int64, Device::Cpu));
        let hashed = mix64(
            &golden_steps(&index)
                .unwrap()
                .f_add_scalar(base as i64)
                .unwrap(),
        )
        .unwrap();
        let values = Vec::<i64>::try_from(&hashed).unwrap();
        for (i, value) in values.iter().enumerate() {
            let counter = base.wrapping_add((i as u64 + 1).wrapping_mul(leyline::rng::GOLDEN));
            assert_eq!(*value as u64, leyline::rng::mix64(counter));
        }
        let shifted = Vec::<i64>::try_from(&logical_shift_right(&hashed, 40).unwrap()).unwrap();
        for (value, top) in values.iter().zip(shifted) {
            assert_eq!((*value as u64) >> 40, top as u64);
        }
    }
}
