//! Fused network layers: batch and group normalisation with ReLU, the 2x2
//! max-pool and the 3x3 convolution for few channels, as run-time compiled kernels with
//! their backward wired into autograd by the shim (`cpp/nn.cpp`).
//!
//! libtorch runs `relu(batch_norm(x))` in training as five kernels forward
//! (statistics, running-statistics update, normalisation, ReLU, and a copy
//! or two around them) and three backward, and its channels-last kernels
//! spread a tensor of few channels poorly over the GPU; its max-pool keeps
//! an index tensor and zero-fills the input gradient before scattering into
//! it. For the small convolutional hosts Kasmina trains, those kernels were
//! a fifth of a training step (the `tolaria-fmnist` profile in
//! `baselines/perf/tolaria-fmnist/NOTES.md`). Here:
//!
//! - [`batch_norm_relu`]: a statistics pass (per-block sums of each value
//!   less its channel's first value, and of their squares, so a mean far
//!   from zero costs no precision), then a pass in which every block adds
//!   the partials up in the same fixed order, normalises and applies ReLU,
//!   block 0 also writing the saved statistics and updating the running
//!   ones (momentum, unbiased variance). Backward recomputes the ReLU mask
//!   from the saved input: one pass sums the gradient and gradient x
//!   normalised input per block, the next adds them up and writes the
//!   input gradient, block 0 the weight and bias gradients. Every sum is
//!   taken in a fixed order, so results are deterministic.
//! - [`batch_norm_relu_pool2x2`]: a CNN block's batch norm, ReLU and 2x2
//!   max-pool as one node: the statistics pass, then a pass that adds the
//!   partials up and writes only each pool window's maximum; backward, two
//!   passes that recompute each window's activations and argmax from the
//!   saved input and route the pooled gradient through the pool and the
//!   ReLU. The full-size activation and its gradient are never written
//!   (two kernels and two full-size passes fewer than the two nodes).
//! - [`max_pool2x2`]: `max_pool2d(x, 2, 2)` (floor), NCHW or NHWC; the
//!   backward recomputes each window's argmax from the saved input (the
//!   first maximum wins, a NaN wins over numbers, as libtorch picks them)
//!   and writes every input gradient once, zeros included.
//! - [`conv3x3`]: stride 1, padding 1, no bias, NHWC. The weight gradient
//!   is two kernels: a block stages an image band's output gradient and
//!   padded input in shared memory (image after image, for one or two
//!   images) and writes its partial sums, then a fixed-order reduction. On
//!   TF32 tensor cores a warp owns 16 output x 8 input channels and all nine
//!   taps, so one output-gradient fragment feeds nine `mma` chains; warps
//!   left over split the band's pixels and are added in a fixed order. In
//!   f32 (TF32 off) a thread owns 4 x 4 channels x one kernel row. In a
//!   captured backward pass the two can run on a side stream, beside the
//!   input gradients ([`set_overlapped_weight_grads`]). The forward and the input
//!   gradient are one direct kernel for few channels (the input gradient is
//!   the convolution of the output gradient with the flipped, transposed
//!   weight): an implicit GEMM on TF32 tensor cores in which a block stages
//!   a band of padded input rows and the weights, and a warp owns 16 output
//!   pixels x every output channel.
//! - [`group_norm_relu`]: `relu(group_norm(x))`, NHWC, one block an image:
//!   one kernel forward (the group statistics from shifted sums, then the
//!   output), one backward (the input gradient with the ReLU mask
//!   recomputed, and the image's per-channel sums), then the fixed-order
//!   reduction into the weight and bias gradients. Groups of a multiple of
//!   four channels sum per thread's channel quad; narrower groups (1 - 3
//!   channels, where a quad spans groups) per channel (`_narrow` kernels).
//!   [`group_norm_relu_add`] adds a seed's residual (`x + ReLU(GN(conv x))`)
//!   inside the forward kernel, rounded as libtorch's add rounds it: no add
//!   kernel, and one pass over the activations fewer.
//! - [`blend_lerp`]: a seed's alpha blend `lerp(h, s, w)` with one weight
//!   per sample read on the device (what a captured step replays with a
//!   new alpha), one elementwise kernel each way; libtorch runs it, and
//!   the two products of its backward, on its strided one-value-a-thread
//!   path, since the broadcast weight is not contiguous.
//!   [`blend_lerp_clamped`] clamps the weights to `[0, 1]` as the kernels
//!   read them (an alpha schedule's blend without a clamp kernel).
//!   [`blend_lerp_replicated`] blends a batch's replicated copies (the
//!   counterfactual configurations) forward only, reading the batch once
//!   per copy instead of copying it first. [`blend_lerp_pool2x2`] (and
//!   [`blend_lerp_clamped_pool2x2`]) is the blend followed by a 2x2
//!   max-pool, one kernel each way: a seed blended just before a host's
//!   pool writes only each window's maximum, and its backward routes the
//!   pooled gradient through the pool and the blend in one pass.
//! - [`squeeze_excite`]: a CNN seed's channel attention, `x · sigmoid(W2
//!   relu(W1 mean_hw(x)) + b2)`, NHWC, one block an image: one kernel
//!   forward (the means, both small products and the gate, then the
//!   output), one backward (the input gradient and the image's share of
//!   the parameter gradients), then the fixed-order reduction of the
//!   shares. libtorch ran about 7 kernels forward (mean, two GEMMs with a
//!   split-K reduction, ReLU, sigmoid, product) and 15 backward.
//! - [`pooled_linear`]: a CNN's classifier head, `mean_hw(x) Wᵀ + b`,
//!   NHWC: one kernel forward (a block an image: the means, saved, then
//!   the outputs), one backward (a block an image for the input gradient,
//!   then a block an output and 32 weight and bias columns, its warps
//!   splitting the images, their sums added in a fixed order).
//!   libtorch ran a mean reduction and a GEMM forward and, backward, two
//!   GEMMs, a sum reduction and two element-wise kernels.
//! - [`layer_norm`]: layer normalisation over the last dimension (the
//!   transformer host's), one warp a row with the row in registers: one
//!   kernel forward, one backward (the input gradient and each block's
//!   per-column sums), then the fixed-order reduction into the weight and
//!   bias gradients. libtorch spends a separate kernel on the weight and
//!   bias gradients that, for rows of 128 values, took longer than the rest
//!   of the layer's backward (`baselines/perf/tolaria-lm/NOTES.md`).
//!   [`layer_norm_bf16`] writes its output in `bf16`; [`layer_norm_fork`]
//!   returns `(x, layer_norm(x))` as one node for a norm on a residual
//!   stream, so its backward kernel adds the stream's gradient into the
//!   input gradient instead of autograd's separate sum.
//! - [`embedding`]: a token embedding whose backward sums each vocabulary
//!   row's output-gradient rows without sorting the ids: a block owns one
//!   row and one chunk of ids, a warp finds its 32 ids' matches with one
//!   ballot, and a fixed-order reduction adds the chunks (libtorch's
//!   deterministic backward ran 24 radix-sort passes a step on the
//!   language-model host).
//! - [`linear`]: a fully connected layer whose backward writes its weight
//!   gradient in the weight's dtype from one product (under `bf16`
//!   autocast cuBLAS writes the `f32` gradient of an `f32` weight directly)
//!   and its bias gradient as column sums from one kernel and the
//!   fixed-order reduction; libtorch ran a generic sum reduction of 13 -
//!   14 us for each bias and a cast for each `bf16` gradient.
//!   Under `bf16` autocast it reads the weight's and bias's shadow where a
//!   [`Bf16Shadows`] scope holds one (cast for every layer in one launch
//!   at the step's start) instead of casting them itself.
//! - [`causal_attention`]: causal self-attention over a packed `qkv`
//!   projection for short sequences in `bf16`, one kernel each way (a
//!   block a sequence and head, tensor-core products, the softmax in
//!   registers); the backward writes the projection's gradient in its own
//!   layout, where libtorch ran layout copies, cuDNN's kernels, two helpers
//!   and a concatenation.
//! - [`gram`]: not a layer, the Gram matrix of a few long rows (the
//!   gradient aggregator's dot products): one pass sums every product of
//!   two rows per block in `f32`, and the fixed-order reduction adds the
//!   blocks; libtorch's `mm` ran a generic TF32 GEMM kernel for it.
//!
//! Every kernel keeps several loads in flight per thread, and where the
//! channel count is a multiple of four each thread moves four channels with
//! one 16-byte access (8 bytes in bf16).
//!
//! The fused kernels run where they apply: a CUDA tensor of `f32` or `bf16`
//! (the dtype under bf16 autocast) with batch statistics, channels-last for
//! the normalisation (at most [`MAX_FUSED_CHANNELS`] channels), contiguous
//! in either layout for the pool. Anything else takes libtorch's ops, with
//! the same results up to float rounding; [`set_fused_kernels`] turns the
//! fused path off for a whole process (the benchmarks measure both).
//! Nothing is read back and no scratch outlives a call, so a step using
//! them can be captured, and several streams may run them at once.
//!
//! (Not run as a doctest: doctest binaries do not find libtorch.)
//!
//! ```ignore
//! use tch::{Device, Kind, Tensor};
//! let x = Tensor::randn([8, 16, 14, 14], (Kind::Float, Device::Cuda(0)))
//!     .contiguous() // channels-last via torch_ext::memory in real use
//!     .set_requires_grad(true);
//! let (w, b) = (Tensor::ones([16], (Kind::Float, Device::Cuda(0))), Tensor::zeros([16], (Kind::Float, Device::Cuda(0))));
//! let y = torch_ext::nn::batch_norm_relu(&x, &w, &b, None, None, true, 0.1, 1e-5)?;
//! let pooled = torch_ext::nn::max_pool2x2(&y)?;
//! pooled.sum(Kind::Float).backward();
//! # Ok::<(), torch_ext::Error>(())
//! ```

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::ffi;

