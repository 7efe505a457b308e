//! The CUDA C source of [`super`]'s kernels, compiled once per device,
//! dtype (`ESPER_BF16`) and channel width (`VEC`, four channels a thread or
//! one) by NVRTC: batch norm + ReLU (statistics, forward, and the two
//! backward passes; with the 2x2 max-pool taken in: `BN_POOL_SOURCE`), the column sums of a linear layer's bias gradient, the
//! 2x2 max-pool forward and backward, and the two
//! passes of the 3x3 convolution's weight gradient ([`CONV_SOURCE`],
//! appended to [`SOURCE`]; it uses `SOURCE`'s types and loads).

pub(super) const SOURCE: &str = r#"
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
// Four consecutive values at an 8-byte aligned index, as floats.
__device__ __forceinline__ void load4(const T* __restrict__ p, long long i, float* v) {
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    v[0] = bf(u.x & 0xffffu); v[1] = bf(u.x >> 16); v[2] = bf(u.y & 0xffffu); v[3] = bf(u.y >> 16);
}
__device__ __forceinline__ void store4(T* __restrict__ p, long long i, const float* v) {
    uint2 u;
    u.x = to_bf(v[0]) | (to_bf(v[1]) << 16);
    u.y = to_bf(v[2]) | (to_bf(v[3]) << 16);
    *reinterpret_cast<uint2*>(p + i) = u;
}
__device__ __forceinline__ float ld1(const T* __restrict__ p, long long i) { return bf(p[i]); }
// v rounded to T and back (a value as a T tensor holds it).
__device__ __forceinline__ float round_t(float v) { return bf(to_bf(v)); }
// Two consecutive values at a 4-byte aligned (even) index.
__device__ __forceinline__ void st2(T* __restrict__ p, long long i, float a, float b) {
    *reinterpret_cast<unsigned int*>(p + i) = to_bf(a) | (to_bf(b) << 16);
}
__device__ __forceinline__ void st1(T* __restrict__ p, long long i, float v) {
    p[i] = (unsigned short)to_bf(v);
}
#else
typedef float T;
// Four consecutive values at a 16-byte aligned index.
__device__ __forceinline__ void load4(const T* __restrict__ p, long long i, float* v) {
    const float4 f = *reinterpret_cast<const float4*>(p + i);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}
__device__ __forceinline__ void store4(T* __restrict__ p, long long i, const float* v) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ float ld1(const T* __restrict__ p, long long i) { return p[i]; }
__device__ __forceinline__ float round_t(float v) { return v; }
// Two consecutive values at an 8-byte aligned (even) index.
__device__ __forceinline__ void st2(T* __restrict__ p, long long i, float a, float b) {
    *reinterpret_cast<float2*>(p + i) = make_float2(a, b);
}
__device__ __forceinline__ void st1(T* __restrict__ p, long long i, float v) { p[i] = v; }
#endif

// A thread's VEC channels at index i.
__device__ __forceinline__ void load(const T* __restrict__ p, long long i, float* v) {
#if VEC == 4
    load4(p, i, v);
#else
    v[0] = ld1(p, i);
#endif
}
__device__ __forceinline__ void store(T* __restrict__ p, long long i, const float* v) {
#if VEC == 4
    store4(p, i, v);
#else
    st1(p, i, v[0]);
#endif
}

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

// A thread's per-channel pair (a, b) summed over the block's rows (the
// tree): the totals land at the threads of row 0.
__device__ __forceinline__ void block_sum_pairs(const float* a, const float* b, const Layout& l,
                                                float (*sh)[THREADS]) {
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sh[v][threadIdx.x] = a[v]; sh[VEC + v][threadIdx.x] = b[v]; }
    tree<2 * VEC>(sh, l);
}

// The block's pair totals into partials[block][channel][2].
__device__ __forceinline__ void write_block_pairs(float* __restrict__ partials, const Layout& l,
                                                  int C, float (*sh)[THREADS]) {
    if (l.active && l.row == 0) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            float* out = partials + ((long long)blockIdx.x * C + l.group * VEC + v) * 2;
            out[0] = sh[v][threadIdx.x]; out[1] = sh[VEC + v][threadIdx.x];
        }
    }
}

// UNROLL rows of x (this thread's channel group) from row r0 on, `step`
// rows apart: all loads issued before any is used.
__device__ __forceinline__ void load_rows(
    const T* __restrict__ x, const Layout& l, long long r0, long long step, long long rows,
    int C, float (*val)[VEC]) {
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const long long r = r0 + u * step;
        if (r < rows) load(x, r * C + l.group * VEC, val[u]);
    }
}

