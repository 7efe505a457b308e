//! Tensor copies tch cannot express: `copy_` with `non_blocking = true`,
//! writing bytes straight into a host tensor ([`write_host_bytes`]), and a
//! raw asynchronous copy a CUDA graph can capture ([`memcpy_async`]).

use crate::error::{Error, Result};
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

/// Writes `src` into the host memory of `dst` from its first element on,
/// without a libtorch op: `dst` must be a contiguous CPU tensor (pinned or
/// not) of at least `src.len()` bytes. The packing path of an upload: write
/// the step's bytes straight into a page-locked buffer, then queue one
/// [`copy_non_blocking`] to the device. The caller must not write while an
/// earlier copy from `dst` may still be running (synchronise an event
/// recorded after it).
pub fn write_host_bytes(dst: &tch::Tensor, src: &[u8]) -> Result<()> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "write_host_bytes",
        message,
    };
    if dst.device() != tch::Device::Cpu {
        return Err(refuse(format!(
            "the target is on {:?}, not the host",
            dst.device()
        )));
    }
    if !dst.is_contiguous() {
        return Err(refuse("the target is not contiguous".to_owned()));
    }
    let element = dst.kind().elt_size_in_bytes();
    let capacity = dst.numel().saturating_mul(element);
    if src.len() > capacity {
        return Err(refuse(format!(
            "{} bytes do not fit a target of {capacity} bytes",
            src.len()
        )));
    }
    if src.is_empty() {
        return Ok(());
    }
    let target = dst.data_ptr().cast::<u8>();
    if target.is_null() {
        return Err(refuse("the target has no storage".to_owned()));
    }
    // SAFETY: `dst` is a live, contiguous host tensor whose storage spans
    // at least `capacity >= src.len()` bytes from `data_ptr` (checked
    // above); `src` is a distinct Rust slice, so the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), target, src.len()) };
    Ok(())
}

/// The bytes of `src` into `dst` with one `cudaMemcpyAsync` on the current
/// stream of the CUDA side's device. Unlike [`copy_non_blocking`] it
/// touches neither the dispatcher nor libtorch's pinned-memory allocator,
/// so a CUDA graph can capture it: each replay then copies what the host
/// memory holds at that moment (the upload of a step's inputs, the
/// readback of its outputs, inside the step's graph).
///
/// Both tensors must be contiguous with the same size in bytes (dtypes may
/// differ: the bytes are copied as they are); at least one must be on a
/// CUDA device, and a host side must be page-locked ([`crate::memory::pin`]).
/// The caller keeps the host memory alive and does not touch it until the
/// copy (or the replay that holds it) has run.
pub fn memcpy_async(dst: &tch::Tensor, src: &tch::Tensor) -> Result<()> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "memcpy_async",
        message,
    };
    let sides = [("target", dst), ("source", src)];
    for (side, tensor) in sides {
        if !tensor.is_contiguous() {
            return Err(refuse(format!("the {side} is not contiguous")));
        }
    }
    for (side, tensor) in sides {
        if tensor.device() == tch::Device::Cpu && !crate::memory::is_pinned(tensor) {
            return Err(refuse(format!(
                "the {side} is in pageable host memory (pin it first)"
            )));
        }
    }
    if dst.device() == tch::Device::Cpu && src.device() == tch::Device::Cpu {
        return Err(refuse("neither side is on a CUDA device".to_owned()));
    }
    let bytes = |tensor: &tch::Tensor| {
        tensor
            .numel()
            .saturating_mul(tensor.kind().elt_size_in_bytes())
    };
    if bytes(dst) != bytes(src) {
        return Err(refuse(format!(
            "the target holds {} bytes, the source {}",
            bytes(dst),
            bytes(src)
        )));
    }
    // SAFETY: both pointers are the live `at::Tensor`s behind tch tensors
    // that outlive the call; the shim checks layouts and sizes again.
    unsafe {
        ffi::check(
            "memcpy_async",
            ffi::esper_memcpy_async(ffi::tensor_ptr(dst), ffi::tensor_ptr(src)),
        )
    }
}
