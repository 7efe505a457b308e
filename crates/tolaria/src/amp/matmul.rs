//! The training precision settings every trainer applies once when it
//! starts: TF32 and the float32 matrix-product precision
//! ([`PrecisionConfig`], applied by [`apply_precision`] through
//! `torch_ext::precision`, the one mechanism for process-wide flags).

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// `torch.set_float32_matmul_precision` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MatmulPrecision {
    /// Full fp32 matrix products.
    Highest,
    /// TF32 (or bf16x3) matrix products allowed.
    High,
    /// bf16 matrix products allowed.
    Medium,
}

/// Numeric settings applied once when a trainer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionConfig {
    /// Allow TF32 in cuBLAS matrix products and cuDNN convolutions.
    pub allow_tf32: bool,
    /// Float32 matrix-product precision.
    pub matmul_precision: MatmulPrecision,
}

impl Default for PrecisionConfig {
    fn default() -> Self {
        PrecisionConfig {
            allow_tf32: true,
            matmul_precision: MatmulPrecision::High,
        }
    }
}

/// Applies TF32 and matmul-precision settings (process-wide; call once).
pub fn apply_precision(precision: &PrecisionConfig) -> Result<()> {
    torch_ext::precision::set_allow_tf32(precision.allow_tf32, precision.allow_tf32);
    torch_ext::precision::set_float32_matmul_precision(match precision.matmul_precision {
        MatmulPrecision::Highest => torch_ext::precision::MatmulPrecision::Highest,
        MatmulPrecision::High => torch_ext::precision::MatmulPrecision::High,
        MatmulPrecision::Medium => torch_ext::precision::MatmulPrecision::Medium,
    });
    Ok(())
}
