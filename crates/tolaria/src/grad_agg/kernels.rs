//! PCGrad's small work on CUDA as two run-time compiled kernels: the
//! coefficients from the Gram matrix (one warp: the projection loop, the
//! norms, the teacher share, the conflicts, the column sums and the step's
//! metrics) and the aggregate (the rows weighted and summed in one pass).
//!
//! The libtorch path of [`super::GradAggregator`] runs the same arithmetic
//! as a few dozen kernels on `[r, r]` tensors of 1 - 81 values each (about
//! ten a seed in the projection loop alone) and the weighted sum as a
//! product and a reduction through a `[r, numel]` temporary; on the
//! `tolaria-lm` step those tiny launches were a larger part of the
//! aggregation's time than its arithmetic. Both kernels read and write
//! device memory only (nothing is read back), so a step that runs them can
//! be captured in a CUDA graph.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use torch_ext::jit::{Arg, JitKernel, KernelCache};

use super::agg_error;
use super::metrics::{CONFLICTS, FIELDS};
use crate::error::Result;

/// Most rows (teacher and seeds) the coefficient kernel holds in shared
/// memory; more take the libtorch path.
pub(super) const MAX_FUSED_ROWS: i64 = 17;

const SOURCE: &str = r#"
#define MAX_ROWS 17
#define TINY 2.2250738585072014e-308

// One warp; lane i owns row i of the coefficients C (identity at first).
// gram: [r, r] f32 or f64; allowed, upper: [R, R] f64 tables;
// increments: [*, fields] f64; coef: [R, R] f64 (the square written);
// accum: [fields] f64; weights: [r] f32 or f64 (the column sums of C).
extern "C" __global__ void esper_pcgrad_coefficients(
        const void* gram, int gram_f64, int r, int R,
        const double* allowed, const double* upper, const double* increments,
        double* coef, double* accum, int fields, int conflicts_field,
        void* weights, int weights_f64) {
    ESPER_PDL_ENTRY();
    __shared__ double D[MAX_ROWS * MAX_ROWS];
    __shared__ double C[MAX_ROWS * MAX_ROWS];
    const int lane = threadIdx.x;
    for (int k = lane; k < r * r; k += 32) {
        D[k] = gram_f64 ? ((const double*)gram)[k] : (double)((const float*)gram)[k];
        C[k] = (k / r == k % r) ? 1.0 : 0.0;
    }
    __syncwarp();
    double projections = 0.0;
    for (int j = 1; j < r; ++j) {
        // g_i'.g_j = (C D)[i, j], every row against the original g_j.
        double dot = 0.0;
        if (lane < r) {
            for (int k = 0; k < r; ++k) dot += C[lane * r + k] * D[k * r + j];
        }
        __syncwarp();
        if (lane < r) {
            const double mask = (dot < 0.0 ? 1.0 : 0.0) * allowed[j * R + lane];
            const double denominator = fmax(D[j * r + j], TINY);
            C[lane * r + j] -= dot * mask / denominator;
            projections += mask;
        }
        __syncwarp();
    }
    // |g_i'| = sqrt((C D C^T)[i, i]).
    double norm = 0.0;
    if (lane < r) {
        double s = 0.0;
        for (int k = 0; k < r; ++k) {
            double cd = 0.0;
            for (int m = 0; m < r; ++m) cd += C[lane * r + m] * D[m * r + k];
            s += cd * C[lane * r + k];
        }
        norm = sqrt(fmax(s, 0.0));
    }
    double total = norm;
    for (int offset = 16; offset > 0; offset >>= 1) {
        total += __shfl_down_sync(0xffffffffu, total, offset);
        projections += __shfl_down_sync(0xffffffffu, projections, offset);
    }
    if (lane < r) {
        double w = 0.0;
        for (int i = 0; i < r; ++i) {
            w += C[i * r + lane];
            coef[i * R + lane] = C[i * r + lane];
        }
        if (weights_f64) ((double*)weights)[lane] = w; else ((float*)weights)[lane] = (float)w;
    }
    if (lane == 0) {
        double conflicts = 0.0;
        for (int a = 0; a < r; ++a)
            for (int b = 0; b < r; ++b)
                if (D[a * r + b] < 0.0) conflicts += upper[a * R + b];
        const double share = norm / fmax(total, TINY);
        for (int f = 0; f < fields; ++f) accum[f] += increments[(long long)r * fields + f];
        accum[conflicts_field] += conflicts;
        accum[conflicts_field + 1] += projections;
        accum[conflicts_field + 2] += share;
    }
}

