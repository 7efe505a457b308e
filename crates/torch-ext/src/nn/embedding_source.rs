//! The CUDA C source of [`super::embedding`]'s backward kernel, appended
//! to [`super::source::SOURCE`] (it uses that source's `T` and `ld1`): the
//! weight gradient of an embedding as per-chunk partial sums of the output
//! gradient's rows grouped by token id, deterministic and without a sort.
//!
//! libtorch's deterministic `embedding_dense_backward` sorts the ids (24
//! radix-sort passes a step on the language-model host, 144 us) and sums
//! segments. Here a block owns one vocabulary row and one chunk of ids: a
//! warp takes 32 ids at a time, finds the matching positions with one
//! ballot, and its lanes add those rows' columns in position order (rows
//! of at most 128 values load up to four matching rows at once); the
//! warps' sums are added in warp order. The chunks are then added in chunk
//! order by the convolution source's reduction.

pub(super) const EMBEDDING_SOURCE: &str = r#"
#define EMB_WARPS 8
#define EMB_MAX_C 512
#define EMB_PER_LANE (EMB_MAX_C / 32)
#define EMB_BATCH 4
// One warp's sums of the rows of g at positions [w_begin, w_end) whose id
// is `row`, in position order, into sums[0, C): PER columns a lane (C <=
// 32 PER); up to BATCH matching rows' loads in flight at a time.
template <int PER, int BATCH>
__device__ __forceinline__ void emb_scan(const long long* __restrict__ ids,
                                         const T* __restrict__ g, long long w_begin,
                                         long long w_end, long long row, int C, int lane,
                                         float* sums) {
    float acc[PER];
    #pragma unroll
    for (int k = 0; k < PER; ++k) acc[k] = 0.0f;
    for (long long base = w_begin; base < w_end; base += 32) {
        const long long i = base + lane;
        const bool hit = i < w_end && ids[i] == row;
        unsigned int mask = __ballot_sync(0xffffffffu, hit);
        while (mask != 0u) {
            int js[BATCH];
            #pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                js[b] = -1;
                if (mask != 0u) {
                    js[b] = __ffs(mask) - 1;
                    mask &= mask - 1u;
                }
            }
            float v[BATCH][PER];
            #pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                const long long offset = (base + (js[b] < 0 ? 0 : js[b])) * C;
                #pragma unroll
                for (int k = 0; k < PER; ++k) {
                    const int c = lane + 32 * k;
                    v[b][k] = js[b] >= 0 && c < C ? ld1(g, offset + c) : 0.0f;
                }
            }
            #pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                if (js[b] >= 0) {
                    #pragma unroll
                    for (int k = 0; k < PER; ++k) {
                        if (lane + 32 * k < C) acc[k] += v[b][k];
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int c = lane + 32 * k;
        if (c < C) sums[c] = acc[k];
    }
}

// partials[(chunk * V + row) * C + c] = the sum over the chunk's positions
// i (ids[i] == row, in order) of g[i * C + c]. Block (chunk, row) of
// EMB_WARPS warps; chunk covers ids [chunk * span, (chunk + 1) * span),
// span a multiple of 32 * EMB_WARPS. C <= EMB_MAX_C.
extern "C" __global__ void esper_embedding_backward(
    const long long* __restrict__ ids, const T* __restrict__ g, float* __restrict__ partials,
    long long n, int V, int C, long long span) {
    ESPER_PDL_ENTRY();
    __shared__ float warp_sums[EMB_WARPS][EMB_MAX_C];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long row = blockIdx.y;
    const long long begin = (long long)blockIdx.x * span;
    const long long end = begin + span < n ? begin + span : n;
    // Each warp takes a contiguous run of the chunk, in order.
    const long long per_warp = span / EMB_WARPS;
    const long long w_begin = begin + warp * per_warp;
    const long long w_end = w_begin + per_warp < end ? w_begin + per_warp : end;
    // Narrow rows batch their matches' loads; wide ones keep the registers
    // for their columns.
    if (C <= 128) {
        emb_scan<4, EMB_BATCH>(ids, g, w_begin, w_end, row, C, lane, warp_sums[warp]);
    } else {
        emb_scan<EMB_PER_LANE, 1>(ids, g, w_begin, w_end, row, C, lane, warp_sums[warp]);
    }
    __syncthreads();
    float* out = partials + ((long long)blockIdx.x * V + row) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float total = warp_sums[0][c];
        #pragma unroll
        for (int w = 1; w < EMB_WARPS; ++w) total += warp_sums[w][c];
        out[c] = total;
    }
}
"#;
