//! The CUDA C source of [`super::causal_attention`]'s kernels, compiled
//! on its own (it shares nothing with [`super::source::SOURCE`]): causal
//! self-attention over a packed `[B, T, 3C]` projection in `bf16`, one
//! block of four warps per (sequence, head), for sequences of at most 64
//! positions and heads of 16 or 32 values.
//!
//! The whole head fits in shared memory (queries, keys, values, and in the
//! backward the output gradient and the transposed probabilities), so no
//! pass over the keys is split and nothing is summed across blocks. A block
//! stages all it reads with `cp.async` copies that are in flight together
//! (one memory round trip, not one per tensor). A warp owns 16 query rows:
//! its scores are `mma.m16n8k16` products on bf16 tensor cores with `f32`
//! sums, the causal mask and the softmax stay in registers, and the
//! probabilities go back into the next product as its `A` operand without a
//! round trip through memory. The backward recomputes the probabilities
//! from the forward's base-2 log-sum-exp, writes the query gradient from
//! the rows it owns, then (after one barrier) a warp owns 16 key rows and
//! writes their key and value gradients. The three gradients land in one
//! `[B, T, 3C]` tensor, the projection's layout.

pub(super) const ATTENTION_SOURCE: &str = r#"
typedef unsigned short bf16_t;
#define ATT_KEYS 64
#define ATT_THREADS 128
#define PT_STRIDE (ATT_KEYS + 8)
#define ATT_NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ float bf2f(unsigned int bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ unsigned int f2bf(float v) {
    unsigned int u = __float_as_uint(v);
    return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Two values as one bf16 pair, the first in the low half (the fragments'
// order of consecutive columns).
__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    return f2bf(lo) | (f2bf(hi) << 16);
}
__device__ __forceinline__ unsigned int pair(const bf16_t* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}
__device__ __forceinline__ unsigned int gather2(const bf16_t* lo, const bf16_t* hi) {
    return (unsigned int)(*lo) | ((unsigned int)(*hi) << 16);
}
__device__ __forceinline__ void mma16816(float* c, unsigned int a0, unsigned int a1,
                                         unsigned int a2, unsigned int a3, unsigned int b0,
                                         unsigned int b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
// The A fragment (16 x 16, row-major) at (row0, col0) of M (row stride S).
struct AFrag { unsigned int a0, a1, a2, a3; };
__device__ __forceinline__ AFrag load_a(const bf16_t* M, int S, int row0, int col0, int g, int t) {
    const bf16_t* p = M + (row0 + g) * S + col0 + 2 * t;
    AFrag f;
    f.a0 = pair(p);
    f.a1 = pair(p + 8 * S);
    f.a2 = pair(p + 8);
    f.a3 = pair(p + 8 * S + 8);
    return f;
}
// The A fragment of key block kk from a warp's 16 x 64 accumulators (the
// C fragments of eight 8-column tiles): consecutive tiles 2kk, 2kk + 1.
__device__ __forceinline__ AFrag acc_to_a(const float (*c)[4], int kk) {
    AFrag f;
    f.a0 = pack2(c[2 * kk][0], c[2 * kk][1]);
    f.a1 = pack2(c[2 * kk][2], c[2 * kk][3]);
    f.a2 = pack2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    f.a3 = pack2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    return f;
}
// B (16 x 8) with B[k][n] = M[n0 + n][k0 + k]: rows of M are columns of B.
__device__ __forceinline__ void mma_bt(float* c, const AFrag& a, const bf16_t* M, int S, int n0,
                                       int k0, int g, int t) {
    const bf16_t* p = M + (n0 + g) * S + k0 + 2 * t;
    mma16816(c, a.a0, a.a1, a.a2, a.a3, pair(p), pair(p + 8));
}
// B (16 x 8) with B[k][n] = M[k0 + k][n0 + n]: M is B row-major.
__device__ __forceinline__ void mma_b(float* c, const AFrag& a, const bf16_t* M, int S, int k0,
                                      int n0, int g, int t) {
    const bf16_t* p = M + (k0 + 2 * t) * S + n0 + g;
    mma16816(c, a.a0, a.a1, a.a2, a.a3, gather2(p, p + S), gather2(p + 8 * S, p + 9 * S));
}

// Rows [0, 64) of one head's D columns (from `base`, row stride `ld`) into
// dst[64][D + 8], zeros at and past row T: 16-byte `cp.async` copies, all
// in flight together until the caller's `stage_wait`.
__device__ __forceinline__ void cp16(bf16_t* dst, const bf16_t* src, bool valid) {
#if __CUDA_ARCH__ >= 800
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
}
template <int D>
__device__ __forceinline__ void stage(const bf16_t* __restrict__ src, long long base, long long ld,
                                      int T, bf16_t* dst) {
    const int chunks = D / 8;
    #pragma unroll
    for (int j = 0; j < ATT_KEYS * chunks / ATT_THREADS; ++j) {
        const int i = threadIdx.x + j * ATT_THREADS;
        const int r = i / chunks, c = (i % chunks) * 8;
        const bool valid = r < T;
        cp16(dst + r * (D + 8) + c, valid ? src + base + (long long)r * ld + c : src, valid);
    }
}
// Waits for every `stage` copy of this thread, then for the block's.
__device__ __forceinline__ void stage_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
#endif
    __syncthreads();
}

