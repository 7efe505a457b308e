//! Multi-tensor (`_foreach_*`) operations and fused optimizer steps, which tch
//! 0.24 does not bind (its generated API has no `foreach` or `_fused_*`
//! functions).
//!
//! On CUDA each call launches one multi-tensor kernel (a few for very long
//! lists) for the whole list instead of one kernel per tensor, which is what
//! "fewer kernels per step" needs. Where the tensors allow it (contiguous,
//! on one device; `f32` for adds and AdamW) that kernel is torch-ext's own,
//! which spreads a list over blocks of 1,024 values: zero, copy and add
//! ([`foreach_zero_`], [`foreach_copy_`], [`foreach_add_`]), the AdamW
//! step ([`adamw_step`]) and the SGD step of several groups with their step
//! counts in one launch ([`sgd_step_groups`]). libtorch's gives each block a chunk of 65,536
//! values, which for lists of small tensors leaves most of the GPU idle. On CPU the same calls work: `_foreach_*`
//! falls back to a per-tensor loop, and `_fused_sgd_` / `_fused_adamw_` have
//! CPU kernels in libtorch 2.11, so CPU tests exercise the same code path.
//!
//! All tensors of one call must live on the same device. Every in-place
//! operation here runs under no-grad (like `torch.optim`), so it may update
//! leaf parameters that require grad. Nothing reads a value back to the host,
//! so every function here can be captured in a CUDA graph.

use std::ffi::c_void;

use tch::Tensor;

use crate::error::{Error, Result};
use crate::foreach_kernel::{self, Op};
use crate::{adamw_kernel, ffi, sgd_kernel};

/// A learning rate given as a number or as a 0-dim tensor on the parameters'
/// device. The tensor form lets a captured CUDA graph pick up a new rate on
/// every replay (write it with `copy_`/`fill_` between replays).
#[derive(Clone, Copy, Debug)]
pub enum LearningRate<'a> {
    /// A rate fixed at call time (baked into a captured graph).
    Value(f64),
    /// A rate read from device memory when the kernel runs.
    Tensor(&'a Tensor),
}

impl LearningRate<'_> {
    fn split(&self) -> (f64, *const c_void) {
        match self {
            LearningRate::Value(lr) => (*lr, std::ptr::null()),
            LearningRate::Tensor(tensor) => (0.0, ffi::tensor_ptr(tensor) as *const c_void),
        }
    }
}

/// Everything [`sgd_step_with`] needs besides the tensor lists.
#[derive(Clone, Copy, Debug)]
pub struct SgdOptions<'a> {
    /// Learning rate.
    pub lr: LearningRate<'a>,
    /// Momentum factor (0 disables momentum; the buffer list may then be empty).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Dampening for momentum.
    pub dampening: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Maximise instead of minimise.
    pub maximize: bool,
    /// First step: the momentum buffers are (re)initialised to the gradient
    /// instead of being read. Pass `true` once with freshly allocated buffers
    /// (e.g. `zeros_like`), `false` afterwards, and `false` inside a graph
    /// capture (warm up first).
    pub is_first_step: bool,
    /// AMP: the gradients are divided by this scale (0-dim tensor) first.
    pub grad_scale: Option<&'a Tensor>,
    /// AMP: when this 0-dim tensor is non-zero the step is skipped.
    pub found_inf: Option<&'a Tensor>,
}

impl Default for SgdOptions<'_> {
    fn default() -> Self {
        Self {
            lr: LearningRate::Value(0.01),
            momentum: 0.0,
            weight_decay: 0.0,
            dampening: 0.0,
            nesterov: false,
            maximize: false,
            is_first_step: false,
            grad_scale: None,
            found_inf: None,
        }
    }
}

/// One SGD step over all parameters with `torch._fused_sgd_` (one kernel on
/// CUDA), the same arithmetic as `torch.optim.SGD(fused=True)`.
///
/// `momentum_buffers` holds one tensor per parameter (same shape) when
/// `momentum != 0`; see [`SgdOptions::is_first_step`].
#[allow(clippy::too_many_arguments)]
pub fn sgd_step(
    params: &[Tensor],
    grads: &[Tensor],
    momentum_buffers: &[Tensor],
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    dampening: f64,
    nesterov: bool,
    is_first_step: bool,
) -> Result<()> {
    let options = SgdOptions {
        lr: LearningRate::Value(lr),
        momentum,
        weight_decay,
        dampening,
        nesterov,
        maximize: false,
        is_first_step,
        grad_scale: None,
        found_inf: None,
    };
    sgd_step_with(params, grads, momentum_buffers, &options)
}

