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
//! - [`max_pool2x2`]: `max_pool2d(x, 2, 2)` (floor), NCHW or NHWC; the
//!   backward recomputes each window's argmax from the saved input (the
//!   first maximum wins, a NaN wins over numbers, as libtorch picks them)
//!   and writes every input gradient once, zeros included.
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
// VEC channels per thread: 4 (C % 4 == 0, 16-byte aligned NHWC rows) or 1.
#define THREADS 256
#define UNROLL 4
#if ESPER_BF16
typedef unsigned short T;
__device__ __forceinline__ float bf(unsigned int bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ unsigned int to_bf(float v) {
    unsigned int u = __float_as_uint(v);
    return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void load(const T* __restrict__ p, long long i, float* v) {
#if VEC == 4
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    v[0] = bf(u.x & 0xffffu); v[1] = bf(u.x >> 16); v[2] = bf(u.y & 0xffffu); v[3] = bf(u.y >> 16);
#else
    v[0] = bf(p[i]);
#endif
}
__device__ __forceinline__ void store(T* __restrict__ p, long long i, const float* v) {
#if VEC == 4
    uint2 u;
    u.x = to_bf(v[0]) | (to_bf(v[1]) << 16);
    u.y = to_bf(v[2]) | (to_bf(v[3]) << 16);
    *reinterpret_cast<uint2*>(p + i) = u;
#else
    p[i] = (unsigned short)to_bf(v[0]);
#endif
}
#else
typedef float T;
__device__ __forceinline__ void load(const T* __restrict__ p, long long i, float* v) {
#if VEC == 4
    const float4 f = *reinterpret_cast<const float4*>(p + i);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
#else
    v[0] = p[i];
#endif
}
__device__ __forceinline__ void store(T* __restrict__ p, long long i, const float* v) {
#if VEC == 4
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
#else
    p[i] = v[0];
#endif
}
#endif

// The thread layout of every per-channel pass over a channels-last [R, C]
// tensor: G = C / VEC channel groups; `per` rows a block pass (a power of
// two, per * G <= THREADS); thread t < per * G reads group t % G of rows
// t / G + k * per * gridDim.x.
struct Layout {
    int groups, per, group, row;
    bool active;
};
__device__ __forceinline__ Layout layout(int C) {
    Layout l;
    l.groups = C / VEC;
    int per = 1;
    while (per * 2 * l.groups <= THREADS) per *= 2;
    l.per = per;
    l.group = threadIdx.x % l.groups;
    l.row = threadIdx.x / l.groups;
    l.active = threadIdx.x < per * l.groups;
    return l;
}

// Sums sh[k][t] over the rows of each group: a tree over t / G, in one
// fixed order; leaves the totals at t < G. Every thread of the block calls.
template <int K>
__device__ __forceinline__ void tree(float (*sh)[THREADS], const Layout& l) {
    for (int s = l.per / 2; s >= 1; s /= 2) {
        __syncthreads();
        if (l.active && l.row < s) {
            #pragma unroll
            for (int k = 0; k < K; ++k) sh[k][threadIdx.x] += sh[k][threadIdx.x + s * l.groups];
        }
    }
    __syncthreads();
}

// Per-block sums of (x - shift) and (x - shift)^2 per channel, the shift
// being row 0's value (so a mean far from zero loses no precision).
extern "C" __global__ void esper_bn_stats(const T* __restrict__ x, float* __restrict__ partials,
                                          long long rows, int C) {
    __shared__ float sh[2 * VEC][THREADS];
    const Layout l = layout(C);
    float s1[VEC], s2[VEC], k[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { s1[v] = 0.0f; s2[v] = 0.0f; }
    if (l.active) {
        load(x, (long long)l.group * VEC, k);
        const long long step = (long long)gridDim.x * l.per;
        for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
            float val[UNROLL][VEC];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const long long r = r0 + u * step;
                if (r < rows) load(x, r * C + l.group * VEC, val[u]);
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (r0 + u * step < rows) {
                    #pragma unroll
                    for (int v = 0; v < VEC; ++v) {
                        const float d = val[u][v] - k[v];
                        s1[v] += d; s2[v] += d * d;
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sh[v][threadIdx.x] = s1[v]; sh[VEC + v][threadIdx.x] = s2[v]; }
    tree<2 * VEC>(sh, l);
    if (l.active && l.row == 0) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            float* out = partials + ((long long)blockIdx.x * C + l.group * VEC + v) * 2;
            out[0] = sh[v][threadIdx.x]; out[1] = sh[VEC + v][threadIdx.x];
        }
    }
}

// Every block sums the `blocks` partial pairs of every channel in one fixed
// order (thread t adds blocks t / G, t / G + per, ..., then the tree) and
// leaves the totals in tot[0][c], tot[1][c].
__device__ __forceinline__ void merge_pairs(const float* __restrict__ partials, int blocks, int C,
                                            const Layout& l, float (*sh)[THREADS],
                                            float (*tot)[THREADS]) {
    float a[VEC], b[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { a[v] = 0.0f; b[v] = 0.0f; }
    if (l.active) {
        for (int blk = l.row; blk < blocks; blk += l.per) {
            #pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const float* p = partials + ((long long)blk * C + l.group * VEC + v) * 2;
                a[v] += p[0]; b[v] += p[1];
            }
        }
    }
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sh[v][threadIdx.x] = a[v]; sh[VEC + v][threadIdx.x] = b[v]; }
    tree<2 * VEC>(sh, l);
    if (l.active && l.row == 0) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            tot[0][l.group * VEC + v] = sh[v][threadIdx.x];
            tot[1][l.group * VEC + v] = sh[VEC + v][threadIdx.x];
        }
    }
    __syncthreads();
}