// s = A[row0, row0 + 16) . B^T over 64 rows of B (both [64][D + 8]): the
// tiles of keys past the warp's last row are left at zero (masked later).
template <int D>
__device__ __forceinline__ void rows_by_keys(const bf16_t* A, const bf16_t* B, int row0, int g,
                                             int t, float (*s)[4]) {
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const AFrag a = load_a(A, D + 8, row0, kk * 16, g, t);
        #pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            if (nt * 8 <= row0 + 15) mma_bt(s[nt], a, B, D + 8, nt * 8, kk * 16, g, t);
        }
    }
}

// out[b, i, h*D + d] = softmax_j<=i(scale q_i . k_j) v_j; lse2[bh, i] = the
// base-2 log-sum-exp of row i's scaled scores (for the backward).
template <int D>
__device__ __forceinline__ void attention_forward(const bf16_t* __restrict__ qkv,
                                                  bf16_t* __restrict__ out,
                                                  float* __restrict__ lse2, int T, int H,
                                                  float scale_log2) {
    __shared__ __align__(16) bf16_t Qs[ATT_KEYS * (D + 8)];
    __shared__ __align__(16) bf16_t Ks[ATT_KEYS * (D + 8)];
    __shared__ __align__(16) bf16_t Vs[ATT_KEYS * (D + 8)];
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int C = H * D;
    const long long ld = 3LL * C;
    const long long base = (long long)b * T * ld + h * D;
    stage<D>(qkv, base, ld, T, Qs);
    stage<D>(qkv, base + C, ld, T, Ks);
    stage<D>(qkv, base + 2 * C, ld, T, Vs);
    stage_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = warp * 16;
    if (row0 >= T) return;
    float s[8][4];
    rows_by_keys<D>(Qs, Ks, row0, g, t, s);
    const int rows[2] = {row0 + g, row0 + g + 8};
    float m[2] = {ATT_NEG_INF, ATT_NEG_INF};
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = nt * 8 + 2 * t + (e & 1);
            if (col > rows[e >> 1]) s[nt][e] = ATT_NEG_INF;
            m[e >> 1] = fmaxf(m[e >> 1], s[nt][e]);
        }
    }
    float l[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], 1));
        m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], 2));
    }
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = exp2f((s[nt][e] - m[e >> 1]) * scale_log2);
            s[nt][e] = p;
            l[e >> 1] += p;
        }
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    // The unnormalised probabilities (at most 1) enter the product; the
    // rows are divided by their sums in f32 at the end.
    const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
    float o[D / 8][4];
    #pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        if (kk <= warp) {
            const AFrag a = acc_to_a(s, kk);
            #pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) mma_b(o[nd], a, Vs, D + 8, kk * 16, nd * 8, g, t);
        }
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (rows[i] < T) {
            bf16_t* row = out + ((long long)b * T + rows[i]) * C + h * D + 2 * t;
            #pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) {
                *reinterpret_cast<unsigned int*>(row + nd * 8) =
                    pack2(o[nd][2 * i] * inv[i], o[nd][2 * i + 1] * inv[i]);
            }
            if (t == 0) lse2[(long long)bh * T + rows[i]] = m[i] * scale_log2 + log2f(l[i]);
        }
    }
}

