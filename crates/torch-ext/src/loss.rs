//! The training loss as two CUDA kernels: mean cross-entropy, its gradient
//! with respect to the logits, and the epoch's loss and hit counters, with
//! [`backward_with`] carrying the gradient on through autograd.
//!
//! libtorch's `cross_entropy` forward and backward plus the usual metric
//! kernels (argmax, compare, sum, two accumulations) are about ten small
//! kernels a step; on a tiny model they are most of the step. Here:
//!
//! 1. one kernel computes every row's log-sum-exp, loss, argmax hit and
//!    softmax (into the gradient buffer), reduces the rows deterministically
//!    (a fixed row-to-warp mapping, warps and blocks summed in index order,
//!    the last block to finish sums the blocks' partials) and adds the mean
//!    loss and the hits into the caller's accumulator;
//! 2. one element-wise kernel turns the softmax into the gradient of
//!    `weight · scale · mean loss`: `(softmax − onehot) · weight · scale /
//!    valid rows`. For a small batch (up to 32 rows) one block does both in
//!    a single launch.
//!
//! Rows whose label is outside `[0, classes)` are ignored, as libtorch's
//! `ignore_index` ignores −100: no loss, no hit, no gradient, not counted in
//! the mean. The arithmetic is libtorch's up to float rounding; a GPU test
//! compares loss, accumulators and gradients with `cross_entropy`.
//!
//! Everything is launched on the current stream and nothing is read back,
//! so a step using it can be captured. The reduction's scratch (block
//! partials and a ticket) belongs to one [`FusedCrossEntropy`]: give each
//! trainer its own, since two streams running one instance at the same time
//! would share it.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::ffi;
use crate::jit::{Arg, JitKernel, KernelCache};

/// Threads per block of the row kernel (8 warps).
const ROW_THREADS: u32 = 256;
/// Warps per block of the row kernel.
const WARPS: u32 = ROW_THREADS / 32;
/// Most blocks of the row kernel (the partials buffer's length).
const MAX_BLOCKS: u32 = 256;
/// Threads per block of the gradient kernel.
const GRAD_THREADS: u32 = 256;
/// Up to this many rows (four per warp) and logits one block does
/// everything, gradient included, in one launch; above, the rows spread over
/// blocks (one block walking 256 rows took longer than two launches).
const ONE_BLOCK_ROWS: i64 = 4 * WARPS as i64;
const ONE_BLOCK_ELEMENTS: i64 = 1 << 15;

