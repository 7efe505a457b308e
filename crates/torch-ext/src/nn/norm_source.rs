//! The CUDA C source of group normalisation + ReLU over a channels-last
//! tensor (appended to [`super::source::SOURCE`], whose `T`, `THREADS` and
//! four-value loads and stores it uses): one kernel forward, one backward
//! plus the convolution source's fixed-order reduction for the weight and
//! bias gradients. Groups of a multiple of four channels take the quad
//! kernels; narrower groups (1, 2 or 3 channels, as a seed's GroupNorm has
//! at a 4- or 8-channel slot) the `_narrow` pair, which keep every sum per
//! channel.

pub(in crate::nn) const GROUP_NORM_SOURCE: &str = r#"
// ---- group norm + ReLU, NHWC, one block per image ----
// C % 4 == 0 and (C / G) % 4 == 0, so a thread's four channels belong to
// one group; Q = C / 4 channel quads, P = THREADS / Q pixel rows a pass
// (thread t: quad t % Q of pixels t / Q, t / Q + P, ...). Sums are taken
// per thread, then over the rows in a fixed tree, then over a group's
// quads in order, so results are deterministic.

// One block's thread layout over image blockIdx.x.
struct GnLayout {
    int n, Q, P, q, row, Cg, g;
    bool active;
    long long base;
};
__device__ __forceinline__ GnLayout gn_layout(int HW, int C, int G) {
    GnLayout l;
    l.n = blockIdx.x;
    l.Q = C / 4;
    l.P = THREADS / l.Q;
    l.q = threadIdx.x % l.Q;
    l.row = threadIdx.x / l.Q;
    l.active = l.row < l.P;
    l.Cg = C / G;
    l.g = l.q * 4 / l.Cg;
    l.base = (long long)l.n * HW * C;
    return l;
}

// This thread's four channels' gamma and beta.
__device__ __forceinline__ void gn_affine_params(const float* __restrict__ gamma,
                                                 const float* __restrict__ beta, int q,
                                                 float* gm, float* bt) {
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        gm[j] = gamma[q * 4 + j];
        bt[j] = beta[q * 4 + j];
    }
}

// Adds red[k * stride_k + row * width + i] over the P rows into row 0 for
// K arrays (a fixed tree; every active thread passes its own column i).
template <int K>
__device__ __forceinline__ void gn_rows_sum(float* red, int stride_k, int P, int width, int row,
                                            int i, bool active) {
    int span = 1;
    while (span < P) span *= 2;
    for (int stride = span / 2; stride >= 1; stride /= 2) {
        __syncthreads();
        if (active && row < stride && row + stride < P) {
            #pragma unroll
            for (int k = 0; k < K; ++k) {
                red[k * stride_k + row * width + i] += red[k * stride_k + (row + stride) * width + i];
            }
        }
    }
    __syncthreads();
}

// z = x_hat * gamma + beta with x_hat = (x - mean) * rstd, written the same
// way forward and backward so the ReLU mask agrees.
__device__ __forceinline__ float gn_affine(float v, float mean, float rstd, float gamma,
                                           float beta, float* xhat) {
    const float h = __fmul_rn(__fsub_rn(v, mean), rstd);
    *xhat = h;
    return __fmaf_rn(h, gamma, beta);
}

// The ReLU-masked gradient dz of four channels and their x_hat.
__device__ __forceinline__ void gn_masked_grad(const float* v, const float* d, float mean,
                                               float rstd, const float* gm, const float* bt,
                                               float* dz, float* h) {
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        dz[j] = gn_affine(v[j], mean, rstd, gm[j], bt[j], &h[j]) > 0.0f ? d[j] : 0.0f;
    }
}

// res + z for this thread's four outputs z where a residual is given
// (res not null): z rounded to T first, then added in f32, as libtorch's
// add of the two tensors rounds, so the sum is the unfused one bit for bit.
__device__ __forceinline__ void gn_add_residual(const T* __restrict__ res, long long i,
                                                float* o) {
    if (res == nullptr) return;
    float r[4];
    load4(res, i, r);
    #pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = r[j] + round_t(o[j]);
}