extern "C" __global__ void esper_bn_relu_forward(
    const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ partials, int blocks,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ save_mean, float* __restrict__ save_invstd,
    float* __restrict__ running_mean, float* __restrict__ running_var,
    float momentum, float eps, long long rows, int C) {
    __shared__ float sh[2 * VEC][THREADS];
    __shared__ float tot[2][THREADS];
    __shared__ float scale[THREADS], shift[THREADS];
    const Layout l = layout(C);
    merge_pairs(partials, blocks, C, l, sh, tot);
    for (int c = threadIdx.x; c < C; c += THREADS) {
        float k[VEC];
        load(x, (long long)(c / VEC) * VEC, k);
        const float n = (float)rows;
        const float m1 = tot[0][c] / n;
        const float mean = k[c % VEC] + m1;
        const float var = fmaxf(tot[1][c] / n - m1 * m1, 0.0f);
        const float invstd = rsqrtf(var + eps);
        const float s = invstd * weight[c];
        scale[c] = s;
        shift[c] = bias[c] - mean * s;
        if (blockIdx.x == 0) {
            save_mean[c] = mean;
            save_invstd[c] = invstd;
            if (running_mean != nullptr) {
                running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
            }
            if (running_var != nullptr) {
                const float unbiased = rows > 1 ? var * n / (n - 1.0f) : var;
                running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
            }
        }
    }
    __syncthreads();
    if (!l.active) return;
    float s[VEC], h[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { s[v] = scale[l.group * VEC + v]; h[v] = shift[l.group * VEC + v]; }
    const long long step = (long long)gridDim.x * l.per;
    for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
        float val[UNROLL][VEC];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long r = r0 + u * step;
            if (r < rows) load(x, r * C + l.group * VEC, val[u]);
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long r = r0 + u * step;
            if (r < rows) {
                #pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    const float z = val[u][v] * s[v] + h[v];
                    val[u][v] = z != z ? z : (z > 0.0f ? z : 0.0f);
                }
                store(y, r * C + l.group * VEC, val[u]);
            }
        }
    }
}

