//! [`batch_norm_relu_pool2x2`]: a CNN block's batch norm, ReLU and 2x2
//! max-pool as one autograd node where it applies (see the parent module's
//! docs), [`super::batch_norm_relu`] then [`super::max_pool2x2`] otherwise.

use tch::Tensor;

use super::{MAX_FUSED_CHANNELS, NormArgs, batch_norm_relu, fused_target, is_nhwc, max_pool2x2};
use crate::error::Result;
use crate::ffi;

/// `max_pool2d(relu(batch_norm(x, ...)), 2, 2)` (floor): a convolutional
/// block's normalisation, activation and pool.
///
/// In training, on a channels-last CUDA `x` of `f32` or `bf16` with at most
/// [`MAX_FUSED_CHANNELS`] channels, at least 2 x 2 pixels and more than one
/// value a channel, with `weight`, `bias` and the running statistics
/// contiguous `f32` `[C]` on its device, it runs as one node of three
/// kernels forward (the statistics, whose partials every block of the
/// second adds up before it writes each pool window's maximum) and two
/// backward (each recomputes a window's activations and argmax from the
/// saved input and routes the pooled gradient through the pool and the
/// ReLU itself). The full-size activation is neither written nor read:
/// forward saves one pass over it and the pool's kernel, backward the
/// pool's kernel and its full-size gradient. The running statistics, when
/// given, are updated in place, as by [`batch_norm_relu`].
///
/// Anything else (evaluation, the CPU, other layouts or dtypes, a 1-pixel
/// side) runs [`batch_norm_relu`] and then [`max_pool2x2`], with the same
/// results up to float rounding (the fused sums are taken in another fixed
/// order; the pool's choice, the first maximum and a NaN over numbers, is
/// the same).
///
/// # Shapes
/// `x: [B, C, H, W]`, `weight`, `bias` and the running statistics `[C]`;
/// returns `[B, C, H / 2, W / 2]` in `x`'s layout and dtype.
///
/// # Errors
/// libtorch's error for tensors that do not fit together (on the unfused
/// path); [`crate::Error::Cpp`] when the kernels cannot be compiled or
/// launched.
///
/// # Examples
///
/// ```ignore
/// use tch::{Device, Kind, Tensor};
/// let opts = (Kind::Float, Device::Cpu);
/// let x = Tensor::randn([2, 8, 6, 6], opts);
/// let (weight, bias) = (Tensor::ones([8], opts), Tensor::zeros([8], opts));
/// let y = torch_ext::nn::batch_norm_relu_pool2x2(&x, &weight, &bias, None, None, true, 0.1, 1e-5)?;
/// assert_eq!(y.size(), [2, 8, 3, 3]);
/// # Ok::<(), torch_ext::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu_pool2x2(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    train: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let size = x.size();
    let fits = match size[..] {
        [n, c, h, w] => {
            (1..=MAX_FUSED_CHANNELS).contains(&c)
                && h >= 2
                && w >= 2
                && n.saturating_mul(h).saturating_mul(w) > 1
        }
        _ => false,
    };
    let args = NormArgs {
        op: "nn::batch_norm_relu_pool2x2",
        x,
        weight,
        bias,
        running_mean,
        running_var,
        momentum,
        eps,
    };
    let fused = fused_target(x).filter(|_| train && fits && args.per_channel_ok() && is_nhwc(x));
    let Some(target) = fused else {
        let y = batch_norm_relu(
            x,
            weight,
            bias,
            running_mean,
            running_var,
            train,
            momentum,
            eps,
        )?;
        return max_pool2x2(&y);
    };
    args.run_training(target, ffi::esper_batch_norm_relu_pool2, |k| {
        [
            k.bn_stats.raw(),
            k.bn_pool_forward.raw(),
            k.bn_pool_reduce.raw(),
            k.bn_pool_apply.raw(),
        ]
    })
}
