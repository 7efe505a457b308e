//! The AdamW step of [`crate::fused::adamw_step`] as torch-ext's own
//! kernels, for `f32` tensors on CUDA: one launch updates every tensor of a
//! list (up to [`MAX_TENSORS`] a launch), a second advances their step
//! counts.
//!
//! libtorch's `_fused_adamw_` gives each block one chunk of 65,536 values
//! of one tensor, so a list of small tensors (a transformer's weights and
//! biases of 128 - 65,536 values) runs a few dozen blocks, each looping
//! over its chunk: on an H200 that took 33 - 100 us a group in the
//! `tolaria-lm` profile, besides the `_foreach_add_` of the step counts.
//! Here a block takes 1,024 values of one tensor, so the same list is a few
//! hundred blocks of one pass each.
//!
//! The arithmetic is `_fused_adamw_`'s on CUDA (ADAMW mode, no amsgrad),
//! in `f32` with the hyperparameters cast to `f32` first, as ATen's kernel
//! does: the gradient divided by the grad scale (and written back so) when
//! there is one, negated for `maximize`; `param -= lr·wd·param`; the
//! moments `m = β1·m + (1 - β1)·g` and `v = β2·v + (1 - β2)·g²`; the bias
//! corrections from the advanced step count;
//! `param -= (lr / bc1)·m / (√v / √bc2 + eps)`. Nothing is updated, and no
//! step count advanced, when `found_inf` holds 1 (a count is advanced by
//! `1 - found_inf`, as libtorch's add-then-subtract does). Nothing is read
//! back: the launches can be captured in a CUDA graph (the tensor addresses
//! and hyperparameters travel by value in the kernel's parameters; a
//! learning rate given as a tensor is read on the device at each run).

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::fused::{AdamWOptions, LearningRate};
use crate::jit::{Arg, JitKernel, KernelCache};

/// Tensors one launch takes (the kernel's parameter table stays under the
/// 4 KiB every CUDA architecture accepts).
pub(crate) const MAX_TENSORS: usize = 40;

/// Values a block updates (256 threads, four values each).
const BLOCK_VALUES: i64 = 1024;

/// Bytes of the table: the header (`count`, `maximize`, `lr`, `lr_ptr`,
/// `beta1`, `beta2`, `weight_decay`, `eps`, `grad_scale`, `found_inf`) and
/// [`MAX_TENSORS`] entries (`param`, `grad`, `exp_avg`, `exp_avg_sq`,
/// `step`, `numel`, `first_block`), eight bytes each.
const TABLE_BYTES: usize = 10 * 8 + MAX_TENSORS * 7 * 8;

// The table travels as a kernel parameter: within the 4 KiB limit.
const _: () = assert!(TABLE_BYTES <= 4096);

const SOURCE: &str = r#"
struct Entry {
    long long param, grad, exp_avg, exp_avg_sq, step, numel, first_block;
};
struct Table {
    long long count, maximize;
    double lr;
    long long lr_ptr;
    double beta1, beta2, weight_decay, eps;
    long long grad_scale, found_inf;
    Entry entries[40];
};

extern "C" __global__ void esper_adamw(const Table t) {
    ESPER_PDL_ENTRY();
    const float* found_inf = reinterpret_cast<const float*>(t.found_inf);
    if (found_inf != nullptr && *found_inf == 1.0f) return;
    const Entry e = t.entries[entry_of_block(t)];
    const long long start = ((long long)blockIdx.x - e.first_block) * 1024;
    float* param = reinterpret_cast<float*>(e.param);
    float* grad = reinterpret_cast<float*>(e.grad);
    float* exp_avg = reinterpret_cast<float*>(e.exp_avg);
    float* exp_avg_sq = reinterpret_cast<float*>(e.exp_avg_sq);
    const float* grad_scale = reinterpret_cast<const float*>(t.grad_scale);
    const float* lr_ptr = reinterpret_cast<const float*>(t.lr_ptr);
    // ATen's CUDA kernel does its arithmetic in float: the hyperparameters
    // cast to float first, the bias corrections from the float step count.
    const float lr = lr_ptr != nullptr ? *lr_ptr : (float)t.lr;
    const float beta1 = (float)t.beta1, beta2 = (float)t.beta2;
    const float weight_decay = (float)t.weight_decay, eps = (float)t.eps;
    // The step count as the libtorch path reads it: advanced by one first.
    const float step = *reinterpret_cast<const float*>(e.step) + 1.0f;
    const float bias_correction1 = 1.0f - powf(beta1, step);
    const float bias_correction2 = 1.0f - powf(beta2, step);
    const float bias_correction2_sqrt = sqrtf(bias_correction2);
    const float step_size = lr / bias_correction1;
    float p[4], g[4], m[4], v[4];
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long i = start + threadIdx.x + u * 256;
        if (i < e.numel) {
            p[u] = param[i]; g[u] = grad[i]; m[u] = exp_avg[i]; v[u] = exp_avg_sq[i];
        }
    }
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long i = start + threadIdx.x + u * 256;
        if (i >= e.numel) continue;
        float pv = p[u], gv = g[u], mv = m[u], vv = v[u];
        if (grad_scale != nullptr) {
            gv = gv / *grad_scale;
            grad[i] = gv;
        }
        if (t.maximize) gv = -gv;
        if (weight_decay != 0.0f) pv -= lr * weight_decay * pv;
        mv = beta1 * mv + (1.0f - beta1) * gv;
        vv = beta2 * vv + (1.0f - beta2) * gv * gv;
        const float denom = sqrtf(vv) / bias_correction2_sqrt + eps;
        pv -= step_size * mv / denom;
        param[i] = pv; exp_avg[i] = mv; exp_avg_sq[i] = vv;
    }
}