// Backward, pass 1: per-block sums of g and g * xhat, g = dy where the
// forward's pre-activation was positive (recomputed with the forward's
// arithmetic).
extern "C" __global__ void esper_bn_relu_backward_reduce(
    const T* __restrict__ x, const T* __restrict__ dy,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ partials, long long rows, int C) {
    __shared__ float sh[2 * VEC][THREADS];
    const Layout l = layout(C);
    float sg[VEC], sgx[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sg[v] = 0.0f; sgx[v] = 0.0f; }
    if (l.active) {
        float mean[VEC], invstd[VEC], s[VEC], h[VEC];
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const int c = l.group * VEC + v;
            mean[v] = save_mean[c]; invstd[v] = save_invstd[c];
            s[v] = invstd[v] * weight[c];
            h[v] = bias[c] - mean[v] * s[v];
        }
        const long long step = (long long)gridDim.x * l.per;
        for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
            float xv[UNROLL][VEC], gv[UNROLL][VEC];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const long long r = r0 + u * step;
                if (r < rows) {
                    load(x, r * C + l.group * VEC, xv[u]);
                    load(dy, r * C + l.group * VEC, gv[u]);
                }
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (r0 + u * step < rows) {
                    #pragma unroll
                    for (int v = 0; v < VEC; ++v) {
                        const float g = xv[u][v] * s[v] + h[v] > 0.0f ? gv[u][v] : 0.0f;
                        sg[v] += g;
                        sgx[v] += g * ((xv[u][v] - mean[v]) * invstd[v]);
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sh[v][threadIdx.x] = sg[v]; sh[VEC + v][threadIdx.x] = sgx[v]; }
    tree<2 * VEC>(sh, l);
    if (l.active && l.row == 0) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            float* out = partials + ((long long)blockIdx.x * C + l.group * VEC + v) * 2;
            out[0] = sh[v][threadIdx.x]; out[1] = sh[VEC + v][threadIdx.x];
        }
    }
}

// Backward, pass 2: dx = s * (g - mean(g) - xhat * mean(g * xhat)); block 0
// writes the weight and bias gradients.
extern "C" __global__ void esper_bn_relu_backward_apply(
    const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
    const float* __restrict__ partials, int blocks,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ dweight, float* __restrict__ dbias, long long rows, int C) {
    __shared__ float sh[2 * VEC][THREADS];
    __shared__ float tot[2][THREADS];
    const Layout l = layout(C);
    merge_pairs(partials, blocks, C, l, sh, tot);
    if (blockIdx.x == 0) {
        for (int c = threadIdx.x; c < C; c += THREADS) { dweight[c] = tot[1][c]; dbias[c] = tot[0][c]; }
    }
    if (!l.active) return;
    const float n = (float)rows;
    float mean[VEC], invstd[VEC], s[VEC], h[VEC], a[VEC], b[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const int c = l.group * VEC + v;
        mean[v] = save_mean[c]; invstd[v] = save_invstd[c];
        s[v] = invstd[v] * weight[c];
        h[v] = bias[c] - mean[v] * s[v];
        a[v] = tot[0][c] / n;
        b[v] = tot[1][c] / n;
    }
    const long long step = (long long)gridDim.x * l.per;
    for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
        float xv[UNROLL][VEC], gv[UNROLL][VEC];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long r = r0 + u * step;
            if (r < rows) {
                load(x, r * C + l.group * VEC, xv[u]);
                load(dy, r * C + l.group * VEC, gv[u]);
            }
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long r = r0 + u * step;
            if (r < rows) {
                #pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    const float g = xv[u][v] * s[v] + h[v] > 0.0f ? gv[u][v] : 0.0f;
                    xv[u][v] = s[v] * (g - a[v] - (xv[u][v] - mean[v]) * invstd[v] * b[v]);
                }
                store(dx, r * C + l.group * VEC, xv[u]);
            }
        }
    }
}

