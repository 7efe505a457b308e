//! The SGD step of [`crate::fused::sgd_step_groups`] as torch-ext's own
//! kernel, for `f32` tensors on CUDA: one launch updates every tensor of
//! several parameter groups, each group with its own learning rate,
//! momentum, dampening, weight decay and flags, and advances the groups'
//! step counts.
//!
//! libtorch's `_fused_sgd_` is one launch a group, plus a `_foreach_add_`
//! of the step counts: in `tolaria-fmnist` four launches of 1.5 - 3.1 us a
//! step on an H200 for about 20 small tensors. Here a block takes 1,024
//! values of one tensor, and a last block the step counts.
//!
//! The arithmetic is `_fused_sgd_`'s on CUDA: the gradient divided by the
//! grad scale (and written back so) when there is one, negated for
//! `maximize`, the weight decay's `wd · p` added in double precision; with
//! momentum the buffer `m · buf + (1 − dampening) · g` (the gradient itself
//! on the first step) in double precision, rounded to `f32` when stored;
//! the direction the buffer, or `g + m · buf` for Nesterov; `p −= lr · d` in
//! double precision. A group whose `found_inf` holds 1 is left alone. The
//! step counts go up by one whatever `found_inf` says, as the
//! `_foreach_add_` they replace did. Nothing is read back: the launch can
//! be captured in a CUDA graph (addresses and hyperparameters travel by
//! value in the kernel's parameters; a learning rate given as a tensor is
//! read on the device at each run).

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::fused::{LearningRate, SgdGroup};
use crate::jit::{Arg, JitKernel, KernelCache};

/// Tensors one launch takes.
pub(crate) const MAX_TENSORS: usize = 64;

/// Groups one launch takes.
pub(crate) const MAX_GROUPS: usize = 8;

/// Step counts one launch advances.
pub(crate) const MAX_COUNTS: usize = 8;

/// Values a block updates (256 threads, four values each).
const BLOCK_VALUES: i64 = 1024;

/// Bytes of the table: the header (`count`, `groups`, `counts`), eight
/// words a group (`lr`, `lr_ptr`, `momentum`, `dampening`,
/// `weight_decay`, `flags`, `grad_scale`, `found_inf`), a word a step count
/// and six an entry (`param`, `grad`, `buf`, `numel`, `first_block`,
/// `group`), eight bytes each.
const TABLE_BYTES: usize = (3 + MAX_GROUPS * 8 + MAX_COUNTS + MAX_TENSORS * 6) * 8;

// The table travels as a kernel parameter: within the 4 KiB limit.
const _: () = assert!(TABLE_BYTES <= 4096);

const SOURCE: &str = r#"
struct Group {
    double lr;
    long long lr_ptr;
    double momentum, dampening, weight_decay;
    long long flags, grad_scale, found_inf;
};
struct Entry { long long param, grad, buf, numel, first_block, group; };
struct Table {
    long long count, groups, counts;
    Group g[8];
    long long count_ptrs[8];
    Entry entries[64];
};

// flags: bit 0 Nesterov, bit 1 maximize, bit 2 the first step.
extern "C" __global__ void esper_sgd(const Table t) {
    ESPER_PDL_ENTRY();
    if ((int)blockIdx.x == (int)gridDim.x - 1) {
        if ((long long)threadIdx.x < t.counts) {
            float* count = reinterpret_cast<float*>(t.count_ptrs[threadIdx.x]);
            *count = *count + 1.0f;
        }
        return;
    }
    const Entry e = t.entries[entry_of_block(t)];
    const Group g = t.g[e.group];
    const float* found_inf = reinterpret_cast<const float*>(g.found_inf);
    if (found_inf != nullptr && *found_inf == 1.0f) return;
    const long long start = ((long long)blockIdx.x - e.first_block) * 1024;
    float* param = reinterpret_cast<float*>(e.param);
    float* grad = reinterpret_cast<float*>(e.grad);
    float* buf = reinterpret_cast<float*>(e.buf);
    const float* grad_scale = reinterpret_cast<const float*>(g.grad_scale);
    const float* lr_ptr = reinterpret_cast<const float*>(g.lr_ptr);
    const double lr = lr_ptr != nullptr ? (double)*lr_ptr : g.lr;
    const bool nesterov = (g.flags & 1) != 0, maximize = (g.flags & 2) != 0;
    const bool first = (g.flags & 4) != 0;
    float p[4], d[4], m[4];
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long i = start + threadIdx.x + u * 256;
        if (i < e.numel) {
            p[u] = param[i]; d[u] = grad[i];
            if (buf != nullptr && !first) m[u] = buf[i];
        }
    }
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long i = start + threadIdx.x + u * 256;
        if (i >= e.numel) continue;
        float gv = d[u];
        if (grad_scale != nullptr) {
            gv = (float)((double)gv / (double)*grad_scale);
            grad[i] = gv;
        }
        if (maximize) gv = -gv;
        if (g.weight_decay != 0.0) gv = (float)((double)gv + g.weight_decay * (double)p[u]);
        if (buf != nullptr) {
            const double mb = first ? (double)gv
                                    : g.momentum * (double)m[u] + (1.0 - g.dampening) * (double)gv;
            buf[i] = (float)mb;
            gv = nesterov ? (float)((double)gv + g.momentum * mb) : (float)mb;
        }
        param[i] = (float)((double)p[u] - lr * (double)gv);
    }
}
"#;

