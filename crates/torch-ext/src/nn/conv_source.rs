//! The CUDA C source of the 3x3 convolution's kernels (appended to
//! [`super::source::SOURCE`], whose `T`, `VEC` and loads it uses): the
//! weight gradient's passes (on tensor cores or in f32, then the
//! reduction), the forward for at most four input channels, and the direct
//! forward / input gradient for few channels.

pub(in crate::nn) const CONV_SOURCE: &str = r#"
// ---- 3x3 convolution (stride 1, padding 1, no bias) weight gradient ----
// dW[co][kh][kw][ci] = sum over positions of dy[n,h,w,co] * x[n,h+kh-1,w+kw-1,ci],
// NHWC. Pass 1: one block per (image, band of TH rows) stages its dy band
// and the x rows around it (zero padded) in shared memory as floats; a
// thread owns 4 output channels x VEC input channels x the 3 taps of one
// kernel row (48 multiply-adds for five shared loads a position); with
// fewer tasks than threads, `pg` position groups split the band's positions
// and are summed in a fixed order. Each block writes its partial dW.
#define STAGE 8

extern "C" __global__ void esper_conv3_wgrad_partial(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partials,
    int H, int W, int Ci, int Co, int TH, int bands) {
    ESPER_PDL_ENTRY();
    extern __shared__ __align__(16) float smem[];
    const int n = blockIdx.x / bands, band = blockIdx.x % bands;
    const int h0 = band * TH;
    const int th = min(TH, H - h0);
    const int XW = W + 2;
    float* dyS = smem;                       // [th][W][Co]
    float* xS = smem + TH * W * Co;          // [th + 2][W + 2][Ci]
    // Staging: STAGE loads in flight a thread, then their stores.
    const long long dbase = ((long long)n * H + h0) * W * Co;
    // dy's band is contiguous and Co % 4 == 0: four values a load.
    const int dquads = th * W * Co / 4;
    for (int i0 = threadIdx.x; i0 < dquads; i0 += blockDim.x * STAGE) {
        float v[STAGE][4];
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < dquads) load4(dy, dbase + 4 * (long long)i, v[u]);
        }
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < dquads) {
                *reinterpret_cast<float4*>(dyS + 4 * i) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
            }
        }
    }
    // x rows h0 - 1 .. h0 + th, zero padded: inside a padded row of
    // XW * Ci values the interior is contiguous in memory.
    const int rowlen = XW * Ci;
    const int xcount = (th + 2) * rowlen;
    for (int i0 = threadIdx.x; i0 < xcount; i0 += blockDim.x * STAGE) {
        float v[STAGE];
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            const int r = i / rowlen;
            const int j = i - r * rowlen;
            const int hh = h0 + r - 1;
            v[u] = (i < xcount && hh >= 0 && hh < H && j >= Ci && j < rowlen - Ci)
                ? ld1(x, ((long long)n * H + hh) * W * Ci + (j - Ci)) : 0.0f;
        }
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < xcount) xS[i] = v[u];
        }
    }
    __syncthreads();
    const int cig = Ci / VEC;
    const int tasks = (Co / 4) * 3 * cig;
    const int pgs = tasks >= (int)blockDim.x ? 1 : (int)blockDim.x / tasks;
    const int positions = th * W;
    const int out_size = Co * 9 * Ci;
    float* out = partials + (long long)blockIdx.x * out_size;
    float* red = smem;  // reused after the tiles, [pgs][tasks][3 * 4 * VEC]
    for (int base = 0; base < tasks; base += (int)blockDim.x) {
        const int local = (int)threadIdx.x;
        const int task = pgs > 1 ? local % tasks : base + local;
        const int pg = pgs > 1 ? local / tasks : 0;
        const bool active = pgs > 1 ? local < tasks * pgs : task < tasks;
        // acc[kw][co][ci] for output channels co4 * 4 + co, input channels
        // c4 * VEC + ci, kernel row kh.
        float acc[3][4][VEC];
        #pragma unroll
        for (int k = 0; k < 3; ++k)
            #pragma unroll
            for (int a = 0; a < 4; ++a)
                #pragma unroll
                for (int b = 0; b < VEC; ++b) acc[k][a][b] = 0.0f;
        int co4 = 0, kh = 0, c4 = 0;
        if (active) {
            c4 = task % cig;
            kh = (task / cig) % 3;
            co4 = task / (cig * 3);
            int h = pg / W, w = pg - (pg / W) * W;
            const int wstep = pgs % W, hstep = pgs / W;
            for (int q = pg; q < positions; q += pgs) {
                const float4 d = *reinterpret_cast<const float4*>(dyS + q * Co + co4 * 4);
                const float* xp = xS + ((h + kh) * XW + w) * Ci + c4 * VEC;
                #pragma unroll
                for (int k = 0; k < 3; ++k) {
                    float xv[VEC];
#if VEC == 4
                    const float4 xq = *reinterpret_cast<const float4*>(xp + k * Ci);
                    xv[0] = xq.x; xv[1] = xq.y; xv[2] = xq.z; xv[3] = xq.w;
#else
                    xv[0] = xp[k * Ci];
#endif
                    #pragma unroll
                    for (int b = 0; b < VEC; ++b) {
                        acc[k][0][b] += d.x * xv[b];
                        acc[k][1][b] += d.y * xv[b];
                        acc[k][2][b] += d.z * xv[b];
                        acc[k][3][b] += d.w * xv[b];
                    }
                }
                w += wstep; h += hstep;
                if (w >= W) { w -= W; h += 1; }
            }
        }
        constexpr int PER = 3 * 4 * VEC;
        // Output index of this task's accumulator e = (k * 4 + a) * VEC + b.
        auto out_index = [&](int e) {
            const int b = e % VEC, a = (e / VEC) % 4, k = e / (4 * VEC);
            return ((co4 * 4 + a) * 9 + kh * 3 + k) * Ci + c4 * VEC + b;
        };
        if (pgs == 1) {
            if (active) {
                #pragma unroll
                for (int k = 0; k < 3; ++k)
                    #pragma unroll
                    for (int a = 0; a < 4; ++a)
                        #pragma unroll
                        for (int b = 0; b < VEC; ++b)
                            out[out_index((k * 4 + a) * VEC + b)] = acc[k][a][b];
            }
        } else {
            // The position groups' sums: red[(g * PER + e) * tasks + task]
            // (consecutive lanes, consecutive words); then thread (task, pg)
            // adds up its task's accumulators e = pg, pg + pgs, ... over
            // the groups in order.
            __syncthreads();  // the tiles are no longer read
            if (active) {
                #pragma unroll
                for (int k = 0; k < 3; ++k)
                    #pragma unroll
                    for (int a = 0; a < 4; ++a)
                        #pragma unroll
                        for (int b = 0; b < VEC; ++b)
                            red[(pg * PER + (k * 4 + a) * VEC + b) * tasks + task] = acc[k][a][b];
            }
            __syncthreads();
            if (active) {
                for (int e = pg; e < PER; e += pgs) {
                    float total = 0.0f;
                    for (int g = 0; g < pgs; ++g) total += red[(g * PER + e) * tasks + task];
                    out[out_index(e)] = total;
                }
            }
        }
    }
}