/// [`sgd_step`] with every option of `torch._fused_sgd_` (tensor learning
/// rate, AMP grad scale / found-inf, maximise).
pub fn sgd_step_with(
    params: &[Tensor],
    grads: &[Tensor],
    momentum_buffers: &[Tensor],
    options: &SgdOptions<'_>,
) -> Result<()> {
    const OP: &str = "fused::sgd_step";
    same_length(OP, "grads", params.len(), grads.len())?;
    // Without momentum the buffer list may be empty; otherwise one per param.
    if options.momentum != 0.0 || !momentum_buffers.is_empty() {
        same_length(OP, "momentum_buffers", params.len(), momentum_buffers.len())?;
    }
    if params.is_empty() {
        return Ok(());
    }
    let (param_ptrs, grad_ptrs, buffer_ptrs) = (
        ffi::tensor_ptrs(params),
        ffi::tensor_ptrs(grads),
        ffi::tensor_ptrs(momentum_buffers),
    );
    let (lr, lr_tensor) = options.lr.split();
    // SAFETY: every pointer array holds the live `at::Tensor`s of slices that
    // outlive the call, with the lengths passed alongside; optional tensors
    // are NULL or live.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_fused_sgd_(
                param_ptrs.as_ptr(),
                grad_ptrs.as_ptr(),
                buffer_ptrs.as_ptr(),
                len_i64(params.len()),
                len_i64(momentum_buffers.len()),
                options.weight_decay,
                options.momentum,
                lr,
                lr_tensor,
                options.dampening,
                i32::from(options.nesterov),
                i32::from(options.maximize),
                i32::from(options.is_first_step),
                optional_ptr(options.grad_scale),
                optional_ptr(options.found_inf),
            ),
        )
    }
}

/// One parameter group of [`sgd_step_groups`]: its lists (as
/// [`sgd_step_with`] takes them) and options.
#[derive(Clone, Copy, Debug)]
pub struct SgdGroup<'a> {
    /// The parameters.
    pub params: &'a [Tensor],
    /// One gradient per parameter.
    pub grads: &'a [Tensor],
    /// One momentum buffer per parameter when `options.momentum != 0`,
    /// none otherwise.
    pub momentum_buffers: &'a [Tensor],
    /// The group's learning rate, momentum and flags.
    pub options: SgdOptions<'a>,
}

/// [`sgd_step_with`] for every group, each with its own options, then
/// every tensor of `counts` (0-dim `f32` step counts) advanced by one.
///
/// On CUDA, with every tensor `f32` and on one device, each parameter in a
/// dense layout (contiguous, channels-last or another order of its
/// dimensions) that its gradient and buffer share, at most
/// 8 groups, 8 counts and 64 tensors, this is one launch of torch-ext's
/// own kernel (the arithmetic of `_fused_sgd_`, see `sgd_kernel`), where
/// libtorch runs one `_fused_sgd_` launch a group and a `_foreach_add_`.
/// Anything else runs those. Nothing is read back either way, so a
/// captured CUDA graph can hold the step.
///
/// # Errors
/// [`Error::InvalidArgument`] for lists whose lengths do not match (checked
/// before anything runs); [`Error::Cpp`] when a kernel cannot be compiled
/// or launched, or libtorch's ops fail.
pub fn sgd_step_groups(groups: &[SgdGroup<'_>], counts: &[Tensor]) -> Result<()> {
    const OP: &str = "fused::sgd_step_groups";
    for group in groups {
        same_length(OP, "grads", group.params.len(), group.grads.len())?;
        if group.options.momentum != 0.0 || !group.momentum_buffers.is_empty() {
            same_length(
                OP,
                "momentum_buffers",
                group.params.len(),
                group.momentum_buffers.len(),
            )?;
        }
    }
    if let Some(device) = sgd_kernel::target(groups, counts) {
        return sgd_kernel::step(device, groups, counts);
    }
    for group in groups {
        sgd_step_with(
            group.params,
            group.grads,
            group.momentum_buffers,
            &group.options,
        )?;
    }
    foreach_add_scalar_(counts, 1.0)
}

/// Everything [`adamw_step`] needs besides the tensor lists.
#[derive(Clone, Copy, Debug)]
pub struct AdamWOptions<'a> {
    /// Learning rate.
    pub lr: LearningRate<'a>,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Maximise instead of minimise.
    pub maximize: bool,
    /// AMP: the gradients are divided by this scale (0-dim tensor) first.
    pub grad_scale: Option<&'a Tensor>,
    /// AMP: when this 0-dim tensor is non-zero the step is skipped.
    pub found_inf: Option<&'a Tensor>,
}

