//! The CUDA C source of [`super::blend_lerp`]'s two kernels, appended to
//! [`super::source::SOURCE`] (it uses that source's `T`, `VEC`, `load` and
//! `store`): the alpha blend `lerp(h, s, w)` with one weight per sample,
//! read from the device, forward and backward, `VEC` values a thread; the
//! forward also blends a batch's replicated copies without making them.
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
        for (int k = 0; k < VEC; ++k) {
            const float d = sv[k] - hv[k];
            out[k] = fabsf(a) < 0.5f ? hv[k] + a * d : sv[k] - d * (1.0f - a);
        }
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
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            to_h[k] = gv[k] * (1.0f - a);
            to_s[k] = gv[k] * a;
        }
        store(dh, i, to_h);
        store(ds, i, to_s);
    }
}
"#;