// Pass 2: dW = the blocks' partials summed in block order; a block of 256
// threads covers 32 outputs with 8 slices of the blocks, then adds the
// slices in order.
extern "C" __global__ void esper_conv3_wgrad_reduce(const float* __restrict__ partials,
                                                    float* __restrict__ dw, int blocks,
                                                    int out_size) {
    ESPER_PDL_ENTRY();
    __shared__ float sh[8][32];
    const int lane = threadIdx.x % 32, slice = threadIdx.x / 32;
    const int o = blockIdx.x * 32 + lane;
    float s = 0.0f;
    if (o < out_size) {
        #pragma unroll 8
        for (int b = slice; b < blocks; b += 8) s += partials[(long long)b * out_size + o];
    }
    sh[slice][lane] = s;
    __syncthreads();
    if (slice == 0 && o < out_size) {
        float total = sh[0][lane];
        #pragma unroll
        for (int k = 1; k < 8; ++k) total += sh[k][lane];
        dw[o] = total;
    }
}

// Forward for at most four input channels (the host's first layer): one
// thread per output pixel, its 3x3 neighbourhood read once, every output
// channel from the weights ([Co][3][3][Ci], as floats) in shared memory,
// fp32 accumulation. 32-bit indices (the host checks the sizes).
extern "C" __global__ void esper_conv3_forward_small(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int N, int H, int W, int Ci, int Co) {
    ESPER_PDL_ENTRY();
    extern __shared__ __align__(16) float ws[];
    for (int i = threadIdx.x; i < Co * 9 * Ci; i += blockDim.x) ws[i] = ld1(w, i);
    __syncthreads();
    const int total = N * H * W;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < total; p += gridDim.x * blockDim.x) {
        const int wo = p % W;
        const int r = p / W;
        const int h = r % H;
        const int n = r / H;
        // The 3x3 x Ci neighbourhood once (zero outside the image).
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
        for (int g = 0; g < Co / 4; ++g) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            #pragma unroll
            for (int k = 0; k < 9; ++k) {
                #pragma unroll
                for (int ci = 0; ci < 4; ++ci) {
                    if (ci < Ci) {
                        #pragma unroll
                        for (int a = 0; a < 4; ++a) acc[a] += xv[k][ci] * ws[((g * 4 + a) * 9 + k) * Ci + ci];
                    }
                }
            }
            store4(y, (long long)p * Co + g * 4, acc);
        }
    }
}