// out[n] = sum_i w[i] rows[i][n], rows [r, n] contiguous; products and sums
// rounded one at a time, in row order.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

template <typename T>
__device__ void weighted_rows(const T* rows, const T* w, T* out, long long n, int r) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        T acc = 0;
        for (int k = 0; k < r; ++k) acc = add_rn(acc, mul_rn(w[k], rows[k * n + i]));
        out[i] = acc;
    }
}

extern "C" __global__ void esper_weighted_rows_f32(
        const float* rows, const float* w, float* out, long long n, int r) {
    ESPER_PDL_ENTRY();
    weighted_rows(rows, w, out, n, r);
}

extern "C" __global__ void esper_weighted_rows_f64(
        const double* rows, const double* w, double* out, long long n, int r) {
    ESPER_PDL_ENTRY();
    weighted_rows(rows, w, out, n, r);
}
"#;

/// The three kernels of one device.
pub(super) struct Kernels {
    coefficients: JitKernel,
    rows_f32: JitKernel,
    rows_f64: JitKernel,
}

/// The kernels for `device` where they apply: a CUDA device, the fused
/// kernels on ([`torch_ext::nn::fused_kernels_enabled`]), at most
/// [`MAX_FUSED_ROWS`] rows. `None` otherwise (the libtorch path runs), and
/// when they cannot be compiled there (the libtorch path runs too: the
/// arithmetic is the same).
pub(super) fn for_device(device: Device, rows: i64) -> Option<Arc<Kernels>> {
    let Device::Cuda(index) = device else {
        return None;
    };
    if !torch_ext::nn::fused_kernels_enabled() || !(1..=MAX_FUSED_ROWS).contains(&rows) {
        return None;
    }
    static CACHE: KernelCache<usize, Kernels> = KernelCache::new();
    CACHE
        .get_or_build(index, || {
            let arch = torch_ext::cuda::device_capability(index).map_err(|e| e.to_string())?;
            let cubin =
                torch_ext::jit::compile(SOURCE, "esper_pcgrad", arch).map_err(|e| e.to_string())?;
            let load = |name: &std::ffi::CStr| {
                JitKernel::load_named(&cubin, name, index).map_err(|e| e.to_string())
            };
            Ok(Kernels {
                coefficients: load(c"esper_pcgrad_coefficients")?,
                rows_f32: load(c"esper_weighted_rows_f32")?,
                rows_f64: load(c"esper_weighted_rows_f64")?,
            })
        })
        .ok()
}

/// The tables and accumulators the coefficient kernel reads and adds to.
pub(super) struct Tables<'a> {
    /// `f64 [R, R]`.
    pub(super) allowed: &'a Tensor,
    /// `f64 [R, R]`.
    pub(super) upper: &'a Tensor,
    /// `f64 [R + 1, FIELDS]`.
    pub(super) increments: &'a Tensor,
    /// `f64 [R, R]`: the coefficients written into its `[r, r]` corner.
    pub(super) coef: &'a Tensor,
    /// `f64 [FIELDS]`.
    pub(super) accum: &'a Tensor,
}

fn int(value: i64, field: &'static str) -> Result<i32> {
    i32::try_from(value).map_err(|_| agg_error(field, format!("{value} does not fit in i32")))
}

