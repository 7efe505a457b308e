//! [`squeeze_excite`]: channel attention (a CNN seed's squeeze-and-excite
//! block) as one kernel forward and two backward where they apply (see the
//! parent module's docs), libtorch's ops otherwise.

use tch::{Kind, Tensor};

use super::{fused_target, is_nhwc, kernels, shim_tensor, torch};
use crate::error::{Error, Result};
use crate::ffi;

/// Most channels [`squeeze_excite`]'s kernels take (a block's threads hold
/// at least one pixel row of every channel); wider tensors use libtorch's
/// ops.
pub const MAX_FUSED_EXCITE_CHANNELS: i64 = 256;

/// Most hidden units (the squeeze's outputs) [`squeeze_excite`]'s kernels
/// take; more use libtorch's ops.
pub const MAX_FUSED_EXCITE_HIDDEN: i64 = 64;

/// `x · sigmoid(excite · relu(squeeze · mean_hw(x)) + excite_bias)`, the
/// gate broadcast over each image's pixels: squeeze-and-excite channel
/// attention.
///
/// The fused kernels run where they apply: `x` a channels-last CUDA tensor
/// of `f32` or `bf16` with at most [`MAX_FUSED_EXCITE_CHANNELS`] channels,
/// the three parameters contiguous `f32` on its device with at most
/// [`MAX_FUSED_EXCITE_HIDDEN`] hidden units. One kernel forward (a block an
/// image: the channel means, both products, the ReLU and sigmoid in `f32`,
/// then the output); backward, one kernel for the input gradient and each
/// image's share of the parameter gradients, then a fixed-order sum of the
/// shares, so results are deterministic. libtorch runs about 7 kernels
/// forward and 15 backward for it. Anything else (the CPU, `f64`, wider
/// layers) takes libtorch's mean, [`super::linear`], ReLU, sigmoid and
/// product, with the same results up to float rounding (under `bf16`
/// autocast the fused path keeps the products and the gate in `f32`).
///
/// # Shapes
/// `x: [B, C, H, W]`, `squeeze: [R, C]`, `excite: [C, R]`,
/// `excite_bias: [C]`; returns `[B, C, H, W]` in `x`'s dtype (channels-last
/// when fused).
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
/// let (squeeze, excite) = (Tensor::randn([2, 8], opts), Tensor::randn([8, 2], opts));
/// let y = torch_ext::nn::squeeze_excite(&x, &squeeze, &excite, &Tensor::zeros([8], opts))?;
/// assert_eq!(y.size(), [2, 8, 4, 4]);
/// # Ok::<(), torch_ext::Error>(())
/// ```
pub fn squeeze_excite(
    x: &Tensor,
    squeeze: &Tensor,
    excite: &Tensor,
    excite_bias: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "nn::squeeze_excite";
    let (batch, channels, hidden) = check_shapes(x, squeeze, excite, excite_bias)?;
    let fused = fused_target(x).filter(|_| {
        channels <= MAX_FUSED_EXCITE_CHANNELS
            && hidden <= MAX_FUSED_EXCITE_HIDDEN
            && is_nhwc(x)
            && [squeeze, excite, excite_bias]
                .into_iter()
                .all(|t| t.kind() == Kind::Float && t.device() == x.device() && t.is_contiguous())
    });
    let Some((device, bf16)) = fused else {
        let pooled = x
            .f_mean_dim([2_i64, 3].as_slice(), false, None)
            .map_err(|error| torch(OP, error))?; // [B, C]
        let hidden = super::linear(&pooled, squeeze, None)?
            .f_relu()
            .map_err(|error| torch(OP, error))?; // [B, R]
        let gate = super::linear(&hidden, excite, Some(excite_bias))?
            .f_sigmoid()
            .and_then(|gate| gate.f_reshape([batch, channels, 1, 1]))
            .map_err(|error| torch(OP, error))?;
        return x.f_mul(&gate).map_err(|error| torch(OP, error));
    };
    let k = kernels(OP, device, bf16, true)?;
    let handles = [k.se_forward.raw(), k.se_backward.raw(), k.conv_reduce.raw()];
    // SAFETY: every tensor pointer is live for the call; the handles are
    // the cached kernels' (never unloaded, so the autograd node's backward
    // may use them later).
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_squeeze_excite(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(squeeze),
                ffi::tensor_ptr(excite),
                ffi::tensor_ptr(excite_bias),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// `(B, C, R)` where the shapes fit together (see [`squeeze_excite`]).
fn check_shapes(
    x: &Tensor,
    squeeze: &Tensor,
    excite: &Tensor,
    excite_bias: &Tensor,
) -> Result<(i64, i64, i64)> {
    let shape = x.size();
    let [batch, channels, height, width] = shape.as_slice() else {
        return Err(Error::InvalidArgument {
            op: "nn::squeeze_excite",
            message: format!("x of shape {shape:?}; expected [B, C, H, W]"),
        });
    };
    let hidden = squeeze.size().first().copied().unwrap_or(0);
    let fits = *batch >= 1
        && *channels >= 1
        && *height >= 1
        && *width >= 1
        && hidden >= 1
        && squeeze.size() == [hidden, *channels]
        && excite.size() == [*channels, hidden]
        && excite_bias.size() == [*channels];
    if !fits {
        return Err(Error::InvalidArgument {
            op: "nn::squeeze_excite",
            message: format!(
                "x {shape:?}, squeeze {:?}, excite {:?}, bias {:?}; expected [B, C, H, W], \
                 [R, C], [C, R], [C] with every size at least 1",
                squeeze.size(),
                excite.size(),
                excite_bias.size()
            ),
        });
    }
    Ok((*batch, *channels, hidden))
}