impl Default for AdamWOptions<'_> {
    fn default() -> Self {
        Self {
            lr: LearningRate::Value(1e-3),
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 1e-2,
            eps: 1e-8,
            maximize: false,
            grad_scale: None,
            found_inf: None,
        }
    }
}

/// One AdamW step, the same arithmetic as `torch.optim.AdamW(fused=True)`
/// without amsgrad.
///
/// For `f32` tensors on one CUDA device (contiguous, every state shaped like
/// its parameter, the fused kernels on: [`crate::nn::fused_kernels_enabled`])
/// it runs torch-ext's own kernels: one launch updates up to 40 tensors,
/// a second advances their step counts; a list of many small tensors takes
/// a few microseconds where libtorch's `_fused_adamw_` loops a few dozen
/// blocks over 65,536-value chunks. Anything else (the CPU, bf16
/// parameters, the fused kernels off) runs `torch._fused_adamw_`.
///
/// `exp_avgs` and `exp_avg_sqs` are per-parameter state (start with
/// `zeros_like`); `state_steps` holds one float32 0-dim tensor per parameter
/// **on the parameters' device** (start at 0), which this call advances by one
/// before the update (and takes back when `found_inf` is set), as
/// `torch.optim.AdamW` does. That device-side step count is what makes the
/// step capturable, unlike tch's Adam, which counts steps on the host.
pub fn adamw_step(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    state_steps: &[Tensor],
    options: &AdamWOptions<'_>,
) -> Result<()> {
    const OP: &str = "fused::adamw_step";
    same_length(OP, "grads", params.len(), grads.len())?;
    same_length(OP, "exp_avgs", params.len(), exp_avgs.len())?;
    same_length(OP, "exp_avg_sqs", params.len(), exp_avg_sqs.len())?;
    same_length(OP, "state_steps", params.len(), state_steps.len())?;
    if params.is_empty() {
        return Ok(());
    }
    let lists = adamw_kernel::Lists {
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        state_steps,
    };
    if let Some(device) = adamw_kernel::target(&lists, options) {
        return adamw_kernel::step(device, &lists, options);
    }
    let param_ptrs = ffi::tensor_ptrs(params);
    let grad_ptrs = ffi::tensor_ptrs(grads);
    let exp_avg_ptrs = ffi::tensor_ptrs(exp_avgs);
    let exp_avg_sq_ptrs = ffi::tensor_ptrs(exp_avg_sqs);
    let step_ptrs = ffi::tensor_ptrs(state_steps);
    let (lr, lr_tensor) = options.lr.split();
    // SAFETY: every pointer array holds the live `at::Tensor`s of slices that
    // outlive the call, all of length `params.len()`; optional tensors are
    // NULL or live.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_fused_adamw_(
                param_ptrs.as_ptr(),
                grad_ptrs.as_ptr(),
                exp_avg_ptrs.as_ptr(),
                exp_avg_sq_ptrs.as_ptr(),
                step_ptrs.as_ptr(),
                len_i64(params.len()),
                lr,
                lr_tensor,
                options.beta1,
                options.beta2,
                options.weight_decay,
                options.eps,
                i32::from(options.maximize),
                optional_ptr(options.grad_scale),
                optional_ptr(options.found_inf),
            ),
        )
    }
}

