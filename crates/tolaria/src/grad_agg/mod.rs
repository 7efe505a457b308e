//! Gradient aggregation across seeds, with PCGrad: used by the general
//! step ([`crate::engine::model_step::ModelStep`]) whenever seeds feed the
//! host's gradient (its gradient taps give the per-seed parts).
//!
//! One step of a morphogenetic model has a *teacher* gradient (the host's
//! own loss gradient) and one contribution gradient per active seed, all
//! over the same parameter layout (the parameters whose `.grad` receives the
//! result). [`GradAggregator::aggregate`] writes
//! `teacher + Σ seeds'` into those gradients, where `seeds'` are the seed
//! gradients after PCGrad (Yu et al. 2020, "Gradient Surgery for Multi-Task
//! Learning"):
//!
//! - **0 seeds**: pass-through, `out = teacher` (one multi-tensor copy).
//! - **1 seed, and the caller's attribution confirms one active seed**: the
//!   single-seed fast path, `out = teacher + seed`, without the Gram matrix
//!   and the projection loop. The reference allows this path only when
//!   Kasmina's attribution confirms a single active seed
//!   (`attribution_confirms_single_seed`); without that confirmation one seed
//!   goes through the general path (with one seed there is no pair to
//!   project, so the gradient is the same; the step counts as a general one).
//! - **2 or more seeds**: PCGrad. For each seed `i`, for each other seed `j`
//!   in ascending order, `if g_i'·g_j < 0 { g_i' -= (g_i'·g_j / |g_j|²) g_j }`,
//!   against the *original* `g_j`; the projected gradients are summed. The
//!   teacher is the anchor: it is neither projected nor projected against.
//!
//! Where the reference is silent or differs, the choices are: a fixed
//! ascending order (the reference shuffles with Python's `random`; a fixed
//! order keeps CPU runs bitwise reproducible and is what a captured CUDA
//! graph would replay anyway) and projection against the original seed
//! gradients (the reference projects against gradients already adjusted in
//! the same pass; the original paper uses the originals).
//!
//! **Pooled buffers.** The aggregator owns one flat device buffer with a row
//! per gradient source (`[max_seeds + 1, numel]`, row 0 the teacher) and a
//! flat aggregate `[numel]`, plus per-parameter views of both, allocated once
//! for a layout (the shapes, dtype and device of `out`) and reused by every
//! step; a different layout re-allocates them (see
//! [`GradAggregator::allocations`]). Each step copies the gradients into
//! their rows with one torch-ext `_foreach_copy_` (no per-parameter clones).
//! A parameter's views lie in its gradient's own memory order where that is
//! dense channels-last (a convolution weight on the GPU), so the copies in
//! and out move memory as it lies instead of transposing it on ATen's
//! strided path; the dot products, sums and projections do not depend on
//! the order of a row's elements.
//!
//! **Device-only projection.** PCGrad runs in the span of the rows: with the
//! Gram matrix `D = G Gᵀ` (`torch_ext::nn::gram` over the `[k + 1, numel]`
//! rows: on CUDA one pass and a fixed-order reduction in f32) each
//! projected gradient is `g_i' = Σ_m C[i, m] g_m` with a small coefficient
//! matrix `C` (identity at the start), and `g_i'·g_j = (C D)[i, j]`. One
//! projection step against seed `j` updates column `j` of `C` for every `i`
//! at once, with `(dot < 0)` as a float multiplier instead of a branch, so
//! nothing is read back and the step can be captured in a CUDA graph (the
//! seed count is the host-side shape of the step: a different count is a
//! different graph). The aggregate is `(1ᵀ C) G`, the rows weighted and
//! summed elementwise into the pooled aggregate (in the gradients' own
//! precision: as a matmul it would be rounded to TF32 where TF32 is on),
//! copied into `out` with one `_foreach_copy_`. The Gram matrix is summed
//! in f32 on CUDA (where libtorch's product rounded the rows to TF32 when
//! TF32 was on) and off CUDA is libtorch's product; the `k × k` work runs
//! in `f64`.
//!
//! **Fused on CUDA.** With at most 16 seeds on a CUDA device (and
//! torch-ext's fused kernels on), the `k × k` work is one kernel of one
//! warp (the projection loop, the norms, the teacher share, the conflicts,
//! the column sums of `C` and the step's metrics) and the weighted sum one
//! more, rounding each product and sum in row order (`kernels`); the
//! libtorch path launches a few dozen kernels on `[k + 1, k + 1]` tensors
//! for the same arithmetic. Elsewhere the libtorch path runs.
//!
//! **Metrics.** Every step adds to one `f64` device accumulator (steps per
//! path, seed pairs compared, conflicting pairs, projections applied, teacher
//! share); [`GradAggregator::take_epoch_metrics`] reads it once, at the end
//! of the epoch, and zeroes it. The conflict ratio is conflicting pairs
//! (negative dot product between the *original* seed gradients, counted
//! before any projection) over pairs compared; the reference divides the
//! conflict count by `seeds − 1` instead, which is not a ratio for three or
//! more seeds. The teacher share of a step is `|t| / (|t| + Σ|s_i'|)`, the
//! teacher's norm over the sum of the norms of the aggregated parts, as the
//! reference's per-bucket share (norm over summed norms); a pass-through
//! step's share is 1 by definition, and the epoch's value is the mean over
//! steps. The telemetry names are leyline's `tolaria.grad_agg.*`.