mod attention;
mod attention_source;
mod blend;
mod blend_source;
mod bn_pool;
mod bn_pool_source;
mod conv;
mod conv_fixed_source;
mod conv_source;
mod embedding;
mod embedding_source;
mod excite;
mod excite_source;
mod gram;
mod gram_source;
mod group_norm;
mod kernels;
mod layer_norm;
mod layer_norm_source;
mod linear;
mod linear_source;
mod norm_source;
mod pooled;
mod pooled_source;
mod shadow;
mod source;
pub use attention::{FUSED_ATTENTION_HEAD_DIMS, MAX_FUSED_ATTENTION_TIME, causal_attention};
pub use blend::{
    blend_lerp, blend_lerp_clamped, blend_lerp_clamped_pool2x2, blend_lerp_pool2x2,
    blend_lerp_replicated,
};
pub use bn_pool::batch_norm_relu_pool2x2;
pub use conv::conv3x3;
pub use embedding::embedding;
pub use excite::{MAX_FUSED_EXCITE_CHANNELS, MAX_FUSED_EXCITE_HIDDEN, squeeze_excite};
pub use gram::gram;
pub use group_norm::{MAX_FUSED_GROUPS, group_norm_relu, group_norm_relu_add};
use kernels::{Kernels, kernels};
pub use layer_norm::{layer_norm, layer_norm_bf16, layer_norm_fork};
pub use linear::linear;
pub use pooled::{MAX_FUSED_POOLED_CHANNELS, MAX_FUSED_POOLED_OUTPUTS, pooled_linear};
pub use shadow::{Bf16Shadows, ShadowScope};

