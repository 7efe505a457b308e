//! Fused network layers: batch normalisation with ReLU, and the 2x2 max-pool,
//! each as two run-time compiled kernels forward and two (one for the pool)
//! backward, wired into autograd by the shim (`cpp/nn.cpp`).
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
//! - [`batch_norm_relu`]: a statistics pass (per-block Welford partials, one
//!   channel per thread, so no thread divides by the channel count), then a
//!   pass in which every block merges the partials in the same fixed order,
//!   normalises and applies ReLU, block 0 also writing the saved statistics
//!   and updating the running ones (momentum, unbiased variance). Backward
//!   recomputes the ReLU mask from the saved input: one pass sums the
//!   gradient and gradient x normalised input per block, the next merges
//!   them and writes the input gradient, block 0 the weight and bias
//!   gradients. Every sum is taken in a fixed order, so results are
//!   deterministic.
//! - [`max_pool2x2`]: `max_pool2d(x, 2, 2)` (floor), NCHW or NHWC; the
//!   backward recomputes each window's argmax from the saved input (the
//!   first maximum wins, a NaN wins over numbers, as libtorch picks them)
//!   and writes every input gradient once, zeros included.
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
//! ```no_run
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

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::ffi;
use crate::jit::{JitKernel, KernelCache};

/// Most channels the fused normalisation takes (one block pass holds at
/// least one row of every channel); wider tensors use libtorch's op.
pub const MAX_FUSED_CHANNELS: i64 = 256;

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