// Every step count advanced by 1 - found_inf (by 1 without one).
extern "C" __global__ void esper_adamw_steps(const Table t) {
    ESPER_PDL_ENTRY();
    const float* found_inf = reinterpret_cast<const float*>(t.found_inf);
    for (int k = threadIdx.x; k < (int)t.count; k += blockDim.x) {
        float* step = reinterpret_cast<float*>(t.entries[k].step);
        float s = *step + 1.0f;
        if (found_inf != nullptr) s -= *found_inf;
        *step = s;
    }
}
"#;

/// The two kernels, compiled once per device.
struct Kernels {
    update: JitKernel,
    steps: JitKernel,
}

fn kernels(device: usize) -> Result<std::sync::Arc<Kernels>> {
    static CACHE: KernelCache<usize, Kernels> = KernelCache::new();
    CACHE
        .get_or_build(device, || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let source = format!("{}{SOURCE}", crate::foreach_kernel::ENTRY_OF_BLOCK);
            let cubin =
                crate::jit::compile(&source, "esper_adamw", arch).map_err(|e| e.to_string())?;
            let load = |name: &std::ffi::CStr| {
                JitKernel::load_named(&cubin, name, device).map_err(|e| e.to_string())
            };
            Ok(Kernels {
                update: load(c"esper_adamw")?,
                steps: load(c"esper_adamw_steps")?,
            })
        })
        .map_err(|message| Error::Cpp {
            op: "fused::adamw_step",
            message,
        })
}

/// The five lists of one AdamW step, each a tensor per parameter.
pub(crate) struct Lists<'a> {
    pub(crate) params: &'a [Tensor],
    pub(crate) grads: &'a [Tensor],
    pub(crate) exp_avgs: &'a [Tensor],
    pub(crate) exp_avg_sqs: &'a [Tensor],
    pub(crate) state_steps: &'a [Tensor],
}

