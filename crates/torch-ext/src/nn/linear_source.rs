//! The CUDA C source of [`super::linear`]'s weight-and-bias gradient kernel
//! under `bf16`, appended to [`super::source::SOURCE`] (empty in the `f32`
//! build): `dW = gᵀ x` and `db = Σ_rows g` in one pass over the rows, as
//! per-split partial sums for the convolution source's fixed-order
//! reduction.
//!
//! A block owns a 64 x 64 tile of `dW` (output x input features) and one
//! split of the rows; its four warps own 32 x 32 each, as `mma.m16n8k16`
//! products on bf16 tensor cores with `f32` sums. Both operands are read
//! transposed from shared memory by `ldmatrix.trans` (the rows are the
//! product's inner dimension), 32 rows a stage in a ring of four, three
//! stages' `cp.async` copies in flight while one is multiplied. The bias
//! gradient is the same product with a column of ones: the warps on the
//! first input columns run one more `mma` per 16 outputs, so the output
//! gradient is read once for both. cuBLAS ran a split-K product and its own
//! reduction, and the bias took a column-sum kernel and a second reduction.

pub(super) const LINEAR_SOURCE: &str = r#"
#if ESPER_BF16
#define LW_ROWS 32
#define LW_TILE 64
#define LW_STRIDE (LW_TILE + 8)
#define LW_THREADS 128
#define LW_STAGES 4
__device__ __forceinline__ void lw_cp16(void* smem, const void* gmem, bool valid) {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void lw_ldsm_t(unsigned int* r, const unsigned short* p) {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void lw_mma(float* c, const unsigned int* a, unsigned int b0,
                                       unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// partials[split][O * I (+ O where bias)]: block (tile, split) writes its tile's
// dW[o][i] = Σ_r g[r][o] x[r][i] over rows [split * span, (split + 1) *
// span) at o * I + i, and (tiles of the first input columns, where
// `bias`) db[o] = Σ_r g[r][o] at O * I + o. g: [R, O], x: [R, I], both bf16
// dense with O, I multiples of 8 and 16-byte aligned; span a multiple of
// LW_ROWS.
extern "C" __global__ void __launch_bounds__(LW_THREADS) esper_linear_wgrad(
    const unsigned short* __restrict__ g, const unsigned short* __restrict__ x,
    float* __restrict__ partials, long long R, int O, int I, long long span, int bias) {
ESPER_PDL_ENTRY();
#if __CUDA_ARCH__ >= 800
    __shared__ __align__(16) unsigned short gS[LW_STAGES][LW_ROWS * LW_STRIDE];
    __shared__ __align__(16) unsigned short xS[LW_STAGES][LW_ROWS * LW_STRIDE];
    const int tiles_i = (I + LW_TILE - 1) / LW_TILE;
    const int o0 = (blockIdx.x / tiles_i) * LW_TILE, i0 = (blockIdx.x % tiles_i) * LW_TILE;
    const long long r_begin = (long long)blockIdx.y * span;
    const long long r_end = r_begin + span < R ? r_begin + span : R;
    const int steps = r_end > r_begin ? (int)((r_end - r_begin + LW_ROWS - 1) / LW_ROWS) : 0;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    const bool with_bias = bias && i0 == 0 && wn == 0;
    auto load = [&](int buf, long long r0) {
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = tid + j * LW_THREADS;
            const int row = c >> 3, col = (c & 7) * 8;
            const long long r = r0 + row;
            const bool in_rows = r < r_end;
            const bool go = in_rows && o0 + col < O, gx = in_rows && i0 + col < I;
            lw_cp16(&gS[buf][row * LW_STRIDE + col], go ? g + r * O + o0 + col : g, go);
            lw_cp16(&xS[buf][row * LW_STRIDE + col], gx ? x + r * I + i0 + col : x, gx);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    float acc[2][4][4], bacc[2][4];
    #pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            bacc[mt][e] = 0.0f;
            #pragma unroll
            for (int nt = 0; nt < 4; ++nt) acc[mt][nt][e] = 0.0f;
        }
    }
    const unsigned int ones = 0x3f803f80u;  // two bf16 1.0
    // ldmatrix row addresses: lane l gives row l & 7 of matrix l >> 3.
    const int q = lane >> 3, rr = lane & 7;
    #pragma unroll
    for (int p = 0; p < LW_STAGES - 1; ++p) {
        if (p < steps) {
            load(p, r_begin + (long long)p * LW_ROWS);
        } else {
            asm volatile("cp.async.commit_group;\n" ::);
        }
    }
    for (int s = 0; s < steps; ++s) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(LW_STAGES - 2));
        __syncthreads();
        const int next = s + LW_STAGES - 1;
        if (next < steps) {
            load(next % LW_STAGES, r_begin + (long long)next * LW_ROWS);
        } else {
            asm volatile("cp.async.commit_group;\n" ::);
        }
        const unsigned short* gs = gS[s % LW_STAGES];
        const unsigned short* xs = xS[s % LW_STAGES];
        #pragma unroll
        for (int kk = 0; kk < LW_ROWS / 16; ++kk) {
            unsigned int a[2][4], b[2][4];
            // A = gᵀ (outputs x rows): matrices (k 0-7, m 0-7), (k 0-7,
            // m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15).
            #pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int k = kk * 16 + (q >> 1) * 8 + rr;
                const int m = wm * 32 + mt * 16 + (q & 1) * 8;
                lw_ldsm_t(a[mt], gs + k * LW_STRIDE + m);
            }
            // B = x (rows x inputs), two 8-column tiles: matrices (k 0-7,
            // n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
            #pragma unroll
            for (int np = 0; np < 2; ++np) {
                const int k = kk * 16 + (q & 1) * 8 + rr;
                const int n = wn * 32 + np * 16 + (q >> 1) * 8;
                lw_ldsm_t(b[np], xs + k * LW_STRIDE + n);
            }
            #pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                #pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    lw_mma(acc[mt][nt], a[mt], b[nt >> 1][(nt & 1) * 2],
                           b[nt >> 1][(nt & 1) * 2 + 1]);
                }
                if (with_bias) lw_mma(bacc[mt], a[mt], ones, ones);
            }
        }
    }
    const int gq = lane >> 2, t = lane & 3;
    float* out = partials + (long long)blockIdx.y * ((long long)O * I + (bias ? O : 0));
    #pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int o = o0 + wm * 32 + mt * 16 + gq + 8 * h;
            if (o < O) {
                #pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int i = i0 + wn * 32 + nt * 8 + 2 * t;
                    if (i < I) {
                        *reinterpret_cast<float2*>(out + (long long)o * I + i) =
                            make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
                    }
                }
                if (with_bias && t == 0) out[(long long)O * I + o] = bacc[mt][2 * h];
            }
        }
    }
#endif
}
#endif
"#;