// Forward: y = relu(group_norm(x)), plus res where it is not null; mean and
// rstd [N][G] saved. G <= 64.
extern "C" __global__ void esper_gn_relu_forward(
    const T* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
    const T* __restrict__ res, T* __restrict__ y, float* __restrict__ mean_out,
    float* __restrict__ rstd_out, int HW, int C, int G, float eps) {
    ESPER_PDL_ENTRY();
    __shared__ float red[2 * THREADS];
    __shared__ float stats[2 * 64];
    const GnLayout l = gn_layout(HW, C, G);
    const int n = l.n, Q = l.Q, P = l.P, q = l.q, row = l.row, Cg = l.Cg, g = l.g;
    const bool active = l.active;
    const long long base = l.base;
    // Each group's values less its first one at pixel 0 (a shift, so a
    // mean far from zero costs no precision).
    const float shift = ld1(x, base + g * Cg);
    float s = 0.0f, ss = 0.0f;
    if (active) {
        for (int p = row; p < HW; p += P) {
            float v[4];
            load4(x, base + (long long)p * C + q * 4, v);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float d = v[j] - shift;
                s += d;
                ss += d * d;
            }
        }
        red[row * Q + q] = s;
        red[THREADS + row * Q + q] = ss;
    }
    gn_rows_sum<2>(red, THREADS, P, Q, row, q, active);
    if (threadIdx.x < G) {
        const int gq = Cg / 4;
        float ts = 0.0f, tss = 0.0f;
        for (int k = 0; k < gq; ++k) {
            ts += red[threadIdx.x * gq + k];
            tss += red[THREADS + threadIdx.x * gq + k];
        }
        const float count = (float)Cg * (float)HW;
        const float m = ts / count;
        const float var = fmaxf(tss / count - m * m, 0.0f);
        const float mean = ld1(x, base + threadIdx.x * Cg) + m;
        const float rstd = rsqrtf(var + eps);
        stats[threadIdx.x] = mean;
        stats[64 + threadIdx.x] = rstd;
        mean_out[n * G + threadIdx.x] = mean;
        rstd_out[n * G + threadIdx.x] = rstd;
    }
    __syncthreads();
    if (!active) return;
    const float mean = stats[g], rstd = stats[64 + g];
    float gm[4], bt[4];
    gn_affine_params(gamma, beta, q, gm, bt);
    for (int p = row; p < HW; p += P) {
        float v[4], o[4];
        const long long i = base + (long long)p * C + q * 4;
        load4(x, i, v);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float h;
            o[j] = fmaxf(gn_affine(v[j], mean, rstd, gm[j], bt[j], &h), 0.0f);
        }
        gn_add_residual(res, i, o);
        store4(y, i, o);
    }
}

// Backward, per image: dz = dy where z > 0; with dh = dz * gamma,
// dx = rstd * (dh - mean(dh) - x_hat * mean(dh * x_hat)) over the group;
// the image's sums of dz * x_hat and of dz per channel go to
// partials[n][0, C) and [C, 2C), for the reduction into dgamma and dbeta.
extern "C" __global__ void esper_gn_relu_backward(
    const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ gamma,
    const float* __restrict__ beta, const float* __restrict__ mean_in,
    const float* __restrict__ rstd_in, T* __restrict__ dx, float* __restrict__ partials,
    int HW, int C, int G) {
    ESPER_PDL_ENTRY();
    // Four arrays of P x C <= 4 * THREADS words: per channel, the sums of
    // dz * x_hat and of dz; per quad (P x Q), the sums of dh and dh * x_hat.
    __shared__ float red[4 * 4 * THREADS];
    __shared__ float stats[2 * 64];
    const GnLayout l = gn_layout(HW, C, G);
    const int n = l.n, Q = l.Q, P = l.P, q = l.q, row = l.row, Cg = l.Cg, g = l.g;
    const bool active = l.active;
    const long long base = l.base;
    const float mean = mean_in[n * G + g], rstd = rstd_in[n * G + g];
    float gm[4], bt[4];
    gn_affine_params(gamma, beta, q, gm, bt);
    float dg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, db[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float sa = 0.0f, sb = 0.0f;
    if (active) {
        for (int p = row; p < HW; p += P) {
            float v[4], d[4], dz[4], h[4];
            const long long i = base + (long long)p * C + q * 4;
            load4(x, i, v);
            load4(dy, i, d);
            gn_masked_grad(v, d, mean, rstd, gm, bt, dz, h);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                dg[j] += dz[j] * h[j];
                db[j] += dz[j];
                const float dh = dz[j] * gm[j];
                sa += dh;
                sb += dh * h[j];
            }
        }
        // The quad sums sit as a fifth and sixth "channel" pair: red is
        // [4][P][C] with k = 0, 1 the channel sums of quads 0 .. Q and
        // k = 2, 3 the quad sums in column q.
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            red[row * C + q * 4 + j] = dg[j];
            red[4 * THREADS + row * C + q * 4 + j] = db[j];
        }
        red[8 * THREADS + row * C + q] = sa;
        red[12 * THREADS + row * C + q] = sb;
    }
    // Tree over the rows: the channel sums column by column (four a
    // thread), the quad sums in column q.
    int span = 1;
    while (span < P) span *= 2;
    for (int stride = span / 2; stride >= 1; stride /= 2) {
        __syncthreads();
        if (active && row < stride && row + stride < P) {
            const int a = row * C, b = (row + stride) * C;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                red[a + q * 4 + j] += red[b + q * 4 + j];
                red[4 * THREADS + a + q * 4 + j] += red[4 * THREADS + b + q * 4 + j];
            }
            red[8 * THREADS + a + q] += red[8 * THREADS + b + q];
            red[12 * THREADS + a + q] += red[12 * THREADS + b + q];
        }
    }
    __syncthreads();
    if (threadIdx.x < G) {
        const int gq = Cg / 4;
        float ta = 0.0f, tb = 0.0f;
        for (int k = 0; k < gq; ++k) {
            ta += red[8 * THREADS + threadIdx.x * gq + k];
            tb += red[12 * THREADS + threadIdx.x * gq + k];
        }
        const float count = (float)Cg * (float)HW;
        stats[threadIdx.x] = ta / count;
        stats[64 + threadIdx.x] = tb / count;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        partials[(long long)n * 2 * C + c] = red[c];
        partials[(long long)n * 2 * C + C + c] = red[4 * THREADS + c];
    }
    __syncthreads();
    if (!active) return;
    const float ma = stats[g], mb = stats[64 + g];
    for (int p = row; p < HW; p += P) {
        float v[4], d[4], dz[4], h[4], o[4];
        const long long i = base + (long long)p * C + q * 4;
        load4(x, i, v);
        load4(dy, i, d);
        gn_masked_grad(v, d, mean, rstd, gm, bt, dz, h);
        #pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = rstd * (dz[j] * gm[j] - ma - h[j] * mb);
        store4(dx, i, o);
    }
}

