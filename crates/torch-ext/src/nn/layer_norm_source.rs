//! The CUDA C source of layer normalisation over the last dimension
//! (appended to [`super::source::SOURCE`], whose `T`, `THREADS` and
//! four-value loads and stores it uses): one warp a row, the row held in
//! registers, so the forward reads the input once and the backward reads
//! the input and its gradient once (for rows of at most 128 values, the
//! backward loads four of a warp's rows before reducing the first, so
//! that their loads are in flight together). The weight and bias gradients are the
//! blocks' per-column partial sums, added up by the convolution source's
//! fixed-order reduction. Every sum is taken in a fixed order (a warp's
//! butterfly, then the block's warps in order, then the blocks in order),
//! so results are deterministic. The `f32` build also has the kernels of a
//! layer norm with a `bf16` output (`esper_ln_*_bf16_out`): under `bf16`
//! autocast, a linear layer's input in the dtype the layer casts it to.
//! The backward kernels add an optional second gradient into the input
//! gradient (a layer norm that forks a residual stream, whose other branch's
//! gradient autograd would otherwise add in a pass of its own).

pub(in crate::nn) const LAYER_NORM_SOURCE: &str = r#"
// ---- layer norm over the last dimension of dense [M, C] rows ----
// C % 4 == 0 and C <= 4 * 32 * LN_CHUNKS; lane l of a warp holds columns
// 4 l + 128 k (k < LN_CHUNKS) of its row.
#define LN_CHUNKS 4
#define LN_MAX_C (128 * LN_CHUNKS)
#define LN_WARPS (THREADS / 32)
// Rows a warp of the backward loads at once where C <= 128.
#define LN_BATCH 4