// dqkv (the projection's layout) from the output gradient dout, the forward's
// output and base-2 log-sum-exp.
template <int D>
__device__ __forceinline__ void attention_backward(
    const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ out,
    const bf16_t* __restrict__ dout, const float* __restrict__ lse2, bf16_t* __restrict__ dqkv,
    int T, int H, float scale, float scale_log2) {
    __shared__ __align__(16) bf16_t Qs[ATT_KEYS * (D + 8)];
    __shared__ __align__(16) bf16_t Ks[ATT_KEYS * (D + 8)];
    __shared__ __align__(16) bf16_t Vs[ATT_KEYS * (D + 8)];
    __shared__ __align__(16) bf16_t dOs[ATT_KEYS * (D + 8)];
    // Transposed probabilities and score gradients: [key][query]. The
    // forward's output is staged in Pt's place: it is read (for Di) before
    // the first probability is written.
    __shared__ __align__(16) bf16_t Pt[ATT_KEYS * PT_STRIDE];
    __shared__ __align__(16) bf16_t dSt[ATT_KEYS * PT_STRIDE];
    __shared__ float Di[ATT_KEYS];
    bf16_t* Os = Pt;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int C = H * D;
    const long long ld = 3LL * C;
    const long long base = (long long)b * T * ld + h * D;
    const long long obase = (long long)b * T * C + h * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = warp * 16;
    const int rows[2] = {row0 + g, row0 + g + 8};
    const bool valid[2] = {rows[0] < T, rows[1] < T};
    // Issued before the copies, so that all loads are in flight together.
    const float L[2] = {valid[0] ? lse2[(long long)bh * T + rows[0]] : 0.0f,
                        valid[1] ? lse2[(long long)bh * T + rows[1]] : 0.0f};
    stage<D>(qkv, base, ld, T, Qs);
    stage<D>(qkv, base + C, ld, T, Ks);
    stage<D>(qkv, base + 2 * C, ld, T, Vs);
    stage<D>(dout, obase, C, T, dOs);
    stage<D>(out, obase, C, T, Os);
    stage_wait();
    {
        // Di[i] = dout_i . out_i, two threads a row (zero past row T: the
        // staged rows are zeros there).
        const int row = threadIdx.x >> 1, half = threadIdx.x & 1;
        const bf16_t* dor = dOs + row * (D + 8) + half * (D / 2);
        const bf16_t* orow = Os + row * (D + 8) + half * (D / 2);
        float acc = 0.0f;
        #pragma unroll
        for (int d = 0; d < D / 2; d += 2) {
            const unsigned int x = pair(dor + d), y = pair(orow + d);
            acc += bf2f(x & 0xffffu) * bf2f(y & 0xffffu) + bf2f(x >> 16) * bf2f(y >> 16);
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (half == 0) Di[row] = acc;
    }
    __syncthreads();
    const float dd[2] = {Di[rows[0]], Di[rows[1]]};
    float p[8][4], ds[8][4];
    rows_by_keys<D>(Qs, Ks, row0, g, t, p);
    rows_by_keys<D>(dOs, Vs, row0, g, t, ds);
    #pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1, col = nt * 8 + 2 * t + (e & 1);
            const float pv =
                valid[i] && col <= rows[i] ? exp2f(p[nt][e] * scale_log2 - L[i]) : 0.0f;
            p[nt][e] = pv;
            ds[nt][e] = pv * (ds[nt][e] - dd[i]);
            Pt[col * PT_STRIDE + rows[i]] = (bf16_t)f2bf(pv);
            dSt[col * PT_STRIDE + rows[i]] = (bf16_t)f2bf(ds[nt][e]);
        }
    }
    // dQ for the warp's rows: scale * dS K.
    {
        float dq[D / 8][4];
        #pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            if (kk <= warp) {
                const AFrag a = acc_to_a(ds, kk);
                #pragma unroll
                for (int nd = 0; nd < D / 8; ++nd) mma_b(dq[nd], a, Ks, D + 8, kk * 16, nd * 8, g, t);
            }
        }
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (valid[i]) {
                bf16_t* row = dqkv + ((long long)b * T + rows[i]) * ld + h * D + 2 * t;
                #pragma unroll
                for (int nd = 0; nd < D / 8; ++nd) {
                    *reinterpret_cast<unsigned int*>(row + nd * 8) =
                        pack2(dq[nd][2 * i] * scale, dq[nd][2 * i + 1] * scale);
                }
            }
        }
    }
    __syncthreads();
    // The warp's 16 keys: dV = P^T dO, dK = scale * dS^T Q, over the
    // queries at or after them.
    float dv[D / 8][4], dk[D / 8][4];
    #pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
        dv[nd][0] = dv[nd][1] = dv[nd][2] = dv[nd][3] = 0.0f;
        dk[nd][0] = dk[nd][1] = dk[nd][2] = dk[nd][3] = 0.0f;
    }
    #pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        if (kk >= warp) {
            const AFrag ap = load_a(Pt, PT_STRIDE, row0, kk * 16, g, t);
            const AFrag as = load_a(dSt, PT_STRIDE, row0, kk * 16, g, t);
            #pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) {
                mma_b(dv[nd], ap, dOs, D + 8, kk * 16, nd * 8, g, t);
                mma_b(dk[nd], as, Qs, D + 8, kk * 16, nd * 8, g, t);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (valid[i]) {
            bf16_t* row = dqkv + ((long long)b * T + rows[i]) * ld + h * D + 2 * t;
            #pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) {
                *reinterpret_cast<unsigned int*>(row + C + nd * 8) =
                    pack2(dk[nd][2 * i] * scale, dk[nd][2 * i + 1] * scale);
                *reinterpret_cast<unsigned int*>(row + 2 * C + nd * 8) =
                    pack2(dv[nd][2 * i], dv[nd][2 * i + 1]);
            }
        }
    }
}

#define ESPER_ATTENTION(D)                                                                     \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) esper_attention_forward_d##D(    \
        const bf16_t* qkv, bf16_t* out, float* lse2, int T, int H, float scale_log2) {         \
        ESPER_PDL_ENTRY();                                                                     \
        attention_forward<D>(qkv, out, lse2, T, H, scale_log2);                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) esper_attention_backward_d##D(   \
        const bf16_t* qkv, const bf16_t* out, const bf16_t* dout, const float* lse2,           \
        bf16_t* dqkv, int T, int H, float scale, float scale_log2) {                           \
        ESPER_PDL_ENTRY();                                                                     \
        attention_backward<D>(qkv, out, dout, lse2, dqkv, T, H, scale, scale_log2);            \
    }
ESPER_ATTENTION(16)
ESPER_ATTENTION(32)
"#;
