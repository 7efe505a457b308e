//! Device-level CUDA queries and switches: availability, synchronisation,
//! sync-debug mode, caching-allocator statistics, device and runtime facts.
//!
//! Everything except [`is_available`], [`device_count`] and
//! [`runtime_versions`] returns [`Error::CudaUnavailable`] on a machine
//! without a CUDA device.

use std::ffi::c_char;

use crate::error::{Error, Result};
use crate::ffi;

/// Loads `libtorch_cuda.so` (through the binary's runpath or the library
/// search path) so that libtorch's CUDA kernels are registered, and reports
/// whether it is loaded. Idempotent and cheap after the first call.
///
/// torch-sys names that library at link time, but the linker drops it from a
/// binary that references none of its symbols (`--as-needed`); tch's CUDA
/// tensor operations then fail with "Could not run ... with arguments from
/// the 'CUDA' backend" although the GPU is visible. [`is_available`] and
/// [`device_count`] call this first, so any caller that asks torch-ext about
/// CUDA before using tch on a GPU gets working kernels. Returns `false` with a
/// CPU-only libtorch.
pub fn load_backend() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        // SAFETY: a valid NUL-terminated name and plain flags; the handle is
        // deliberately never closed, so the library stays for the process.
        let handle = unsafe { dlopen(c"libtorch_cuda.so".as_ptr(), RTLD_NOW | RTLD_GLOBAL) };
        !handle.is_null()
    })
}

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flags: std::ffi::c_int) -> *mut std::ffi::c_void;
}

const RTLD_NOW: std::ffi::c_int = 2;
const RTLD_GLOBAL: std::ffi::c_int = 0x100;

/// Whether at least one CUDA device can be used (loading libtorch's CUDA
/// backend first, see [`load_backend`]).
pub fn is_available() -> bool {
    device_count() > 0
}

/// Number of CUDA devices (0 without a driver or device).
pub fn device_count() -> usize {
    load_backend();
    // SAFETY: no arguments; c10::cuda::device_count is noexcept and caches its
    // answer, returning 0 when CUDA cannot be initialised.
    let count = unsafe { ffi::esper_cuda_device_count() };
    usize::try_from(count).unwrap_or(0)
}

/// The calling thread's current CUDA device (what device-less CUDA calls,
/// graph captures and memory pools use).
pub fn current_device() -> Result<usize> {
    ensure_available()?;
    let mut index: i32 = 0;
    // SAFETY: `index` is a live out-parameter.
    unsafe {
        ffi::check(
            "cuda::current_device",
            ffi::esper_cuda_current_device(&mut index),
        )?
    };
    usize::try_from(index).map_err(|_| Error::Cpp {
        op: "cuda::current_device",
        message: format!("negative device index {index}"),
    })
}

/// Makes `device` the calling thread's current CUDA device. A process that
/// works on one GPU (a data-parallel rank) sets it once at the start.
pub fn set_device(device: usize) -> Result<()> {
    ensure_available()?;
    let count = device_count();
    if device >= count {
        return Err(Error::InvalidDevice { device, count });
    }
    let index = i32::try_from(device).map_err(|_| Error::InvalidDevice { device, count })?;
    // SAFETY: value argument; the shim catches all exceptions.
    unsafe { ffi::check("cuda::set_device", ffi::esper_cuda_set_device(index)) }
}

/// Checks that CUDA is usable at all.
pub(crate) fn ensure_available() -> Result<()> {
    if is_available() {
        Ok(())
    } else {
        Err(Error::CudaUnavailable)
    }
}

/// Checks `device` against the device count and converts it for the shim.
pub(crate) fn ensure_device(device: usize) -> Result<i32> {
    let count = device_count();
    if count == 0 {
        return Err(Error::CudaUnavailable);
    }
    if device >= count {
        return Err(Error::InvalidDevice { device, count });
    }
    i32::try_from(device).map_err(|_| Error::InvalidDevice { device, count })
}