__device__ __forceinline__ float ln_warp_sum(float v) {
    #pragma unroll
    for (int offset = 16; offset >= 1; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

#if !ESPER_BF16
// The f32 source's bf16 loads and stores, for the layer norm whose output
// (and so its output gradient) is bf16: under bf16 autocast, the input of
// a linear layer in the dtype the layer would cast it to (the same
// rounding as libtorch's cast: to nearest even).
typedef unsigned short B16;
__device__ __forceinline__ void load4(const B16* __restrict__ p, long long i, float* v) {
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    v[0] = __uint_as_float((u.x & 0xffffu) << 16); v[1] = __uint_as_float(u.x & 0xffff0000u);
    v[2] = __uint_as_float((u.y & 0xffffu) << 16); v[3] = __uint_as_float(u.y & 0xffff0000u);
}
__device__ __forceinline__ unsigned int ln_to_bf(float v) {
    unsigned int u = __float_as_uint(v);
    return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void store4(B16* __restrict__ p, long long i, const float* v) {
    uint2 u;
    u.x = ln_to_bf(v[0]) | (ln_to_bf(v[1]) << 16);
    u.y = ln_to_bf(v[2]) | (ln_to_bf(v[3]) << 16);
    *reinterpret_cast<uint2*>(p + i) = u;
}
#endif

// y = (x - mean) * rstd * gamma + beta, with the biased variance, as
// libtorch's layer_norm; mean and rstd saved per row (f32). TY: the
// output's type (T, or bf16 from an f32 input).
template <typename TY>
__device__ __forceinline__ void ln_forward(const T* __restrict__ x,
                                           const float* __restrict__ gamma,
                                           const float* __restrict__ beta, TY* __restrict__ y,
                                           float* __restrict__ mean_out,
                                           float* __restrict__ rstd_out, int M, int C,
                                           float eps) {
    const int lane = threadIdx.x % 32;
    const int stride = gridDim.x * LN_WARPS;
    for (int r = blockIdx.x * LN_WARPS + threadIdx.x / 32; r < M; r += stride) {
        const long long base = (long long)r * C;
        float v[LN_CHUNKS][4];
        float s = 0.0f;
        #pragma unroll
        for (int k = 0; k < LN_CHUNKS; ++k) {
            const int c = 4 * lane + 128 * k;
            if (c < C) {
                load4(x, base + c, v[k]);
                s += (v[k][0] + v[k][1]) + (v[k][2] + v[k][3]);
            }
        }
        const float mu = ln_warp_sum(s) / C;
        float q = 0.0f;
        #pragma unroll
        for (int k = 0; k < LN_CHUNKS; ++k) {
            const int c = 4 * lane + 128 * k;
            if (c < C) {
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float d = v[k][j] - mu;
                    q += d * d;
                }
            }
        }
        const float rstd = rsqrtf(ln_warp_sum(q) / C + eps);
        #pragma unroll
        for (int k = 0; k < LN_CHUNKS; ++k) {
            const int c = 4 * lane + 128 * k;
            if (c < C) {
                float o[4];
                #pragma unroll
                for (int j = 0; j < 4; ++j) o[j] = (v[k][j] - mu) * rstd * gamma[c + j] + beta[c + j];
                store4(y, base + c, o);
            }
        }
        if (lane == 0) {
            mean_out[r] = mu;
            rstd_out[r] = rstd;
        }
    }
}

extern "C" __global__ void esper_ln_forward(const T* __restrict__ x,
                                            const float* __restrict__ gamma,
                                            const float* __restrict__ beta, T* __restrict__ y,
                                            float* __restrict__ mean_out,
                                            float* __restrict__ rstd_out, int M, int C,
                                            float eps) {
    ESPER_PDL_ENTRY();
    ln_forward<T>(x, gamma, beta, y, mean_out, rstd_out, M, C, eps);
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma, per row,
// plus dres where it is not null (the gradient of the input's other use,
// for a layer norm that forks a residual stream: the sum autograd would
// otherwise add in a pass of its own); and this block's partial weight and
// bias gradients, sum(dy xhat) and sum(dy) per column over its rows:
// partials[block][0, C) and [C, 2C). TY: the output gradient's type (the
// forward's output type).
template <typename TY>
__device__ __forceinline__ void ln_backward(const T* __restrict__ x, const TY* __restrict__ dy,
                                            const float* __restrict__ gamma,
                                            const float* __restrict__ mean,
                                            const float* __restrict__ rstd,
                                            const T* __restrict__ dres, T* __restrict__ dx,
                                            float* __restrict__ partials, int M, int C) {
    __shared__ float red[LN_WARPS][2 * LN_MAX_C];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int stride = gridDim.x * LN_WARPS;
    float dg[LN_CHUNKS][4], db[LN_CHUNKS][4];
    #pragma unroll
    for (int k = 0; k < LN_CHUNKS; ++k) {
        #pragma unroll
        for (int j = 0; j < 4; ++j) dg[k][j] = db[k][j] = 0.0f;
    }
    if (C <= 128) {
        // One chunk a lane (columns 4 lane to 4 lane + 3): LN_BATCH of the
        // warp's rows are loaded before the first is reduced, so that their
        // loads are in flight together. Each row's arithmetic, and the order
        // in which the rows enter the column sums, are those of the general
        // loop below.
        const int c = 4 * lane;
        const bool on = c < C;
        float gm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (on) {
            #pragma unroll
            for (int j = 0; j < 4; ++j) gm[j] = gamma[c + j];
        }
        for (int r0 = blockIdx.x * LN_WARPS + warp; r0 < M; r0 += LN_BATCH * stride) {
            float xv[LN_BATCH][4], gv[LN_BATCH][4], rv[LN_BATCH][4], mu[LN_BATCH], rs[LN_BATCH];
            #pragma unroll
            for (int u = 0; u < LN_BATCH; ++u) {
                const long long r = r0 + (long long)u * stride;
                mu[u] = rs[u] = 0.0f;
                #pragma unroll
                for (int j = 0; j < 4; ++j) xv[u][j] = gv[u][j] = rv[u][j] = 0.0f;
                if (r < M) {
                    mu[u] = mean[r];
                    rs[u] = rstd[r];
                    if (on) {
                        load4(x, r * C + c, xv[u]);
                        load4(dy, r * C + c, gv[u]);
                        if (dres != nullptr) load4(dres, r * C + c, rv[u]);
                    }
                }
            }
            #pragma unroll
            for (int u = 0; u < LN_BATCH; ++u) {
                const long long r = r0 + (long long)u * stride;
                if (r >= M) break;  // the same for the whole warp
                float xh[4], g[4];
                float a = 0.0f, b = 0.0f;
                if (on) {
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        xh[j] = (xv[u][j] - mu[u]) * rs[u];
                        g[j] = gv[u][j] * gm[j];
                        a += g[j];
                        b += g[j] * xh[j];
                        dg[0][j] += gv[u][j] * xh[j];
                        db[0][j] += gv[u][j];
                    }
                }
                const float ma = ln_warp_sum(a) / C, mb = ln_warp_sum(b) / C;
                if (on) {
                    float o[4];
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) o[j] = rs[u] * (g[j] - ma - xh[j] * mb);
                    if (dres != nullptr) {
                        #pragma unroll
                        for (int j = 0; j < 4; ++j) o[j] += rv[u][j];
                    }
                    store4(dx, r * C + c, o);
                }
            }
        }
    } else {
        for (int r = blockIdx.x * LN_WARPS + warp; r < M; r += stride) {
            const long long base = (long long)r * C;
            const float mu = mean[r], rs = rstd[r];
            float xh[LN_CHUNKS][4], g[LN_CHUNKS][4];
            float a = 0.0f, b = 0.0f;
            #pragma unroll
            for (int k = 0; k < LN_CHUNKS; ++k) {
                const int c = 4 * lane + 128 * k;
                if (c < C) {
                    float xv[4], gv[4];
                    load4(x, base + c, xv);
                    load4(dy, base + c, gv);
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        xh[k][j] = (xv[j] - mu) * rs;
                        g[k][j] = gv[j] * gamma[c + j];
                        a += g[k][j];
                        b += g[k][j] * xh[k][j];
                        dg[k][j] += gv[j] * xh[k][j];
                        db[k][j] += gv[j];
                    }
                }
            }
            const float ma = ln_warp_sum(a) / C, mb = ln_warp_sum(b) / C;
            #pragma unroll
            for (int k = 0; k < LN_CHUNKS; ++k) {
                const int c = 4 * lane + 128 * k;
                if (c < C) {
                    float o[4];
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) o[j] = rs * (g[k][j] - ma - xh[k][j] * mb);
                    if (dres != nullptr) {
                        float rv[4];
                        load4(dres, base + c, rv);
                        #pragma unroll
                        for (int j = 0; j < 4; ++j) o[j] += rv[j];
                    }
                    store4(dx, base + c, o);
                }
            }
        }
    }
    #pragma unroll
    for (int k = 0; k < LN_CHUNKS; ++k) {
        const int c = 4 * lane + 128 * k;
        if (c < C) {
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                red[warp][c + j] = dg[k][j];
                red[warp][C + c + j] = db[k][j];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * C; i += THREADS) {
        float total = red[0][i];
        #pragma unroll
        for (int w = 1; w < LN_WARPS; ++w) total += red[w][i];
        partials[(long long)blockIdx.x * 2 * C + i] = total;
    }
}