const SOURCE: &str = r#"
#define WARPS 8
#define MAX_BLOCKS 256
#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void esper_ce_rows(
    const float* __restrict__ logits, const long long* __restrict__ labels,
    float* __restrict__ probs, float* __restrict__ partials, unsigned int* __restrict__ ticket,
    float* __restrict__ stats, float* __restrict__ acc,
    long long rows, long long classes, float loss_weight, float hits_weight,
    int fuse_grad, const float* __restrict__ scale, int has_scale, float weight) {
    ESPER_PDL_ENTRY();
    __shared__ float warp_sums[WARPS][3];
    __shared__ bool last;
    __shared__ float valid_rows;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long stride = (long long)gridDim.x * WARPS;
    float loss_sum = 0.0f, hits = 0.0f, valid = 0.0f;
    for (long long r = (long long)blockIdx.x * WARPS + warp; r < rows; r += stride) {
        const float* x = logits + r * classes;
        // argmax as torch.argmax: NaN counts as the largest value, the
        // first index wins ties; -1 while a lane has seen nothing larger
        // than -inf.
        float best = NEG_INF;
        long long best_index = -1;
        for (long long j = lane; j < classes; j += 32) {
            float v = x[j];
            bool v_nan = v != v, best_nan = best != best;
            if (!best_nan && (v > best || v_nan || (best_index < 0 && v == best))) {
                best = v; best_index = j;
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            float other = __shfl_down_sync(0xffffffff, best, offset);
            long long other_index = __shfl_down_sync(0xffffffff, best_index, offset);
            bool o_nan = other != other, b_nan = best != best;
            bool take = other_index >= 0 && (best_index < 0
                || (o_nan && !b_nan)
                || (o_nan == b_nan && (other > best || (other == best && other_index < best_index))));
            if (take) { best = other; best_index = other_index; }
        }
        best = __shfl_sync(0xffffffff, best, 0);
        best_index = __shfl_sync(0xffffffff, best_index, 0);
        if (best_index < 0) best_index = 0;
        float sum = 0.0f;
        for (long long j = lane; j < classes; j += 32) sum += expf(x[j] - best);
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffff, sum, offset);
        sum = __shfl_sync(0xffffffff, sum, 0);
        const float inv = 1.0f / sum;
        for (long long j = lane; j < classes; j += 32) probs[r * classes + j] = expf(x[j] - best) * inv;
        if (lane == 0) {
            const long long label = labels[r];
            if (label >= 0 && label < classes) {
                loss_sum += best + logf(sum) - x[label];
                hits += best_index == label ? 1.0f : 0.0f;
                valid += 1.0f;
            }
        }
    }
    if (lane == 0) { warp_sums[warp][0] = loss_sum; warp_sums[warp][1] = hits; warp_sums[warp][2] = valid; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0.0f, b = 0.0f, c = 0.0f;
        for (int w = 0; w < WARPS; ++w) { a += warp_sums[w][0]; b += warp_sums[w][1]; c += warp_sums[w][2]; }
        partials[blockIdx.x * 3 + 0] = a;
        partials[blockIdx.x * 3 + 1] = b;
        partials[blockIdx.x * 3 + 2] = c;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        float a = 0.0f, b = 0.0f, c = 0.0f;
        for (unsigned int k = 0; k < gridDim.x; ++k) {
            a += ((volatile float*)partials)[k * 3 + 0];
            b += ((volatile float*)partials)[k * 3 + 1];
            c += ((volatile float*)partials)[k * 3 + 2];
        }
        stats[0] = a; stats[1] = b; stats[2] = c;
        acc[0] += (a / c) * loss_weight;
        acc[1] += b * hits_weight;
        *ticket = 0u;
        valid_rows = c;
    }
    // One block: the gradient too, in the same launch.
    if (fuse_grad) {
        __syncthreads();
        const float coefficient = weight * (has_scale ? scale[0] : 1.0f) / valid_rows;
        const long long n = rows * classes;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            const long long r = i / classes;
            const long long j = i - r * classes;
            const long long label = labels[r];
            const bool valid = label >= 0 && label < classes;
            probs[i] = valid ? (probs[i] - (j == label ? 1.0f : 0.0f)) * coefficient : 0.0f;
        }
    }
}

extern "C" __global__ void esper_ce_grad(
    float* __restrict__ grad, const long long* __restrict__ labels,
    const float* __restrict__ stats, const float* __restrict__ scale, int has_scale,
    long long rows, long long classes, float weight) {
    ESPER_PDL_ENTRY();
    const long long n = rows * classes;
    const float coefficient = weight * (has_scale ? scale[0] : 1.0f) / stats[2];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / classes;
        const long long j = i - r * classes;
        const long long label = labels[r];
        const bool valid = label >= 0 && label < classes;
        grad[i] = valid ? (grad[i] - (j == label ? 1.0f : 0.0f)) * coefficient : 0.0f;
    }
}
"#;

/// The two kernels, compiled once per device and process.
struct Kernels {
    rows: JitKernel,
    grad: JitKernel,
}

fn kernels(device: usize) -> Result<Arc<Kernels>> {
    static CACHE: KernelCache<usize, Kernels> = KernelCache::new();
    CACHE
        .get_or_build(device, || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let load = |name: &str| {
                crate::jit::compile(SOURCE, name, arch)
                    .and_then(|cubin| JitKernel::load(&cubin, device))
                    .map_err(|e| e.to_string())
            };
            Ok(Kernels {
                rows: load("esper_ce_rows")?,
                grad: load("esper_ce_grad")?,
            })
        })
        .map_err(|message| Error::Cpp {
            op: "loss::FusedCrossEntropy",
            message,
        })
}