fn kernel(device: usize) -> Result<std::sync::Arc<JitKernel>> {
    static CACHE: KernelCache<usize, JitKernel> = KernelCache::new();
    CACHE
        .get_or_build(device, || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let source = format!("{}{SOURCE}", crate::foreach_kernel::ENTRY_OF_BLOCK);
            let cubin =
                crate::jit::compile(&source, "esper_sgd", arch).map_err(|e| e.to_string())?;
            JitKernel::load_named(&cubin, c"esper_sgd", device).map_err(|e| e.to_string())
        })
        .map_err(|message| Error::Cpp {
            op: "fused::sgd_step_groups",
            message,
        })
}

/// The CUDA device where the kernel takes the step, or `None` when
/// libtorch's `_fused_sgd_` (and `_foreach_add_`) must: the fused kernels
/// off, a tensor off that device, not `f32`, a parameter whose values do
/// not fill one dense span (any order of its dimensions is taken, so
/// channels-last weights are), a gradient or buffer shaped or strided
/// unlike its parameter, momentum buffers that do not match
/// the momentum (one a parameter with momentum, none without), a scalar
/// that is not one `f32`, or more groups, counts or tensors than one
/// launch takes. The lists' lengths have been checked by the caller.
pub(crate) fn target(groups: &[SgdGroup<'_>], counts: &[Tensor]) -> Option<usize> {
    if !crate::nn::fused_kernels_enabled()
        || groups.len() > MAX_GROUPS
        || counts.len() > MAX_COUNTS
        || groups.iter().map(|g| g.params.len()).sum::<usize>() > MAX_TENSORS
    {
        return None;
    }
    let first = groups
        .iter()
        .find_map(|g| g.params.first())
        .or(counts.first())?;
    let Device::Cuda(device) = first.device() else {
        return None;
    };
    let on = Device::Cuda(device);
    let dense = |t: &Tensor, numel: usize| {
        t.defined() && t.device() == on && t.kind() == Kind::Float && t.numel() == numel
    };
    let scalar = |t: &Tensor| dense(t, 1);
    // A parameter may be in any dense layout (channels-last conv weights);
    // its gradient and buffer must share it, so that the kernel's `i`-th
    // value of each is the same element.
    // (Strides of dimensions of one value do not matter.)
    let like = |t: &Tensor, param: &Tensor| {
        let (size, stride) = (param.size(), param.stride());
        dense(t, param.numel())
            && t.size() == size
            && t.stride()
                .iter()
                .zip(&stride)
                .zip(&size)
                .all(|((a, b), &n)| n == 1 || a == b)
    };
    for group in groups {
        let options = &group.options;
        let with_buffers = !group.momentum_buffers.is_empty();
        if with_buffers != (options.momentum != 0.0) {
            return None;
        }
        for (index, (param, grad)) in group.params.iter().zip(group.grads).enumerate() {
            let buffer_fits = group
                .momentum_buffers
                .get(index)
                .is_none_or(|b| like(b, param));
            if !dense(param, param.numel())
                || !dense_layout(param)
                || !like(grad, param)
                || !buffer_fits
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
    }
    counts.iter().all(scalar).then_some(device)
}

/// Whether `t`'s values fill one span of `numel` values without gaps or
/// overlaps, in some order of its dimensions (contiguous, channels-last or
/// any other permutation of a contiguous layout), so that `data_ptr` and
/// an offset below `numel` reach every value once.
fn dense_layout(t: &Tensor) -> bool {
    let mut dims: Vec<(i64, i64)> = t
        .stride()
        .into_iter()
        .zip(t.size())
        .filter(|&(_, size)| size != 1)
        .collect();
    if dims.iter().any(|&(_, size)| size == 0) {
        return true;
    }
    dims.sort_unstable();
    let mut expected = 1_i64;
    for (stride, size) in dims {
        if stride != expected {
            return false;
        }
        expected = expected.saturating_mul(size);
    }
    true
}

/// The step on `device` (checked by [`target`]): one launch; empty tensors
/// are left out.
pub(crate) fn step(device: usize, groups: &[SgdGroup<'_>], counts: &[Tensor]) -> Result<()> {
    const OP: &str = "fused::sgd_step_groups";
    let k = kernel(device)?;
    let address = |t: &Tensor| t.data_ptr() as i64;
    let optional = |t: Option<&Tensor>| t.map_or(0, address);
    let word = |table: &mut Vec<u8>, w: i64| table.extend_from_slice(&w.to_ne_bytes());
    let float = |table: &mut Vec<u8>, v: f64| table.extend_from_slice(&v.to_ne_bytes());
    let mut entries = Vec::new();
    let mut blocks = 0_i64;
    for (group_index, group) in groups.iter().enumerate() {
        for (index, (param, grad)) in group.params.iter().zip(group.grads).enumerate() {
            let numel = i64::try_from(param.numel()).map_err(|_| Error::InvalidArgument {
                op: OP,
                message: format!(
                    "a tensor of {} values: more than an i64 counts",
                    param.numel()
                ),
            })?;
            if numel == 0 {
                continue;
            }
            let buffer = group.momentum_buffers.get(index).map_or(0, address);
            let group_word = i64::try_from(group_index).unwrap_or(0);
            entries.push([
                address(param),
                address(grad),
                buffer,
                numel,
                blocks,
                group_word,
            ]);
            blocks = blocks.saturating_add((numel + BLOCK_VALUES - 1) / BLOCK_VALUES);
        }
    }
    let mut table = Vec::with_capacity(TABLE_BYTES);
    for w in [entries.len(), groups.len(), counts.len()] {
        word(&mut table, i64::try_from(w).unwrap_or(0));
    }
    for index in 0..MAX_GROUPS {
        let Some(group) = groups.get(index) else {
            table.extend_from_slice(&[0; 64]);
            continue;
        };
        let o = &group.options;
        let (lr, lr_ptr) = match o.lr {
            LearningRate::Value(value) => (value, 0),
            LearningRate::Tensor(tensor) => (0.0, address(tensor)),
        };
        float(&mut table, lr);
        word(&mut table, lr_ptr);
        for v in [o.momentum, o.dampening, o.weight_decay] {
            float(&mut table, v);
        }
        let flags = i64::from(o.nesterov)
            | (i64::from(o.maximize) << 1)
            | (i64::from(o.is_first_step) << 2);
        for w in [flags, optional(o.grad_scale), optional(o.found_inf)] {
            word(&mut table, w);
        }
    }
    for index in 0..MAX_COUNTS {
        word(&mut table, counts.get(index).map_or(0, address));
    }
    for entry in &entries {
        for &w in entry {
            word(&mut table, w);
        }
    }
    table.resize(TABLE_BYTES, 0);
    // The update's blocks, then one for the step counts.
    let grid = u32::try_from(blocks.saturating_add(1)).map_err(|_| Error::InvalidArgument {
        op: OP,
        message: format!("{blocks} blocks do not fit one launch"),
    })?;
    k.launch([grid, 1, 1], [256, 1, 1], 0, &[Arg::Bytes(&table)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::SgdOptions;

    #[test]
    fn the_sgd_kernel_compiles_without_a_gpu() {
        let source = format!("{}{SOURCE}", crate::foreach_kernel::ENTRY_OF_BLOCK);
        match crate::jit::compile(&source, "esper_sgd", (9, 0)) {
            Ok(cubin) => assert!(cubin.contains_symbol("esper_sgd")),
            Err(error) if error.to_string().contains("libnvrtc") => {
                println!("skipping: NVRTC is not installed here ({error})");
            }
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn the_table_holds_as_many_entries_groups_and_counts_as_the_kernels_struct() {
        assert!(SOURCE.contains(&format!("Entry entries[{MAX_TENSORS}]")));
        assert!(SOURCE.contains(&format!("Group g[{MAX_GROUPS}]")));
        assert!(SOURCE.contains(&format!("count_ptrs[{MAX_COUNTS}]")));
    }

    #[test]
    fn dense_layouts_are_any_order_of_a_contiguous_span() {
        let x = Tensor::zeros([2, 3, 4, 5], (Kind::Float, Device::Cpu));
        assert!(dense_layout(&x));
        let nhwc = crate::memory::contiguous_channels_last(&x).unwrap();
        assert!(!nhwc.is_contiguous() && dense_layout(&nhwc));
        assert!(dense_layout(&x.permute([3, 1, 0, 2])));
        // Gaps (every second value) and overlaps (a broadcast) are not.
        assert!(!dense_layout(&x.slice(3, 0, 5, 2)));
        assert!(!dense_layout(
            &x.slice(0, 0, 1, 1).expand([4, 3, 4, 5], false)
        ));
        // A dimension of one value may have any stride.
        assert!(dense_layout(
            &Tensor::zeros([8, 1, 3, 3], (Kind::Float, Device::Cpu)).as_strided(
                [8, 1, 3, 3],
                [9, 1, 3, 1],
                None
            )
        ));
    }

    #[test]
    fn tensors_off_cuda_go_to_libtorch() {
        let p = vec![Tensor::zeros([3], (Kind::Float, Device::Cpu))];
        let group = SgdGroup {
            params: &p,
            grads: &p,
            momentum_buffers: &[],
            options: SgdOptions {
                momentum: 0.0,
                ..SgdOptions::default()
            },
        };
        assert_eq!(target(&[group], &[]), None);
    }
}