const SOURCE: &str = r#"
#define THREADS 256
#if ESPER_BF16
typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p, long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ void st(T* p, long long i, float v) {
    unsigned int u = __float_as_uint(v);
    p[i] = (u & 0x7fffffffu) > 0x7f800000u
        ? (unsigned short)0x7fc0
        : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#else
typedef float T;
__device__ __forceinline__ float ld(const T* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long long i, float v) { p[i] = v; }
#endif

// Chan's merge of (n, mean, m2) summaries.
__device__ __forceinline__ void merge(float& n, float& mean, float& m2,
                                      float nb, float mb, float m2b) {
    if (nb == 0.0f) return;
    if (n == 0.0f) { n = nb; mean = mb; m2 = m2b; return; }
    const float total = n + nb;
    const float delta = mb - mean;
    const float f = nb / total;
    mean += delta * f;
    m2 += m2b + delta * delta * n * f;
    n = total;
}

// Per-block Welford summaries of every channel of a channels-last [R, C]
// tensor: thread t < per*C reads channel t % C of rows t / C + k * per.
extern "C" __global__ void esper_bn_stats(const T* __restrict__ x, float* __restrict__ partials,
                                          long long rows, int C) {
    __shared__ float sh[3][THREADS];
    const int per = THREADS / C;
    const int t = threadIdx.x;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    if (t < per * C) {
        const int c = t % C;
        const long long step = (long long)gridDim.x * per;
        for (long long r = (long long)blockIdx.x * per + t / C; r < rows; r += step) {
            const float v = ld(x, r * C + c);
            n += 1.0f;
            const float d = v - mean;
            mean += d / n;
            m2 += d * (v - mean);
        }
    }
    sh[0][t] = n; sh[1][t] = mean; sh[2][t] = m2;
    __syncthreads();
    if (t < C) {
        for (int j = 1; j < per; ++j) {
            const int o = t + j * C;
            merge(n, mean, m2, sh[0][o], sh[1][o], sh[2][o]);
        }
        float* out = partials + ((long long)blockIdx.x * C + t) * 3;
        out[0] = n; out[1] = mean; out[2] = m2;
    }
}

// Every block merges the `blocks` partial summaries in one fixed order:
// thread t merges blocks t / C, t / C + per, ... of channel t % C, then
// threads t < C merge those `per` results in order. Leaves the channel's
// (n, mean, m2) in the returned registers of threads t < C.
__device__ void merge_partials(const float* __restrict__ partials, int blocks, int C,
                               float (*sh)[THREADS], float& n, float& mean, float& m2) {
    const int per = THREADS / C;
    const int t = threadIdx.x;
    n = 0.0f; mean = 0.0f; m2 = 0.0f;
    if (t < per * C) {
        const int c = t % C;
        for (int b = t / C; b < blocks; b += per) {
            const float* p = partials + ((long long)b * C + c) * 3;
            merge(n, mean, m2, p[0], p[1], p[2]);
        }
    }
    sh[0][t] = n; sh[1][t] = mean; sh[2][t] = m2;
    __syncthreads();
    if (t < C) {
        for (int j = 1; j < per; ++j) {
            const int o = t + j * C;
            merge(n, mean, m2, sh[0][o], sh[1][o], sh[2][o]);
        }
    }
}

extern "C" __global__ void esper_bn_relu_forward(
    const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ partials, int blocks,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ save_mean, float* __restrict__ save_invstd,
    float* __restrict__ running_mean, float* __restrict__ running_var,
    float momentum, float eps, long long rows, int C) {
    __shared__ float sh[3][THREADS];
    __shared__ float scale[THREADS], shift[THREADS];
    const int t = threadIdx.x;
    float n, mean, m2;
    merge_partials(partials, blocks, C, sh, n, mean, m2);
    if (t < C) {
        const float var = n > 0.0f ? m2 / n : 0.0f;
        const float invstd = rsqrtf(var + eps);
        const float s = invstd * weight[t];
        scale[t] = s;
        shift[t] = bias[t] - mean * s;
        if (blockIdx.x == 0) {
            save_mean[t] = mean;
            save_invstd[t] = invstd;
            if (running_mean != nullptr) {
                running_mean[t] = (1.0f - momentum) * running_mean[t] + momentum * mean;
            }
            if (running_var != nullptr) {
                const float unbiased = n > 1.0f ? m2 / (n - 1.0f) : var;
                running_var[t] = (1.0f - momentum) * running_var[t] + momentum * unbiased;
            }
        }
    }
    __syncthreads();
    const int per = THREADS / C;
    if (t >= per * C) return;
    const int c = t % C;
    const float s = scale[c], h = shift[c];
    const long long step = (long long)gridDim.x * per;
    for (long long r = (long long)blockIdx.x * per + t / C; r < rows; r += step) {
        const long long i = r * C + c;
        const float v = ld(x, i) * s + h;
        st(y, i, v != v ? v : (v > 0.0f ? v : 0.0f));
    }
}

// Backward, pass 1: per-block sums of g and g * xhat, g = dy where the
// forward's pre-activation was positive.
extern "C" __global__ void esper_bn_relu_backward_reduce(
    const T* __restrict__ x, const T* __restrict__ dy,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ partials, long long rows, int C) {
    __shared__ float sh[2][THREADS];
    const int per = THREADS / C;
    const int t = threadIdx.x;
    float sg = 0.0f, sgx = 0.0f;
    if (t < per * C) {
        const int c = t % C;
        const float mean = save_mean[c], invstd = save_invstd[c];
        const float s = invstd * weight[c];
        const float h = bias[c] - mean * s;
        const long long step = (long long)gridDim.x * per;
        for (long long r = (long long)blockIdx.x * per + t / C; r < rows; r += step) {
            const long long i = r * C + c;
            const float xv = ld(x, i);
            const float g = xv * s + h > 0.0f ? ld(dy, i) : 0.0f;
            sg += g;
            sgx += g * ((xv - mean) * invstd);
        }
    }
    sh[0][t] = sg; sh[1][t] = sgx;
    __syncthreads();
    if (t < C) {
        for (int j = 1; j < per; ++j) { sg += sh[0][t + j * C]; sgx += sh[1][t + j * C]; }
        float* out = partials + ((long long)blockIdx.x * C + t) * 2;
        out[0] = sg; out[1] = sgx;
    }
}

// Backward, pass 2: every block sums the partials in one fixed order, then
// dx = weight * invstd * (g - mean(g) - xhat * mean(g * xhat)).
extern "C" __global__ void esper_bn_relu_backward_apply(
    const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
    const float* __restrict__ partials, int blocks,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ dweight, float* __restrict__ dbias, long long rows, int C) {
    __shared__ float sh[2][THREADS];
    __shared__ float mg[THREADS], mgx[THREADS];
    const int per = THREADS / C;
    const int t = threadIdx.x;
    float sg = 0.0f, sgx = 0.0f;
    if (t < per * C) {
        for (int b = t / C; b < blocks; b += per) {
            const float* p = partials + ((long long)b * C + t % C) * 2;
            sg += p[0]; sgx += p[1];
        }
    }
    sh[0][t] = sg; sh[1][t] = sgx;
    __syncthreads();
    if (t < C) {
        for (int j = 1; j < per; ++j) { sg += sh[0][t + j * C]; sgx += sh[1][t + j * C]; }
        mg[t] = sg / (float)rows;
        mgx[t] = sgx / (float)rows;
        if (blockIdx.x == 0) { dweight[t] = sgx; dbias[t] = sg; }
    }
    __syncthreads();
    if (t >= per * C) return;
    const int c = t % C;
    const float mean = save_mean[c], invstd = save_invstd[c];
    const float s = invstd * weight[c];
    const float h = bias[c] - mean * s;
    const float a = mg[c], b = mgx[c];
    const long long step = (long long)gridDim.x * per;
    for (long long r = (long long)blockIdx.x * per + t / C; r < rows; r += step) {
        const long long i = r * C + c;
        const float xv = ld(x, i);
        const float g = xv * s + h > 0.0f ? ld(dy, i) : 0.0f;
        st(dx, i, s * (g - a - (xv - mean) * invstd * b));
    }
}

// 2x2 max-pool, stride 2, floor; NCHW or (cl) NHWC, both contiguous.
__device__ __forceinline__ long long offset(long long n, int c, int h, int w,
                                            int C, int H, int W, int cl) {
    return cl ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

// libtorch's choice: the first maximum in row-major window order, and a NaN
// (the last one seen) over any number.
__device__ __forceinline__ int window_argmax(const T* __restrict__ x, long long base,
                                             long long sh, long long sw, float& best) {
    const float v[4] = {ld(x, base), ld(x, base + sw), ld(x, base + sh), ld(x, base + sh + sw)};
    best = __int_as_float(0xff800000);
    int k = 0;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (v[j] > best || v[j] != v[j]) { best = v[j]; k = j; }
    }
    return k;
}

extern "C" __global__ void esper_pool2_forward(const T* __restrict__ x, T* __restrict__ y,
                                               long long N, int C, int H, int W, int cl) {
    const int Ho = H >> 1, Wo = W >> 1;
    const long long total = N * C * (long long)Ho * Wo;
    const long long sh = cl ? (long long)W * C : W, sw = cl ? C : 1;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long n, r; int c, ho, wo;
        if (cl) { c = (int)(i % C); r = i / C; wo = (int)(r % Wo); r /= Wo; ho = (int)(r % Ho); n = r / Ho; }
        else { wo = (int)(i % Wo); r = i / Wo; ho = (int)(r % Ho); r /= Ho; c = (int)(r % C); n = r / C; }
        float best;
        window_argmax(x, offset(n, c, 2 * ho, 2 * wo, C, H, W, cl), sh, sw, best);
        st(y, i, best);
    }
}