impl<'a> Lists<'a> {
    /// Each parameter's five tensors, `[param, grad, exp_avg, exp_avg_sq,
    /// step]` (the caller has checked the lists' lengths agree).
    fn rows(&self) -> impl Iterator<Item = [&'a Tensor; 5]> + 'a {
        self.params
            .iter()
            .zip(self.grads)
            .zip(self.exp_avgs)
            .zip(self.exp_avg_sqs)
            .zip(self.state_steps)
            .map(|((((p, g), m), v), s)| [p, g, m, v, s])
    }
}

/// The CUDA device where the kernels take the step, or `None` when
/// libtorch's `_fused_adamw_` must (the fused kernels off, a tensor off
/// that device, not `f32`, not contiguous, a gradient or state shaped
/// unlike its parameter, a step count or scalar that is not one `f32`).
pub(crate) fn target(lists: &Lists<'_>, options: &AdamWOptions<'_>) -> Option<usize> {
    if !crate::nn::fused_kernels_enabled() {
        return None;
    }
    let Device::Cuda(device) = lists.params.first()?.device() else {
        return None;
    };
    let on = Device::Cuda(device);
    let dense = |t: &Tensor, numel: usize| {
        t.defined()
            && t.device() == on
            && t.kind() == Kind::Float
            && t.is_contiguous()
            && t.numel() == numel
    };
    let scalar = |t: &Tensor| dense(t, 1);
    for [param, grad, exp_avg, exp_avg_sq, step] in lists.rows() {
        let numel = param.numel();
        if ![param, grad, exp_avg, exp_avg_sq]
            .iter()
            .all(|t| dense(t, numel))
            || !scalar(step)
        {
            return None;
        }
    }
    if let LearningRate::Tensor(lr) = options.lr
        && !scalar(lr)
    {
        return None;
    }
    if options.grad_scale.is_some_and(|t| !scalar(t))
        || options.found_inf.is_some_and(|t| !scalar(t))
    {
        return None;
    }
    Some(device)
}

/// The step on `device` (checked by [`target`]): one update launch and one
/// step-count launch per [`MAX_TENSORS`] tensors; empty tensors are left
/// out of the update (their step counts still advance).
pub(crate) fn step(device: usize, lists: &Lists<'_>, options: &AdamWOptions<'_>) -> Result<()> {
    const OP: &str = "fused::adamw_step";
    let k = kernels(device)?;
    let address = |t: &Tensor| t.data_ptr() as i64;
    let (lr, lr_ptr) = match options.lr {
        LearningRate::Value(value) => (value, 0),
        LearningRate::Tensor(tensor) => (0.0, address(tensor)),
    };
    let optional = |t: Option<&Tensor>| t.map_or(0, address);
    let entries: Vec<[&Tensor; 5]> = lists.rows().collect();
    for chunk in entries.chunks(MAX_TENSORS) {
        let mut table = Vec::with_capacity(TABLE_BYTES);
        let count = i64::try_from(chunk.len()).unwrap_or(0);
        for word in [count, i64::from(options.maximize)] {
            table.extend_from_slice(&word.to_ne_bytes());
        }
        table.extend_from_slice(&lr.to_ne_bytes());
        table.extend_from_slice(&lr_ptr.to_ne_bytes());
        for value in [
            options.beta1,
            options.beta2,
            options.weight_decay,
            options.eps,
        ] {
            table.extend_from_slice(&value.to_ne_bytes());
        }
        for word in [optional(options.grad_scale), optional(options.found_inf)] {
            table.extend_from_slice(&word.to_ne_bytes());
        }
        let mut blocks = 0_i64;
        for [param, grad, exp_avg, exp_avg_sq, step] in chunk {
            let numel = i64::try_from(param.numel()).map_err(|_| Error::InvalidArgument {
                op: OP,
                message: format!(
                    "a tensor of {} values: more than an i64 counts",
                    param.numel()
                ),
            })?;
            for word in [
                address(param),
                address(grad),
                address(exp_avg),
                address(exp_avg_sq),
                address(step),
                numel,
                blocks,
            ] {
                table.extend_from_slice(&word.to_ne_bytes());
            }
            blocks = blocks.saturating_add((numel + BLOCK_VALUES - 1) / BLOCK_VALUES);
        }
        table.resize(TABLE_BYTES, 0);
        if blocks > 0 {
            let grid = u32::try_from(blocks).map_err(|_| Error::InvalidArgument {
                op: OP,
                message: format!("{blocks} blocks do not fit one launch"),
            })?;
            k.update
                .launch([grid, 1, 1], [256, 1, 1], 0, &[Arg::Bytes(&table)])?;
        }
        k.steps
            .launch([1, 1, 1], [64, 1, 1], 0, &[Arg::Bytes(&table)])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_adamw_kernels_compile_without_a_gpu() {
        let source = format!("{}{SOURCE}", crate::foreach_kernel::ENTRY_OF_BLOCK);
        let cubin = crate::jit::compile(&source, "esper_adamw", (9, 0)).expect("NVRTC compiles it");
        assert!(cubin.contains_symbol("esper_adamw"));
        assert!(cubin.contains_symbol("esper_adamw_steps"));
    }

    #[test]
    fn the_table_holds_as_many_entries_as_the_kernels_struct() {
        assert!(SOURCE.contains(&format!("Entry entries[{MAX_TENSORS}]")));
    }

    #[test]
    fn tensors_off_cuda_go_to_libtorch() {
        let p = vec![Tensor::zeros([3], (Kind::Float, Device::Cpu))];
        let s = vec![Tensor::zeros([], (Kind::Float, Device::Cpu))];
        let options = AdamWOptions::default();
        let lists = Lists {
            params: &p,
            grads: &p,
            exp_avgs: &p,
            exp_avg_sqs: &p,
            state_steps: &s,
        };
        assert_eq!(target(&lists, &options), None);
    }
}
