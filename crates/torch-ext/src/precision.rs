//! Process-wide numeric precision switches: TF32, float32 matmul precision and
//! cuDNN autotuning / determinism (`torch.backends.*` in Python).
//!
//! These are plain flags in libtorch's global context; they can be set and
//! read on any machine and take effect on CUDA kernels only.

use crate::error::{Error, Result};
use crate::ffi;

/// Lets cuBLAS matmuls (`matmul`) and cuDNN convolutions (`cudnn`) use TF32
/// tensor cores (`torch.backends.cuda.matmul.allow_tf32`,
/// `torch.backends.cudnn.allow_tf32`).
///
/// The matmul switch is the same setting as [`set_float32_matmul_precision`]:
/// `true` sets precision `High`, `false` sets `Highest`.
pub fn set_allow_tf32(matmul: bool, cudnn: bool) {
    // SAFETY: value arguments; the shim catches all exceptions.
    let result = unsafe {
        ffi::check(
            "precision::set_allow_tf32",
            ffi::esper_set_allow_tf32(i32::from(matmul), i32::from(cudnn)),
        )
    };
    // Setting a global flag cannot fail; keep the error visible in debug builds.
    debug_assert!(result.is_ok(), "{result:?}");
}

/// `(matmul, cudnn)` TF32 switches.
pub fn allow_tf32() -> (bool, bool) {
    try_allow_tf32().unwrap_or((false, false))
}

/// [`allow_tf32`], reporting libtorch's error when the legacy and the new TF32
/// settings disagree (only possible if something else used the new
/// `fp32_precision` API).
pub fn try_allow_tf32() -> Result<(bool, bool)> {
    let (mut matmul, mut cudnn) = (0_i32, 0_i32);
    // SAFETY: both out-parameters are live for the duration of the call.
    unsafe {
        ffi::check(
            "precision::allow_tf32",
            ffi::esper_get_allow_tf32(&mut matmul, &mut cudnn),
        )?
    };
    Ok((matmul != 0, cudnn != 0))
}

/// `torch.set_float32_matmul_precision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// Full float32 (no TF32); libtorch's default.
    Highest,
    /// TF32 tensor cores allowed.
    High,
    /// bfloat16-based internal precision allowed.
    Medium,
}

impl MatmulPrecision {
    fn to_raw(self) -> i32 {
        match self {
            MatmulPrecision::Highest => 0,
            MatmulPrecision::High => 1,
            MatmulPrecision::Medium => 2,
        }
    }

    fn from_raw(raw: i32) -> Result<Self> {
        match raw {
            0 => Ok(MatmulPrecision::Highest),
            1 => Ok(MatmulPrecision::High),
            2 => Ok(MatmulPrecision::Medium),
            other => Err(Error::Cpp {
                op: "precision::float32_matmul_precision",
                message: format!("unknown precision {other}"),
            }),
        }
    }
}

/// Sets the internal precision of float32 matmuls.
pub fn set_float32_matmul_precision(precision: MatmulPrecision) {
    // SAFETY: value argument; the shim catches all exceptions.
    let result = unsafe {
        ffi::check(
            "precision::set_float32_matmul_precision",
            ffi::esper_set_float32_matmul_precision(precision.to_raw()),
        )
    };
    debug_assert!(result.is_ok(), "{result:?}");
}

/// The internal precision of float32 matmuls.
pub fn float32_matmul_precision() -> MatmulPrecision {
    let mut raw = 0_i32;
    // SAFETY: `raw` is a live out-parameter.
    let result = unsafe {
        ffi::check(
            "precision::float32_matmul_precision",
            ffi::esper_get_float32_matmul_precision(&mut raw),
        )
    };
    result
        .and_then(|()| MatmulPrecision::from_raw(raw))
        .unwrap_or(MatmulPrecision::Highest)
}

/// `torch.backends.cudnn.benchmark`: autotune convolution algorithms per shape.
pub fn set_cudnn_benchmark(enabled: bool) {
    set_cudnn_flags(i32::from(enabled), -1);
}

/// `torch.backends.cudnn.deterministic`: use only deterministic algorithms.
pub fn set_cudnn_deterministic(enabled: bool) {
    set_cudnn_flags(-1, i32::from(enabled));
}

/// `(benchmark, deterministic)` cuDNN switches.
pub fn cudnn_flags() -> (bool, bool) {
    let (mut benchmark, mut deterministic) = (0_i32, 0_i32);
    // SAFETY: both out-parameters are live for the duration of the call.
    let result = unsafe {
        ffi::check(
            "precision::cudnn_flags",
            ffi::esper_get_cudnn_flags(&mut benchmark, &mut deterministic),
        )
    };
    debug_assert!(result.is_ok(), "{result:?}");
    (benchmark != 0, deterministic != 0)
}

/// Sets the cuDNN switches; a negative value leaves that switch unchanged.
fn set_cudnn_flags(benchmark: i32, deterministic: i32) {
    // SAFETY: value arguments; the shim catches all exceptions.
    let result = unsafe {
        ffi::check(
            "precision::set_cudnn_flags",
            ffi::esper_set_cudnn_flags(benchmark, deterministic),
        )
    };
    debug_assert!(result.is_ok(), "{result:?}");
}