// 2x2 max-pool, stride 2, floor. One thread per output window and channel
// group, 32-bit index arithmetic (the host checks the sizes). With VEC 4
// the tensor is NHWC; with VEC 1 `cl` picks NHWC or NCHW.
__device__ __forceinline__ int offset(int n, int c, int h, int w, int C, int H, int W, int cl) {
    return cl ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

// libtorch's choice per channel: the first maximum in row-major window
// order, and a NaN (the last one seen) over any number.
__device__ __forceinline__ void window(const float (*v)[VEC], float* best, int* k) {
    #pragma unroll
    for (int c = 0; c < VEC; ++c) {
        best[c] = __int_as_float(0xff800000);
        k[c] = 0;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (v[j][c] > best[c] || v[j][c] != v[j][c]) { best[c] = v[j][c]; k[c] = j; }
        }
    }
}

__device__ __forceinline__ void decompose(int i, int C, int Ho, int Wo, int cl,
                                          int& n, int& c, int& ho, int& wo) {
    const int G = C / VEC;
    int r;
    if (cl) { c = (i % G) * VEC; r = i / G; wo = r % Wo; r /= Wo; ho = r % Ho; n = r / Ho; }
    else { wo = i % Wo; r = i / Wo; ho = r % Ho; r /= Ho; c = r % C; n = r / C; }
}

extern "C" __global__ void esper_pool2_forward(const T* __restrict__ x, T* __restrict__ y,
                                               int N, int C, int H, int W, int cl) {
    const int Ho = H >> 1, Wo = W >> 1;
    const int total = N * (C / VEC) * Ho * Wo;
    const int sh = cl ? W * C : W, sw = cl ? C : 1;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, ho, wo;
        decompose(i, C, Ho, Wo, cl, n, c, ho, wo);
        const int base = offset(n, c, 2 * ho, 2 * wo, C, H, W, cl);
        float v[4][VEC], best[VEC];
        int k[VEC];
        load(x, base, v[0]); load(x, base + sw, v[1]); load(x, base + sh, v[2]); load(x, base + sh + sw, v[3]);
        window(v, best, k);
        store(y, offset(n, c, ho, wo, C, Ho, Wo, cl), best);
    }
}

// Writes every input gradient of its window (the gradient at the argmax,
// zero elsewhere), and the windows at the bottom and right edge also zero
// the row and column a floor pool leaves out.
extern "C" __global__ void esper_pool2_backward(const T* __restrict__ x, const T* __restrict__ gy,
                                                T* __restrict__ gx, int N, int C, int H, int W,
                                                int cl) {
    const int Ho = H >> 1, Wo = W >> 1;
    const int total = N * (C / VEC) * Ho * Wo;
    const int sh = cl ? W * C : W, sw = cl ? C : 1;
    float zero[VEC];
    #pragma unroll
    for (int c = 0; c < VEC; ++c) zero[c] = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, ho, wo;
        decompose(i, C, Ho, Wo, cl, n, c, ho, wo);
        const int base = offset(n, c, 2 * ho, 2 * wo, C, H, W, cl);
        const int at[4] = {base, base + sw, base + sh, base + sh + sw};
        float v[4][VEC], best[VEC], g[VEC];
        int k[VEC];
        #pragma unroll
        for (int j = 0; j < 4; ++j) load(x, at[j], v[j]);
        window(v, best, k);
        load(gy, offset(n, c, ho, wo, C, Ho, Wo, cl), g);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float out[VEC];
            #pragma unroll
            for (int q = 0; q < VEC; ++q) out[q] = k[q] == j ? g[q] : 0.0f;
            store(gx, at[j], out);
        }
        const bool right = (W & 1) && wo == Wo - 1, bottom = (H & 1) && ho == Ho - 1;
        if (right) { store(gx, base + 2 * sw, zero); store(gx, base + sh + 2 * sw, zero); }
        if (bottom) { store(gx, base + 2 * sh, zero); store(gx, base + 2 * sh + sw, zero); }
        if (right && bottom) store(gx, base + 2 * sh + 2 * sw, zero);
    }
}
// ---- 3x3 convolution (stride 1, padding 1, no bias) weight gradient ----
// dW[co][kh][kw][ci] = sum over positions of dy[n,h,w,co] * x[n,h+kh-1,w+kw-1,ci],
// NHWC. Pass 1: one block per (image, band of TH rows) stages its dy band
// and the x rows around it (zero padded) in shared memory as floats; a
// thread owns 4 output channels x VEC input channels x the 3 taps of one
// kernel row (48 multiply-adds for five shared loads a position); with
// fewer tasks than threads, `pg` position groups split the band's positions
// and are summed in a fixed order. Each block writes its partial dW.
#define STAGE 8
// Four consecutive values from a 16-byte (8-byte in bf16) aligned index.
__device__ __forceinline__ void load4(const T* __restrict__ p, long long i, float* v) {
#if ESPER_BF16
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    v[0] = bf(u.x & 0xffffu); v[1] = bf(u.x >> 16); v[2] = bf(u.y & 0xffffu); v[3] = bf(u.y >> 16);
#else
    const float4 f = *reinterpret_cast<const float4*>(p + i);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
#endif
}
__device__ __forceinline__ float ld1(const T* __restrict__ p, long long i) {
#if ESPER_BF16
    return bf(p[i]);
#else
    return p[i];
#endif
}

