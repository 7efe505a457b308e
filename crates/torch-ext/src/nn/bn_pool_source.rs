//! The CUDA C source of batch norm + ReLU + 2x2 max-pool in one node
//! (appended to [`super::source::SOURCE`], whose layout, loads, sums,
//! `bn_forward_constants`, `bn_constants`, `bn_act` and `window` it uses).
//!
//! The statistics pass is `esper_bn_stats` over every pixel; then:
//! - forward: every block adds the partials up (as `esper_bn_relu_forward`
//!   does), and a thread takes one pool window and channel group: it
//!   normalises the window's four pixels, applies ReLU, rounds to the
//!   tensor's dtype and writes only the window's maximum. The full-size
//!   activation is never written.
//! - backward, pass 1: a thread recomputes its window's four activations
//!   and their argmax from the saved input (the pool's choice: the first
//!   maximum, a NaN over numbers), routes the pooled gradient to it, masks
//!   it with ReLU and adds it and its product with the normalised input
//!   into the block's sums.
//! - backward, pass 2: the input gradient of every pixel,
//!   `s (g - mean(g) - x̂ mean(g x̂))` with `g` routed as in pass 1; pixels
//!   of the row and column a floor pool leaves out (odd sizes) have
//!   `g = 0`. Block 0 writes the weight and bias gradients.
//!
//! The layout's "rows" are the pool's windows, in the pooled output's
//! channels-last order. Sums are taken in a fixed order, so the results
//! are deterministic (they differ from the unfused kernels' by rounding:
//! the order differs).

pub(in crate::nn) const BN_POOL_SOURCE: &str = r#"
// ---- batch norm + ReLU + 2x2 max-pool, NHWC ----
// Window wi of an [N, H, W] pixel grid (Ho = H / 2, Wo = W / 2): its first
// pixel's row index and its (ho, wo).
__device__ __forceinline__ long long bnp_window(long long wi, int H, int W, int* ho, int* wo) {
    const int Wo = W >> 1, Ho = H >> 1;
    *wo = (int)(wi % Wo);
    const long long t = wi / Wo;
    *ho = (int)(t % Ho);
    const long long n = t / Ho;
    return (n * H + 2 * *ho) * W + 2 * *wo;
}

// The ReLU-masked gradient of the window's four pixels: gp at the pool's
// argmax of the rounded activations, where the pre-activation is positive.
__device__ __forceinline__ void bnp_grads(const float (*xv)[VEC], const float* gp, const float* s,
                                          const float* h, float (*g)[VEC]) {
    float y[4][VEC], best[VEC];
    int k[VEC];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) y[j][v] = round_t(bn_act(xv[j][v], s[v], h[v]));
    }
    window(y, best, k);
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            g[j][v] = (k[v] == j && xv[j][v] * s[v] + h[v] > 0.0f) ? gp[v] : 0.0f;
        }
    }
}

// The window's four pixels of this thread's channel group.
__device__ __forceinline__ void bnp_load(const T* __restrict__ x, long long r0, int W, int C,
                                         const Layout& l, float (*xv)[VEC]) {
    const long long at[4] = {r0, r0 + 1, r0 + W, r0 + W + 1};
    #pragma unroll
    for (int j = 0; j < 4; ++j) load(x, at[j] * C + l.group * VEC, xv[j]);
}

// Window wi's four pixels (xv) and the pooled gradient routed through the
// pool and the ReLU to them (g); returns the window's first pixel row.
__device__ __forceinline__ long long bnp_window_grads(
    const T* __restrict__ x, const T* __restrict__ dy, long long wi, int H, int W, int C,
    const Layout& l, const float* s, const float* h, float (*xv)[VEC], float (*g)[VEC],
    int* ho, int* wo) {
    const long long r0 = bnp_window(wi, H, W, ho, wo);
    float gp[VEC];
    bnp_load(x, r0, W, C, l, xv);
    load(dy, wi * C + l.group * VEC, gp);
    bnp_grads(xv, gp, s, h, g);
    return r0;
}

extern "C" __global__ void esper_bn_relu_pool_forward(
    const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ partials, int blocks,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ save_mean, float* __restrict__ save_invstd,
    float* __restrict__ running_mean, float* __restrict__ running_var,
    float momentum, float eps, long long rows, int C, int H, int W) {
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
    const long long windows = rows / ((long long)H * W) * (H >> 1) * (W >> 1);
    const long long step = (long long)gridDim.x * l.per;
    for (long long wi = (long long)blockIdx.x * l.per + l.row; wi < windows; wi += step) {
        int ho, wo;
        const long long r0 = bnp_window(wi, H, W, &ho, &wo);
        float v[4][VEC], best[VEC];
        int k[VEC];
        bnp_load(x, r0, W, C, l, v);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            #pragma unroll
            for (int c = 0; c < VEC; ++c) v[j][c] = round_t(bn_act(v[j][c], s[c], h[c]));
        }
        window(v, best, k);
        store(y, wi * C + l.group * VEC, best);
    }
}

