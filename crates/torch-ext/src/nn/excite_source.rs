//! The CUDA C source of [`super::squeeze_excite`] (appended to
//! [`super::source::SOURCE`], whose `T`, `THREADS` and one-value loads and
//! stores it uses): channel attention over a channels-last tensor, one
//! block an image. The forward kernel takes each channel's mean over the
//! image, the two small products, the ReLU and the sigmoid, and writes
//! `x · s`; the backward kernel writes the input gradient and the image's
//! share of the three parameter gradients, which the convolution source's
//! fixed-order reduction adds up.

pub(in crate::nn) const EXCITE_SOURCE: &str = r#"
// ---- squeeze-and-excite, NHWC, one block per image ----
// y = x * s with s = sigmoid(W2 relu(W1 mean_hw(x)) + b2); W1 [R][C],
// W2 [C][R], b2 [C]; C <= SE_MAX_C (so THREADS / C >= 1 pixel rows a
// pass), R <= SE_MAX_R. saved[n] holds the image's mean [C], hidden
// activations [R] (after the ReLU) and s [C], for the backward.
#define SE_MAX_C 256
#define SE_MAX_R 64

// Per-channel sum over the image's HW pixels of f(index), in a fixed
// order: thread t sums channel t % C of pixels t / C, t / C + P, ... (P =
// THREADS / C), then threads t < C add the P row sums in row order.
// Returns the sum at threads t < C; every thread of the block calls.
template <class F>
__device__ __forceinline__ float se_channel_sum(long long base, int HW, int C, float* red, F f) {
    const int P = THREADS / C;
    const int c = threadIdx.x % C, row = threadIdx.x / C;
    float s = 0.0f;
    if (row < P) {
        for (int p = row; p < HW; p += P) s += f(base + (long long)p * C + c);
    }
    red[threadIdx.x] = s;
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x < C) {
        for (int r = 0; r < P; ++r) total += red[r * C + threadIdx.x];
    }
    __syncthreads();
    return total;
}

extern "C" __global__ void esper_se_forward(
    const T* __restrict__ x, const float* __restrict__ w1, const float* __restrict__ w2,
    const float* __restrict__ b2, T* __restrict__ y, float* __restrict__ saved, int HW, int C,
    int R) {
    ESPER_PDL_ENTRY();
    __shared__ float red[THREADS];
    __shared__ float mean[SE_MAX_C], hidden[SE_MAX_R], scale[SE_MAX_C];
    const int t = threadIdx.x;
    const long long base = (long long)blockIdx.x * HW * C;
    const float sum = se_channel_sum(base, HW, C, red, [&](long long i) { return ld1(x, i); });
    if (t < C) mean[t] = sum / (float)HW;
    __syncthreads();
    if (t < R) {
        float z = 0.0f;
        for (int k = 0; k < C; ++k) z += w1[t * C + k] * mean[k];
        hidden[t] = z != z ? z : (z > 0.0f ? z : 0.0f);
    }
    __syncthreads();
    float* out = saved + (long long)blockIdx.x * (2 * C + R);
    if (t < C) {
        float z = b2[t];
        for (int j = 0; j < R; ++j) z += w2[t * R + j] * hidden[j];
        const float s = 1.0f / (1.0f + expf(-z));
        scale[t] = s;
        out[t] = mean[t];
        out[C + R + t] = s;
    }
    if (t < R) out[C + t] = hidden[t];
    __syncthreads();
    const int total = HW * C;
    for (int i = t; i < total; i += THREADS) st1(y, base + i, ld1(x, base + i) * scale[i % C]);
}

// Backward: with g = dy, ds[c] = sum_hw g x, dz2 = ds s (1 - s), dz1 =
// (W2^T dz2) where hidden > 0, and the mean's gradient dm = W1^T dz1:
// dx = g s + dm / HW (when write_dx), and the image's share of dW1 = dz1
// mean^T, dW2 = dz2 hidden^T and db2 = dz2 in partials[n] = [dW1 (R * C) |
// dW2 (C * R) | db2 (C)].
extern "C" __global__ void esper_se_backward(
    const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ w1,
    const float* __restrict__ w2, const float* __restrict__ saved, T* __restrict__ dx,
    float* __restrict__ partials, int HW, int C, int R, int write_dx) {
    ESPER_PDL_ENTRY();
    __shared__ float red[THREADS];
    __shared__ float dz2[SE_MAX_C], dz1[SE_MAX_R], dmean[SE_MAX_C], scale[SE_MAX_C];
    const int t = threadIdx.x;
    const long long base = (long long)blockIdx.x * HW * C;
    const float* sv = saved + (long long)blockIdx.x * (2 * C + R);
    const float* mean = sv;
    const float* hidden = sv + C;
    const float ds = se_channel_sum(base, HW, C, red,
                                    [&](long long i) { return ld1(dy, i) * ld1(x, i); });
    if (t < C) {
        const float s = sv[C + R + t];
        scale[t] = s;
        dz2[t] = ds * ((1.0f - s) * s);
    }
    __syncthreads();
    if (t < R) {
        float d = 0.0f;
        for (int c = 0; c < C; ++c) d += w2[c * R + t] * dz2[c];
        dz1[t] = hidden[t] > 0.0f ? d : 0.0f;
    }
    __syncthreads();
    if (t < C) {
        float d = 0.0f;
        for (int j = 0; j < R; ++j) d += w1[j * C + t] * dz1[j];
        dmean[t] = d / (float)HW;
    }
    float* out = partials + (long long)blockIdx.x * (2 * R * C + C);
    for (int k = t; k < R * C; k += THREADS) out[k] = dz1[k / C] * mean[k % C];
    for (int k = t; k < C * R; k += THREADS) out[R * C + k] = dz2[k / R] * hidden[k % R];
    if (t < C) out[2 * R * C + t] = dz2[t];
    if (!write_dx) return;
    __syncthreads();
    const int total = HW * C;
    for (int i = t; i < total; i += THREADS) {
        const int c = i % C;
        st1(dx, base + i, ld1(dy, base + i) * scale[c] + dmean[c]);
    }
}
"#;