extern "C" __global__ void esper_conv3_wgrad_partial(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partials,
    int H, int W, int Ci, int Co, int TH, int bands) {
    extern __shared__ __align__(16) float smem[];
    const int n = blockIdx.x / bands, band = blockIdx.x % bands;
    const int h0 = band * TH;
    const int th = min(TH, H - h0);
    const int XW = W + 2;
    float* dyS = smem;                       // [th][W][Co]
    float* xS = smem + TH * W * Co;          // [th + 2][W + 2][Ci]
    // Staging: STAGE loads in flight a thread, then their stores.
    const long long dbase = ((long long)n * H + h0) * W * Co;
    // dy's band is contiguous and Co % 4 == 0: four values a load.
    const int dquads = th * W * Co / 4;
    for (int i0 = threadIdx.x; i0 < dquads; i0 += blockDim.x * STAGE) {
        float v[STAGE][4];
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < dquads) load4(dy, dbase + 4 * (long long)i, v[u]);
        }
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < dquads) {
                *reinterpret_cast<float4*>(dyS + 4 * i) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
            }
        }
    }
    // x rows h0 - 1 .. h0 + th, zero padded: inside a padded row of
    // XW * Ci values the interior is contiguous in memory.
    const int rowlen = XW * Ci;
    const int xcount = (th + 2) * rowlen;
    for (int i0 = threadIdx.x; i0 < xcount; i0 += blockDim.x * STAGE) {
        float v[STAGE];
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            const int r = i / rowlen;
            const int j = i - r * rowlen;
            const int hh = h0 + r - 1;
            v[u] = (i < xcount && hh >= 0 && hh < H && j >= Ci && j < rowlen - Ci)
                ? ld1(x, ((long long)n * H + hh) * W * Ci + (j - Ci)) : 0.0f;
        }
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < xcount) xS[i] = v[u];
        }
    }
    __syncthreads();
    const int cig = Ci / VEC;
    const int tasks = (Co / 4) * 3 * cig;
    const int pgs = tasks >= (int)blockDim.x ? 1 : (int)blockDim.x / tasks;
    const int positions = th * W;
    const int out_size = Co * 9 * Ci;
    float* out = partials + (long long)blockIdx.x * out_size;
    float* red = smem;  // reused after the tiles, [pgs][tasks][3 * 4 * VEC]
    for (int base = 0; base < tasks; base += (int)blockDim.x) {
        const int local = (int)threadIdx.x;
        const int task = pgs > 1 ? local % tasks : base + local;
        const int pg = pgs > 1 ? local / tasks : 0;
        const bool active = pgs > 1 ? local < tasks * pgs : task < tasks;
        // acc[kw][co][ci] for output channels co4 * 4 + co, input channels
        // c4 * VEC + ci, kernel row kh.
        float acc[3][4][VEC];
        #pragma unroll
        for (int k = 0; k < 3; ++k)
            #pragma unroll
            for (int a = 0; a < 4; ++a)
                #pragma unroll
                for (int b = 0; b < VEC; ++b) acc[k][a][b] = 0.0f;
        int co4 = 0, kh = 0, c4 = 0;
        if (active) {
            c4 = task % cig;
            kh = (task / cig) % 3;
            co4 = task / (cig * 3);
            int h = pg / W, w = pg - (pg / W) * W;
            const int wstep = pgs % W, hstep = pgs / W;
            for (int q = pg; q < positions; q += pgs) {
                const float4 d = *reinterpret_cast<const float4*>(dyS + q * Co + co4 * 4);
                const float* xp = xS + ((h + kh) * XW + w) * Ci + c4 * VEC;
                #pragma unroll
                for (int k = 0; k < 3; ++k) {
                    float xv[VEC];
#if VEC == 4
                    const float4 xq = *reinterpret_cast<const float4*>(xp + k * Ci);
                    xv[0] = xq.x; xv[1] = xq.y; xv[2] = xq.z; xv[3] = xq.w;
#else
                    xv[0] = xp[k * Ci];
#endif
                    #pragma unroll
                    for (int b = 0; b < VEC; ++b) {
                        acc[k][0][b] += d.x * xv[b];
                        acc[k][1][b] += d.y * xv[b];
                        acc[k][2][b] += d.z * xv[b];
                        acc[k][3][b] += d.w * xv[b];
                    }
                }
                w += wstep; h += hstep;
                if (w >= W) { w -= W; h += 1; }
            }
        }
        constexpr int PER = 3 * 4 * VEC;
        // Output index of this task's accumulator e = (k * 4 + a) * VEC + b.
        auto out_index = [&](int e) {
            const int b = e % VEC, a = (e / VEC) % 4, k = e / (4 * VEC);
            return ((co4 * 4 + a) * 9 + kh * 3 + k) * Ci + c4 * VEC + b;
        };
        if (pgs == 1) {
            if (active) {
                #pragma unroll
                for (int k = 0; k < 3; ++k)
                    #pragma unroll
                    for (int a = 0; a < 4; ++a)
                        #pragma unroll
                        for (int b = 0; b < VEC; ++b)
                            out[out_index((k * 4 + a) * VEC + b)] = acc[k][a][b];
            }
        } else {
            // The position groups' sums: red[(g * PER + e) * tasks + task]
            // (consecutive lanes, consecutive words); then thread (task, pg)
            // adds up its task's accumulators e = pg, pg + pgs, ... over
            // the groups in order.
            __syncthreads();  // the tiles are no longer read
            if (active) {
                #pragma unroll
                for (int k = 0; k < 3; ++k)
                    #pragma unroll
                    for (int a = 0; a < 4; ++a)
                        #pragma unroll
                        for (int b = 0; b < VEC; ++b)
                            red[(pg * PER + (k * 4 + a) * VEC + b) * tasks + task] = acc[k][a][b];
            }
            __syncthreads();
            if (active) {
                for (int e = pg; e < PER; e += pgs) {
                    float total = 0.0f;
                    for (int g = 0; g < pgs; ++g) total += red[(g * PER + e) * tasks + task];
                    out[out_index(e)] = total;
                }
            }
        }
    }
}