/// Blocks until all work queued on every stream of `device` has finished
/// (`cudaDeviceSynchronize`).
pub fn synchronize(device: usize) -> Result<()> {
    let device = ensure_device(device)?;
    // SAFETY: plain value argument; the shim catches all exceptions.
    unsafe { ffi::check("cuda::synchronize", ffi::esper_cuda_synchronize(device)) }
}

/// PyTorch's CUDA sync-debug mode (`torch.cuda.set_sync_debug_mode`): what to
/// do when a tensor operation synchronises the host with the device
/// implicitly (`.item()`-style reads, `nonzero`, blocking copies).
///
/// Explicit synchronisation through this crate ([`synchronize`],
/// [`crate::CudaStream::synchronize`], [`crate::CudaEvent::synchronize`]) is
/// never flagged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncDebugMode {
    /// Say nothing (the default).
    Off,
    /// Print a warning for each synchronising operation.
    Warn,
    /// Make each synchronising operation fail with an error.
    Error,
}

impl SyncDebugMode {
    fn to_raw(self) -> i32 {
        match self {
            SyncDebugMode::Off => 0,
            SyncDebugMode::Warn => 1,
            SyncDebugMode::Error => 2,
        }
    }

    fn from_raw(raw: i32) -> Result<Self> {
        match raw {
            0 => Ok(SyncDebugMode::Off),
            1 => Ok(SyncDebugMode::Warn),
            2 => Ok(SyncDebugMode::Error),
            other => Err(Error::Cpp {
                op: "cuda::sync_debug_mode",
                message: format!("unknown sync debug mode {other}"),
            }),
        }
    }
}

/// Sets the process-wide sync-debug mode.
pub fn set_sync_debug_mode(mode: SyncDebugMode) -> Result<()> {
    ensure_available()?;
    // SAFETY: plain value argument; the shim catches all exceptions.
    unsafe {
        ffi::check(
            "cuda::set_sync_debug_mode",
            ffi::esper_cuda_set_sync_debug_mode(mode.to_raw()),
        )
    }
}

/// The current process-wide sync-debug mode.
pub fn sync_debug_mode() -> Result<SyncDebugMode> {
    ensure_available()?;
    let mut raw = 0_i32;
    // SAFETY: `raw` is a live out-parameter for the duration of the call.
    unsafe {
        ffi::check(
            "cuda::sync_debug_mode",
            ffi::esper_cuda_get_sync_debug_mode(&mut raw),
        )?
    };
    SyncDebugMode::from_raw(raw)
}

/// Caching-allocator byte counters of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryStats {
    /// Bytes currently held by tensors (`torch.cuda.memory_allocated`).
    pub allocated_bytes: u64,
    /// Peak of `allocated_bytes` since start or the last
    /// [`reset_peak_memory_stats`] (`torch.cuda.max_memory_allocated`).
    pub peak_allocated_bytes: u64,
    /// Bytes the allocator has reserved from the driver
    /// (`torch.cuda.memory_reserved`).
    pub reserved_bytes: u64,
}

/// All caching-allocator byte counters of `device` in one call.
pub fn memory_stats(device: usize) -> Result<MemoryStats> {
    let device = ensure_device(device)?;
    let (mut allocated, mut peak, mut reserved) = (0_u64, 0_u64, 0_u64);
    // SAFETY: the three out-parameters are live for the duration of the call.
    unsafe {
        ffi::check(
            "cuda::memory_stats",
            ffi::esper_cuda_memory_stats(device, &mut allocated, &mut peak, &mut reserved),
        )?;
    }
    Ok(MemoryStats {
        allocated_bytes: allocated,
        peak_allocated_bytes: peak,
        reserved_bytes: reserved,
    })
}

/// Peak bytes held by tensors on `device` (`torch.cuda.max_memory_allocated`).
pub fn max_memory_allocated(device: usize) -> Result<u64> {
    Ok(memory_stats(device)?.peak_allocated_bytes)
}