// Calls f(values) with this thread's VEC channels of each of its rows, in
// row order (UNROLL rows loaded at a time).
template <class F>
__device__ __forceinline__ void for_each_row(const T* __restrict__ x, const Layout& l,
                                             long long rows, int C, F f) {
    const long long step = (long long)gridDim.x * l.per;
    for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
        float val[UNROLL][VEC];
        load_rows(x, l, r0, step, rows, C, val);
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (r0 + u * step < rows) f(val[u]);
        }
    }
}

// Per-block sums of (x - shift) and (x - shift)^2 per channel, the shift
// being row 0's value (so a mean far from zero loses no precision).
extern "C" __global__ void esper_bn_stats(const T* __restrict__ x, float* __restrict__ partials,
                                          long long rows, int C) {
    ESPER_PDL_ENTRY();
    __shared__ float sh[2 * VEC][THREADS];
    const Layout l = layout(C);
    float s1[VEC], s2[VEC], k[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { s1[v] = 0.0f; s2[v] = 0.0f; }
    if (l.active) {
        load(x, (long long)l.group * VEC, k);
        for_each_row(x, l, rows, C, [&](const float* val) {
            #pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const float d = val[v] - k[v];
                s1[v] += d; s2[v] += d * d;
            }
        });
    }
    block_sum_pairs(s1, s2, l, sh);
    write_block_pairs(partials, l, C, sh);
}

// Per-block column sums of a dense [rows, C] tensor (a linear layer's bias
// gradient): partials[block][c], summed in one fixed order.
extern "C" __global__ void esper_col_sum(const T* __restrict__ g, float* __restrict__ partials,
                                         long long rows, int C) {
    ESPER_PDL_ENTRY();
    __shared__ float sh[VEC][THREADS];
    const Layout l = layout(C);
    float s[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) s[v] = 0.0f;
    if (l.active) {
        for_each_row(g, l, rows, C, [&](const float* val) {
            #pragma unroll
            for (int v = 0; v < VEC; ++v) s[v] += val[v];
        });
    }
    #pragma unroll
    for (int v = 0; v < VEC; ++v) sh[v][threadIdx.x] = s[v];
    tree<VEC>(sh, l);
    if (l.active && l.row == 0) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v)
            partials[(long long)blockIdx.x * C + l.group * VEC + v] = sh[v][threadIdx.x];
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
    block_sum_pairs(a, b, l, sh);
    if (l.active && l.row == 0) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            tot[0][l.group * VEC + v] = sh[v][threadIdx.x];
            tot[1][l.group * VEC + v] = sh[VEC + v][threadIdx.x];
        }
    }
    __syncthreads();
}

// relu(x * s + h) (a NaN stays NaN), the forward's activation; the
// pooled kernels recompute it with this same arithmetic.
__device__ __forceinline__ float bn_act(float x, float s, float h) {
    const float z = x * s + h;
    return z != z ? z : (z > 0.0f ? z : 0.0f);
}

// From the merged totals: every channel's affine scale and shift into
// shared memory; block 0 writes the saved statistics and updates the
// running ones (momentum, unbiased variance). Ends with a barrier.
__device__ __forceinline__ void bn_forward_constants(
    const T* __restrict__ x, float (*tot)[THREADS], const float* __restrict__ weight,
    const float* __restrict__ bias, float* __restrict__ save_mean,
    float* __restrict__ save_invstd, float* __restrict__ running_mean,
    float* __restrict__ running_var, float momentum, float eps, long long rows, int C,
    float* scale, float* shift) {
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
}

extern "C" __global__ void esper_bn_relu_forward(
    const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ partials, int blocks,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ save_mean, float* __restrict__ save_invstd,
    float* __restrict__ running_mean, float* __restrict__ running_var,
    float momentum, float eps, long long rows, int C) {
    ESPER_PDL_ENTRY();
    __shared__ float sh[2 * VEC][THREADS];
    __shared__ float tot[2][THREADS];
    __shared__ float scale[THREADS], shift[THREADS];
    const Layout l = layout(C);
    merge_pairs(partials, blocks, C, l, sh, tot);
    bn_forward_constants(x, tot, weight, bias, save_mean, save_invstd, running_mean, running_var,
                         momentum, eps, rows, C, scale, shift);
    if (!l.active) return;
    float s[VEC], h[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { s[v] = scale[l.group * VEC + v]; h[v] = shift[l.group * VEC + v]; }
    const long long step = (long long)gridDim.x * l.per;
    for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
        float val[UNROLL][VEC];
        load_rows(x, l, r0, step, rows, C, val);
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long r = r0 + u * step;
            if (r < rows) {
                #pragma unroll
                for (int v = 0; v < VEC; ++v) val[u][v] = bn_act(val[u][v], s[v], h[v]);
                store(y, r * C + l.group * VEC, val[u]);
            }
        }
    }
}

