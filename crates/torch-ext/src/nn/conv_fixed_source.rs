//! The CUDA C source of the direct 3x3 convolution's kernels for 8, 16 or
//! 32 channels each way (appended after [`super::conv_source::CONV_SOURCE`],
//! whose `tf32_round`, `STAGE` and layout they share): one kernel per
//! channel pair, `esper_conv3_direct_c<Ci / 8>_n<Co / 8>`, with the loops
//! unrolled at compile time. Measured on an H100 at the workloads' shapes
//! they take about half the time of the general `esper_conv3_direct`
//! (`baselines/perf/tolaria-fmnist/NOTES.md`, `h100-2026-12-02h`).

pub(in crate::nn) const CONV_FIXED_SOURCE: &str = r#"
// ---- direct 3x3 convolution, channel counts known at compile time ----
// Loads padded pixel `pix` of image n's rows h0 - 1 .. (W + 2 columns,
// zero outside the image): its C8 * 8 channels, four at a time.
template <int C8>
__device__ __forceinline__ void direct_load_pixel(const T* __restrict__ x, int n, int h0, int H,
                                                  int W, int pix, float (*v)[4]) {
    const int XW = W + 2;
    const int r = pix / XW, c = pix - r * XW;
    const int hh = h0 + r - 1, ww = c - 1;
    const bool inside = hh >= 0 && hh < H && ww >= 0 && ww < W;
    const int src = ((n * H + hh) * W + ww) * (C8 * 8);
    #pragma unroll
    for (int q = 0; q < 2 * C8; ++q) {
        v[q][0] = v[q][1] = v[q][2] = v[q][3] = 0.0f;
        if (inside) load4(x, src + q * 4, v[q]);
    }
}

// Stores a pixel loaded by direct_load_pixel in xS, TF32-rounded, with
// esper_conv3_direct's pixel stride (C8 * 8 + 4 words).
template <int C8>
__device__ __forceinline__ void direct_store_pixel(float* xS, int pix, const float (*v)[4]) {
    #pragma unroll
    for (int q = 0; q < 2 * C8; ++q)
        *reinterpret_cast<float4*>(xS + pix * (C8 * 8 + 4) + q * 4) =
            make_float4(tf32_round(v[q][0]), tf32_round(v[q][1]), tf32_round(v[q][2]),
                        tf32_round(v[q][3]));
}

