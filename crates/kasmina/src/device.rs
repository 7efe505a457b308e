//! Device selection that makes tch's CUDA kernels usable.
//!
//! libtorch registers its CUDA kernels from `libtorch_cuda.so`. torch-sys
//! names that library at link time, but the linker drops it from binaries
//! that reference none of its symbols (`--as-needed`), and then every CUDA
//! tensor operation fails with "Could not run ... with arguments from the
//! 'CUDA' backend" even though the GPU is visible (seen on the H100 with the
//! prefetch benchmark). [`load_cuda_backend`] loads the library by name so
//! its kernels register; [`cuda_if_available`] does that and picks GPU 0.

use std::ffi::{c_char, c_int, c_void};

use tch::Device;

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
}

const RTLD_NOW: c_int = 2;
const RTLD_GLOBAL: c_int = 0x100;

/// Loads `libtorch_cuda.so` (found through the usual library search path,
/// the binary's runpath included) so that its CUDA kernels register with
/// libtorch. Returns whether it is loaded; `false` on CPU-only libtorch
/// builds. Loading it twice is harmless (the loader counts references).
pub fn load_cuda_backend() -> bool {
    // SAFETY: a valid NUL-terminated name and plain flags; the handle is
    // deliberately never closed, so the library stays for the process.
    let handle = unsafe { dlopen(c"libtorch_cuda.so".as_ptr(), RTLD_NOW | RTLD_GLOBAL) };
    !handle.is_null()
}

/// `Device::Cuda(0)` when the CUDA backend loads and a GPU is present,
/// `Device::Cpu` otherwise.
pub fn cuda_if_available() -> Device {
    if load_cuda_backend() && torch_ext::cuda::is_available() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}