// The forward's per-channel constants for a thread's channel group:
// mean, invstd, and the affine scale s = invstd * weight and shift
// h = bias - mean * s (the backward recomputes the ReLU mask with them).
__device__ __forceinline__ void bn_constants(
    const Layout& l, const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* mean, float* invstd, float* s, float* h) {
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const int c = l.group * VEC + v;
        mean[v] = save_mean[c]; invstd[v] = save_invstd[c];
        s[v] = invstd[v] * weight[c];
        h[v] = bias[c] - mean[v] * s[v];
    }
}

// UNROLL rows of x and dy from row r0 on, `step` rows apart.
__device__ __forceinline__ void load_rows(
    const T* __restrict__ x, const T* __restrict__ dy, const Layout& l, long long r0,
    long long step, long long rows, int C, float (*xv)[VEC], float (*gv)[VEC]) {
    load_rows(x, l, r0, step, rows, C, xv);
    load_rows(dy, l, r0, step, rows, C, gv);
}

// Backward, pass 1: per-block sums of g and g * xhat, g = dy where the
// forward's pre-activation was positive (recomputed with the forward's
// arithmetic).
extern "C" __global__ void esper_bn_relu_backward_reduce(
    const T* __restrict__ x, const T* __restrict__ dy,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ partials, long long rows, int C) {
    ESPER_PDL_ENTRY();
    __shared__ float sh[2 * VEC][THREADS];
    const Layout l = layout(C);
    float sg[VEC], sgx[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sg[v] = 0.0f; sgx[v] = 0.0f; }
    if (l.active) {
        float mean[VEC], invstd[VEC], s[VEC], h[VEC];
        bn_constants(l, save_mean, save_invstd, weight, bias, mean, invstd, s, h);
        const long long step = (long long)gridDim.x * l.per;
        for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
            float xv[UNROLL][VEC], gv[UNROLL][VEC];
            load_rows(x, dy, l, r0, step, rows, C, xv, gv);
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
    block_sum_pairs(sg, sgx, l, sh);
    write_block_pairs(partials, l, C, sh);
}

// Backward, pass 2: dx = s * (g - mean(g) - xhat * mean(g * xhat)); block 0
// writes the weight and bias gradients.
extern "C" __global__ void esper_bn_relu_backward_apply(
    const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
    const float* __restrict__ partials, int blocks,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ dweight, float* __restrict__ dbias, long long rows, int C) {
    ESPER_PDL_ENTRY();
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
    bn_constants(l, save_mean, save_invstd, weight, bias, mean, invstd, s, h);
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        a[v] = tot[0][l.group * VEC + v] / n;
        b[v] = tot[1][l.group * VEC + v] / n;
    }
    const long long step = (long long)gridDim.x * l.per;
    for (long long r0 = (long long)blockIdx.x * l.per + l.row; r0 < rows; r0 += UNROLL * step) {
        float xv[UNROLL][VEC], gv[UNROLL][VEC];
        load_rows(x, dy, l, r0, step, rows, C, xv, gv);
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

// relu(batch_norm(x)) in evaluation mode, x channels-last (channel =
// index % C; VEC values of one pixel a thread, C a multiple of VEC), from
// the running statistics: one pass, where libtorch runs cuDNN's inference
// batch norm and a separate ReLU. A NaN stays NaN, as relu leaves it.
extern "C" __global__ void esper_bn_relu_eval(
    const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ mean,
    const float* __restrict__ var, const float* __restrict__ weight,
    const float* __restrict__ bias, float eps, long long n, int C) {
    ESPER_PDL_ENTRY();
    const long long stride = (long long)gridDim.x * blockDim.x * VEC;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n;
         i += stride) {
        float v[VEC], out[VEC];
        load(x, i, v);
        const int c0 = (int)(i % C);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const int c = c0 + k;
            const float r = (v[k] - mean[c]) * (rsqrtf(var[c] + eps) * weight[c]) + bias[c];
            out[k] = r > 0.0f ? r : (r == r ? 0.0f : r);
        }
        store(y, i, out);
    }
}

