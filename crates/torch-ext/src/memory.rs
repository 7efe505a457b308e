//! Memory formats tch cannot express: channels-last (NHWC) copies of 4-D
//! tensors, converting parameters to channels-last in place, and
//! [`repeat_batch`], copies of a batch that keep its layout.
//!
//! cuDNN runs convolutions, pooling and normalisation of NHWC tensors
//! without layout conversions; a CNN whose weights are channels-last gets
//! NHWC activations throughout (`torch.channels_last` in PyTorch).
//!
//! Also [`pin`] and [`is_pinned`]: page-locked host memory on the current
//! device, without tch's deprecated device argument. And [`set_grads_to_none`]: `zero_grad(set_to_none=True)`, which tch
//! lacks (its `zero_grad` zeroes in place).

use crate::error::Result;
use crate::ffi;

/// `tensor.contiguous(memory_format=torch.channels_last)`: a 4-D tensor in
/// NHWC layout (the tensor itself, shared, when it already is). Anything
/// but 4-D is an error.
pub fn contiguous_channels_last(tensor: &tch::Tensor) -> Result<tch::Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `tensor` is a live `at::Tensor`; `out` receives a fresh heap
    // tensor on success.
    unsafe {
        ffi::check(
            "contiguous_channels_last",
            ffi::esper_contiguous_channels_last(ffi::tensor_ptr(tensor), &mut out),
        )?;
        // SAFETY: on success `out` is a fresh heap `at::Tensor*`, owned now by
        // the returned tch tensor.
        Ok(tch::Tensor::from_ptr(out.cast()))
    }
}

/// `replicas` copies of `x` stacked along its first dimension (block `k` is
/// copy `k`), in `x`'s layout: a channels-last `x` gives channels-last
/// copies. libtorch's `repeat` returns a contiguous (NCHW) tensor whatever
/// the input's layout, so its copy of a channels-last batch transposes
/// every value, and a consumer that wants NHWC converts it back.
///
/// # Errors
/// [`crate::Error::InvalidArgument`] for `replicas < 1` or a 0-D `x`;
/// libtorch's error otherwise.
pub fn repeat_batch(x: &tch::Tensor, replicas: i64) -> Result<tch::Tensor> {
    const OP: &str = "memory::repeat_batch";
    if replicas < 1 || x.dim() == 0 {
        return Err(crate::Error::InvalidArgument {
            op: OP,
            message: format!(
                "{replicas} copies of a {}-D tensor (at least 1, of at least 1-D)",
                x.dim()
            ),
        });
    }
    if replicas == 1 {
        return Ok(x.shallow_clone());
    }
    let torch = |error: tch::TchError| crate::Error::Cpp {
        op: OP,
        message: error.to_string(),
    };
    if x.dim() == 4 && !x.is_contiguous() && is_channels_last(x)? {
        // NHWC memory is the contiguous [N, H, W, C] view: repeat that and
        // view it back, a plain copy that keeps the layout.
        return x
            .f_permute([0, 2, 3, 1])
            .and_then(|nhwc| nhwc.f_repeat([replicas, 1, 1, 1]))
            .and_then(|copies| copies.f_permute([0, 3, 1, 2]))
            .map_err(torch);
    }
    let mut repeats = vec![replicas];
    repeats.extend(std::iter::repeat_n(1, x.dim().saturating_sub(1)));
    x.f_repeat(repeats.as_slice()).map_err(torch)
}

/// Converts a 4-D parameter to channels-last in place (its data, and its
/// gradient when it has one), keeping its autograd identity
/// (`param.data = param.contiguous(channels_last)`). Returns whether
/// anything changed: tensors that are not 4-D, or already channels-last,
/// are left alone. Do it before optimizer state is built from the
/// parameter, so the state follows the layout.
pub fn set_channels_last_(parameter: &tch::Tensor) -> Result<bool> {
    let mut changed = 0_i32;
    // SAFETY: `parameter` is a live `at::Tensor`; `changed` outlives the call.
    unsafe {
        ffi::check(
            "set_channels_last_",
            ffi::esper_set_channels_last_(ffi::tensor_ptr(parameter), &mut changed),
        )?;
    }
    Ok(changed != 0)
}

/// Whether `tensor` is 4-D and contiguous in channels-last layout.
pub fn is_channels_last(tensor: &tch::Tensor) -> Result<bool> {
    let mut result = 0_i32;
    // SAFETY: `tensor` is a live `at::Tensor`; `result` outlives the call.
    unsafe {
        ffi::check(
            "is_channels_last",
            ffi::esper_is_channels_last(ffi::tensor_ptr(tensor), &mut result),
        )?;
    }
    Ok(result != 0)
}

/// Drops the gradient of every tensor (`param.grad = None`), as
/// `optimizer.zero_grad(set_to_none=True)`: the next backward writes fresh
/// gradients instead of adding into zeroed ones, which saves a zeroing
/// kernel per list and an accumulation kernel per parameter. Host-only; no
/// device work.
pub fn set_grads_to_none(tensors: &[tch::Tensor]) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let ptrs = ffi::tensor_ptrs(tensors);
    let len = i64::try_from(ptrs.len()).unwrap_or(i64::MAX);
    // SAFETY: `ptrs` holds the live tensors of `tensors`, length passed along.
    unsafe {
        ffi::check(
            "set_grads_to_none",
            ffi::esper_set_grads_to_none(ptrs.as_ptr(), len),
        )
    }
}

/// `tensor.pin_memory()` without a device: a page-locked copy of a host
/// tensor (the tensor itself, shared, when it already is), owned by the
/// calling thread's current CUDA device. tch passes `cuda:0` as the
/// (deprecated) device argument, which makes a process that works on another
/// GPU create a context on GPU 0 and prints a warning per call. Needs CUDA.
pub fn pin(tensor: &tch::Tensor) -> Result<tch::Tensor> {
    crate::cuda::ensure_available()?;
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `tensor` is borrowed for the call; on success `out` is a fresh
    // heap `at::Tensor*`, owned now by the returned tch tensor.
    unsafe {
        ffi::check(
            "memory::pin",
            ffi::esper_pin_memory(ffi::tensor_ptr(tensor), &mut out),
        )?;
        Ok(tch::Tensor::from_ptr(out.cast()))
    }
}

/// Whether `tensor` is in page-locked host memory (`false` without CUDA).
pub fn is_pinned(tensor: &tch::Tensor) -> bool {
    if !crate::cuda::is_available() {
        return false;
    }
    let mut pinned: i32 = 0;
    // SAFETY: `tensor` is borrowed for the call; `pinned` is a live out-parameter.
    let checked = unsafe {
        ffi::check(
            "memory::is_pinned",
            ffi::esper_is_pinned(ffi::tensor_ptr(tensor), &mut pinned),
        )
    };
    checked.is_ok() && pinned != 0
}