/// `torch._foreach_zero_`: zeroes every tensor (e.g. all gradients) in place.
pub fn foreach_zero_(tensors: &[Tensor]) -> Result<()> {
    if tensors.is_empty() || foreach_kernel::run(Op::Zero, tensors, &[], 0.0)? {
        return Ok(());
    }
    let ptrs = ffi::tensor_ptrs(tensors);
    // SAFETY: `ptrs` holds the live tensors of `tensors`, length passed along.
    unsafe {
        ffi::check(
            "fused::foreach_zero_",
            ffi::esper_foreach_zero_(ptrs.as_ptr(), len_i64(ptrs.len())),
        )
    }
}

/// `torch._foreach_add_(tensors, others, alpha=alpha)`: `t += alpha * o` for
/// each pair.
pub fn foreach_add_(tensors: &[Tensor], others: &[Tensor], alpha: f64) -> Result<()> {
    same_length("fused::foreach_add_", "others", tensors.len(), others.len())?;
    if tensors.is_empty() || foreach_kernel::run(Op::Add, tensors, others, alpha)? {
        return Ok(());
    }
    let (ptrs, other_ptrs) = (ffi::tensor_ptrs(tensors), ffi::tensor_ptrs(others));
    // SAFETY: both arrays hold live tensors and have the length passed.
    unsafe {
        ffi::check(
            "fused::foreach_add_",
            ffi::esper_foreach_add_list_(
                ptrs.as_ptr(),
                other_ptrs.as_ptr(),
                len_i64(ptrs.len()),
                alpha,
            ),
        )
    }
}

/// `torch._foreach_add_(tensors, scalar)`: adds `scalar` to every element.
pub fn foreach_add_scalar_(tensors: &[Tensor], scalar: f64) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let ptrs = ffi::tensor_ptrs(tensors);
    // SAFETY: `ptrs` holds live tensors; length passed along.
    unsafe {
        ffi::check(
            "fused::foreach_add_scalar_",
            ffi::esper_foreach_add_scalar_(ptrs.as_ptr(), len_i64(ptrs.len()), scalar),
        )
    }
}

/// `torch._foreach_mul_(tensors, scalar)`: multiplies every tensor by `scalar`.
pub fn foreach_mul_scalar_(tensors: &[Tensor], scalar: f64) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let ptrs = ffi::tensor_ptrs(tensors);
    // SAFETY: `ptrs` holds live tensors; length passed along.
    unsafe {
        ffi::check(
            "fused::foreach_mul_scalar_",
            ffi::esper_foreach_mul_scalar_(ptrs.as_ptr(), len_i64(ptrs.len()), scalar),
        )
    }
}

/// `torch._foreach_mul_(tensors, scalar_tensor)`: multiplies every tensor by a
/// 0-dim device tensor (no host read-back, so capturable).
pub fn foreach_mul_tensor_(tensors: &[Tensor], scalar: &Tensor) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let ptrs = ffi::tensor_ptrs(tensors);
    // SAFETY: `ptrs` and `scalar` are live tensors; length passed along.
    unsafe {
        ffi::check(
            "fused::foreach_mul_tensor_",
            ffi::esper_foreach_mul_tensor_(
                ptrs.as_ptr(),
                len_i64(ptrs.len()),
                ffi::tensor_ptr(scalar) as *const c_void,
            ),
        )
    }
}

/// `torch._foreach_copy_(dst, src, non_blocking)`: copies each `src[i]` into
/// `dst[i]` (e.g. refreshing a set of static graph inputs in one launch).
pub fn foreach_copy_(dst: &[Tensor], src: &[Tensor], non_blocking: bool) -> Result<()> {
    same_length("fused::foreach_copy_", "src", dst.len(), src.len())?;
    if dst.is_empty() || foreach_kernel::run(Op::Copy, dst, src, 0.0)? {
        return Ok(());
    }
    let (dst_ptrs, src_ptrs) = (ffi::tensor_ptrs(dst), ffi::tensor_ptrs(src));
    // SAFETY: both arrays hold live tensors and have the length passed.
    unsafe {
        ffi::check(
            "fused::foreach_copy_",
            ffi::esper_foreach_copy_(
                dst_ptrs.as_ptr(),
                src_ptrs.as_ptr(),
                len_i64(dst_ptrs.len()),
                i32::from(non_blocking),
            ),
        )
    }
}