// Direct 3x3 convolution for few channels on TF32 tensor cores (sm_80+):
// Ci % 8 == 0, Co % 8 == 0, both at most 64; NHWC; products of TF32-rounded
// values (what cuDNN's TF32 convolutions compute; bf16 values are exact in
// TF32) summed in fp32. With `flip` it is the input gradient:
// dx = conv(dy, w') with w'[ci][co][k] = w[co][ci][8 - k], so the same
// kernel runs with (Ci, Co) = (the layer's Co, Ci). `w` is always the
// layer's weight as [Co_layer][3][3][Ci_layer].
//
// An implicit GEMM: out[pixel][co] = sum over k = tap * Ci + ci of
// A[pixel][k] * B[k][co], with A read straight from the staged input. One
// block per (image, band of TH rows) stages the band's zero-padded input
// rows (pixel stride Ci + 4 floats, so the eight pixels x four channels a
// warp reads for one fragment fall in 32 different banks) and the weight
// in its own layout with padded rows; a warp owns 16 pixels x every output
// channel and runs mma.m16n8k8 over k. 32-bit indices (the host checks the
// sizes).
#define DIRECT_MAX_TILES 8
__device__ __forceinline__ float tf32_round(float v) {
#if __CUDA_ARCH__ >= 800
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
#else
    return v;
#endif
}

// Stages image n's rows h0 - 1 .. h0 + th (zero padded, W + 2 columns) in
// xS with a pixel stride of PS words, TF32-rounded: a thread a pixel, all
// its channels (Ci / 4 loads in flight).
__device__ __forceinline__ void stage_padded_rows(const T* __restrict__ x, float* xS, int n,
                                                  int h0, int th, int H, int W, int Ci,
                                                  int PS) {
    const int XW = W + 2, cq = Ci / 4;
    const int pix_count = (th + 2) * XW;
    for (int pix = threadIdx.x; pix < pix_count; pix += blockDim.x) {
        const int r = pix / XW, c = pix - r * XW;
        const int hh = h0 + r - 1, ww = c - 1;
        const bool inside = hh >= 0 && hh < H && ww >= 0 && ww < W;
        const int src = ((n * H + hh) * W + ww) * Ci;
        #pragma unroll 4
        for (int q = 0; q < cq; ++q) {
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (inside) load4(x, src + q * 4, v);
            *reinterpret_cast<float4*>(xS + pix * PS + q * 4) =
                make_float4(tf32_round(v[0]), tf32_round(v[1]), tf32_round(v[2]),
                            tf32_round(v[3]));
        }
    }
}

