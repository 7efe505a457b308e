//! [`layer_norm`]: layer normalisation over the last dimension (see the
//! parent module's docs), from run-time compiled kernels where they apply
//! and libtorch's `layer_norm` otherwise; [`layer_norm_bf16`] with a `bf16`
//! output, and [`layer_norm_fork`] for a layer norm on a residual stream.

use std::ffi::c_void;

use tch::{Device, Kind, Tensor};

use super::{
    MAX_FUSED_LAYER_NORM_WIDTH, four_channels, fused_kernels_enabled, kernels, per_channel_f32,
    shim_tensor, torch,
};
use crate::error::Result;
use crate::ffi;

/// `layer_norm(x, [C], weight, bias, eps)` over the last dimension, the
/// fused kernels where they apply (see the module docs), libtorch's
/// `layer_norm` otherwise.
///
/// The fused path takes a dense CUDA `f32` tensor, or a `bf16` one while
/// CUDA autocast is off (under autocast libtorch's `layer_norm` computes in
/// `f32` and returns `f32`, so a `bf16` input takes libtorch's op there), a
/// last dimension `C` of a multiple of four up to [`MAX_FUSED_LAYER_NORM_WIDTH`],
/// and `weight` and `bias` as contiguous `f32` `[C]` tensors on `x`'s
/// device. Its output has `x`'s dtype, as libtorch's outside autocast.
///
/// # Shapes
/// `x: [..., C]`, `weight`, `bias` `[C]`; returns `x`'s shape.
///
/// # Errors
/// libtorch's error for tensors that do not fit together; [`Error::Cpp`](crate::Error::Cpp)
/// when the kernels cannot be compiled or launched.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    layer_norm_as(x, weight, bias, eps, false)
}

/// [`layer_norm`] with a `bf16` output: the values of [`layer_norm`] cast
/// to `bf16` (rounded to nearest even), with the cast inside the kernel
/// where the fused path takes an `f32` input (its backward then takes the
/// `bf16` output gradient and computes in `f32`, as [`layer_norm`]'s does
/// after the cast's backward). Elsewhere, [`layer_norm`] and a cast.
///
/// Meant for a layer norm whose output feeds only linear layers computing
/// in `bf16` (under `bf16` autocast, which would cast it there): one pass
/// over the rows instead of two, both ways.
///
/// # Shapes
/// As [`layer_norm`]; returns `bf16`.
///
/// # Errors
/// As [`layer_norm`].
pub fn layer_norm_bf16(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    layer_norm_as(x, weight, bias, eps, true)
}

/// `(x, layer_norm(x))` (or `(x, layer_norm_bf16(x))` with `bf16_out`) as
/// one autograd node, for a layer norm on a residual stream that goes on
/// past it: use the first output for the stream. The backward then adds
/// the stream's gradient into the input gradient inside the layer norm's
/// backward kernel, where using `x` twice would leave autograd to add the
/// two gradients in a pass of its own. The first output is a view of `x`
/// (no copy). Where the fused kernels do not apply (see [`layer_norm`]),
/// `(x, layer_norm(x))` from libtorch's op, with autograd's sum.
///
/// # Shapes
/// As [`layer_norm`]; returns `(x's shape, x's shape)`.
///
/// # Errors
/// As [`layer_norm`].
pub fn layer_norm_fork(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    bf16_out: bool,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "nn::layer_norm_fork";
    let Some(handles) = fused_handles(OP, x, weight, bias, bf16_out)? else {
        return Ok((
            x.shallow_clone(),
            libtorch_layer_norm(OP, x, weight, bias, eps, bf16_out)?,
        ));
    };
    let mixed = bf16_out && x.kind() == Kind::Float;
    let mut pass: *mut c_void = std::ptr::null_mut();
    let mut y: *mut c_void = std::ptr::null_mut();
    // SAFETY: every tensor pointer is live for the call and the kernels
    // are live (the cache never drops them); on success each out pointer
    // holds a fresh heap `at::Tensor*` (tch's `C_tensor`) that `from_ptr`
    // takes over, and on failure neither is set.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_layer_norm_fork(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                ffi::tensor_ptr(bias),
                eps,
                i32::from(mixed),
                handles.as_ptr(),
                &mut pass,
                &mut y,
            ),
        )?;
        Ok((Tensor::from_ptr(pass.cast()), Tensor::from_ptr(y.cast())))
    }
}

fn layer_norm_as(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    bf16_out: bool,
) -> Result<Tensor> {
    const OP: &str = "nn::layer_norm";
    let Some(handles) = fused_handles(OP, x, weight, bias, bf16_out)? else {
        return libtorch_layer_norm(OP, x, weight, bias, eps, bf16_out);
    };
    let mixed = bf16_out && x.kind() == Kind::Float;
    // SAFETY: as in `batch_norm_relu`.
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_layer_norm(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                ffi::tensor_ptr(bias),
                eps,
                i32::from(mixed),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// The fused path's kernels (forward, backward, reduction) where it
/// applies to these tensors, `None` where libtorch's op runs instead.
fn fused_handles(
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    bf16_out: bool,
) -> Result<Option<[*mut c_void; 3]>> {
    let width = x.size().last().copied().unwrap_or(0);
    let per_channel_ok = [weight, bias]
        .into_iter()
        .all(|t| per_channel_f32(t, width, x));
    let shape_ok = width >= 4
        && width % 4 == 0
        && width <= MAX_FUSED_LAYER_NORM_WIDTH
        && i64::try_from(x.numel()).is_ok_and(|n| n / width <= i64::from(i32::MAX));
    let fused = layer_norm_target(x)
        .filter(|_| per_channel_ok && shape_ok && x.is_contiguous() && four_channels(x, width));
    let k = match fused {
        Some((device, bf16)) => Some((kernels(op, device, bf16, true)?, bf16)),
        None => None,
    };
    // The bf16 output from the f32 build's `_bf16_out` kernels; a bf16
    // input already gives bf16.
    Ok(match &k {
        Some((k, false)) if bf16_out => k
            .ln_bf16_out
            .as_ref()
            .map(|(forward, backward)| [forward.raw(), backward.raw(), k.conv_reduce.raw()]),
        Some((k, _)) => Some([k.ln_forward.raw(), k.ln_backward.raw(), k.conv_reduce.raw()]),
        None => None,
    })
}

/// libtorch's `layer_norm` over the last dimension, cast to `bf16` where
/// `bf16_out`.
fn libtorch_layer_norm(
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    bf16_out: bool,
) -> Result<Tensor> {
    let width = x.size().last().copied().unwrap_or(0);
    let y = x
        .f_layer_norm([width].as_slice(), Some(weight), Some(bias), eps, true)
        .map_err(|error| torch(op, error))?;
    if bf16_out {
        y.f_to_kind(Kind::BFloat16)
            .map_err(|error| torch(op, error))
    } else {
        Ok(y)
    }
}

/// [`fused_target`] for [`layer_norm`]: any rank of at least one, and a
/// `bf16` input only while CUDA autocast is off.
fn layer_norm_target(x: &Tensor) -> Option<(usize, bool)> {
    if !fused_kernels_enabled() || x.dim() == 0 {
        return None;
    }
    let Device::Cuda(device) = x.device() else {
        return None;
    };
    match x.kind() {
        Kind::Float => Some((device, false)),
        Kind::BFloat16 => {
            let autocast = crate::autocast::autocast_state(crate::autocast::AutocastDevice::Cuda);
            autocast
                .is_ok_and(|state| !state.enabled)
                .then_some((device, true))
        }
        _ => None,
    }
}
