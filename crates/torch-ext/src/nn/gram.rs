//! [`gram`]: the Gram matrix of a few long rows (every pairwise dot
//! product) in `f32`, from one pass over the rows and a fixed-order
//! reduction where the kernels apply, libtorch's product otherwise.

use tch::{Device, Kind, Tensor};

use super::{MAX_FUSED_GRAM_ROWS, fused_kernels_enabled, kernels, torch};
use crate::error::{Error, Result};
use crate::jit::Arg;

/// Threads of a block of the partial-sum kernel (the source's `THREADS`).
const THREADS: i64 = 256;

/// Most blocks of the partial-sum kernel: a fixed number, so the order of
/// the sums, and with it the result, is the same on every GPU.
const MAX_BLOCKS: i64 = 256;

/// `rows · rowsᵀ` in `f32` (in `f64` for `f64` rows):
/// `G[a][b] = Σ_i rows[a][i] · rows[b][i]`.
///
/// On a contiguous CUDA tensor of `f32` or `bf16` with at most
/// [`MAX_FUSED_GRAM_ROWS`] rows, one kernel sums every product of two rows
/// per block of positions in `f32` and the convolution source's reduction
/// adds the blocks in order: deterministic, every value from `f32`
/// products and sums (libtorch's `mm` on such a tall, thin product runs a
/// generic GEMM kernel that rounds its inputs to TF32 where TF32 is on, and
/// for three rows of 636,032 values took 52 us on an H200, the
/// `tolaria-lm` profile). Elsewhere (the CPU, other dtypes, more rows, the
/// fused kernels off) it is libtorch's `mm` of the rows in `f32`, or in
/// `f64` for `f64` rows.
/// Nothing is read back, so the call can be captured in a CUDA graph.
///
/// # Shapes
/// `rows: [R, N]` with `R >= 1`; returns `[R, R]` on the rows' device, in
/// `f32` (`f64` for `f64` rows).
///
/// # Errors
/// [`Error::InvalidArgument`] for a tensor that is not two-dimensional or
/// has no row; [`Error::Cpp`] when the kernels cannot be compiled or
/// launched, or libtorch's product fails.
pub fn gram(rows: &Tensor) -> Result<Tensor> {
    const OP: &str = "nn::gram";
    let size = rows.size();
    let [r, n] = size[..] else {
        return Err(Error::InvalidArgument {
            op: OP,
            message: format!("expected rows [R, N], got a tensor of shape {size:?}"),
        });
    };
    if r < 1 {
        return Err(Error::InvalidArgument {
            op: OP,
            message: format!("expected at least one row, got shape {size:?}"),
        });
    }
    let Some((device, bf16)) = gram_target(rows, r, n) else {
        let kind = if rows.kind() == Kind::Double {
            Kind::Double
        } else {
            Kind::Float
        };
        let rows = rows.f_to_kind(kind).map_err(|e| torch(OP, e))?;
        let transposed = rows.f_tr().map_err(|e| torch(OP, e))?;
        return rows.f_mm(&transposed).map_err(|e| torch(OP, e));
    };
    let k = kernels(OP, device, bf16, true)?;
    // n >= 1 here; every quotient is of positive numbers.
    let div_ceil = |a: i64, b: i64| (a + b - 1) / b;
    let blocks_wanted = div_ceil(n, THREADS * 4).clamp(1, MAX_BLOCKS);
    let span = div_ceil(div_ceil(n, blocks_wanted), THREADS) * THREADS;
    let blocks = div_ceil(n, span);
    let pairs = r * r;
    // Every launch figure is small and positive by construction (blocks <=
    // MAX_BLOCKS, r <= MAX_FUSED_GRAM_ROWS); one that is not is an error,
    // never a clamped launch.
    let int = |value: i64| {
        i32::try_from(value).map_err(|_| Error::InvalidArgument {
            op: OP,
            message: format!("launch figure {value} outside i32"),
        })
    };
    let (r_arg, blocks_arg, pairs_arg) = (int(r)?, int(blocks)?, int(pairs)?);
    let grid = blocks_arg.unsigned_abs();
    let threads = int(THREADS)?.unsigned_abs();
    let reduce_grid = int(div_ceil(pairs, 32))?.unsigned_abs();
    let on = (Kind::Float, Device::Cuda(device));
    let partials = Tensor::f_empty([blocks, pairs], on).map_err(|e| torch(OP, e))?;
    let out = Tensor::f_empty([r, r], on).map_err(|e| torch(OP, e))?;
    k.gram_partial.launch(
        [grid, 1, 1],
        [threads, 1, 1],
        0,
        &[
            Arg::Tensor(rows),
            Arg::Tensor(&partials),
            Arg::I64(n),
            Arg::I32(r_arg),
            Arg::I64(span),
        ],
    )?;
    // The reduction's geometry, as the shim's `sum_partials`
    // (`cpp/nn_internal.h`) launches it: 32 outputs a block.
    k.conv_reduce.launch(
        [reduce_grid, 1, 1],
        [threads, 1, 1],
        0,
        &[
            Arg::Tensor(&partials),
            Arg::Tensor(&out),
            Arg::I32(blocks_arg),
            Arg::I32(pairs_arg),
        ],
    )?;
    Ok(out)
}

/// The CUDA device and whether the rows are `bf16`, where [`gram`]'s
/// kernels apply: the fused kernels on, a contiguous CUDA tensor of `f32`
/// or `bf16`, `1..=MAX_FUSED_GRAM_ROWS` rows of at least one value.
fn gram_target(rows: &Tensor, r: i64, n: i64) -> Option<(usize, bool)> {
    if !fused_kernels_enabled() || !(1..=MAX_FUSED_GRAM_ROWS).contains(&r) || n < 1 {
        return None;
    }
    let Device::Cuda(device) = rows.device() else {
        return None;
    };
    if !rows.is_contiguous() {
        return None;
    }
    match rows.kind() {
        Kind::Float => Some((device, false)),
        Kind::BFloat16 => Some((device, true)),
        _ => None,
    }
}
