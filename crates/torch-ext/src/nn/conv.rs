//! [`conv3x3`]: the 3x3 convolution from run-time compiled kernels where
//! they apply (see the parent module's docs), and [`conv3x3_with_stats`]:
//! the same, with a batch norm's statistics of its output taken in the
//! first layer's forward kernel ([`BatchStats`]), which
//! [`super::batch_norm_relu_pool2x2_with_stats`] reads instead of running
//! its statistics pass.

use std::ffi::c_void;

use tch::{Kind, Tensor};

use super::kernels::Kernels;
use super::{SMALL_CONV_INPUT_CHANNELS, fused_target, is_nhwc, kernels, shim_tensor, torch};
use crate::error::Result;
use crate::ffi;

/// Most blocks the statistics epilogue splits a batch into (so many partial
/// sums the batch norm's blocks add up).
const MAX_STATS_BLOCKS: i64 = 1024;

/// A batch norm's statistics of one convolution output, taken in the
/// convolution's kernel: per block of pixels, every channel's sums of
/// `y - k` and `(y - k)^2` (`k` the output at pixel 0), the partial sums
/// the batch norm's own statistics pass would write. They belong to the
/// tensor [`conv3x3_with_stats`] returned beside them; the batch norm
/// checks that it is given that tensor.
#[derive(Debug)]
pub struct BatchStats {
    partials: Tensor,
    /// The output they describe: its data pointer and shape.
    output: (usize, Vec<i64>),
}

impl BatchStats {
    /// The partial sums (f32 `[blocks · C · 2]`) where `x` is the output
    /// they were taken from; `None` for any other tensor.
    pub(super) fn partials_of(&self, x: &Tensor) -> Option<&Tensor> {
        (self.output.0 == x.data_ptr() as usize && self.output.1 == x.size())
            .then_some(&self.partials)
    }
}

/// `conv2d(x, weight, stride 1, padding 1)` for a `3 x 3` weight without
/// bias, from run-time compiled kernels where they apply: a channels-last
/// CUDA input in f32 or under bf16 autocast, a multiple of four output
/// channels, and an image band that fits in shared memory, with or without
/// gradients (a frozen seed in an inference-mode validation pass takes the
/// same kernels as in training). libtorch's `conv2d` otherwise, with its
/// errors.
///
/// - The weight gradient: two kernels (see the module docs).
/// - The forward: a kernel for at most [`SMALL_CONV_INPUT_CHANNELS`] input
///   channels (cuDNN's choice took 17 - 19 us for the Fashion-MNIST host's
///   first layer); the direct kernel on an sm_80+ GPU for multiples of
///   eight input and output channels, both at most
///   [`MAX_DIRECT_CONV_CHANNELS`] (cuDNN's picks for the host's and seed's
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
    run(x, weight, false).map(|(y, _)| y)
}

/// [`conv3x3`] that also returns its output's batch statistics where the
/// first layer's forward kernel takes them: a CUDA channels-last input of at
/// most [`SMALL_CONV_INPUT_CHANNELS`] channels and 8 or 16 output channels
/// (the CNN hosts' first block). The kernel writes the output as
/// [`conv3x3`]'s does, bit for bit, and each block's per-channel sums in
/// one fixed order, so the result does not depend on timing. `None` (and
/// [`conv3x3`]'s output) anywhere else; a batch norm given `None` takes its
/// own statistics.
///
/// # Shapes
/// As [`conv3x3`].
///
/// # Errors
/// As [`conv3x3`].
pub fn conv3x3_with_stats(x: &Tensor, weight: &Tensor) -> Result<(Tensor, Option<BatchStats>)> {
    run(x, weight, true)
}

/// [`conv3x3`] and [`conv3x3_with_stats`].
fn run(x: &Tensor, weight: &Tensor, stats: bool) -> Result<(Tensor, Option<BatchStats>)> {
    const OP: &str = "nn::conv3x3";
    let unfused = || {
        x.f_conv2d(weight, None::<&Tensor>, [1, 1], [1, 1], [1, 1], 1)
            .map(|y| (y, None))
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
    let epilogue = stats_epilogue(&k, x, c_in, c_out, stats)?;
    let (stats_kernel, partials) = match &epilogue {
        Some((kernel, partials)) => (*kernel, ffi::tensor_ptr(partials)),
        None => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    // SAFETY: as in `batch_norm_relu`; `partials` lives to the end of the
    // call.
    let y = unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_conv3x3(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                i32::from(compute == Kind::BFloat16),
                if vec4 { 4 } else { 1 },
                handles.as_ptr(),
                stats_kernel,
                partials,
                out,
            )
        })
    }?;
    let stats = epilogue.map(|(_, partials)| BatchStats {
        partials,
        output: (y.data_ptr() as usize, y.size()),
    });
    Ok((y, stats))
}

/// The statistics epilogue's kernel and a partials tensor for it, where
/// `wanted` and the small forward with 8 or 16 output channels runs; `None`
/// otherwise.
fn stats_epilogue(
    k: &Kernels,
    x: &Tensor,
    c_in: i64,
    c_out: i64,
    wanted: bool,
) -> Result<Option<(*mut c_void, Tensor)>> {
    let pixels = match x.size()[..] {
        [n, _, h, w] => n.saturating_mul(h).saturating_mul(w),
        _ => return Ok(None),
    };
    let kernel = match c_out {
        8 => &k.conv_forward_small_stats[0],
        16 => &k.conv_forward_small_stats[1],
        _ => return Ok(None),
    };
    if !wanted
        || c_in > SMALL_CONV_INPUT_CHANNELS
        || pixels.saturating_mul(c_out) > i64::from(i32::MAX)
    {
        return Ok(None);
    }
    // About two pixels a thread (256 threads a block): the batch norm's
    // forward blocks each add every block's partials up.
    let blocks = (pixels + 511) / 512;
    let blocks = blocks.clamp(1, MAX_STATS_BLOCKS);
    let partials = Tensor::f_empty([blocks * c_out * 2], (Kind::Float, x.device()))
        .map_err(|error| torch("nn::conv3x3_with_stats", error))?;
    Ok(Some((kernel.raw(), partials)))
}