// Backward, pass 1: per-block sums of g and g * xhat (dy is the pooled
// gradient, [N, Ho, Wo, C]).
extern "C" __global__ void esper_bn_relu_pool_backward_reduce(
    const T* __restrict__ x, const T* __restrict__ dy,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ partials, long long rows, int C, int H, int W) {
    ESPER_PDL_ENTRY();
    __shared__ float sh[2 * VEC][THREADS];
    const Layout l = layout(C);
    float sg[VEC], sgx[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) { sg[v] = 0.0f; sgx[v] = 0.0f; }
    if (l.active) {
        float mean[VEC], invstd[VEC], s[VEC], h[VEC];
        bn_constants(l, save_mean, save_invstd, weight, bias, mean, invstd, s, h);
        const long long windows = rows / ((long long)H * W) * (H >> 1) * (W >> 1);
        const long long step = (long long)gridDim.x * l.per;
        for (long long wi = (long long)blockIdx.x * l.per + l.row; wi < windows; wi += step) {
            int ho, wo;
            float xv[4][VEC], g[4][VEC];
            bnp_window_grads(x, dy, wi, H, W, C, l, s, h, xv, g, &ho, &wo);
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                #pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    sg[v] += g[j][v];
                    sgx[v] += g[j][v] * ((xv[j][v] - mean[v]) * invstd[v]);
                }
            }
        }
    }
    block_sum_pairs(sg, sgx, l, sh);
    write_block_pairs(partials, l, C, sh);
}

// The input gradient of one pixel's VEC values xv with routed gradient g.
__device__ __forceinline__ void bnp_dx_values(const float* xv, const float* g, const float* s,
                                              const float* mean, const float* invstd,
                                              const float* a, const float* b, float* out) {
    #pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = s[v] * (g[v] - a[v] - (xv[v] - mean[v]) * invstd[v] * b[v]);
}

// The input gradient of pixel row r with routed gradient g (a pixel no
// window covers: g = 0).
__device__ __forceinline__ void bnp_dx(const T* __restrict__ x, T* __restrict__ dx, long long r,
                                       int C, const Layout& l, const float* g, const float* s,
                                       const float* mean, const float* invstd, const float* a,
                                       const float* b) {
    float xv[VEC], out[VEC];
    load(x, r * C + l.group * VEC, xv);
    bnp_dx_values(xv, g, s, mean, invstd, a, b, out);
    store(dx, r * C + l.group * VEC, out);
}

// Backward, pass 2: every pixel's input gradient; block 0 writes the
// weight and bias gradients.
extern "C" __global__ void esper_bn_relu_pool_backward_apply(
    const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
    const float* __restrict__ partials, int blocks,
    const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
    const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ dweight, float* __restrict__ dbias, long long rows, int C, int H, int W) {
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
    float mean[VEC], invstd[VEC], s[VEC], h[VEC], a[VEC], b[VEC], zero[VEC];
    bn_constants(l, save_mean, save_invstd, weight, bias, mean, invstd, s, h);
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        a[v] = tot[0][l.group * VEC + v] / n;
        b[v] = tot[1][l.group * VEC + v] / n;
        zero[v] = 0.0f;
    }
    const int Ho = H >> 1, Wo = W >> 1;
    const long long windows = rows / ((long long)H * W) * Ho * Wo;
    const long long step = (long long)gridDim.x * l.per;
    for (long long wi = (long long)blockIdx.x * l.per + l.row; wi < windows; wi += step) {
        int ho, wo;
        float xv[4][VEC], g[4][VEC];
        const long long r0 = bnp_window_grads(x, dy, wi, H, W, C, l, s, h, xv, g, &ho, &wo);
        const long long at[4] = {r0, r0 + 1, r0 + W, r0 + W + 1};
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float out[VEC];
            bnp_dx_values(xv[j], g[j], s, mean, invstd, a, b, out);
            store(dx, at[j] * C + l.group * VEC, out);
        }
        // The column and row a floor pool leaves out, at the last window
        // of a row and of an image.
        const bool right = (W & 1) && wo == Wo - 1, bottom = (H & 1) && ho == Ho - 1;
        if (right) {
            bnp_dx(x, dx, r0 + 2, C, l, zero, s, mean, invstd, a, b);
            bnp_dx(x, dx, r0 + W + 2, C, l, zero, s, mean, invstd, a, b);
        }
        if (bottom) {
            bnp_dx(x, dx, r0 + 2 * W, C, l, zero, s, mean, invstd, a, b);
            bnp_dx(x, dx, r0 + 2 * W + 1, C, l, zero, s, mean, invstd, a, b);
        }
        if (right && bottom) bnp_dx(x, dx, r0 + 2 * W + 2, C, l, zero, s, mean, invstd, a, b);
    }
}
"#;
