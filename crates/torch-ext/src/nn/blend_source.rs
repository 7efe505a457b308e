//! The CUDA C source of [`super::blend_lerp`]'s kernels, appended to
//! [`super::source::SOURCE`] (it uses that source's `T`, `VEC`, `load` and
//! `store`): the alpha blend `lerp(h, s, w)` with one weight per sample,
//! read from the device, forward and backward, `VEC` values a thread; the
//! forward also blends a batch's replicated copies without making them; and
//! the blend followed by the 2x2 max-pool, forward and backward, for
//! [`super::blend_lerp_pool2x2`].
//!
//! libtorch's `lerp` with a weight tensor of shape `[N, 1, ..., 1]` takes
//! its strided, one-value-a-thread path (a broadcast operand is not
//! contiguous), and so do the two products of its backward; these kernels
//! read the weight of a value's sample from a pointer instead and move
//! four values a thread where the sample size allows.

pub(super) const BLEND_SOURCE: &str = r#"
// The weight of sample `sample`: w has one value when bit 0 of `flags` is
// set; bit 1 clamps it to [0, 1] (NaN stays NaN, as libtorch's clamp).
__device__ __forceinline__ float blend_weight(const float* __restrict__ w, long long sample,
                                              int flags) {
    const float a = w[(flags & 1) ? 0 : sample];
    return (flags & 2) && a == a ? fminf(fmaxf(a, 0.0f), 1.0f) : a;
}

// The blend's gradient split: to_h = g (1 - a), to_s = g a.
__device__ __forceinline__ void blend_split(const float* g, float a, float* to_h,
                                            float* to_s) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        to_h[k] = g[k] * (1.0f - a);
        to_s[k] = g[k] * a;
    }
}

// lerp(h, s, a) by libtorch's formula: the end nearer the weight is the
// anchor.
__device__ __forceinline__ float blend_value(float h, float s, float a) {
    const float d = s - h;
    return fabsf(a) < 0.5f ? h + a * d : s - d * (1.0f - a);
}

// lerp(h, s, a) at index i, VEC values, each rounded to T as the stored
// blend holds it.
__device__ __forceinline__ void blend_at(const T* __restrict__ h, const T* __restrict__ s,
                                         int i, float a, float* out) {
    float hv[VEC], sv[VEC];
    load(h, i, hv);
    load(s, i, sv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = round_t(blend_value(hv[k], sv[k], a));
}

// The two gradients' VEC values at index i.
__device__ __forceinline__ void store_pair(T* __restrict__ dh, T* __restrict__ ds, long long i,
                                           const float* to_h, const float* to_s) {
    store(dh, i, to_h);
    store(ds, i, to_s);
}

// y = lerp(h, s, w[sample]) over n values, per_sample values a sample
// (w's value as blend_weight reads it), libtorch's formula: the end
// nearer the weight is the anchor. h and s hold `period` values (a multiple
// of per_sample and of VEC), read again for every block of `period` outputs:
// n for a plain blend, the batch's size for its replicated copies.
extern "C" __global__ void esper_blend_lerp_forward(
    const T* __restrict__ h, const T* __restrict__ s, const float* __restrict__ w,
    T* __restrict__ y, long long n, long long per_sample, int flags, long long period) {
    ESPER_PDL_ENTRY();
    const long long stride = (long long)gridDim.x * blockDim.x * VEC;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n;
         i += stride) {
        const float a = blend_weight(w, i / per_sample, flags);
        const long long j = period == n ? i : i % period;
        float hv[VEC], sv[VEC], out[VEC];
        load(h, j, hv);
        load(s, j, sv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = blend_value(hv[k], sv[k], a);
        store(y, i, out);
    }
}

// dh = g (1 - w[sample]), ds = g w[sample] (w's value as blend_weight
// reads it).
extern "C" __global__ void esper_blend_lerp_backward(
    const T* __restrict__ g, const float* __restrict__ w, T* __restrict__ dh,
    T* __restrict__ ds, long long n, long long per_sample, int flags) {
    ESPER_PDL_ENTRY();
    const long long stride = (long long)gridDim.x * blockDim.x * VEC;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n;
         i += stride) {
        const float a = blend_weight(w, i / per_sample, flags);
        float gv[VEC], to_h[VEC], to_s[VEC];
        load(g, i, gv);
        blend_split(gv, a, to_h, to_s);
        store_pair(dh, ds, i, to_h, to_s);
    }
}

// The 2x2 max-pool (stride 2, floor; the pool kernels' layouts, pool_window
// and window) of lerp(h, s, w[n]): each window's four blends are rounded to T,
// as the blend's output would be, before the pool's choice. The full-size
// blend is never written.
extern "C" __global__ void esper_blend_lerp_pool_forward(
    const T* __restrict__ h, const T* __restrict__ s, const float* __restrict__ w,
    T* __restrict__ y, int N, int C, int H, int W, int cl, int flags) {
    ESPER_PDL_ENTRY();
    const int total = pool_windows(N, C, H, W);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const PoolWindow p = pool_window(i, C, H, W, cl);
        const float a = blend_weight(w, p.n, flags);
        float v[4][VEC], best[VEC];
        int k[VEC];
        #pragma unroll
        for (int j = 0; j < 4; ++j) blend_at(h, s, p.at[j], a, v[j]);
        window(v, best, k);
        store(y, p.out, best);
    }
}

// Its backward: each window's argmax recomputed from h, s and w, the pooled
// gradient routed to it (zero elsewhere, and on the row and column a floor
// pool leaves out), then split as the blend's backward splits it:
// dh = g (1 - w[n]), ds = g w[n].
extern "C" __global__ void esper_blend_lerp_pool_backward(
    const T* __restrict__ h, const T* __restrict__ s, const float* __restrict__ w,
    const T* __restrict__ gy, T* __restrict__ dh, T* __restrict__ ds, int N, int C, int H,
    int W, int cl, int flags) {
    ESPER_PDL_ENTRY();
    const int total = pool_windows(N, C, H, W);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const PoolWindow p = pool_window(i, C, H, W, cl);
        const float a = blend_weight(w, p.n, flags);
        float v[4][VEC], best[VEC], g[VEC], zero[VEC], zh[VEC], zs[VEC];
        int k[VEC];
        #pragma unroll
        for (int j = 0; j < 4; ++j) blend_at(h, s, p.at[j], a, v[j]);
        window(v, best, k);
        load(gy, p.out, g);
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float routed[VEC], to_h[VEC], to_s[VEC];
            #pragma unroll
            for (int q = 0; q < VEC; ++q) routed[q] = k[q] == j ? g[q] : 0.0f;
            blend_split(routed, a, to_h, to_s);
            store_pair(dh, ds, p.at[j], to_h, to_s);
        }
        #pragma unroll
        for (int q = 0; q < VEC; ++q) zero[q] = 0.0f;
        blend_split(zero, a, zh, zs);
        #pragma unroll
        for (int e = 0; e < 5; ++e) {
            if (p.left_out[e] >= 0) store_pair(dh, ds, p.left_out[e], zh, zs);
        }
    }
}
"#;