/// Mean cross-entropy with its logits gradient and metric accumulation in
/// two kernels (see the module docs); one per trainer.
pub struct FusedCrossEntropy {
    kernels: Arc<Kernels>,
    device: usize,
    partials: Tensor,
    ticket: Tensor,
    stats: Tensor,
}

impl std::fmt::Debug for FusedCrossEntropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedCrossEntropy")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// What one [`FusedCrossEntropy::run`] adds up and how it scales.
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyWeights {
    /// The gradient is that of `weight · mean loss` (a microbatch's share
    /// of its batch).
    pub weight: f64,
    /// `accumulator[0] += mean loss · loss_weight`.
    pub loss_weight: f64,
    /// `accumulator[1] += hits · hits_weight`.
    pub hits_weight: f64,
}

impl FusedCrossEntropy {
    /// The kernels for CUDA device `device` (compiled on first use in the
    /// process) and this instance's scratch.
    pub fn new(device: usize) -> Result<FusedCrossEntropy> {
        let kernels = kernels(device)?;
        let on = Device::Cuda(device);
        let zeros = |size: i64, kind: Kind| {
            Tensor::f_zeros([size], (kind, on)).map_err(|error| Error::Cpp {
                op: "loss::FusedCrossEntropy",
                message: error.to_string(),
            })
        };
        Ok(FusedCrossEntropy {
            kernels,
            device,
            partials: zeros(i64::from(MAX_BLOCKS) * 3, Kind::Float)?,
            ticket: zeros(1, Kind::Int)?,
            stats: zeros(3, Kind::Float)?,
        })
    }

    /// The device it runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// For `logits` `[N, C]` (f32, contiguous, no grad needed) and `labels`
    /// `[N]` (i64): returns the gradient `[N, C]` of `weights.weight ·
    /// scale · mean loss` with respect to the logits, and adds the mean
    /// loss and the hits into `accumulator` (`[2]` f32) as `weights` says.
    /// `scale` is a one-element f32 tensor (a grad scaler's) or none.
    pub fn run(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        scale: Option<&Tensor>,
        accumulator: &Tensor,
        weights: CrossEntropyWeights,
    ) -> Result<Tensor> {
        const OP: &str = "loss::FusedCrossEntropy::run";
        let on = Device::Cuda(self.device);
        let (rows, classes) = match logits.size().as_slice() {
            [rows, classes] if *rows > 0 && *classes > 0 => (*rows, *classes),
            other => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    message: format!("logits of shape {other:?}; expected [N >= 1, C >= 1]"),
                });
            }
        };
        let check = |what: &str, tensor: &Tensor, kind: Kind, shape: &[i64]| {
            if tensor.kind() != kind || tensor.size() != shape || tensor.device() != on {
                Err(Error::InvalidArgument {
                    op: OP,
                    message: format!(
                        "{what}: {:?} {:?} on {:?}; expected {kind:?} {shape:?} on {on:?}",
                        tensor.kind(),
                        tensor.size(),
                        tensor.device()
                    ),
                })
            } else {
                Ok(())
            }
        };
        check("logits", logits, Kind::Float, &[rows, classes])?;
        check("labels", labels, Kind::Int64, &[rows])?;
        check("accumulator", accumulator, Kind::Float, &[2])?;
        let torch = |error: tch::TchError| Error::Cpp {
            op: OP,
            message: error.to_string(),
        };
        let scale = match scale {
            Some(scale) => {
                let flat = scale.f_reshape([-1]).map_err(torch)?;
                check("scale", &flat, Kind::Float, &[1])?;
                Some(flat.f_contiguous().map_err(torch)?)
            }
            None => None,
        };
        let logits = logits.f_contiguous().map_err(torch)?;
        let labels = labels.f_contiguous().map_err(torch)?;
        let grad = Tensor::f_empty([rows, classes], (Kind::Float, on)).map_err(torch)?;
        let elements = rows.saturating_mul(classes);
        let one_block = rows <= ONE_BLOCK_ROWS && elements <= ONE_BLOCK_ELEMENTS;
        let blocks = if one_block {
            1
        } else {
            u32::try_from(rows.unsigned_abs().div_ceil(u64::from(WARPS)))
                .unwrap_or(MAX_BLOCKS)
                .clamp(1, MAX_BLOCKS)
        };
        // Without a scale the kernels never read the scale pointer.
        let scale_arg = scale.as_ref().unwrap_or(&self.stats);
        let has_scale = i32::from(scale.is_some());
        self.kernels.rows.launch(
            [blocks, 1, 1],
            [ROW_THREADS, 1, 1],
            0,
            &[
                Arg::Tensor(&logits),
                Arg::Tensor(&labels),
                Arg::Tensor(&grad),
                Arg::Tensor(&self.partials),
                Arg::Tensor(&self.ticket),
                Arg::Tensor(&self.stats),
                Arg::Tensor(accumulator),
                Arg::I64(rows),
                Arg::I64(classes),
                Arg::F32(weights.loss_weight as f32),
                Arg::F32(weights.hits_weight as f32),
                Arg::I32(i32::from(one_block)),
                Arg::Tensor(scale_arg),
                Arg::I32(has_scale),
                Arg::F32(weights.weight as f32),
            ],
        )?;
        if one_block {
            return Ok(grad);
        }
        let grad_blocks = u32::try_from(elements.unsigned_abs().div_ceil(u64::from(GRAD_THREADS)))
            .unwrap_or(u32::MAX)
            .clamp(1, 4096);
        self.kernels.grad.launch(
            [grad_blocks, 1, 1],
            [GRAD_THREADS, 1, 1],
            0,
            &[
                Arg::Tensor(&grad),
                Arg::Tensor(&labels),
                Arg::Tensor(&self.stats),
                Arg::Tensor(scale_arg),
                Arg::I32(has_scale),
                Arg::I64(rows),
                Arg::I64(classes),
                Arg::F32(weights.weight as f32),
            ],
        )?;
        Ok(grad)
    }
}

