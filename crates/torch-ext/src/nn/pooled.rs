//! [`pooled_linear`]: a classifier head, the global average over each
//! image followed by a fully connected layer, as one kernel each way where
//! it applies (see the parent module's docs), libtorch's ops otherwise.

use tch::{Kind, Tensor};

use super::{fused_target, is_nhwc, kernels, shim_tensor, torch};
use crate::autocast::{AutocastDevice, autocast_state};
use crate::error::{Error, Result};
use crate::ffi;

/// Most channels [`pooled_linear`]'s kernels take; wider inputs use
/// libtorch's ops.
pub const MAX_FUSED_POOLED_CHANNELS: i64 = 1024;

/// Most outputs (classes) [`pooled_linear`]'s kernels take; more use
/// libtorch's ops.
pub const MAX_FUSED_POOLED_OUTPUTS: i64 = 64;

/// `mean_hw(x) weightᵀ + bias`: each image's channel means over its pixels
/// through a fully connected layer, the usual classifier head of a CNN.
///
/// The fused kernels run where they apply: `x` a channels-last CUDA tensor,
/// `f32` outside autocast or `bf16` under CUDA autocast to `bf16`, with at
/// most [`MAX_FUSED_POOLED_CHANNELS`] channels; `weight` and `bias`
/// contiguous `f32` on its device with at most [`MAX_FUSED_POOLED_OUTPUTS`]
/// outputs. Forward is one kernel (a block an image: the means, then the
/// products, in `f32`); backward is one kernel (a block an image writes
/// the input gradient, the rest the weight and bias gradients, a block an
/// output and 32 columns, its warps splitting the images and their sums
/// added in a fixed order, so results are deterministic). libtorch runs a mean reduction and a GEMM forward, and
/// two GEMMs, a sum reduction and two element-wise kernels backward.
/// Anything else (the CPU, other dtypes, no bias, wider layers) takes
/// libtorch's mean and [`super::linear`], with the same results up to float
/// rounding.
///
/// # Shapes
/// `x: [B, C, H, W]`, `weight: [K, C]`, `bias: [K]`; returns `[B, K]` in
/// `x`'s dtype.
///
/// # Errors
/// [`Error::InvalidArgument`] for shapes that do not fit together (checked
/// before anything runs); [`Error::Cpp`] when the kernels cannot be
/// compiled or launched, or libtorch's ops fail.
///
/// # Examples
///
/// ```ignore
/// use tch::{Device, Kind, Tensor};
/// let opts = (Kind::Float, Device::Cpu);
/// let x = Tensor::randn([2, 8, 4, 4], opts);
/// let (weight, bias) = (Tensor::randn([10, 8], opts), Tensor::zeros([10], opts));
/// let logits = torch_ext::nn::pooled_linear(&x, &weight, Some(&bias))?;
/// assert_eq!(logits.size(), [2, 10]);
/// # Ok::<(), torch_ext::Error>(())
/// ```
pub fn pooled_linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "nn::pooled_linear";
    let (channels, outputs) = check_shapes(x, weight, bias)?;
    let fused = bias.and_then(|bias| {
        let target = fused_target(x)?;
        let fits = channels <= MAX_FUSED_POOLED_CHANNELS
            && outputs <= MAX_FUSED_POOLED_OUTPUTS
            && is_nhwc(x)
            && compute_fits(x)
            && [weight, bias]
                .into_iter()
                .all(|t| t.kind() == Kind::Float && t.device() == x.device() && t.is_contiguous());
        fits.then_some((target, bias))
    });
    let Some(((device, bf16), bias)) = fused else {
        let pooled = x
            .f_mean_dim([2_i64, 3].as_slice(), false, None)
            .map_err(|error| torch(OP, error))?; // [B, C]
        return super::linear(&pooled, weight, bias);
    };
    let k = kernels(OP, device, bf16, true)?;
    let handles = [k.pooled_forward.raw(), k.pooled_backward.raw()];
    // SAFETY: every tensor pointer is live for the call; the handles are
    // the cached kernels' (never unloaded, so the autograd node's backward
    // may use them later).
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_pooled_linear(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                ffi::tensor_ptr(bias),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// Whether `x`'s dtype is the one libtorch's composition would compute in:
/// `f32` outside autocast, `bf16` under CUDA autocast to `bf16` (an `f32`
/// input there would give `bf16` logits, which the kernels do not write).
fn compute_fits(x: &Tensor) -> bool {
    match autocast_state(AutocastDevice::Cuda) {
        Ok(state) if state.enabled => state.dtype == Kind::BFloat16 && x.kind() == Kind::BFloat16,
        Ok(_) => x.kind() == Kind::Float,
        Err(_) => false,
    }
}

/// `(C, K)` where the shapes fit together (see [`pooled_linear`]).
fn check_shapes(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<(i64, i64)> {
    let shape = x.size();
    let [batch, channels, height, width] = shape.as_slice() else {
        return Err(Error::InvalidArgument {
            op: "nn::pooled_linear",
            message: format!("x of shape {shape:?}; expected [B, C, H, W]"),
        });
    };
    let outputs = weight.size().first().copied().unwrap_or(0);
    let fits = *batch >= 1
        && *channels >= 1
        && *height >= 1
        && *width >= 1
        && outputs >= 1
        && weight.size() == [outputs, *channels]
        && bias.is_none_or(|b| b.size() == [outputs]);
    if !fits {
        return Err(Error::InvalidArgument {
            op: "nn::pooled_linear",
            message: format!(
                "x {shape:?}, weight {:?}, bias {:?}; expected [B, C, H, W], [K, C], [K] with \
                 every size at least 1",
                weight.size(),
                bias.map(Tensor::size)
            ),
        });
    }
    Ok((*channels, outputs))
}