extern "C" __global__ void esper_pool2_backward(const T* __restrict__ x, const T* __restrict__ gy,
                                                T* __restrict__ gx, long long N, int C, int H,
                                                int W, int cl) {
    const int Ho = H >> 1, Wo = W >> 1;
    const long long total = N * C * (long long)H * W;
    const long long sh = cl ? (long long)W * C : W, sw = cl ? C : 1;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long n, r; int c, h, w;
        if (cl) { c = (int)(i % C); r = i / C; w = (int)(r % W); r /= W; h = (int)(r % H); n = r / H; }
        else { w = (int)(i % W); r = i / W; h = (int)(r % H); r /= H; c = (int)(r % C); n = r / C; }
        const int ho = h >> 1, wo = w >> 1;
        float g = 0.0f;
        if (ho < Ho && wo < Wo) {
            float best;
            const int k = window_argmax(x, offset(n, c, 2 * ho, 2 * wo, C, H, W, cl), sh, sw, best);
            if (k == (((h & 1) << 1) | (w & 1))) g = ld(gy, offset(n, c, ho, wo, C, Ho, Wo, cl));
        }
        st(gx, i, g);
    }
}
"#;

/// The six kernels for one dtype on one device.
struct Kernels {
    bn_stats: JitKernel,
    bn_forward: JitKernel,
    bn_reduce: JitKernel,
    bn_apply: JitKernel,
    pool_forward: JitKernel,
    pool_backward: JitKernel,
}