// ---- group norm + ReLU, NHWC, groups of any width (C % 4 == 0) ----
// For groups whose width Cg is not a multiple of four (a thread's quad
// then spans several groups): the sums are kept per channel (P x C words
// an array), summed over the rows in the same fixed tree, then over a
// group's channels in order. Deterministic, as the kernels above.

// Adds the per-channel arrays red[k * stride_k + row * C + c] (K arrays,
// this thread's four channels c = q * 4 + j) over the P rows into row 0.
template <int K>
__device__ __forceinline__ void gn_rows_sum4(float* red, int stride_k, int P, int C, int row,
                                             int q, bool active) {
    int span = 1;
    while (span < P) span *= 2;
    for (int stride = span / 2; stride >= 1; stride /= 2) {
        __syncthreads();
        if (active && row < stride && row + stride < P) {
            const int a = row * C + q * 4, b = (row + stride) * C + q * 4;
            #pragma unroll
            for (int k = 0; k < K; ++k) {
                #pragma unroll
                for (int j = 0; j < 4; ++j) red[k * stride_k + a + j] += red[k * stride_k + b + j];
            }
        }
    }
    __syncthreads();
}

extern "C" __global__ void esper_gn_relu_forward_narrow(
    const T* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
    const T* __restrict__ res, T* __restrict__ y, float* __restrict__ mean_out,
    float* __restrict__ rstd_out, int HW, int C, int G, float eps) {
    ESPER_PDL_ENTRY();
    __shared__ float red[2 * 4 * THREADS];
    __shared__ float stats[2 * 64];
    const GnLayout l = gn_layout(HW, C, G);
    const int n = l.n, P = l.P, q = l.q, row = l.row, Cg = l.Cg;
    const bool active = l.active;
    const long long base = l.base;
    // Each channel's shift is its group's first value at pixel 0.
    float shift[4], s[4], ss[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        shift[j] = ld1(x, base + ((q * 4 + j) / Cg) * Cg);
        s[j] = 0.0f;
        ss[j] = 0.0f;
    }
    if (active) {
        for (int p = row; p < HW; p += P) {
            float v[4];
            load4(x, base + (long long)p * C + q * 4, v);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float d = v[j] - shift[j];
                s[j] += d;
                ss[j] += d * d;
            }
        }
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            red[row * C + q * 4 + j] = s[j];
            red[4 * THREADS + row * C + q * 4 + j] = ss[j];
        }
    }
    gn_rows_sum4<2>(red, 4 * THREADS, P, C, row, q, active);
    if (threadIdx.x < G) {
        float ts = 0.0f, tss = 0.0f;
        for (int k = 0; k < Cg; ++k) {
            ts += red[threadIdx.x * Cg + k];
            tss += red[4 * THREADS + threadIdx.x * Cg + k];
        }
        const float count = (float)Cg * (float)HW;
        const float m = ts / count;
        const float var = fmaxf(tss / count - m * m, 0.0f);
        const float mean = ld1(x, base + threadIdx.x * Cg) + m;
        const float rstd = rsqrtf(var + eps);
        stats[threadIdx.x] = mean;
        stats[64 + threadIdx.x] = rstd;
        mean_out[n * G + threadIdx.x] = mean;
        rstd_out[n * G + threadIdx.x] = rstd;
    }
    __syncthreads();
    if (!active) return;
    float mean[4], rstd[4], gm[4], bt[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int g = (q * 4 + j) / Cg;
        mean[j] = stats[g];
        rstd[j] = stats[64 + g];
    }
    gn_affine_params(gamma, beta, q, gm, bt);
    for (int p = row; p < HW; p += P) {
        float v[4], o[4];
        const long long i = base + (long long)p * C + q * 4;
        load4(x, i, v);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float h;
            o[j] = fmaxf(gn_affine(v[j], mean[j], rstd[j], gm[j], bt[j], &h), 0.0f);
        }
        gn_add_residual(res, i, o);
        store4(y, i, o);
    }
}

