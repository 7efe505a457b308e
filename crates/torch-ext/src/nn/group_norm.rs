//! [`group_norm_relu`]: `relu(group_norm(x))` over a channels-last tensor
//! (see the parent module's docs), and [`group_norm_relu_add`], the same
//! with a seed's residual added inside the forward kernel; run-time compiled
//! kernels where they apply, libtorch's ops otherwise.

use std::ffi::c_void;

use tch::Tensor;

use super::{four_channels, fused_target, is_nhwc, kernels, per_channel_f32, shim_tensor, torch};
use crate::error::{Error, Result};
use crate::ffi;

/// Most groups [`group_norm_relu`]'s kernels take.
pub const MAX_FUSED_GROUPS: i64 = 64;

/// `relu(group_norm(x, groups, weight, bias, eps))`, the fused kernels where
/// they apply (see the module docs): a channels-last CUDA tensor of `f32`
/// or `bf16`, a multiple of four channels, at most `4 * 256`, in at most
/// [`MAX_FUSED_GROUPS`] groups (groups of a multiple of four channels take
/// the quad kernels, narrower ones the per-channel kernels), `weight` and `bias`
/// contiguous `f32` `[C]` on `x`'s device. libtorch's `group_norm` and
/// `relu` otherwise. The fused output has `x`'s dtype (libtorch's
/// `group_norm` under autocast returns `f32`).
///
/// # Shapes
/// `x: [B, C, H, W]`, `weight`, `bias` `[C]`; returns `[B, C, H, W]`.
///
/// # Errors
/// libtorch's error for tensors that do not fit together; [`Error::Cpp`]
/// when the kernels cannot be compiled or launched.
pub fn group_norm_relu(
    x: &Tensor,
    groups: i64,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "nn::group_norm_relu";
    match fused_plan(OP, x, groups, weight, bias)? {
        Some(handles) => launch(OP, x, None, groups, weight, bias, eps, &handles),
        None => x
            .f_group_norm(groups, Some(weight), Some(bias), eps, true)
            .and_then(|y| y.f_relu())
            .map_err(|error| torch(OP, error)),
    }
}

/// `residual + relu(group_norm(x, groups, weight, bias, eps))`, a seed's
/// residual block (`x + ReLU(GN(conv x))`), with the add inside the fused
/// forward kernel where [`group_norm_relu`]'s kernels apply and `residual`
/// has `x`'s dtype and is channels-last on its device: one pass over the
/// activations fewer forward, and no add kernel. The sum is rounded as
/// libtorch's add of the two tensors rounds it, so the result is the
/// unfused one bit for bit; the residual's gradient is the output's.
/// Otherwise [`group_norm_relu`] (fused where it applies) and libtorch's
/// add, whose type promotion applies: under autocast an `f32` residual and
/// a `bf16` normalised output sum to `f32`.
///
/// # Shapes
/// `x` and `residual`: `[B, C, H, W]`, `weight`, `bias` `[C]`; returns
/// `[B, C, H, W]`.
///
/// # Errors
/// [`Error::InvalidArgument`] where `residual`'s shape is not `x`'s (no
/// broadcasting); otherwise as [`group_norm_relu`].
///
/// # Examples
///
/// ```ignore
/// use tch::{Device, Kind, Tensor};
/// let x = Tensor::randn([2, 8, 4, 4], (Kind::Float, Device::Cpu));
/// let (w, b) = (Tensor::ones([8], (Kind::Float, Device::Cpu)), Tensor::zeros([8], (Kind::Float, Device::Cpu)));
/// let y = torch_ext::nn::group_norm_relu_add(&x, &x, 8, &w, &b, 1e-5)?; // x + relu(gn(x))
/// # Ok::<(), torch_ext::Error>(())
/// ```
pub fn group_norm_relu_add(
    x: &Tensor,
    residual: &Tensor,
    groups: i64,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "nn::group_norm_relu_add";
    if residual.size() != x.size() {
        return Err(Error::InvalidArgument {
            op: OP,
            message: format!(
                "the residual's shape {:?} is not the input's {:?}",
                residual.size(),
                x.size()
            ),
        });
    }
    let channels = x.size().get(1).copied().unwrap_or(0);
    let fits = residual.kind() == x.kind()
        && residual.device() == x.device()
        && is_nhwc(residual)
        && four_channels(residual, channels);
    if fits && let Some(handles) = fused_plan(OP, x, groups, weight, bias)? {
        return launch(OP, x, Some(residual), groups, weight, bias, eps, &handles);
    }
    let y = group_norm_relu(x, groups, weight, bias, eps)?;
    residual.f_add(&y).map_err(|error| torch(OP, error))
}

/// The kernels' handles (forward, backward, weight-gradient reduction) for
/// `x` where the fused kernels take it (see [`group_norm_relu`]): the quad
/// kernels for groups of a multiple of four channels, the per-channel ones
/// otherwise. `None` where libtorch's ops must run.
fn fused_plan(
    op: &'static str,
    x: &Tensor,
    groups: i64,
    weight: &Tensor,
    bias: &Tensor,
) -> Result<Option<[*mut c_void; 3]>> {
    let channels = x.size().get(1).copied().unwrap_or(0);
    let shape_ok = (1..=MAX_FUSED_GROUPS).contains(&groups)
        && channels % groups == 0
        && channels % 4 == 0
        && channels <= 1024;
    let fused = fused_target(x).filter(|_| {
        shape_ok
            && [weight, bias]
                .into_iter()
                .all(|t| per_channel_f32(t, channels, x))
            && is_nhwc(x)
            && four_channels(x, channels)
    });
    let Some((device, bf16)) = fused else {
        return Ok(None);
    };
    let k = kernels(op, device, bf16, true)?;
    Ok(Some(if (channels / groups) % 4 == 0 {
        [k.gn_forward.raw(), k.gn_backward.raw(), k.conv_reduce.raw()]
    } else {
        [
            k.gn_forward_narrow.raw(),
            k.gn_backward_narrow.raw(),
            k.conv_reduce.raw(),
        ]
    }))
}

/// The fused kernels on `x` (with `residual` added in the forward kernel
/// when given), through the shim's autograd function.
#[allow(clippy::too_many_arguments)]
fn launch(
    op: &'static str,
    x: &Tensor,
    residual: Option<&Tensor>,
    groups: i64,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    handles: &[*mut c_void; 3],
) -> Result<Tensor> {
    // SAFETY: as in `batch_norm_relu`; the handles are the cached kernels'
    // (never unloaded), the residual, when given, is a live tensor for the
    // call.
    unsafe {
        shim_tensor(op, |out| {
            ffi::esper_group_norm_relu(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                ffi::tensor_ptr(bias),
                residual.map_or(std::ptr::null_mut(), ffi::tensor_ptr),
                groups,
                eps,
                handles.as_ptr(),
                out,
            )
        })
    }
}
