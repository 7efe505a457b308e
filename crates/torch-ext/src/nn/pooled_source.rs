//! The CUDA C source of [`super::pooled_linear`] (appended after
//! [`super::excite_source::EXCITE_SOURCE`], whose `se_channel_sum` it
//! uses, and [`super::source::SOURCE`], whose `T`, `THREADS` and one-value
//! loads and stores it uses): a classifier head, the global average over a
//! channels-last image followed by a fully connected layer. Forward is one
//! block an image; backward is one launch whose first blocks write the
//! input gradient (one an image) and whose last blocks write the weight and
//! bias gradients (a block an output and 32 columns, its warps splitting
//! the images, their sums added in a fixed order).

pub(in crate::nn) const POOLED_SOURCE: &str = r#"
// ---- global average pool + linear, NHWC, a block per image ----
// y[n][k] = b[k] + sum_c W[k][c] mean_hw(x[n, :, :, c]); W [K][C], b [K];
// C <= PL_MAX_C, K <= PL_MAX_K. mean[n] (f32 [C]) is saved for the
// backward.
#define PL_MAX_C 1024
#define PL_MAX_K 64

extern "C" __global__ void esper_pooled_linear_forward(
    const T* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
    T* __restrict__ y, float* __restrict__ mean_out, int HW, int C, int K) {
    ESPER_PDL_ENTRY();
    __shared__ float red[THREADS];
    __shared__ float mean[PL_MAX_C];
    const int t = threadIdx.x;
    const long long base = (long long)blockIdx.x * HW * C;
    const float inv = 1.0f / (float)HW;
    if (C <= THREADS) {
        const float sum = se_channel_sum(base, HW, C, red, [&](long long i) { return ld1(x, i); });
        if (t < C) mean[t] = sum * inv;
    } else {
        // A thread a channel, pixels in order (reads coalesce over c).
        for (int c = t; c < C; c += THREADS) {
            float s = 0.0f;
            for (int p = 0; p < HW; ++p) s += ld1(x, base + (long long)p * C + c);
            mean[c] = s * inv;
        }
    }
    __syncthreads();
    float* saved = mean_out + (long long)blockIdx.x * C;
    for (int c = t; c < C; c += THREADS) saved[c] = mean[c];
    // A warp an output: lanes over channels, then a fixed butterfly.
    const int lane = t & 31, warp = t >> 5;
    for (int k = warp; k < K; k += THREADS / 32) {
        float z = 0.0f;
        for (int c = lane; c < C; c += 32) z += w[(long long)k * C + c] * mean[c];
        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
        if (lane == 0) st1(y, (long long)blockIdx.x * K + k, z + b[k]);
    }
}

// Backward with g = dy [N][K]: blocks [0, dx_blocks) (dx_blocks = N when
// the input gradient is wanted, else 0) write dx[n, p, c] = (sum_k g[n][k]
// W[k][c]) / HW; each later block takes one output k and 32 columns of
// [dW[k] | db[k]] (column C is the bias, a mean of 1): a warp's lanes are
// the columns, its 8 warps the images n = warp, warp + 8, ..., and the
// warps' sums are added in warp order (deterministic).
extern "C" __global__ void esper_pooled_linear_backward(
    const T* __restrict__ dy, const float* __restrict__ w, const float* __restrict__ mean,
    T* __restrict__ dx, float* __restrict__ dw, float* __restrict__ db, int N, int HW, int C,
    int K, int dx_blocks) {
    ESPER_PDL_ENTRY();
    const int t = threadIdx.x;
    if ((int)blockIdx.x < dx_blocks) {
        __shared__ float g[PL_MAX_K];
        __shared__ float dmean[PL_MAX_C];
        const int n = blockIdx.x;
        if (t < K) g[t] = ld1(dy, (long long)n * K + t);
        __syncthreads();
        const float inv = 1.0f / (float)HW;
        for (int c = t; c < C; c += THREADS) {
            float d = 0.0f;
            for (int k = 0; k < K; ++k) d += g[k] * w[(long long)k * C + c];
            dmean[c] = d * inv;
        }
        __syncthreads();
        const long long base = (long long)n * HW * C;
        const int total = HW * C;
        for (int i = t; i < total; i += THREADS) st1(dx, base + i, dmean[i % C]);
        return;
    }
    __shared__ float part[THREADS / 32][32];
    const int tiles = (C + 1 + 31) / 32;
    const int block = (int)blockIdx.x - dx_blocks;
    const int k = block / tiles;
    const int lane = t & 31, warp = t >> 5;
    const int c = (block - k * tiles) * 32 + lane;
    float s = 0.0f;
    if (c < C) {
#pragma unroll 8
        for (int n = warp; n < N; n += THREADS / 32)
            s += ld1(dy, (long long)n * K + k) * mean[(long long)n * C + c];
    } else if (c == C) {
#pragma unroll 8
        for (int n = warp; n < N; n += THREADS / 32) s += ld1(dy, (long long)n * K + k);
    }
    part[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && c <= C) {
        float total = 0.0f;
        for (int r = 0; r < THREADS / 32; ++r) total += part[r][lane];
        if (c < C) dw[(long long)k * C + c] = total;
        else db[k] = total;
    }
}
"#;