/// Backward from `tensor` with gradient `grad` (same shape): accumulates
/// into the leaves' `.grad` as `tensor.backward(grad)` does in PyTorch.
pub fn backward_with(tensor: &Tensor, grad: &Tensor) -> Result<()> {
    if tensor.size() != grad.size() {
        return Err(Error::InvalidArgument {
            op: "loss::backward_with",
            message: format!(
                "gradient of shape {:?} for a tensor of shape {:?}",
                grad.size(),
                tensor.size()
            ),
        });
    }
    // SAFETY: both pointers come from live borrowed tensors.
    unsafe {
        ffi::check(
            "loss::backward_with",
            ffi::esper_backward_with(ffi::tensor_ptr(tensor), ffi::tensor_ptr(grad)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_with_carries_a_given_gradient_into_the_leaves() {
        let w = Tensor::from_slice(&[1.0_f32, 2.0, 3.0]).set_requires_grad(true);
        let y = &w * 2.0;
        let grad = Tensor::from_slice(&[1.0_f32, 10.0, 100.0]);
        backward_with(&y, &grad).expect("backward");
        let got = Vec::<f32>::try_from(w.grad()).expect("grad");
        assert_eq!(got, vec![2.0, 20.0, 200.0]);
    }

    #[test]
    fn backward_with_refuses_a_gradient_of_another_shape_or_a_constant() {
        let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let y = &w * 2.0;
        let wrong = Tensor::ones([4], (Kind::Float, Device::Cpu));
        assert!(matches!(
            backward_with(&y, &wrong),
            Err(Error::InvalidArgument { .. })
        ));
        let constant = Tensor::ones([3], (Kind::Float, Device::Cpu));
        let error = backward_with(&constant, &constant).expect_err("no grad to carry");
        assert!(
            error.to_string().contains("does not require grad"),
            "{error}"
        );
    }

    #[test]
    fn the_fused_loss_needs_a_cuda_device() {
        if crate::cuda::is_available() {
            return;
        }
        assert!(FusedCrossEntropy::new(0).is_err());
    }
}