use tch::{Device, Kind, Tensor};
use torch_ext::fused;

use crate::error::{Error, Result, TorchResultExt};

mod kernels;
mod metrics;
mod pcgrad;
mod pool;

pub use metrics::GradAggMetrics;
use metrics::{FIELDS, SHARE};
use pcgrad::teacher_share;
use pool::{Pool, check_list};

/// Most seeds one aggregator holds rows for (the projection loop launches a
/// few small kernels per seed).
pub const MAX_GRAD_AGG_SEEDS: usize = 64;

/// Which path a step took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggPath {
    /// No seed: the teacher gradient passed through.
    PassThrough,
    /// One seed confirmed by attribution: teacher plus seed, no projection.
    SingleSeed,
    /// The general path: Gram matrix and PCGrad over the seeds (one
    /// unconfirmed seed included).
    PcGrad,
}

pub(super) fn agg_error(field: &'static str, reason: String) -> Error {
    Error::GradAgg { field, reason }
}

fn to_i64(value: usize, field: &'static str) -> Result<i64> {
    i64::try_from(value).map_err(|_| agg_error(field, format!("{value} does not fit in i64")))
}

/// PCGrad gradient aggregation over pooled device buffers (see the module
/// docs).
#[derive(Debug)]
pub struct GradAggregator {
    device: Device,
    max_seeds: usize,
    pool: Option<Pool>,
    allocations: u64,
    /// `f64 [FIELDS]`: steps, pass-through, single-seed, general, pairs,
    /// conflicts, projections, teacher-share sum.
    accum: Tensor,
    /// `f64 [max_seeds + 2, FIELDS]`: the constant part of each step's
    /// increment; row 0 pass-through, row 1 single seed, row `1 + k` the
    /// general path with `k` seeds.
    increments: Tensor,
    /// `f64 [R, R]`: `allowed[j][i] = 1` when seed row `i` may be projected
    /// off row `j` (`i ≥ 1`, `i ≠ j`).
    allowed: Tensor,
    /// `f64 [R, R]`: 1 where `1 ≤ i < j` (the seed pairs).
    upper: Tensor,
    /// `f64 [R, R]` identity.
    eye: Tensor,
    /// `f64 [R, R]` coefficients of the last general step.
    coef: Tensor,
    /// Rows used by the last general step (for [`Self::projected_seeds`]).
    last_general_rows: Option<i64>,
    /// Gradient handles of the current step (capacity kept).
    sources: Vec<Tensor>,
}