// Pass 2: dW = the blocks' partials summed in block order; a block of 256
// threads covers 32 outputs with 8 slices of the blocks, then adds the
// slices in order.
extern "C" __global__ void esper_conv3_wgrad_reduce(const float* __restrict__ partials,
                                                    float* __restrict__ dw, int blocks,
                                                    int out_size) {
    __shared__ float sh[8][32];
    const int lane = threadIdx.x % 32, slice = threadIdx.x / 32;
    const int o = blockIdx.x * 32 + lane;
    float s = 0.0f;
    if (o < out_size) {
        #pragma unroll 8
        for (int b = slice; b < blocks; b += 8) s += partials[(long long)b * out_size + o];
    }
    sh[slice][lane] = s;
    __syncthreads();
    if (slice == 0 && o < out_size) {
        float total = sh[0][lane];
        #pragma unroll
        for (int k = 1; k < 8; ++k) total += sh[k][lane];
        dw[o] = total;
    }
}

"#;

/// The kernels for one dtype and channel width on one device.
struct Kernels {
    bn_stats: JitKernel,
    bn_forward: JitKernel,
    bn_reduce: JitKernel,
    bn_apply: JitKernel,
    pool_forward: JitKernel,
    pool_backward: JitKernel,
    conv_partial: JitKernel,
    conv_reduce: JitKernel,
}

