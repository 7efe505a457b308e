//! Tensor copies tch cannot express: `copy_` with `non_blocking = true`.

use crate::error::Result;
use crate::ffi;

/// `dst.copy_(src, non_blocking=true)`.
///
/// A host-to-device copy from pinned memory (`Tensor::pin_memory`) or a
/// device-to-device copy is queued on the current stream and returns at once;
/// other copies behave like a blocking `copy_`. The caller must keep `src`
/// unchanged until the copy has run (synchronise the stream or an event).
/// Shapes must broadcast and dtypes convert exactly as for `copy_`.
pub fn copy_non_blocking(dst: &mut tch::Tensor, src: &tch::Tensor) -> Result<()> {
    // SAFETY: both pointers are the live `at::Tensor`s behind tch tensors that
    // outlive the call; `dst` is borrowed mutably, matching the in-place write.
    unsafe {
        ffi::check(
            "copy_non_blocking",
            ffi::esper_copy_(ffi::tensor_ptr(dst), ffi::tensor_ptr(src), 1),
        )
    }
}