__device__ __forceinline__ void decompose(int i, int C, int Ho, int Wo, int cl,
                                          int& n, int& c, int& ho, int& wo) {
    const int G = C / VEC;
    int r;
    if (cl) { c = (i % G) * VEC; r = i / G; wo = r % Wo; r /= Wo; ho = r % Ho; n = r / Ho; }
    else { wo = i % Wo; r = i / Wo; ho = r % Ho; r /= Ho; c = r % C; n = r / C; }
}

// Output window i of a 2x2 pool (stride 2, floor) over [N, C, H, W] in the
// layout `cl`: its sample, its output's offset, its four inputs' offsets in
// row-major window order, and the inputs a floor pool leaves out next to it
// (the column right of a row's last window where W is odd, the row below an
// image's last where H is odd; -1 for none). One thread a window and
// channel group; pool_windows of them.
struct PoolWindow {
    int n, out;
    int at[4];
    int left_out[5];
};
__device__ __forceinline__ int pool_windows(int N, int C, int H, int W) {
    return N * (C / VEC) * (H >> 1) * (W >> 1);
}
__device__ __forceinline__ PoolWindow pool_window(int i, int C, int H, int W, int cl) {
    const int Ho = H >> 1, Wo = W >> 1;
    const int sh = cl ? W * C : W, sw = cl ? C : 1;
    int n, c, ho, wo;
    decompose(i, C, Ho, Wo, cl, n, c, ho, wo);
    const int base = offset(n, c, 2 * ho, 2 * wo, C, H, W, cl);
    const bool right = (W & 1) && wo == Wo - 1, bottom = (H & 1) && ho == Ho - 1;
    PoolWindow p;
    p.n = n;
    p.out = offset(n, c, ho, wo, C, Ho, Wo, cl);
    p.at[0] = base; p.at[1] = base + sw; p.at[2] = base + sh; p.at[3] = base + sh + sw;
    p.left_out[0] = right ? base + 2 * sw : -1;
    p.left_out[1] = right ? base + sh + 2 * sw : -1;
    p.left_out[2] = bottom ? base + 2 * sh : -1;
    p.left_out[3] = bottom ? base + 2 * sh + sw : -1;
    p.left_out[4] = right && bottom ? base + 2 * sh + 2 * sw : -1;
    return p;
}

extern "C" __global__ void esper_pool2_forward(const T* __restrict__ x, T* __restrict__ y,
                                               int N, int C, int H, int W, int cl) {
    ESPER_PDL_ENTRY();
    const int total = pool_windows(N, C, H, W);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const PoolWindow p = pool_window(i, C, H, W, cl);
        float v[4][VEC], best[VEC];
        int k[VEC];
        #pragma unroll
        for (int j = 0; j < 4; ++j) load(x, p.at[j], v[j]);
        window(v, best, k);
        store(y, p.out, best);
    }
}

// Writes every input gradient of its window (the gradient at the argmax,
// zero elsewhere), and the windows at the bottom and right edge also zero
// the row and column a floor pool leaves out.
extern "C" __global__ void esper_pool2_backward(const T* __restrict__ x, const T* __restrict__ gy,
                                                T* __restrict__ gx, int N, int C, int H, int W,
                                                int cl) {
    ESPER_PDL_ENTRY();
    const int total = pool_windows(N, C, H, W);
    float zero[VEC];
    #pragma unroll
    for (int c = 0; c < VEC; ++c) zero[c] = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const PoolWindow p = pool_window(i, C, H, W, cl);
        float v[4][VEC], best[VEC], g[VEC];
        int k[VEC];
        #pragma unroll
        for (int j = 0; j < 4; ++j) load(x, p.at[j], v[j]);
        window(v, best, k);
        load(gy, p.out, g);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float out[VEC];
            #pragma unroll
            for (int q = 0; q < VEC; ++q) out[q] = k[q] == j ? g[q] : 0.0f;
            store(gx, p.at[j], out);
        }
        #pragma unroll
        for (int e = 0; e < 5; ++e) {
            if (p.left_out[e] >= 0) store(gx, p.left_out[e], zero);
        }
    }
}
"#;
