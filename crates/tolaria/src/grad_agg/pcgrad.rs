//! The general path of [`GradAggregator`]: PCGrad over the pooled rows, as
//! two fused kernels on CUDA ([`super::kernels`]) or libtorch's ops on
//! `[k + 1, k + 1]` tensors elsewhere (see the parent module's docs), and
//! the teacher's share of the aggregate's norm.

use tch::{Kind, Tensor};
use torch_ext::fused;

use super::metrics::CONFLICTS;
use super::{AggPath, GradAggregator, agg_error, kernels, to_i64};
use crate::error::{Result, TorchResultExt};

impl GradAggregator {
    pub(super) fn pcgrad(
        &mut self,
        rows: &Tensor,
        seeds: usize,
        out: &[Tensor],
    ) -> Result<AggPath> {
        let r = to_i64(seeds.saturating_add(1), "seeds")?;
        if let Some(fused) = kernels::for_device(self.device, r) {
            return self.pcgrad_fused(&fused, rows, r, out);
        }
        // torch-ext's Gram kernel on CUDA (f32 products and sums, one pass
        // over the rows), libtorch's product elsewhere.
        let gram = torch_ext::nn::gram(rows)?
            .f_to_dtype(Kind::Double, false, false)
            .op("gram f64")?;
        let square = |t: &Tensor| -> Result<Tensor> {
            t.f_narrow(0, 0, r)
                .op("narrow")?
                .f_narrow(1, 0, r)
                .op("narrow")
        };
        let mut coef = square(&self.coef)?;
        coef.f_copy_(&square(&self.eye)?).op("coef = I")?;
        let allowed = square(&self.allowed)?;
        let mut projections = Tensor::f_zeros([], (Kind::Double, self.device)).op("zeros")?;
        for j in 1..r {
            let column = gram.f_select(1, j).op("select")?;
            // dots[i] = g_i'·g_j for every row i at once.
            let dots = coef.f_mv(&column).op("mv")?;
            let mask = dots
                .f_lt(0.0)
                .op("lt")?
                .f_to_dtype(Kind::Double, false, false)
                .op("mask f64")?
                .f_mul(&allowed.f_select(0, j).op("select")?)
                .op("mask")?;
            let denominator = column
                .f_select(0, j)
                .op("select")?
                .f_clamp_min(f64::MIN_POSITIVE)
                .op("clamp")?;
            let step = dots.f_mul(&mask).op("mul")?.f_div(&denominator).op("div")?;
            let _ = coef.f_select(1, j).op("select")?.f_sub_(&step).op("sub_")?;
            let _ = projections
                .f_add_(&mask.f_sum(Kind::Double).op("sum")?)
                .op("add_")?;
        }
        // |g_i'|² = (C D Cᵀ)[i, i].
        let norms = coef
            .f_mm(&gram)
            .op("mm")?
            .f_mul(&coef)
            .op("mul")?
            .f_sum_dim_intlist([1i64].as_slice(), false, Kind::Double)
            .op("sum")?
            .f_clamp_min(0.0)
            .op("clamp")?
            .f_sqrt()
            .op("sqrt")?;
        let share = teacher_share(&norms)?;
        let conflicts = gram
            .f_lt(0.0)
            .op("lt")?
            .f_to_dtype(Kind::Double, false, false)
            .op("to f64")?
            .f_mul(&square(&self.upper)?)
            .op("mul")?
            .f_sum(Kind::Double)
            .op("sum")?;
        let Some(pool) = self.pool.as_ref() else {
            return Err(agg_error("out", "no layout".into()));
        };
        let weights = coef
            .f_sum_dim_intlist([0i64].as_slice(), true, Kind::Double)
            .op("sum")?
            .f_to_dtype(pool.kind, false, false)
            .op("to kind")?;
        // Σ_i w_i g_i elementwise, in the rows' own precision: a matmul
        // would round every gradient element to TF32 where TF32 is on.
        let _ = rows
            .f_mul(&weights.f_tr().op("t")?)
            .op("weigh rows")?
            .f_sum_intlist_out(&pool.aggregate, [0i64].as_slice(), true, None::<Kind>)
            .op("sum aggregate")?;
        fused::foreach_copy_(out, &pool.aggregate_views, false)?;
        // Increment row `1 + k` is the general path with `k` seeds: row `r`.
        self.add_increment(r)?;
        let stats = Tensor::f_stack(&[conflicts, projections, share], 0).op("stack")?;
        // conflicts, projections, share: three consecutive fields.
        let _ = self
            .accum
            .f_narrow(0, CONFLICTS, 3)
            .op("narrow")?
            .f_add_(&stats)
            .op("add_")?;
        self.last_general_rows = Some(r);
        Ok(AggPath::PcGrad)
    }

    /// [`Self::pcgrad`] on CUDA with the fused kernels
    /// ([`kernels`]): the Gram matrix, one launch for the coefficients, the
    /// weights and the step's metrics, one for the weighted sum of the rows.
    fn pcgrad_fused(
        &mut self,
        fused: &kernels::Kernels,
        rows: &Tensor,
        r: i64,
        out: &[Tensor],
    ) -> Result<AggPath> {
        let gram = torch_ext::nn::gram(rows)?;
        let Some(pool) = self.pool.as_ref() else {
            return Err(agg_error("out", "no layout".into()));
        };
        let weights = pool.weights.f_narrow(0, 0, r).op("narrow weights")?;
        fused.coefficients(
            &gram,
            r,
            &kernels::Tables {
                allowed: &self.allowed,
                upper: &self.upper,
                increments: &self.increments,
                coef: &self.coef,
                accum: &self.accum,
            },
            &weights,
        )?;
        fused.weighted_rows(rows, &weights, &pool.aggregate)?;
        fused::foreach_copy_(out, &pool.aggregate_views, false)?;
        self.last_general_rows = Some(r);
        Ok(AggPath::PcGrad)
    }
}

/// `|t| / (|t| + Σ|s_i'|)` from the row norms (row 0 the teacher); 0 when
/// every norm is 0.
pub(super) fn teacher_share(norms: &Tensor) -> Result<Tensor> {
    let total = norms
        .f_sum(Kind::Double)
        .op("sum")?
        .f_clamp_min(f64::MIN_POSITIVE)
        .op("clamp")?;
    norms.f_select(0, 0).op("select")?.f_div(&total).op("div")
}