/// Most input channels [`conv3x3`] runs its own forward kernel for.
pub const SMALL_CONV_INPUT_CHANNELS: i64 = 4;

/// Most input or output channels [`conv3x3`]'s direct kernel takes (the
/// shim's `kDirectMaxChannels`); wider layers use cuDNN's.
pub const MAX_DIRECT_CONV_CHANNELS: i64 = 64;

/// Most channels the fused normalisation takes (one block pass holds at
/// least one row of every channel); wider tensors use libtorch's op.
pub const MAX_FUSED_CHANNELS: i64 = 256;

/// Widest last dimension the fused [`layer_norm`] takes (a warp holds a row
/// in registers); wider rows use libtorch's op.
pub const MAX_FUSED_LAYER_NORM_WIDTH: i64 = 512;

/// Widest row [`embedding`]'s own backward takes (a warp's lanes hold the
/// row's sums in registers); wider weights use libtorch's op.
pub const MAX_FUSED_EMBEDDING_WIDTH: i64 = 512;

/// Most vocabulary rows [`embedding`]'s own backward takes (a grid
/// dimension of the kernel); larger weights use libtorch's op.
pub const MAX_FUSED_EMBEDDING_ROWS: i64 = 65_535;

/// Most values (rows x width) a weight [`embedding`]'s own backward takes
/// (its per-chunk partial sums stay within 64 MiB); larger weights use
/// libtorch's op.
pub const MAX_FUSED_EMBEDDING_VALUES: i64 = 1 << 22;

