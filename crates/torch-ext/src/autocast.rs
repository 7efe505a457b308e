//! Automatic mixed precision with a chosen dtype (`torch.autocast`): tch's
//! own autocast is float16-only.

use std::marker::PhantomData;

use tch::Kind;

use crate::cuda::ensure_available;
use crate::error::{Error, Result};
use crate::ffi::{self, RawAutocastState};

/// The device type whose operations autocast.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AutocastDevice {
    /// CUDA tensors (`torch.autocast("cuda")`).
    Cuda,
    /// CPU tensors (`torch.autocast("cpu")`).
    Cpu,
}

impl AutocastDevice {
    /// `c10::DeviceType` value.
    fn to_raw(self) -> i32 {
        match self {
            AutocastDevice::Cpu => 0,
            AutocastDevice::Cuda => 1,
        }
    }
}

/// `c10::ScalarType` values of the kinds autocast can involve.
fn kind_to_scalar_type(kind: Kind) -> Option<i32> {
    match kind {
        Kind::Half => Some(5),
        Kind::Float => Some(6),
        Kind::Double => Some(7),
        Kind::BFloat16 => Some(15),
        _ => None,
    }
}

fn scalar_type_to_kind(raw: i32) -> Option<Kind> {
    match raw {
        5 => Some(Kind::Half),
        6 => Some(Kind::Float),
        7 => Some(Kind::Double),
        15 => Some(Kind::BFloat16),
        _ => None,
    }
}

/// Enables autocast for one device type with a chosen lower-precision dtype on
/// this thread until dropped, then restores the previous state, like
/// `with torch.autocast(device, dtype=...)`.
///
/// When the outermost autocast region closes, the cast cache (weights cast
/// once per region) is cleared. Inside a CUDA-graph capture use
/// [`AutocastGuard::with_cache`] with `cache_enabled = false`: a cached cast
/// made during warm-up would otherwise be baked into the graph as a constant.
///
/// Autocast is thread-local, so the guard is neither `Send` nor `Sync`; nested
/// guards should be dropped in reverse order of creation.
#[must_use = "autocast is on only while the guard lives"]
#[derive(Debug)]
pub struct AutocastGuard {
    device: AutocastDevice,
    previous: RawAutocastState,
    _not_send: PhantomData<*const ()>,
}

impl AutocastGuard {
    /// Autocasts `device` operations to `dtype` (`Kind::BFloat16` or
    /// `Kind::Half`) with the cast cache enabled (PyTorch's default).
    pub fn new(device: AutocastDevice, dtype: Kind) -> Result<Self> {
        Self::with_cache(device, dtype, true)
    }

    /// [`AutocastGuard::new`] with an explicit cast-cache setting.
    pub fn with_cache(device: AutocastDevice, dtype: Kind, cache_enabled: bool) -> Result<Self> {
        if device == AutocastDevice::Cuda {
            ensure_available()?;
        }
        if !matches!(dtype, Kind::BFloat16 | Kind::Half) {
            return Err(Error::InvalidArgument {
                op: "AutocastGuard::new",
                message: format!("autocast dtype must be BFloat16 or Half, got {dtype:?}"),
            });
        }
        let raw_dtype = kind_to_scalar_type(dtype).unwrap_or(15);
        let mut previous = RawAutocastState::default();
        // SAFETY: `previous` is a live out-parameter; the shim catches all
        // exceptions and changes only this thread's autocast state, which
        // `Drop` restores on this same thread (the guard is !Send).
        unsafe {
            ffi::check(
                "AutocastGuard::new",
                ffi::esper_autocast_enter(
                    device.to_raw(),
                    raw_dtype,
                    i32::from(cache_enabled),
                    &mut previous,
                ),
            )?;
        }
        Ok(Self {
            device,
            previous,
            _not_send: PhantomData,
        })
    }

    /// The device type this guard autocasts.
    pub fn device(&self) -> AutocastDevice {
        self.device
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // SAFETY: value arguments; restores the state saved by `with_cache`.
        let result = unsafe {
            ffi::check(
                "AutocastGuard::drop",
                ffi::esper_autocast_exit(self.device.to_raw(), self.previous),
            )
        };
        // Restoring flags saved a moment ago cannot fail; there is no way to
        // report from drop.
        debug_assert!(result.is_ok(), "{result:?}");
    }
}

/// Autocast state of one device type on this thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutocastState {
    /// Whether autocast is on.
    pub enabled: bool,
    /// The lower-precision dtype it casts to (when on).
    pub dtype: Kind,
    /// Whether the cast cache is on (shared by all device types).
    pub cache_enabled: bool,
}

/// The current autocast state of `device` on this thread.
pub fn autocast_state(device: AutocastDevice) -> Result<AutocastState> {
    let mut raw = RawAutocastState::default();
    // SAFETY: `raw` is a live out-parameter.
    unsafe {
        ffi::check(
            "autocast_state",
            ffi::esper_autocast_state(device.to_raw(), &mut raw),
        )?
    };
    let dtype = scalar_type_to_kind(raw.dtype).ok_or(Error::Cpp {
        op: "autocast_state",
        message: format!("unexpected autocast scalar type {}", raw.dtype),
    })?;
    Ok(AutocastState {
        enabled: raw.enabled != 0,
        dtype,
        cache_enabled: raw.cache_enabled != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_type_codes_round_trip() {
        for kind in [Kind::Half, Kind::Float, Kind::Double, Kind::BFloat16] {
            let raw = kind_to_scalar_type(kind).unwrap();
            assert_eq!(scalar_type_to_kind(raw), Some(kind));
        }
        assert_eq!(kind_to_scalar_type(Kind::Int64), None);
    }
}
