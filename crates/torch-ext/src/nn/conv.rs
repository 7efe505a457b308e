//! [`conv3x3`]: the 3x3 convolution (stride 1, padding 1, no bias) from
//! run-time compiled kernels where they apply (see the parent module's
//! docs), libtorch's `conv2d` otherwise.

use tch::{Kind, Tensor};

use super::{fused_target, is_nhwc, kernels, overlapped_weight_grads, shim_tensor, torch};
use crate::error::Result;
use crate::ffi;

/// `conv2d(x, weight, stride 1, padding 1)` for a `3 x 3` weight without
/// bias, from run-time compiled kernels where they apply: a channels-last
/// CUDA input in f32 or under bf16 autocast, a multiple of four output
/// channels, and an image band that fits in shared memory, with or without
/// gradients (a frozen seed in an inference-mode validation pass takes the
/// same kernels as in training). libtorch's `conv2d` otherwise, with its
/// errors.
///
/// - The weight gradient: two kernels (see the module docs).
/// - The forward: a kernel for at most [`SMALL_CONV_INPUT_CHANNELS`](super::SMALL_CONV_INPUT_CHANNELS) input
///   channels (cuDNN's choice took 17 - 19 us for the Fashion-MNIST host's
///   first layer); the direct kernel on an sm_80+ GPU for multiples of
///   eight input and output channels, both at most
///   [`MAX_DIRECT_CONV_CHANNELS`](super::MAX_DIRECT_CONV_CHANNELS) (cuDNN's picks for the host's and seed's
///   other layers took about 13 us each with their TF32 layout
///   conversions); cuDNN otherwise.
/// - The input gradient: the same direct kernel run on the output gradient
///   with the weight flipped and transposed, where the channel counts fit
///   it; cuDNN otherwise.
///
/// The direct kernel and the tensor-core weight gradient multiply
/// TF32-rounded values and sum in f32, as cuDNN's TF32 convolutions do
/// (bf16 values are exact in TF32). For f32 they run only while libtorch's
/// cuDNN TF32 switch is on ([`crate::precision::set_allow_tf32`], on by
/// default); with it off an f32 convolution stays exact: cuDNN's forward
/// and input gradient, and the f32 weight-gradient kernel. Results match
/// libtorch's up to rounding.
///
/// # Shapes
/// `x: [B, C_in, H, W]`, `weight: [C_out, C_in, 3, 3]`; returns
/// `[B, C_out, H, W]`.
pub fn conv3x3(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    const OP: &str = "nn::conv3x3";
    let unfused = || {
        x.f_conv2d(weight, None::<&Tensor>, [1, 1], [1, 1], [1, 1], 1)
            .map_err(|error| torch(OP, error))
    };
    let Some((device, _)) = fused_target(x) else {
        return unfused();
    };
    let (x_size, w_size) = (x.size(), weight.size());
    let [_, c_in, h, w] = x_size[..] else {
        return unfused();
    };
    let [c_out, w_in, 3, 3] = w_size[..] else {
        return unfused();
    };
    let autocast = crate::autocast_state(crate::AutocastDevice::Cuda)?;
    let compute = if autocast.enabled {
        autocast.dtype
    } else {
        x.kind()
    };
    let kinds_fit = matches!(compute, Kind::Float | Kind::BFloat16)
        && matches!(weight.kind(), Kind::Float | Kind::BFloat16)
        && (autocast.enabled || weight.kind() == x.kind());
    // SAFETY: plain integer arguments.
    let fits = unsafe { ffi::esper_conv3x3_fits(h, w, c_in, c_out) } != 0;
    if !(kinds_fit
        && is_nhwc(x)
        && w_in == c_in
        && c_out % 4 == 0
        && weight.device() == x.device()
        && fits)
    {
        return unfused();
    }
    let vec4 = c_in % 4 == 0;
    let k = kernels(OP, device, compute == Kind::BFloat16, vec4)?;
    // The five general kernels, then the nine compile-time-sized direct
    // ones (`kernels::DIRECT_FIXED_KERNELS`' order).
    let mut handles = [std::ptr::null_mut(); 14];
    let general = [
        k.conv_partial.raw(),
        k.conv_reduce.raw(),
        k.conv_forward_small.raw(),
        k.conv_direct.raw(),
        k.conv_wgrad_mma.raw(),
    ];
    let sized = k.conv_direct_fixed.iter().map(|kernel| kernel.raw());
    for (slot, kernel) in handles.iter_mut().zip(general.into_iter().chain(sized)) {
        *slot = kernel;
    }
    // SAFETY: as in `batch_norm_relu`.
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_conv3x3(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                i32::from(compute == Kind::BFloat16),
                if vec4 { 4 } else { 1 },
                i32::from(overlapped_weight_grads()),
                handles.as_ptr(),
                out,
            )
        })
    }
}