// Stages the direct kernel's weight (rows_w rows of len values, as in
// memory) in wS with a row stride of RS words, TF32-rounded: four values a
// load, STAGE loads in flight a thread, then their stores.
__device__ __forceinline__ void stage_direct_weight(const T* __restrict__ w, float* wS,
                                                    int rows_w, int len, int RS) {
    const int lq = len / 4;
    const int wquads = rows_w * lq;
    for (int i0 = threadIdx.x; i0 < wquads; i0 += blockDim.x * STAGE) {
        float v[STAGE][4];
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < wquads) load4(w, 4 * i, v[u]);
        }
        #pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < wquads) {
                const int r = i / lq, j = i - r * lq;
                *reinterpret_cast<float4*>(wS + r * RS + 4 * j) =
                    make_float4(tf32_round(v[u][0]), tf32_round(v[u][1]),
                                tf32_round(v[u][2]), tf32_round(v[u][3]));
            }
        }
    }
}

extern "C" __global__ void esper_conv3_direct(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int H, int W, int Ci, int Co, int TH, int bands, int flip) {
ESPER_PDL_ENTRY();
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float smem[];
    const int n = blockIdx.x / bands, band = blockIdx.x % bands;
    const int h0 = band * TH;
    const int th = min(TH, H - h0);
    const int XW = W + 2;
    const int PS = Ci + 4;
    const int NT = Co / 8;
    // The weight as it is in memory, rows padded to RS words so a B
    // fragment's 32 reads fall in 32 banks: forward, row co holds [9][Ci]
    // (RS = 9 Ci + 4); flipped, row ci holds [9][Co] (RS = 9 Co or
    // 9 Co + 8). Four values a load, STAGE loads in flight a thread.
    const int rows_w = flip ? Ci : Co;
    const int len = flip ? 9 * Co : 9 * Ci;
    const int RS = flip ? ((9 * Co) % 16 == 0 ? 9 * Co + 8 : 9 * Co) : 9 * Ci + 4;
    float* wS = smem;                        // [rows_w][RS]
    float* xS = smem + rows_w * RS;          // [th + 2][W + 2][PS]
    stage_direct_weight(w, wS, rows_w, len, RS);
    stage_padded_rows(x, xS, n, h0, th, H, W, Ci, PS);
    __syncthreads();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int pixels = th * W;
    const int tiles = (pixels + 15) / 16;
    for (int tile = threadIdx.x >> 5; tile < tiles; tile += blockDim.x >> 5) {
        // This lane's two pixels (rows g and g + 8 of the tile), clamped
        // into the band for the loads.
        const int p_lo = tile * 16 + g, p_hi = p_lo + 8;
        const int q_lo = min(p_lo, pixels - 1), q_hi = min(p_hi, pixels - 1);
        const int off_lo = ((q_lo / W) * XW + q_lo % W) * PS + t;
        const int off_hi = ((q_hi / W) * XW + q_hi % W) * PS + t;
        float acc[DIRECT_MAX_TILES][4];
        #pragma unroll
        for (int a = 0; a < DIRECT_MAX_TILES; ++a)
            acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.0f;
        // B[k = tap * Ci + c8 * 8 + t (+ 4)][co = nt * 8 + g] in wS:
        // forward at co * RS + tap * Ci + ci, flipped at
        // ci * RS + (8 - tap) * Co + co.
        const int C8 = Ci / 8;
        const int lane_w = flip ? t * RS + g : g * RS + t;
        const int nt_step = flip ? 8 : 8 * RS, c8_step = flip ? 8 * RS : 8;
        const int hi_step = flip ? 4 * RS : 4;
        #pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
            const int shift = ((tap / 3) * XW + tap % 3) * PS;
            const int tap_w = lane_w + (flip ? (8 - tap) * Co : tap * Ci);
            for (int c8 = 0; c8 < C8; ++c8) {
                const int at = shift + c8 * 8;
                const unsigned a0 = __float_as_uint(xS[off_lo + at]);
                const unsigned a1 = __float_as_uint(xS[off_hi + at]);
                const unsigned a2 = __float_as_uint(xS[off_lo + at + 4]);
                const unsigned a3 = __float_as_uint(xS[off_hi + at + 4]);
                const float* bk = wS + tap_w + c8 * c8_step;
                #pragma unroll
                for (int nt = 0; nt < DIRECT_MAX_TILES; ++nt) {
                    if (nt < NT) {
                        const unsigned b0 = __float_as_uint(bk[nt * nt_step]);
                        const unsigned b1 = __float_as_uint(bk[nt * nt_step + hi_step]);
                        asm volatile(
                            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                            : "+f"(acc[nt][0]), "+f"(acc[nt][1]), "+f"(acc[nt][2]),
                              "+f"(acc[nt][3])
                            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                    }
                }
            }
        }
        // acc[nt]: (pixel row g, channels 2t, 2t + 1) and (row g + 8, same).
        const int base = (n * H + h0) * W;
        #pragma unroll
        for (int nt = 0; nt < DIRECT_MAX_TILES; ++nt) {
            if (nt < NT) {
                const int co = nt * 8 + 2 * t;
                if (p_lo < pixels) st2(y, (base + p_lo) * Co + co, acc[nt][0], acc[nt][1]);
                if (p_hi < pixels) st2(y, (base + p_hi) * Co + co, acc[nt][2], acc[nt][3]);
            }
        }
    }
#endif
}

