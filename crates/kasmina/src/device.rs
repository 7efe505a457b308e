//! Device selection that makes tch's CUDA kernels usable.
//!
//! tch's CUDA kernels only work once `libtorch_cuda` is loaded;
//! [`torch_ext::cuda::is_available`] makes sure of that (see
//! [`torch_ext::cuda::load_backend`]), so ask it before putting tensors on a
//! GPU.

use tch::Device;

/// `Device::Cuda(0)` when libtorch's CUDA backend loads and a GPU is present,
/// `Device::Cpu` otherwise.
pub fn cuda_if_available() -> Device {
    if torch_ext::cuda::is_available() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}
