//! The CUDA C source of the first layer's convolution with the batch-norm
//! statistics taken in its epilogue ([`super::conv3x3_with_stats`]),
//! appended to [`super::source::SOURCE`] (it uses that source's `T`,
//! `store4`, `ld1` and `round_t`): what `esper_conv3_forward_small` writes,
//! plus each block's per-channel sums of `y - k` and `(y - k)^2` with `k`
//! the output at pixel 0, the partials `esper_bn_stats` would write, so the
//! batch norm after it reads no statistics pass.
//!
//! The output channels are a compile-time constant (8 or 16: one kernel
//! each), so a thread keeps its sums in registers; a block adds them up in
//! one fixed order (a warp's shuffle tree, then the warps in order), so the
//! statistics do not depend on timing.

pub(super) const CONV_STATS_SOURCE: &str = r#"
// One output pixel p's CO channels of the small convolution (x NHWC with
// Ci <= 4, weights [CO][3][3][Ci] as floats in shared memory), each
// channel's sum taken in esper_conv3_forward_small's order.
template <int CO>
__device__ __forceinline__ void conv_small_pixel(const T* __restrict__ x, const float* ws, int p,
                                                 int H, int W, int Ci, float* acc) {
    const int wo = p % W;
    const int r = p / W;
    const int h = r % H;
    const int n = r / H;
    float xv[9][4];
    #pragma unroll
    for (int kh = 0; kh < 3; ++kh) {
        #pragma unroll
        for (int kw = 0; kw < 3; ++kw) {
            const int hh = h + kh - 1, ww = wo + kw - 1;
            const bool inside = hh >= 0 && hh < H && ww >= 0 && ww < W;
            const int base = ((n * H + hh) * W + ww) * Ci;
            #pragma unroll
            for (int ci = 0; ci < 4; ++ci) {
                xv[kh * 3 + kw][ci] = inside && ci < Ci ? ld1(x, base + ci) : 0.0f;
            }
        }
    }
    #pragma unroll
    for (int c = 0; c < CO; ++c) acc[c] = 0.0f;
    #pragma unroll
    for (int k = 0; k < 9; ++k) {
        #pragma unroll
        for (int ci = 0; ci < 4; ++ci) {
            if (ci < Ci) {
                #pragma unroll
                for (int c = 0; c < CO; ++c) acc[c] += xv[k][ci] * ws[(c * 9 + k) * Ci + ci];
            }
        }
    }
}

// y = conv3x3(x, w) (CO output channels) and partials[block][CO][2] = the
// block's sums of (y - k, (y - k)^2) per channel over its pixels, y as
// stored (rounded to T) and k = y at pixel 0.
template <int CO>
__device__ __forceinline__ void conv_small_stats(const T* __restrict__ x, const T* __restrict__ w,
                                                 T* __restrict__ y, float* __restrict__ partials,
                                                 int N, int H, int W, int Ci) {
    extern __shared__ __align__(16) float ws[];
    __shared__ float red[THREADS / 32][2 * CO];
    for (int i = threadIdx.x; i < CO * 9 * Ci; i += blockDim.x) ws[i] = ld1(w, i);
    __syncthreads();
    float k[CO], s1[CO], s2[CO];
    conv_small_pixel<CO>(x, ws, 0, H, W, Ci, k);
    #pragma unroll
    for (int c = 0; c < CO; ++c) { k[c] = round_t(k[c]); s1[c] = 0.0f; s2[c] = 0.0f; }
    const int total = N * H * W;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < total; p += gridDim.x * blockDim.x) {
        float acc[CO];
        conv_small_pixel<CO>(x, ws, p, H, W, Ci, acc);
        #pragma unroll
        for (int g = 0; g < CO / 4; ++g) store4(y, (long long)p * CO + g * 4, acc + g * 4);
        #pragma unroll
        for (int c = 0; c < CO; ++c) {
            const float d = round_t(acc[c]) - k[c];
            s1[c] += d;
            s2[c] += d * d;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int c = 0; c < CO; ++c) {
        #pragma unroll
        for (int off = 16; off >= 1; off /= 2) {
            s1[c] += __shfl_down_sync(0xffffffffu, s1[c], off);
            s2[c] += __shfl_down_sync(0xffffffffu, s2[c], off);
        }
    }
    if (lane == 0) {
        #pragma unroll
        for (int c = 0; c < CO; ++c) { red[warp][c] = s1[c]; red[warp][CO + c] = s2[c]; }
    }
    __syncthreads();
    if (threadIdx.x < CO) {
        const int c = threadIdx.x;
        float a = 0.0f, b = 0.0f;
        for (int wp = 0; wp < (int)(blockDim.x >> 5); ++wp) { a += red[wp][c]; b += red[wp][CO + c]; }
        float* out = partials + ((long long)blockIdx.x * CO + c) * 2;
        out[0] = a;
        out[1] = b;
    }
}

extern "C" __global__ void esper_conv3_forward_small_stats8(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    float* __restrict__ partials, int N, int H, int W, int Ci) {
    ESPER_PDL_ENTRY();
    conv_small_stats<8>(x, w, y, partials, N, H, W, Ci);
}

extern "C" __global__ void esper_conv3_forward_small_stats16(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    float* __restrict__ partials, int N, int H, int W, int Ci) {
    ESPER_PDL_ENTRY();
    conv_small_stats<16>(x, w, y, partials, N, H, W, Ci);
}
"#;