// The weight gradient on TF32 tensor cores (sm_80+; Ci % 8 == 0, Co % 8 ==
// 0): an implicit GEMM dW[co][(tap, ci)] = sum over pixels p of
// dy[p][co] * x[p + tap][ci], M = Co, N = 9 * Ci, K = the pixels.
// One block per (group of IPB images, band of TH rows) stages, image after
// image, dy (pixel stride Co or Co + 8) and x (pixel stride Ci or Ci + 8,
// each chosen so a fragment's 32 reads fall in 32 banks), zero-padded to a
// multiple of 8 pixels, and each pixel's tile offset. A warp owns one unit
// (16 output channels mt, 8 input channels c8) and all nine taps of it:
// per 8 pixels it reads the dy fragment once and feeds nine mma.m16n8k8
// chains, one a tap, which run on across the group's images. With fewer
// units than warps the warps form KS slices of the pixels (slice s takes
// the 8-pixel steps s, s + KS, ...); at the end the slices are added in
// order through shared memory (over the staging: the host sizes it for
// (KS - 1) x Co x 9 x Ci floats) and the block writes its partial dW
// ([Co][9][Ci]) for esper_conv3_wgrad_reduce. With more units than warps
// the warps take them in passes; the host then keeps IPB and KS at 1, so a
// pass that restages nothing finds the image of the pass before.
extern "C" __global__ void esper_conv3_wgrad_mma(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partials,
    int N, int H, int W, int Ci, int Co, int TH, int bands, int IPB, int KS) {
ESPER_PDL_ENTRY();
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float smem[];
    const int group = blockIdx.x / bands, band = blockIdx.x % bands;
    const int n0 = group * IPB, images = min(IPB, N - n0);
    const int h0 = band * TH;
    const int th = min(TH, H - h0);
    const int XW = W + 2;
    const int pixels = th * W;
    const int ppad = (pixels + 7) / 8 * 8;
    const int CoS = Co % 16 == 0 ? Co + 8 : Co;
    const int PS = Ci % 16 == 0 ? Ci + 8 : Ci;
    float* dyS = smem;                                   // [ppad][CoS]
    float* xS = dyS + ppad * CoS;                        // [th + 2][XW][PS]
    int* slot = reinterpret_cast<int*>(xS + (th + 2) * XW * PS);  // [ppad]
    const int oq = Co / 4;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int wps = warps / KS, slice = warp / wps, wl = warp - slice * wps;
    const int C8 = Ci / 8, MT = (Co + 15) / 16;
    const int units = MT * C8;
    const int out_size = Co * 9 * Ci;
    const int passes = (units + wps - 1) / wps;
    int tap_off[9];
    #pragma unroll
    for (int tap = 0; tap < 9; ++tap) tap_off[tap] = ((tap / 3) * XW + tap % 3) * PS;
    float* out = partials + (long long)blockIdx.x * out_size;
    for (int pass = 0; pass < passes; ++pass) {
        // Unit (mt, c8) = (unit % MT, unit / MT).
        const int unit = pass * wps + wl;
        const bool live = slice < KS && unit < units;
        const int mt = unit % MT, c8 = unit / MT;
        const int m_lo = mt * 16 + g;
        const bool hi = m_lo + 8 < Co;
        const int col = c8 * 8 + g;
        float acc[9][4];
        #pragma unroll
        for (int tap = 0; tap < 9; ++tap) acc[tap][0] = acc[tap][1] = acc[tap][2] = acc[tap][3] = 0.0f;
        for (int i = 0; i < images; ++i) {
            if (pass == 0 || images > 1) {
                const int n = n0 + i;
                const long long dbase = ((long long)n * H + h0) * W * Co;
                __syncthreads();
                for (int p = threadIdx.x; p < ppad; p += blockDim.x) {
                    slot[p] = p < pixels ? (p / W) * XW + p % W : 0;
                    #pragma unroll 4
                    for (int q = 0; q < oq; ++q) {
                        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        if (p < pixels) load4(dy, dbase + (long long)p * Co + q * 4, v);
                        *reinterpret_cast<float4*>(dyS + p * CoS + q * 4) =
                            make_float4(tf32_round(v[0]), tf32_round(v[1]), tf32_round(v[2]),
                                        tf32_round(v[3]));
                    }
                }
                stage_padded_rows(x, xS, n, h0, th, H, W, Ci, PS);
                __syncthreads();
            }
            if (live) {
                for (int k0 = slice * 8; k0 < ppad; k0 += 8 * KS) {
                    const int p0 = k0 + t, p1 = p0 + 4;
                    const float* d0 = dyS + p0 * CoS + m_lo;
                    const float* d1 = dyS + p1 * CoS + m_lo;
                    const unsigned a0 = __float_as_uint(d0[0]);
                    const unsigned a1 = hi ? __float_as_uint(d0[8]) : 0u;
                    const unsigned a2 = __float_as_uint(d1[0]);
                    const unsigned a3 = hi ? __float_as_uint(d1[8]) : 0u;
                    const float* x0 = xS + slot[p0] * PS + col;
                    const float* x1 = xS + slot[p1] * PS + col;
                    #pragma unroll
                    for (int tap = 0; tap < 9; ++tap) {
                        const unsigned b0 = __float_as_uint(x0[tap_off[tap]]);
                        const unsigned b1 = __float_as_uint(x1[tap_off[tap]]);
                        asm volatile(
                            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                            : "+f"(acc[tap][0]), "+f"(acc[tap][1]), "+f"(acc[tap][2]),
                              "+f"(acc[tap][3])
                            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                    }
                }
            }
        }
        // acc[tap]: (co m_lo, columns 2t, 2t + 1) and (co m_lo + 8, same),
        // a column being (tap, ci = c8 * 8 + 2t + {0, 1}).
        const int o0 = (m_lo * 9) * Ci + c8 * 8 + 2 * t;
        if (KS > 1) {
            __syncthreads();
            if (live && slice > 0) {
                float* red = smem + (slice - 1) * out_size;
                #pragma unroll
                for (int tap = 0; tap < 9; ++tap) {
                    const int o = o0 + tap * Ci;
                    *reinterpret_cast<float2*>(red + o) = make_float2(acc[tap][0], acc[tap][1]);
                    if (hi) {
                        *reinterpret_cast<float2*>(red + o + 8 * 9 * Ci) =
                            make_float2(acc[tap][2], acc[tap][3]);
                    }
                }
            }
            __syncthreads();
        }
        if (live && slice == 0) {
            #pragma unroll
            for (int tap = 0; tap < 9; ++tap) {
                const int o = o0 + tap * Ci;
                for (int s = 1; s < KS; ++s) {
                    const float* red = smem + (s - 1) * out_size;
                    acc[tap][0] += red[o];
                    acc[tap][1] += red[o + 1];
                    if (hi) {
                        acc[tap][2] += red[o + 8 * 9 * Ci];
                        acc[tap][3] += red[o + 8 * 9 * Ci + 1];
                    }
                }
                *reinterpret_cast<float2*>(out + o) = make_float2(acc[tap][0], acc[tap][1]);
                if (hi) {
                    *reinterpret_cast<float2*>(out + o + 8 * 9 * Ci) =
                        make_float2(acc[tap][2], acc[tap][3]);
                }
            }
        }
    }
#endif
}
"#;