/// Most rows [`gram`]'s kernel takes (a thread holds every pair's sum in
/// registers); more rows use libtorch's product.
pub const MAX_FUSED_GRAM_ROWS: i64 = 8;

/// Most output features [`linear`]'s own backward takes (its bias-gradient
/// kernel moves four columns a thread, a block pass at least one row);
/// wider layers use libtorch's op.
pub const MAX_FUSED_LINEAR_OUT: i64 = 1024;

static FUSED: AtomicBool = AtomicBool::new(true);

/// Turns the fused kernels on or off for the whole process (on by default);
/// off, every call takes libtorch's ops. Meant for measuring one against
/// the other; a step captured in a graph keeps the path it was captured
/// with.
pub fn set_fused_kernels(enabled: bool) {
    FUSED.store(enabled, Ordering::Relaxed);
}

/// Whether the fused kernels are on (see [`set_fused_kernels`]).
pub fn fused_kernels_enabled() -> bool {
    FUSED.load(Ordering::Relaxed)
}

thread_local! {
    static OVERLAP_WEIGHT_GRADS: Cell<bool> = const { Cell::new(false) };
}

/// Turns on or off, for the calling thread (off by default), the side
/// stream of [`conv3x3`]'s weight gradient. On, a convolution whose weight
/// is a leaf (a parameter) with no gradient yet, in a backward pass that
/// builds no graph of its own and is being captured into a CUDA graph, runs
/// its weight gradient's kernels on a second stream, beside the input
/// gradients of the rest of the pass, and the captured stream waits for
/// them when the pass ends (before `backward` returns: every gradient is
/// there for whatever runs after it, a captured optimizer step included).
/// The graph then replays the two branches side by side. The values are the
/// same bit for bit. Where the weight already has a gradient
/// (accumulation), the pass builds a graph, or nothing is captured (eagerly
/// the host's launches are the bound, and the stream's events would cost
/// more than the overlap gives), the kernels stay on the device's stream.
///
/// The gradient must not be read inside the backward pass itself (a tensor
/// hook on the weight; `tch` has none): that is why it is off by default.
/// Read where a convolution runs forward, on the thread that runs it, so a
/// captured step keeps the choice it was captured with, and two trainers
/// on two threads each keep their own. Tolaria's step sets it around its
/// own forward passes ([`with_overlapped_weight_grads`]).
pub fn set_overlapped_weight_grads(enabled: bool) {
    OVERLAP_WEIGHT_GRADS.with(|flag| flag.set(enabled));
}

/// Whether [`conv3x3`]'s weight gradient may run on a side stream on this
/// thread (see [`set_overlapped_weight_grads`]).
pub fn overlapped_weight_grads() -> bool {
    OVERLAP_WEIGHT_GRADS.with(Cell::get)
}

/// Runs `body` with [`set_overlapped_weight_grads`]`(enabled)` on this
/// thread, and puts the thread's earlier choice back afterwards (a panic
/// in `body` included).
pub fn with_overlapped_weight_grads<T>(enabled: bool, body: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            set_overlapped_weight_grads(self.0);
        }
    }
    let _restore = Restore(overlapped_weight_grads());
    set_overlapped_weight_grads(enabled);
    body()
}

/// Runs a shim entry point that hands back a `new at::Tensor` in `out`.
///
/// # Safety
/// `call` must pass its argument as the entry point's `out` parameter and
/// only live tensor and kernel pointers otherwise.
unsafe fn shim_tensor(
    op: &'static str,
    call: impl FnOnce(*mut *mut c_void) -> ffi::RawError,
) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the caller's contract; on success `out` holds a fresh heap
    // `at::Tensor*` (tch's `C_tensor`) that `from_ptr` takes over.
    unsafe {
        ffi::check(op, call(&mut out))?;
        Ok(Tensor::from_ptr(out.cast()))
    }
}

/// libtorch's error from the unfused path, as the shim reports its own.
fn torch(op: &'static str, error: tch::TchError) -> Error {
    Error::Cpp {
        op,
        message: error.to_string(),
    }
}