// esper_conv3_direct with Ci = 8 C8 and Co = 8 NT known at compile time
// (the tap and channel loops unrolled, the accumulators sized exactly), a
// warp MT 16-pixel tiles at a time (sharing each B fragment), and the
// thread's first input pixel loaded before the weight so the two round
// trips to memory overlap. Same shared-memory layout, same products summed
// in the same order: the results are esper_conv3_direct's bit for bit.
template <int C8, int NT, int MT>
__device__ __forceinline__ void direct_fixed(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, float* smem,
    int H, int W, int TH, int bands, int flip) {
    constexpr int Ci = C8 * 8, Co = NT * 8, PS = Ci + 4;
    const int n = blockIdx.x / bands, band = blockIdx.x % bands;
    const int h0 = band * TH;
    const int th = min(TH, H - h0);
    const int XW = W + 2;
    const int rows_w = flip ? Ci : Co;
    const int len = flip ? 9 * Co : 9 * Ci;
    const int RS = flip ? ((9 * Co) % 16 == 0 ? 9 * Co + 8 : 9 * Co) : 9 * Ci + 4;
    float* wS = smem;
    float* xS = smem + rows_w * RS;
    const int pix_count = (th + 2) * XW;
    // This thread's first input pixel is loaded before the weight, so the
    // two round trips to memory overlap.
    float xv[2 * C8][4];
    int pix = threadIdx.x;
    if (pix < pix_count) direct_load_pixel<C8>(x, n, h0, H, W, pix, xv);
    stage_direct_weight(w, wS, rows_w, len, RS);
    for (; pix < pix_count; pix += blockDim.x) {
        direct_store_pixel<C8>(xS, pix, xv);
        if (pix + (int)blockDim.x < pix_count)
            direct_load_pixel<C8>(x, n, h0, H, W, pix + blockDim.x, xv);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int pixels = th * W;
    const int tiles = (pixels + 15) / 16;
    const int lane_w = flip ? t * RS + g : g * RS + t;
    const int nt_step = flip ? 8 : 8 * RS, c8_step = flip ? 8 * RS : 8;
    const int hi_step = flip ? 4 * RS : 4;
    const int warps = blockDim.x >> 5;
    const int base = (n * H + h0) * W;
    for (int tile0 = (threadIdx.x >> 5) * MT; tile0 < tiles; tile0 += warps * MT) {
        int off_lo[MT], off_hi[MT];
        #pragma unroll
        for (int m = 0; m < MT; ++m) {
            const int p_lo = (tile0 + m) * 16 + g;
            const int q_lo = min(p_lo, pixels - 1), q_hi = min(p_lo + 8, pixels - 1);
            off_lo[m] = ((q_lo / W) * XW + q_lo % W) * PS + t;
            off_hi[m] = ((q_hi / W) * XW + q_hi % W) * PS + t;
        }
        float acc[MT][NT][4];
        #pragma unroll
        for (int m = 0; m < MT; ++m)
            #pragma unroll
            for (int a = 0; a < NT; ++a)
                acc[m][a][0] = acc[m][a][1] = acc[m][a][2] = acc[m][a][3] = 0.0f;
        #pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
            const int shift = ((tap / 3) * XW + tap % 3) * PS;
            const int tap_w = lane_w + (flip ? (8 - tap) * Co : tap * Ci);
            #pragma unroll
            for (int c8 = 0; c8 < C8; ++c8) {
                const int at = shift + c8 * 8;
                unsigned a[MT][4];
                #pragma unroll
                for (int m = 0; m < MT; ++m) {
                    a[m][0] = __float_as_uint(xS[off_lo[m] + at]);
                    a[m][1] = __float_as_uint(xS[off_hi[m] + at]);
                    a[m][2] = __float_as_uint(xS[off_lo[m] + at + 4]);
                    a[m][3] = __float_as_uint(xS[off_hi[m] + at + 4]);
                }
                const float* bk = wS + tap_w + c8 * c8_step;
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const unsigned b0 = __float_as_uint(bk[nt * nt_step]);
                    const unsigned b1 = __float_as_uint(bk[nt * nt_step + hi_step]);
                    #pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        asm volatile(
                            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                            : "+f"(acc[m][nt][0]), "+f"(acc[m][nt][1]), "+f"(acc[m][nt][2]),
                              "+f"(acc[m][nt][3])
                            : "r"(a[m][0]), "r"(a[m][1]), "r"(a[m][2]), "r"(a[m][3]),
                              "r"(b0), "r"(b1));
                    }
                }
            }
        }
        #pragma unroll
        for (int m = 0; m < MT; ++m) {
            const int p_lo = (tile0 + m) * 16 + g, p_hi = p_lo + 8;
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int co = nt * 8 + 2 * t;
                if (p_lo < pixels) st2(y, (base + p_lo) * Co + co, acc[m][nt][0], acc[m][nt][1]);
                if (p_hi < pixels) st2(y, (base + p_hi) * Co + co, acc[m][nt][2], acc[m][nt][3]);
            }
        }
    }
}

// One kernel per channel pair, each with its own register count: a warp
// takes two pixel tiles at a time below 32 output channels, one at 32
// (where two were slower: more accumulators, fewer blocks an SM).
#define ESPER_DIRECT_KERNEL(C8, NT)                                                      \
    extern "C" __global__ void esper_conv3_direct_c##C8##_n##NT(                         \
        const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int H, int W, \
        int TH, int bands, int flip) {                                                   \
        ESPER_PDL_ENTRY();                                                               \
        extern __shared__ __align__(16) float smem[];                                    \
        direct_fixed<C8, NT, NT == 4 ? 1 : 2>(x, w, y, smem, H, W, TH, bands, flip);     \
    }
#if __CUDA_ARCH__ >= 800
ESPER_DIRECT_KERNEL(1, 1) ESPER_DIRECT_KERNEL(1, 2) ESPER_DIRECT_KERNEL(1, 4)
ESPER_DIRECT_KERNEL(2, 1) ESPER_DIRECT_KERNEL(2, 2) ESPER_DIRECT_KERNEL(2, 4)
ESPER_DIRECT_KERNEL(4, 1) ESPER_DIRECT_KERNEL(4, 2) ESPER_DIRECT_KERNEL(4, 4)
#else
// Below sm_80 the kernels exist but do nothing; the host never picks them
// there (the tensor-core kernels need sm_80).
#define ESPER_DIRECT_STUB(C8, NT)                                                        \
    extern "C" __global__ void esper_conv3_direct_c##C8##_n##NT(                         \
        const T* __restrict__, const T* __restrict__, T* __restrict__, int, int, int, int, int) { \
        ESPER_PDL_ENTRY(); }
ESPER_DIRECT_STUB(1, 1) ESPER_DIRECT_STUB(1, 2) ESPER_DIRECT_STUB(1, 4)
ESPER_DIRECT_STUB(2, 1) ESPER_DIRECT_STUB(2, 2) ESPER_DIRECT_STUB(2, 4)
ESPER_DIRECT_STUB(4, 1) ESPER_DIRECT_STUB(4, 2) ESPER_DIRECT_STUB(4, 4)
#endif
"#;