/// `torch._foreach_norm(tensors, ord)`: the `ord`-norm of each tensor, as 0-dim
/// tensors on the tensors' device.
pub fn foreach_norm(tensors: &[Tensor], ord: f64) -> Result<Vec<Tensor>> {
    if tensors.is_empty() {
        return Ok(Vec::new());
    }
    let ptrs = ffi::tensor_ptrs(tensors);
    let mut out: Vec<*mut c_void> = vec![std::ptr::null_mut(); ptrs.len()];
    // SAFETY: `ptrs` holds live tensors; `out` has room for one pointer per
    // tensor and receives `new at::Tensor`s owned by the shim's caller.
    unsafe {
        ffi::check(
            "fused::foreach_norm",
            ffi::esper_foreach_norm(ptrs.as_ptr(), len_i64(ptrs.len()), ord, out.as_mut_ptr()),
        )?;
    }
    Ok(out
        .into_iter()
        // SAFETY: on success each entry is a fresh heap `at::Tensor*` (tch's
        // `C_tensor`); `from_ptr` takes ownership and frees it on drop.
        .map(|raw| unsafe { Tensor::from_ptr(raw.cast()) })
        .collect())
}

/// Clips gradients in place so their joint `norm_type`-norm is at most
/// `max_norm`, like `torch.nn.utils.clip_grad_norm_(foreach=True)`; returns
/// the total norm before clipping as a 0-dim device tensor.
///
/// Unlike tch's `clip_grad_norm`, nothing is read back to the host, so this
/// can run inside a captured step.
pub fn clip_grad_norm_(grads: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    if grads.is_empty() {
        return Err(Error::InvalidArgument {
            op: "fused::clip_grad_norm_",
            message: "no gradients".to_owned(),
        });
    }
    let ptrs = ffi::tensor_ptrs(grads);
    let mut total: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptrs` holds live tensors; `total` receives a fresh heap tensor.
    unsafe {
        ffi::check(
            "fused::clip_grad_norm_",
            ffi::esper_clip_grad_norm_(
                ptrs.as_ptr(),
                len_i64(ptrs.len()),
                max_norm,
                norm_type,
                &mut total,
            ),
        )?;
        // SAFETY: on success `total` is a fresh heap `at::Tensor*`, owned now
        // by the returned tch tensor.
        Ok(Tensor::from_ptr(total.cast()))
    }
}

/// `torch._amp_foreach_non_finite_check_and_unscale_`: multiplies every
/// gradient by `inv_scale` (0-dim float tensor) and sets `found_inf` (0-dim
/// float tensor) to 1 if any gradient holds an inf or NaN. The building block
/// of `GradScaler.unscale_`, in one launch.
pub fn amp_unscale_(grads: &[Tensor], found_inf: &mut Tensor, inv_scale: &Tensor) -> Result<()> {
    if grads.is_empty() {
        return Ok(());
    }
    let ptrs = ffi::tensor_ptrs(grads);
    // SAFETY: `ptrs`, `found_inf` and `inv_scale` are live tensors; `found_inf`
    // is borrowed mutably, matching the in-place write.
    unsafe {
        ffi::check(
            "fused::amp_unscale_",
            ffi::esper_amp_foreach_non_finite_check_and_unscale_(
                ptrs.as_ptr(),
                len_i64(ptrs.len()),
                ffi::tensor_ptr(found_inf),
                ffi::tensor_ptr(inv_scale) as *const c_void,
            ),
        )
    }
}

fn same_length(op: &'static str, what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op,
            message: format!("{what} has {got} tensors, expected {expected}"),
        })
    }
}

fn optional_ptr(tensor: Option<&Tensor>) -> *const c_void {
    tensor.map_or(std::ptr::null(), |tensor| {
        ffi::tensor_ptr(tensor) as *const c_void
    })
}

/// Slice lengths always fit in `i64` on 64-bit targets.
fn len_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}