/// The CUDA device and whether the dtype is `bf16`, where the fused kernels
/// take `x`'s dtype.
fn fused_target(x: &Tensor) -> Option<(usize, bool)> {
    if !fused_kernels_enabled() || x.dim() != 4 {
        return None;
    }
    let Device::Cuda(device) = x.device() else {
        return None;
    };
    // The pool's kernels index with 32-bit integers.
    if i64::try_from(x.numel()).map_or(true, |n| n > i64::from(i32::MAX)) {
        return None;
    }
    match x.kind() {
        Kind::Float => Some((device, false)),
        Kind::BFloat16 => Some((device, true)),
        _ => None,
    }
}

/// Whether the kernels may move four channels at a time: a channel count
/// divisible by four and a 16-byte aligned start (the output and gradient
/// tensors the shim allocates always are).
fn four_channels(x: &Tensor, channels: i64) -> bool {
    channels % 4 == 0 && (x.data_ptr() as usize).is_multiple_of(16)
}

/// Whether `t` is what the normalisation kernels read for a per-channel
/// parameter or statistic of `x`: contiguous `f32` `[channels]` on `x`'s
/// device.
fn per_channel_f32(t: &Tensor, channels: i64, x: &Tensor) -> bool {
    t.size() == [channels]
        && t.kind() == Kind::Float
        && t.device() == x.device()
        && t.is_contiguous()
}

/// Whether a 4-D tensor is dense channels-last (NHWC), by libtorch's rule.
fn is_nhwc(x: &Tensor) -> bool {
    crate::memory::is_channels_last(x).unwrap_or(false)
}

/// `relu(batch_norm(x, ...))`, the fused kernels where they apply (see the
/// module docs), libtorch's `batch_norm` and `relu` otherwise. In training
/// the running statistics, when given, are updated in place. With
/// `train == false` and both running statistics given, one kernel applies
/// them and the ReLU where no gradient is wanted (the validation passes:
/// libtorch runs cuDNN's inference batch norm and a separate ReLU);
/// libtorch's ops where one is.
///
/// # Shapes
/// `x: [B, C, H, W]`, `weight`, `bias` and the running statistics `[C]`;
/// returns `[B, C, H, W]` in `x`'s layout and dtype.
///
/// The fused path also needs `weight`, `bias` and the running statistics
/// as contiguous `f32` `[C]` tensors on `x`'s device; otherwise (bf16
/// parameters, say) libtorch's ops run.
///
/// # Errors
/// libtorch's error for tensors that do not fit together; [`Error::Cpp`]
/// when the kernels cannot be compiled or launched.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    train: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "nn::batch_norm_relu";
    let args = NormArgs {
        op: OP,
        x,
        weight,
        bias,
        running_mean,
        running_var,
        momentum,
        eps,
    };
    let fused = fused_target(x).filter(|_| train && is_nhwc(x));
    let channels = args.channels();
    let rows = x.numel() / usize::try_from(channels.max(1)).unwrap_or(1);
    let eligible =
        args.per_channel_ok() && (1..=MAX_FUSED_CHANNELS).contains(&channels) && rows > 1;
    if !train
        && let (Some(mean), Some(var)) = (running_mean, running_var)
        && let Some((device, bf16)) = fused_target(x).filter(|_| eligible && is_nhwc(x))
    {
        let vec4 = four_channels(x, channels);
        let k = kernels(OP, device, bf16, vec4)?;
        // SAFETY: every tensor pointer is live for the call; the kernel is
        // live (the cache never drops it).
        return unsafe {
            shim_tensor(OP, |out| {
                ffi::esper_batch_norm_relu_eval(
                    ffi::tensor_ptr(x),
                    ffi::tensor_ptr(weight),
                    ffi::tensor_ptr(bias),
                    ffi::tensor_ptr(mean),
                    ffi::tensor_ptr(var),
                    eps,
                    if vec4 { 4 } else { 1 },
                    k.bn_eval.raw(),
                    out,
                )
            })
        };
    }
    let Some(target) = fused.filter(|_| eligible) else {
        let unfused = x
            .f_batch_norm(
                Some(weight),
                Some(bias),
                running_mean,
                running_var,
                train,
                momentum,
                eps,
                true,
            )
            .and_then(|y| y.f_relu());
        return unfused.map_err(|error| torch(OP, error));
    };
    args.run_training(target, ffi::esper_batch_norm_relu, |k| {
        [
            k.bn_stats.raw(),
            k.bn_forward.raw(),
            k.bn_reduce.raw(),
            k.bn_apply.raw(),
        ]
    })
}

