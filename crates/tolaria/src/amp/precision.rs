//! [`Precision`]: the dtype autocast runs the forward pass in, parsed from
//! the configuration's `precision`, picked per device, and its autocast
//! region.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use crate::error::{Error, Result};

/// The dtype autocast runs the forward pass in; the configuration's
/// `precision = "fp32" | "bf16" | "fp16"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// No autocast: everything in fp32 (AMP off).
    Fp32,
    /// Autocast to bfloat16; fp32's exponent range, so no grad scaling.
    Bf16,
    /// Autocast to float16, with a [`GradScaler`](super::GradScaler).
    Fp16,
}

impl Precision {
    /// Every precision, in the order of the configuration's documentation.
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Bf16, Precision::Fp16];

    /// The default for `device`: bf16 on a CUDA device of compute capability
    /// 8.0 or newer (what `torch.cuda.is_bf16_supported` reports), fp16 on an
    /// older CUDA device, fp32 on the CPU and any other device.
    ///
    /// # Errors
    /// [`Error::TorchExt`] when the capability of a CUDA device cannot be
    /// queried (no CUDA, no such device).
    pub fn auto(device: Device) -> Result<Precision> {
        match device {
            Device::Cuda(index) => {
                let (major, _minor) = torch_ext::cuda::device_capability(index)?;
                Ok(if major >= 8 {
                    Precision::Bf16
                } else {
                    Precision::Fp16
                })
            }
            _ => Ok(Precision::Fp32),
        }
    }

    /// The configuration spelling: `fp32`, `bf16` or `fp16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    /// The autocast dtype, or `None` for fp32 (no autocast).
    pub fn autocast_kind(self) -> Option<Kind> {
        match self {
            Precision::Fp32 => None,
            Precision::Bf16 => Some(Kind::BFloat16),
            Precision::Fp16 => Some(Kind::Half),
        }
    }

    /// The autocast region of this precision on `device`: a guard for bf16
    /// or fp16 on CUDA, `None` for fp32 or off CUDA. `cache` keeps casts of
    /// weights for the guard's lifetime; a step that is captured into a
    /// CUDA graph needs it off (a cast cached in one replay is stale in the
    /// next).
    pub fn autocast(self, device: Device, cache: bool) -> Result<Option<torch_ext::AutocastGuard>> {
        match (self.autocast_kind(), device) {
            (Some(kind), Device::Cuda(_)) => Ok(Some(torch_ext::AutocastGuard::with_cache(
                torch_ext::AutocastDevice::Cuda,
                kind,
                cache,
            )?)),
            _ => Ok(None),
        }
    }

    /// Whether gradients need a [`GradScaler`](super::GradScaler) (fp16 only).
    pub fn needs_grad_scaling(self) -> bool {
        matches!(self, Precision::Fp16)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    /// Parses the configuration spelling (`fp32`, `bf16`, `fp16`; exact,
    /// lower case).
    fn from_str(text: &str) -> Result<Precision> {
        Precision::ALL
            .into_iter()
            .find(|precision| precision.name() == text)
            .ok_or_else(|| Error::InvalidConfig {
                field: "precision",
                reason: format!("{text:?} is not one of \"fp32\", \"bf16\", \"fp16\""),
            })
    }
}
