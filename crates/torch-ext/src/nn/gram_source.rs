//! The CUDA C source of [`super::gram`]'s kernel, appended to
//! [`super::source::SOURCE`] (it uses that source's `T`, `THREADS` and
//! `ld1`): every pairwise dot product of a few long rows in one pass, as
//! per-block partial sums in a fixed order, which the convolution source's
//! reduction then adds up in block order.
//!
//! A thread reads each row's value at its positions (the rows' reads are
//! coalesced across the block) and adds every product of two rows into its
//! own sums; the warp adds its lanes' sums with a butterfly of shuffles,
//! the block its warps' in warp order.

pub(super) const GRAM_SOURCE: &str = r#"
#define GRAM_MAX_ROWS 8
#define GRAM_PAIRS (GRAM_MAX_ROWS * (GRAM_MAX_ROWS + 1) / 2)
// partials[(block * R + a) * R + b] = the sum over the block's positions i
// of rows[a * n + i] * rows[b * n + i], for a, b < R <= GRAM_MAX_ROWS (both
// halves of the symmetric matrix written). Block of THREADS threads; the
// block covers positions [block * span, (block + 1) * span).
extern "C" __global__ void esper_gram_partial(const T* __restrict__ rows,
                                              float* __restrict__ partials, long long n, int R,
                                              long long span) {
    ESPER_PDL_ENTRY();
    __shared__ float warp_sums[THREADS / 32][GRAM_PAIRS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long begin = (long long)blockIdx.x * span;
    const long long end = begin + span < n ? begin + span : n;
    float acc[GRAM_PAIRS];
    #pragma unroll
    for (int p = 0; p < GRAM_PAIRS; ++p) acc[p] = 0.0f;
    for (long long i = begin + threadIdx.x; i < end; i += THREADS) {
        float v[GRAM_MAX_ROWS];
        #pragma unroll
        for (int r = 0; r < GRAM_MAX_ROWS; ++r) v[r] = r < R ? ld1(rows, (long long)r * n + i) : 0.0f;
        int p = 0;
        #pragma unroll
        for (int a = 0; a < GRAM_MAX_ROWS; ++a) {
            #pragma unroll
            for (int b = a; b < GRAM_MAX_ROWS; ++b) {
                acc[p] = fmaf(v[a], v[b], acc[p]);
                ++p;
            }
        }
    }
    #pragma unroll
    for (int p = 0; p < GRAM_PAIRS; ++p) {
        float s = acc[p];
        #pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
        if (lane == 0) warp_sums[warp][p] = s;
    }
    __syncthreads();
    if (threadIdx.x < GRAM_PAIRS) {
        // Pair number threadIdx.x in the order the products were added.
        int a = 0, b = 0, p = 0;
        for (int x = 0; x < GRAM_MAX_ROWS; ++x) {
            for (int y = x; y < GRAM_MAX_ROWS; ++y) {
                if (p == (int)threadIdx.x) { a = x; b = y; }
                ++p;
            }
        }
        if (a < R && b < R) {
            float total = warp_sums[0][threadIdx.x];
            #pragma unroll
            for (int w = 1; w < THREADS / 32; ++w) total += warp_sums[w][threadIdx.x];
            float* out = partials + (long long)blockIdx.x * R * R;
            out[a * R + b] = total;
            out[b * R + a] = total;
        }
    }
}
"#;