impl GradAggregator {
    /// An aggregator for up to `max_seeds` seeds (1..=[`MAX_GRAD_AGG_SEEDS`])
    /// on `device`. The gradient buffers are allocated by the first
    /// [`aggregate`](Self::aggregate), for its layout.
    pub fn new(max_seeds: usize, device: Device) -> Result<Self> {
        if !(1..=MAX_GRAD_AGG_SEEDS).contains(&max_seeds) {
            return Err(agg_error(
                "max_seeds",
                format!("{max_seeds} is outside 1..={MAX_GRAD_AGG_SEEDS}"),
            ));
        }
        let rows = max_seeds.saturating_add(1);
        let mut increments = Vec::with_capacity(rows.saturating_add(1).saturating_mul(8));
        increments.extend([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        increments.extend([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        for seeds in 1..=max_seeds {
            let pairs = seeds.saturating_mul(seeds.saturating_sub(1)) / 2;
            increments.extend([1.0, 0.0, 0.0, 1.0, pairs as f64, 0.0, 0.0, 0.0]);
        }
        let mut allowed = Vec::with_capacity(rows.saturating_mul(rows));
        let mut upper = Vec::with_capacity(rows.saturating_mul(rows));
        for j in 0..rows {
            for i in 0..rows {
                allowed.push(if i >= 1 && i != j { 1.0 } else { 0.0 });
                upper.push(if j >= 1 && j < i { 1.0 } else { 0.0 });
            }
        }
        let r = to_i64(rows, "max_seeds")?;
        let table = |values: &[f64], shape: [i64; 2]| -> Result<Tensor> {
            Tensor::f_from_slice(values)
                .op("from_slice")?
                .f_view_(shape)
                .op("view")?
                .f_to(device)
                .op("to device")
        };
        let inc_rows = r
            .checked_add(1)
            .ok_or_else(|| agg_error("max_seeds", "overflow".into()))?;
        let opts = (Kind::Double, device);
        Ok(Self {
            device,
            max_seeds,
            pool: None,
            allocations: 0,
            accum: Tensor::f_zeros([FIELDS], opts).op("zeros accum")?,
            increments: table(&increments, [inc_rows, FIELDS])?,
            allowed: table(&allowed, [r, r])?,
            upper: table(&upper, [r, r])?,
            eye: Tensor::f_eye(r, opts).op("eye")?,
            coef: Tensor::f_zeros([r, r], opts).op("zeros coef")?,
            last_general_rows: None,
            sources: Vec::new(),
        })
    }

    /// Most seeds one step may have.
    pub fn max_seeds(&self) -> usize {
        self.max_seeds
    }

    /// How many times the pooled buffers were allocated (once per layout).
    pub fn allocations(&self) -> u64 {
        self.allocations
    }

    /// The pooled `[max_seeds + 1, numel]` rows (row 0 the teacher), `None`
    /// before the first step.
    pub fn pooled_rows(&self) -> Option<&Tensor> {
        self.pool.as_ref().map(|pool| &pool.rows)
    }

    /// Aggregates one step's gradients into `out` (the parameters' `.grad`
    /// tensors, which define the layout; `teacher` may be those same
    /// tensors) and returns the path taken. `teacher` and every entry of
    /// `seeds` hold one gradient per entry of `out`, of the same shape, dtype
    /// (`f32` or `f64`) and device. `attribution_confirms_single_seed` may be
    /// true only with exactly one seed, and selects the fast path.
    ///
    /// Nothing is read back; the checks are on shapes only. A layout other
    /// than the last one re-allocates the pooled buffers (outside any
    /// captured region).
    pub fn aggregate<S: AsRef<[Tensor]>>(
        &mut self,
        teacher: &[Tensor],
        seeds: &[S],
        attribution_confirms_single_seed: bool,
        out: &[Tensor],
    ) -> Result<AggPath> {
        self.check_inputs(teacher, seeds, attribution_confirms_single_seed, out, false)?;
        tch::no_grad(|| {
            if seeds.is_empty() {
                return self.pass_through(teacher, out);
            }
            let rows = self.flatten(teacher, seeds, false)?;
            self.aggregate_rows(rows, seeds.len(), attribution_confirms_single_seed, out)
        })
    }

    /// [`GradAggregator::aggregate`] from the *total* host gradient instead
    /// of the teacher's: the teacher is `total − Σ seeds`, computed in the
    /// pooled rows (two kernels, not one subtraction per parameter and
    /// seed). A seed's list may hold undefined tensors where the seed sends
    /// no gradient (the parameters above its slot); their rows are zeroed
    /// (one multi-tensor kernel), with no per-parameter allocation. The
    /// result equals `aggregate(total − Σ seeds, seeds, ..)`.
    pub fn aggregate_total<S: AsRef<[Tensor]>>(
        &mut self,
        total: &[Tensor],
        seeds: &[S],
        attribution_confirms_single_seed: bool,
        out: &[Tensor],
    ) -> Result<AggPath> {
        self.check_inputs(total, seeds, attribution_confirms_single_seed, out, true)?;
        tch::no_grad(|| {
            if seeds.is_empty() {
                return self.pass_through(total, out);
            }
            let rows = self.flatten(total, seeds, true)?;
            self.aggregate_rows(rows, seeds.len(), attribution_confirms_single_seed, out)
        })
    }

    fn check_inputs<S: AsRef<[Tensor]>>(
        &mut self,
        teacher: &[Tensor],
        seeds: &[S],
        attribution_confirms_single_seed: bool,
        out: &[Tensor],
        seeds_may_be_undefined: bool,
    ) -> Result<()> {
        if seeds.len() > self.max_seeds {
            return Err(agg_error(
                "seeds",
                format!(
                    "{} seeds, the aggregator holds {}",
                    seeds.len(),
                    self.max_seeds
                ),
            ));
        }
        if attribution_confirms_single_seed && seeds.len() != 1 {
            return Err(agg_error(
                "attribution_confirms_single_seed",
                format!("true with {} seeds", seeds.len()),
            ));
        }
        self.ensure_layout(out)?;
        let Some(pool) = self.pool.as_ref() else {
            return Err(agg_error("out", "no layout".into()));
        };
        check_list(pool, self.device, "teacher", 0, teacher, false)?;
        for (index, seed) in seeds.iter().enumerate() {
            check_list(
                pool,
                self.device,
                "seeds",
                index,
                seed.as_ref(),
                seeds_may_be_undefined,
            )?;
        }
        Ok(())
    }

    /// The single-seed fast path or PCGrad over `rows` (teacher and `seeds`
    /// seeds, flattened).
    fn aggregate_rows(
        &mut self,
        rows: Tensor,
        seeds: usize,
        attribution_confirms_single_seed: bool,
        out: &[Tensor],
    ) -> Result<AggPath> {
        if seeds == 1 && attribution_confirms_single_seed {
            self.single_seed(&rows, out)
        } else {
            self.pcgrad(&rows, seeds, out)
        }
    }

    fn ensure_layout(&mut self, out: &[Tensor]) -> Result<()> {
        let Some(first) = out.first() else {
            return Err(agg_error("out", "no parameter gradients".into()));
        };
        if !first.defined() {
            return Err(agg_error("out", "gradient 0 is undefined".into()));
        }
        let kind = first.f_kind().op("kind")?;
        if !matches!(kind, Kind::Float | Kind::Double) {
            return Err(agg_error(
                "out",
                format!("dtype {kind:?}, expected Float or Double"),
            ));
        }
        let unchanged = self.pool.as_ref().is_some_and(|pool| {
            pool.kind == kind
                && pool.shapes.len() == out.len()
                && out
                    .iter()
                    .zip(pool.shapes.iter().zip(&pool.out_strides))
                    .all(|(tensor, (shape, strides))| {
                        tensor.defined() && tensor.size() == *shape && tensor.stride() == *strides
                    })
        });
        if !unchanged {
            let mut layouts = Vec::with_capacity(out.len());
            for (index, tensor) in out.iter().enumerate() {
                if !tensor.defined() {
                    return Err(agg_error("out", format!("gradient {index} is undefined")));
                }
                layouts.push(pool::Layout::of(tensor)?);
            }
            let rows = to_i64(self.max_seeds.saturating_add(1), "max_seeds")?;
            self.pool = None;
            self.pool = Some(Pool::new(layouts, kind, self.device, rows)?);
            self.allocations = self.allocations.saturating_add(1);
            self.last_general_rows = None;
        }
        let Some(pool) = self.pool.as_ref() else {
            return Err(agg_error("out", "no layout".into()));
        };
        check_list(pool, self.device, "out", 0, out, false)
    }

    fn pass_through(&mut self, teacher: &[Tensor], out: &[Tensor]) -> Result<AggPath> {
        fused::foreach_copy_(out, teacher, false)?;
        self.add_increment(0)?;
        self.last_general_rows = None;
        Ok(AggPath::PassThrough)
    }

    /// Copies the teacher (or, with `from_total`, the total) and the seeds
    /// into rows `0..=k`; undefined seed gradients zero their rows; with
    /// `from_total`, row 0 then becomes `total − Σ seeds`. Returns the rows.
    fn flatten<S: AsRef<[Tensor]>>(
        &mut self,
        teacher: &[Tensor],
        seeds: &[S],
        from_total: bool,
    ) -> Result<Tensor> {
        let Some(pool) = self.pool.as_ref() else {
            return Err(agg_error("out", "no layout".into()));
        };
        let count = teacher.len().saturating_mul(seeds.len().saturating_add(1));
        let views = pool
            .row_views
            .get(..count)
            .ok_or_else(|| agg_error("seeds", "more rows than the pool holds".into()))?;
        let sources = teacher
            .iter()
            .chain(seeds.iter().flat_map(|seed| seed.as_ref().iter()));
        let mut dst = Vec::with_capacity(count);
        let mut zero = Vec::new();
        self.sources.clear();
        for (view, source) in views.iter().zip(sources) {
            if source.defined() {
                dst.push(view.shallow_clone());
                self.sources.push(source.shallow_clone());
            } else {
                zero.push(view.shallow_clone());
            }
        }
        fused::foreach_copy_(&dst, &self.sources, false)?;
        fused::foreach_zero_(&zero)?;
        self.sources.clear();
        let count = to_i64(seeds.len(), "seeds")?;
        let rows = to_i64(seeds.len().saturating_add(1), "seeds")?;
        let rows = pool.rows.f_narrow(0, 0, rows).op("narrow rows")?;
        if from_total {
            let parts = rows
                .f_narrow(0, 1, count)
                .op("narrow seeds")?
                .f_sum_dim_intlist([0i64].as_slice(), false, None::<Kind>)
                .op("sum seeds")?;
            let _ = rows
                .f_select(0, 0)
                .op("select teacher")?
                .f_sub_(&parts)
                .op("teacher = total - seeds")?;
        }
        Ok(rows)
    }

    fn single_seed(&mut self, rows: &Tensor, out: &[Tensor]) -> Result<AggPath> {
        let Some(pool) = self.pool.as_ref() else {
            return Err(agg_error("out", "no layout".into()));
        };
        let teacher_row = rows.f_select(0, 0).op("select")?;
        let seed_row = rows.f_select(0, 1).op("select")?;
        let aggregate = pool.aggregate.f_select(0, 0).op("select")?;
        let _ = teacher_row.f_add_out(&aggregate, &seed_row).op("add_out")?;
        let norms = rows
            .f_norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
            .op("row norms")?
            .f_to_dtype(Kind::Double, false, false)
            .op("to f64")?;
        let share = teacher_share(&norms)?;
        fused::foreach_copy_(out, &pool.aggregate_views, false)?;
        self.add_increment(1)?;
        self.add_at(SHARE, &share)?;
        self.last_general_rows = None;
        Ok(AggPath::SingleSeed)
    }

    fn add_increment(&mut self, row: i64) -> Result<()> {
        let increment = self.increments.f_select(0, row).op("select")?;
        let _ = self.accum.f_add_(&increment).op("add_")?;
        Ok(())
    }

    fn add_at(&mut self, field: i64, value: &Tensor) -> Result<()> {
        let _ = self
            .accum
            .f_narrow(0, field, 1)
            .op("narrow")?
            .f_add_(value)
            .op("add_")?;
        Ok(())
    }

    /// The projected seed gradients `[k, numel]` of the last general step
    /// (`None` if the last step took another path, or none ran since the
    /// last layout change). Allocates:
    /// for tests and diagnostics, not for the step.
    pub fn projected_seeds(&self) -> Result<Option<Tensor>> {
        let (Some(r), Some(pool)) = (self.last_general_rows, self.pool.as_ref()) else {
            return Ok(None);
        };
        let seeds = r.saturating_sub(1);
        let coef = self
            .coef
            .f_narrow(0, 1, seeds)
            .op("narrow")?
            .f_narrow(1, 0, r)
            .op("narrow")?
            .f_to_dtype(pool.kind, false, false)
            .op("to kind")?;
        let rows = pool.rows.f_narrow(0, 0, r).op("narrow")?;
        Ok(Some(coef.f_mm(&rows).op("mm")?))
    }

    /// Reads the epoch's statistics back (the one readback of an epoch),
    /// zeroes the accumulator and returns them. A non-finite or impossible
    /// value (a non-finite gradient makes the teacher share NaN) is
    /// [`Error::InvalidMetric`].
    pub fn take_epoch_metrics(&mut self) -> Result<GradAggMetrics> {
        let host = self.accum.f_to(Device::Cpu).op("accum to cpu")?;
        let values = Vec::<f64>::try_from(&host).op("accum to_vec")?;
        let _ = self.accum.f_zero_().op("zero accum")?;
        let flat_params = self
            .pool
            .as_ref()
            .map_or(0, |pool| u64::try_from(pool.numel).unwrap_or(0));
        GradAggMetrics::from_accumulator(&values, flat_params)
    }
}