// Backward of the narrow forward: as esper_gn_relu_backward, with every
// sum per channel and each channel's own group statistics.
extern "C" __global__ void esper_gn_relu_backward_narrow(
    const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ gamma,
    const float* __restrict__ beta, const float* __restrict__ mean_in,
    const float* __restrict__ rstd_in, T* __restrict__ dx, float* __restrict__ partials,
    int HW, int C, int G) {
    ESPER_PDL_ENTRY();
    // Four per-channel arrays of P x C <= 4 * THREADS words: the sums of
    // dz * x_hat, of dz, of dh and of dh * x_hat.
    __shared__ float red[4 * 4 * THREADS];
    __shared__ float stats[2 * 64];
    const GnLayout l = gn_layout(HW, C, G);
    const int n = l.n, P = l.P, q = l.q, row = l.row, Cg = l.Cg;
    const bool active = l.active;
    const long long base = l.base;
    float mean[4], rstd[4], gm[4], bt[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int g = (q * 4 + j) / Cg;
        mean[j] = mean_in[n * G + g];
        rstd[j] = rstd_in[n * G + g];
    }
    gn_affine_params(gamma, beta, q, gm, bt);
    float dg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, db[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active) {
        for (int p = row; p < HW; p += P) {
            float v[4], d[4];
            const long long i = base + (long long)p * C + q * 4;
            load4(x, i, v);
            load4(dy, i, d);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                float h;
                const float dz =
                    gn_affine(v[j], mean[j], rstd[j], gm[j], bt[j], &h) > 0.0f ? d[j] : 0.0f;
                dg[j] += dz * h;
                db[j] += dz;
                const float dh = dz * gm[j];
                sa[j] += dh;
                sb[j] += dh * h;
            }
        }
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = row * C + q * 4 + j;
            red[c] = dg[j];
            red[4 * THREADS + c] = db[j];
            red[8 * THREADS + c] = sa[j];
            red[12 * THREADS + c] = sb[j];
        }
    }
    gn_rows_sum4<4>(red, 4 * THREADS, P, C, row, q, active);
    if (threadIdx.x < G) {
        float ta = 0.0f, tb = 0.0f;
        for (int k = 0; k < Cg; ++k) {
            ta += red[8 * THREADS + threadIdx.x * Cg + k];
            tb += red[12 * THREADS + threadIdx.x * Cg + k];
        }
        const float count = (float)Cg * (float)HW;
        stats[threadIdx.x] = ta / count;
        stats[64 + threadIdx.x] = tb / count;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        partials[(long long)n * 2 * C + c] = red[c];
        partials[(long long)n * 2 * C + C + c] = red[4 * THREADS + c];
    }
    __syncthreads();
    if (!active) return;
    float ma[4], mb[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int g = (q * 4 + j) / Cg;
        ma[j] = stats[g];
        mb[j] = stats[64 + g];
    }
    for (int p = row; p < HW; p += P) {
        float v[4], d[4], o[4];
        const long long i = base + (long long)p * C + q * 4;
        load4(x, i, v);
        load4(dy, i, d);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float h;
            const float dz =
                gn_affine(v[j], mean[j], rstd[j], gm[j], bt[j], &h) > 0.0f ? d[j] : 0.0f;
            o[j] = rstd[j] * (dz * gm[j] - ma[j] - h * mb[j]);
        }
        store4(dx, i, o);
    }
}
"#;