/// The signature `esper_batch_norm_relu` and `esper_batch_norm_relu_pool2`
/// share: x, weight, bias, running mean and variance (null for none),
/// momentum, eps, vec, the four kernels (statistics, forward, backward
/// reduce and apply), out.
type TrainingNormEntry = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    f64,
    f64,
    i32,
    *const *mut c_void,
    *mut *mut c_void,
) -> ffi::RawError;

/// The arguments of a batch norm + ReLU node (pooled or not).
struct NormArgs<'a> {
    op: &'static str,
    x: &'a Tensor,
    weight: &'a Tensor,
    bias: &'a Tensor,
    running_mean: Option<&'a Tensor>,
    running_var: Option<&'a Tensor>,
    momentum: f64,
    eps: f64,
}

impl NormArgs<'_> {
    /// `x`'s channels (0 for a tensor without a second dimension).
    fn channels(&self) -> i64 {
        self.x.size().get(1).copied().unwrap_or(0)
    }

    /// Whether the weight, bias and running statistics given are what the
    /// kernels read ([`per_channel_f32`]).
    fn per_channel_ok(&self) -> bool {
        let channels = self.channels();
        [
            Some(self.weight),
            Some(self.bias),
            self.running_mean,
            self.running_var,
        ]
        .into_iter()
        .flatten()
        .all(|t| per_channel_f32(t, channels, self.x))
    }

    /// The training node through the shim's `entry` with the four kernels
    /// `pick` takes (statistics, forward, backward reduce and apply) from
    /// those of `device` and the dtype.
    fn run_training(
        &self,
        (device, bf16): (usize, bool),
        entry: TrainingNormEntry,
        pick: impl FnOnce(&Kernels) -> [*mut c_void; 4],
    ) -> Result<Tensor> {
        let vec4 = four_channels(self.x, self.channels());
        let handles = pick(&*kernels(self.op, device, bf16, vec4)?);
        let optional = |t: Option<&Tensor>| t.map_or(std::ptr::null_mut(), ffi::tensor_ptr);
        // SAFETY: every tensor pointer is live for the call; `handles` are
        // live kernels (the cache never drops them, so the autograd node's
        // backward may use them later).
        unsafe {
            shim_tensor(self.op, |out| {
                entry(
                    ffi::tensor_ptr(self.x),
                    ffi::tensor_ptr(self.weight),
                    ffi::tensor_ptr(self.bias),
                    optional(self.running_mean),
                    optional(self.running_var),
                    self.momentum,
                    self.eps,
                    if vec4 { 4 } else { 1 },
                    handles.as_ptr(),
                    out,
                )
            })
        }
    }
}

/// `max_pool2d(x, kernel 2, stride 2)` (floor), the fused kernels where
/// they apply (see the module docs), libtorch's `max_pool2d` otherwise.
///
/// # Shapes
/// `[B, C, H, W] -> [B, C, H / 2, W / 2]`, in `x`'s layout and dtype.
pub fn max_pool2x2(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "nn::max_pool2x2";
    let layout = fused_target(x).and_then(|target| {
        if is_nhwc(x) && x.size().get(1).is_some_and(|&c| c > 1) {
            Some((target, true))
        } else if x.is_contiguous() {
            Some((target, false))
        } else {
            None
        }
    });
    let Some(((device, bf16), channels_last)) = layout else {
        return x
            .f_max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)
            .map_err(|error| torch(OP, error));
    };
    let channels = x.size().get(1).copied().unwrap_or(0);
    let vec4 = channels_last && four_channels(x, channels);
    let k = kernels(OP, device, bf16, vec4)?;
    let handles = [k.pool_forward.raw(), k.pool_backward.raw()];
    // SAFETY: as in `batch_norm_relu`.
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_max_pool2(
                ffi::tensor_ptr(x),
                i32::from(channels_last),
                if vec4 { 4 } else { 1 },
                handles.as_ptr(),
                out,
            )
        })
    }
}

#[cfg(test)]
mod tests;