/// Bytes currently held by tensors on `device` (`torch.cuda.memory_allocated`).
pub fn memory_allocated(device: usize) -> Result<u64> {
    Ok(memory_stats(device)?.allocated_bytes)
}

/// Bytes reserved by the caching allocator on `device`.
pub fn memory_reserved(device: usize) -> Result<u64> {
    Ok(memory_stats(device)?.reserved_bytes)
}

/// Restarts peak tracking on `device` (`torch.cuda.reset_peak_memory_stats`).
pub fn reset_peak_memory_stats(device: usize) -> Result<()> {
    let device = ensure_device(device)?;
    // SAFETY: plain value argument; the shim catches all exceptions.
    unsafe {
        ffi::check(
            "cuda::reset_peak_memory_stats",
            ffi::esper_cuda_reset_peak_memory_stats(device),
        )
    }
}

/// Returns unused cached blocks to the driver (`torch.cuda.empty_cache`).
pub fn empty_cache() -> Result<()> {
    ensure_available()?;
    // SAFETY: no arguments; the shim catches all exceptions.
    unsafe { ffi::check("cuda::empty_cache", ffi::esper_cuda_empty_cache()) }
}

/// The marketing name of `device`, e.g. `"NVIDIA H100 80GB HBM3"`.
pub fn device_name(device: usize) -> Result<String> {
    let device = ensure_device(device)?;
    let mut raw: *mut c_char = std::ptr::null_mut();
    // SAFETY: `raw` is a live out-parameter; on success it receives a string
    // the shim allocated, which `take_string` frees.
    unsafe {
        ffi::check(
            "cuda::device_name",
            ffi::esper_cuda_device_name(device, &mut raw),
        )?;
        Ok(ffi::take_string(raw).unwrap_or_default())
    }
}

/// Compute capability `(major, minor)` of `device`, e.g. `(9, 0)` on an H100.
pub fn device_capability(device: usize) -> Result<(i32, i32)> {
    let device = ensure_device(device)?;
    let (mut major, mut minor) = (0_i32, 0_i32);
    // SAFETY: both out-parameters are live for the duration of the call.
    unsafe {
        ffi::check(
            "cuda::device_capability",
            ffi::esper_cuda_device_capability(device, &mut major, &mut minor),
        )?;
    }
    Ok((major, minor))
}

/// `(runtime, driver)` CUDA versions as `"major.minor"` strings, e.g.
/// `("13.0", "13.0")`.
///
/// Works without a GPU: the runtime version is that of the `libcudart` the
/// binary loaded, and the driver version is `"none"` when no driver is
/// installed.
pub fn runtime_versions() -> Result<(String, String)> {
    let (mut runtime, mut driver) = (0_i32, 0_i32);
    // SAFETY: both out-parameters are live for the duration of the call.
    unsafe {
        ffi::check(
            "cuda::runtime_versions",
            ffi::esper_cuda_runtime_versions(&mut runtime, &mut driver),
        )?;
    }
    let driver = if driver == 0 {
        "none".to_owned()
    } else {
        format_cuda_version(driver)
    };
    Ok((format_cuda_version(runtime), driver))
}

/// CUDA encodes versions as `1000 * major + 10 * minor`.
fn format_cuda_version(encoded: i32) -> String {
    format!("{}.{}", encoded / 1000, (encoded % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_decode_like_nvidia_smi() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12080), "12.8");
        assert_eq!(format_cuda_version(11040), "11.4");
    }

    #[test]
    fn sync_debug_mode_raw_values_round_trip() {
        for mode in [
            SyncDebugMode::Off,
            SyncDebugMode::Warn,
            SyncDebugMode::Error,
        ] {
            assert_eq!(SyncDebugMode::from_raw(mode.to_raw()).unwrap(), mode);
        }
        assert!(SyncDebugMode::from_raw(3).is_err());
    }
}