impl Kernels {
    /// PCGrad's coefficients from `gram` (`[r, r]`, f32 or f64,
    /// contiguous): the column sums of `C` into `weights` (`[r]` of the
    /// rows' dtype), `C` into the corner of `tables.coef`, and the step's
    /// increment and statistics added to `tables.accum`.
    pub(super) fn coefficients(
        &self,
        gram: &Tensor,
        r: i64,
        tables: &Tables<'_>,
        weights: &Tensor,
    ) -> Result<()> {
        if gram.size() != [r, r] || weights.size() != [r] {
            return Err(agg_error(
                "gram",
                format!(
                    "gram {:?} and weights {:?} for {r} rows",
                    gram.size(),
                    weights.size()
                ),
            ));
        }
        let table_rows = tables.allowed.size().first().copied().unwrap_or(0);
        let gram_f64 = i32::from(gram.kind() == Kind::Double);
        let weights_f64 = i32::from(weights.kind() == Kind::Double);
        self.coefficients
            .launch(
                [1, 1, 1],
                [32, 1, 1],
                0,
                &[
                    Arg::Tensor(gram),
                    Arg::I32(gram_f64),
                    Arg::I32(int(r, "seeds")?),
                    Arg::I32(int(table_rows, "max_seeds")?),
                    Arg::Tensor(tables.allowed),
                    Arg::Tensor(tables.upper),
                    Arg::Tensor(tables.increments),
                    Arg::Tensor(tables.coef),
                    Arg::Tensor(tables.accum),
                    Arg::I32(int(FIELDS, "fields")?),
                    Arg::I32(int(CONFLICTS, "fields")?),
                    Arg::Tensor(weights),
                    Arg::I32(weights_f64),
                ],
            )
            .map_err(|error| agg_error("pcgrad kernel", error.to_string()))
    }

    /// `out[n] = Σ_i weights[i]·rows[i][n]` for contiguous `rows`
    /// (`[r, numel]`) and `out` (`numel` values) of one dtype (f32 or f64).
    pub(super) fn weighted_rows(
        &self,
        rows: &Tensor,
        weights: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let size = rows.size();
        let [r, n] = size[..] else {
            return Err(agg_error(
                "rows",
                format!("shape {size:?}, expected [r, numel]"),
            ));
        };
        if i64::try_from(out.numel()).ok() != Some(n)
            || weights.size() != [r]
            || out.kind() != rows.kind()
            || weights.kind() != rows.kind()
        {
            return Err(agg_error(
                "rows",
                format!(
                    "rows {size:?} {:?}, weights {:?} {:?}, out of {} values {:?}",
                    rows.kind(),
                    weights.size(),
                    weights.kind(),
                    out.numel(),
                    out.kind()
                ),
            ));
        }
        let kernel = match rows.kind() {
            Kind::Float => &self.rows_f32,
            Kind::Double => &self.rows_f64,
            other => return Err(agg_error("rows", format!("dtype {other:?}"))),
        };
        let blocks = (n.saturating_add(255) / 256).clamp(1, 1024);
        kernel
            .launch(
                [u32::try_from(blocks).unwrap_or(1024), 1, 1],
                [256, 1, 1],
                0,
                &[
                    Arg::Tensor(rows),
                    Arg::Tensor(weights),
                    Arg::Tensor(out),
                    Arg::I64(n),
                    Arg::I32(int(r, "seeds")?),
                ],
            )
            .map_err(|error| agg_error("pcgrad kernel", error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pcgrad_kernels_compile_without_a_gpu() {
        let cubin = torch_ext::jit::compile(SOURCE, "esper_pcgrad", (9, 0)).expect("NVRTC");
        for name in [
            "esper_pcgrad_coefficients",
            "esper_weighted_rows_f32",
            "esper_weighted_rows_f64",
        ] {
            assert!(cubin.contains_symbol(name), "{name}");
        }
        assert!(SOURCE.contains(&format!("#define MAX_ROWS {MAX_FUSED_ROWS}")));
    }

    #[test]
    fn off_cuda_the_libtorch_path_runs() {
        assert!(for_device(Device::Cpu, 3).is_none());
    }
}
