//! [`linear`]: a fully connected layer over the last dimension (see the
//! parent module's docs) whose backward writes the weight and bias
//! gradients in the parameters' dtype, where libtorch's op applies
//! otherwise.

use tch::{Device, Kind, Tensor};

use super::{MAX_FUSED_LINEAR_OUT, fused_kernels_enabled, kernels, shadow, shim_tensor, torch};
use crate::autocast::{AutocastDevice, autocast_state};
use crate::error::Result;
use crate::ffi;

/// `linear(x, weight, bias)` = `x weightᵀ + bias` over the last dimension,
/// as an autograd function with its own backward where it applies (see the
/// module docs), libtorch's `linear` otherwise.
///
/// The own path takes a CUDA input of at least two dimensions in `f32` or
/// `bf16` (or any of those under CUDA autocast to `bf16`, whose casts it
/// applies itself), an `f32` or `bf16` weight `[out, in]` (outside autocast
/// in `x`'s dtype) and bias `[out]` in the weight's dtype, with `out` a
/// multiple of four up to [`MAX_FUSED_LINEAR_OUT`], and something that
/// wants a gradient. Its forward is libtorch's `linear` on the compute
/// dtype; its backward computes the input gradient as one product, the
/// weight gradient as one product written in the weight's dtype (an `f32`
/// weight under `bf16` autocast gets cuBLAS's `f32` result directly,
/// where libtorch rounds it to `bf16` and casts it back), and the bias
/// gradient as column sums in `f32` from a run-time compiled kernel and a
/// fixed-order reduction (deterministic), where libtorch runs a generic
/// sum reduction and a cast. In `bf16` with an `f32` weight (and bias),
/// feature counts that are multiples of eight and a device of compute
/// capability 8.0 or newer, the weight and bias gradients are instead one
/// tensor-core kernel over the rows (per-split partial sums of `gᵀ x` and
/// of `g`'s columns, in `f32`) and one fixed-order reduction: exact sums
/// of the bf16 products up to `f32` accumulation, deterministic.
/// Results match libtorch's up to float rounding.
/// Under `bf16` autocast, an `f32` weight or bias with a shadow in the
/// thread's [`Bf16Shadows`](super::Bf16Shadows) scope is read from the
/// shadow rather than cast (the same bits).
///
/// # Shapes
/// `x: [..., in]`, `weight: [out, in]`, `bias: [out]`; returns
/// `[..., out]` in the compute dtype (as libtorch's `linear`).
///
/// # Errors
/// libtorch's error for tensors that do not fit together; [`Error::Cpp`](crate::Error::Cpp)
/// when the kernels cannot be compiled or launched.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "nn::linear";
    let Some((device, bf16)) = linear_target(x, weight, bias) else {
        return x.f_linear(weight, bias).map_err(|error| torch(OP, error));
    };
    let k = kernels(OP, device, bf16, true)?;
    // The bf16 build's weight-and-bias gradient kernel (null in the f32
    // build).
    let wgrad = k
        .linear_wgrad
        .as_ref()
        .map_or(std::ptr::null_mut(), |kernel| kernel.raw());
    let handles = [k.col_sum.raw(), k.conv_reduce.raw(), wgrad];
    let bias_ptr = bias.map_or(std::ptr::null_mut(), ffi::tensor_ptr);
    // Under bf16, an f32 weight's and bias's shadows where a scope holds
    // them (super::shadow); the shim casts the rest.
    let cast = |t: &Tensor| {
        (bf16 && t.kind() == Kind::Float)
            .then(|| shadow::lookup(t))
            .flatten()
    };
    let weight_c = cast(weight);
    let bias_c = bias.and_then(cast);
    let weight_c_ptr = weight_c
        .as_ref()
        .map_or(std::ptr::null_mut(), ffi::tensor_ptr);
    let bias_c_ptr = bias_c
        .as_ref()
        .map_or(std::ptr::null_mut(), ffi::tensor_ptr);
    // SAFETY: every tensor pointer is live for the call (a null bias or
    // shadow is allowed); the kernels are live (the cache never drops them, so the
    // autograd node's backward may use them later).
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_linear(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                bias_ptr,
                weight_c_ptr,
                bias_c_ptr,
                i32::from(bf16),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// The CUDA device and whether the compute dtype is `bf16`, where
/// [`linear`]'s own path applies.
fn linear_target(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Option<(usize, bool)> {
    if !fused_kernels_enabled() || x.dim() < 2 {
        return None;
    }
    let Device::Cuda(device) = x.device() else {
        return None;
    };
    let floating = |kind: Kind| matches!(kind, Kind::Float | Kind::BFloat16);
    let autocast = autocast_state(AutocastDevice::Cuda).ok()?;
    let compute = if autocast.enabled {
        autocast.dtype
    } else {
        x.kind()
    };
    let kinds_fit = floating(compute)
        && floating(x.kind())
        && floating(weight.kind())
        && (autocast.enabled || weight.kind() == x.kind())
        && bias.is_none_or(|b| b.kind() == weight.kind());
    let (w_size, x_size) = (weight.size(), x.size());
    let [out, inputs] = w_size[..] else {
        return None;
    };
    let shapes_fit = x_size.last() == Some(&inputs)
        && out >= 4
        && out % 4 == 0
        && out <= MAX_FUSED_LINEAR_OUT
        && bias.is_none_or(|b| b.size() == [out]);
    let on_device = weight.device() == x.device() && bias.is_none_or(|b| b.device() == x.device());
    let wants_grad =
        x.requires_grad() || weight.requires_grad() || bias.is_some_and(Tensor::requires_grad);
    (kinds_fit && shapes_fit && on_device && wants_grad)
        .then_some((device, compute == Kind::BFloat16))
}