fn kernels(op: &'static str, device: usize, bf16: bool, vec4: bool) -> Result<Arc<Kernels>> {
    static CACHE: KernelCache<(usize, bool, bool), Kernels> = KernelCache::new();
    CACHE
        .get_or_build((device, bf16, vec4), || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let source = format!(
                "#define ESPER_BF16 {}\n#define VEC {}\n{SOURCE}",
                u8::from(bf16),
                if vec4 { 4 } else { 1 }
            );
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
                conv_partial: load("esper_conv3_wgrad_partial")?,
                conv_reduce: load("esper_conv3_wgrad_reduce")?,
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
    let vec4 = four_channels(x, channels);
    let k = kernels(OP, device, bf16, vec4)?;
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
                if vec4 { 4 } else { 1 },
                handles.as_ptr(),
                &mut out,
            ),
        )?;
        Ok(Tensor::from_ptr(out.cast()))
    }
}

/// `conv2d(x, weight, stride 1, padding 1)` for a `3 x 3` weight without
/// bias: libtorch's convolution forward and input gradient, and the weight
/// gradient from two run-time compiled kernels (see the module docs) where
/// they apply: a channels-last CUDA input that requires a gradient or whose
/// weight does, in f32 or under bf16 autocast, a multiple of four output
/// channels, and an image band that fits in shared memory. libtorch's
/// `conv2d` otherwise, with its errors.
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
    let wanted = x.requires_grad() || weight.requires_grad();
    // SAFETY: plain integer arguments.
    let fits = unsafe { ffi::esper_conv3x3_fits(h, w, c_in, c_out) } != 0;
    if !(wanted
        && kinds_fit
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
    let handles = [k.conv_partial.raw(), k.conv_reduce.raw()];
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: as in `batch_norm_relu`.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_conv3x3(
                ffi::tensor_ptr(x),
                ffi::tensor_ptr(weight),
                i32::from(compute == Kind::BFloat16),
                if vec4 { 4 } else { 1 },
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
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: as in `batch_norm_relu`.
    unsafe {
        ffi::check(
            OP,
            ffi::esper_max_pool2(
                ffi::tensor_ptr(x),
                i32::from(channels_last),
                if vec4 { 4 } else { 1 },
                handles.as_ptr(),
                &mut out,
            ),
        )?;
        Ok(Tensor::from_ptr(out.cast()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype and channel-width variant compiles (NVRTC needs no GPU).
    #[test]
    fn every_kernel_variant_compiles() {
        for bf16 in [false, true] {
            for vec in [1, 4] {
                let source = format!(
                    "#define ESPER_BF16 {}\n#define VEC {vec}\n{SOURCE}",
                    u8::from(bf16)
                );
                match crate::jit::compile(&source, "esper_nn", (9, 0)) {
                    Ok(cubin) => assert!(!cubin.is_empty()),
                    Err(error) if error.to_string().contains("libnvrtc") => {
                        println!("skipping: NVRTC is not installed here ({error})");
                        return;
                    }
                    Err(error) => panic!("bf16 {bf16} vec {vec}: {error}"),
                }
            }
        }
    }
}