fn kernels(op: &'static str, device: usize, bf16: bool) -> Result<Arc<Kernels>> {
    static CACHE: KernelCache<(usize, bool), Kernels> = KernelCache::new();
    CACHE
        .get_or_build((device, bf16), || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let source = format!("#define ESPER_BF16 {}\n{SOURCE}", u8::from(bf16));
            let cubin =
                crate::jit::compile(&source, "esper_nn", arch).map_err(|e| e.to_string())?;
            let load = |name: &str| {
                let name = CString::new(name).map_err(|e| e.to_string())?;
                JitKernel::load_named(&cubin, &name, device).map_err(|e| e.to_string())
            };
            Ok(Kernels {
                bn_stats: load("esper_bn_stats")?,
                bn_forward: load("esper_bn_relu_forward")?,
                bn_reduce: load("esper_bn_relu_backward_reduce")?,
                bn_apply: load("esper_bn_relu_backward_apply")?,
                pool_forward: load("esper_pool2_forward")?,
                pool_backward: load("esper_pool2_backward")?,
            })
        })
        .map_err(|message| Error::Cpp { op, message })
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
    match x.kind() {
        Kind::Float => Some((device, false)),
        Kind::BFloat16 => Some((device, true)),
        _ => None,
    }
}

/// Whether a 4-D tensor's strides are dense channels-last (NHWC).
fn is_nhwc(x: &Tensor) -> bool {
    let size = x.size();
    let [_, c, h, w] = size[..] else {
        return false;
    };
    let stride = x.stride();
    // A dimension of extent 1 may have any stride.
    let want = [h * w * c, 1, w * c, c];
    size.iter()
        .zip(stride.iter().zip(want))
        .all(|(&extent, (&got, want))| extent == 1 || got == want)
}

/// `relu(batch_norm(x, ...))`, the fused kernels where they apply (see the
/// module docs), libtorch's `batch_norm` and `relu` otherwise (and always
/// for `train == false`, which uses the running statistics). In training
/// the running statistics, when given, are updated in place.
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
    let fused = fused_target(x).filter(|_| train && is_nhwc(x));
    let channels = x.size().get(1).copied().unwrap_or(0);
    let rows = x.numel() / usize::try_from(channels.max(1)).unwrap_or(1);
    let per_channel_ok = [Some(weight), Some(bias), running_mean, running_var]
        .into_iter()
        .flatten()
        .all(|t| {
            t.size() == [channels]
                && t.kind() == Kind::Float
                && t.device() == x.device()
                && t.is_contiguous()
        });
    let eligible = per_channel_ok && (1..=MAX_FUSED_CHANNELS).contains(&channels) && rows > 1;
    let Some((device, bf16)) = fused.filter(|_| eligible) else {
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
    let k = kernels(OP, device, bf16)?;
    let handles = [
        k.bn_stats.raw(),
        k.bn_forward.raw(),
        k.bn_reduce.raw(),
        k.bn_apply.raw(),
    ];
    let optional = |t: Option<&Tensor>| t.map_or(std::ptr::null_mut(), ffi::tensor_ptr);
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: every tensor pointer is live for the call; `handles` are live
    // kernels (the cache never drops them, so the autograd node's backward
    // may use them later); `out` receives a `new at::Tensor` we take over.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_batch_norm_relu(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                ffi::tensor_ptr(bias),
                optional(running_mean),
                optional(running_var),
                momentum,
                eps,
                handles.as_ptr(),
                &mut out,
            ),
        )?;
        Ok(Tensor::from_ptr(out.cast()))
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
        if is_nhwc(x) && x.size()[1] > 1 {
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
    let k = kernels(OP, device, bf16)?;
    let handles = [k.pool_forward.raw(), k.pool_backward.raw()];
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: as in `batch_norm_relu`.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_max_pool2(
                ffi::tensor_ptr(x),
                i32::from(channels_last),
                handles.as_ptr(),
                &mut out,
            ),
        )?;
        Ok(Tensor::from_ptr(out.cast()))
    }
}