extern "C" __global__ void esper_ln_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                             const float* __restrict__ gamma,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd,
                                             const T* __restrict__ dres, T* __restrict__ dx,
                                             float* __restrict__ partials, int M, int C) {
    ESPER_PDL_ENTRY();
    ln_backward<T>(x, dy, gamma, mean, rstd, dres, dx, partials, M, C);
}

#if !ESPER_BF16
// f32 input, bf16 output: the same kernels with B16 stores and loads.
extern "C" __global__ void esper_ln_forward_bf16_out(const float* __restrict__ x,
                                                     const float* __restrict__ gamma,
                                                     const float* __restrict__ beta,
                                                     B16* __restrict__ y,
                                                     float* __restrict__ mean_out,
                                                     float* __restrict__ rstd_out, int M, int C,
                                                     float eps) {
    ESPER_PDL_ENTRY();
    ln_forward<B16>(x, gamma, beta, y, mean_out, rstd_out, M, C, eps);
}

extern "C" __global__ void esper_ln_backward_bf16_out(const float* __restrict__ x,
                                                      const B16* __restrict__ dy,
                                                      const float* __restrict__ gamma,
                                                      const float* __restrict__ mean,
                                                      const float* __restrict__ rstd,
                                                      const float* __restrict__ dres,
                                                      float* __restrict__ dx,
                                                      float* __restrict__ partials, int M, int C) {
    ESPER_PDL_ENTRY();
    ln_backward<B16>(x, dy, gamma, mean, rstd, dres, dx, partials, M, C);
}
#endif
"#;
