//! The auxiliary losses of the policy's extra heads (reference §3.4, §4.2),
//! added to the PPO loss when the evaluation carries them:
//!
//! - the Q head: `0.5·⟨(Q(s, op) − R)²⟩_c`, the value loss's form against
//!   the same normalised returns `R` and critic weights `c`, scaled by the
//!   value coefficient like the value loss (the reference's
//!   `0.5·c_v·Q-aux`). The head reads the trunk detached, so this trains
//!   the Q head only: it is telemetry of how well the trunk predicts
//!   returns per op;
//! - the contribution predictor: the masked mean of `(p − clip(y, ±10))²`
//!   over the slots whose contribution `y` was measured at that step,
//!   scaled by `contribution_aux_coef` (0.05) times a linear warm-up over
//!   the first `contribution_aux_warmup` transitions (1000). Its gradient
//!   reaches the trunk.

use tch::{Kind, Tensor};

use super::{PpoBatch, shape_error};
use crate::Result;
use crate::error::TorchResultExt;

/// Contribution targets are clipped to this many percentage points.
pub const CONTRIBUTION_TARGET_CLIP: f64 = 10.0;

/// The auxiliary heads' evaluation of a set of rows (`[r, T]` for Q,
/// `[r, T, S]` for the contributions), fp32 on the batch's device.
#[derive(Debug)]
pub struct AuxiliaryEvaluation {
    /// Q(s, op taken), with gradient to the Q head.
    pub q: Tensor,
    /// Predicted contribution per slot, with gradient.
    pub contribution: Tensor,
    /// Measured contribution per slot (percentage points; any value where
    /// the mask is 0).
    pub contribution_target: Tensor,
    /// 1 where a contribution was measured, 0 elsewhere.
    pub contribution_mask: Tensor,
}

/// The two auxiliary terms, 0-dim `f32`, before their coefficients.
pub(super) struct AuxiliaryTerms {
    /// `0.5·⟨(Q − R)²⟩_c`.
    pub(super) q: Tensor,
    /// Masked mean squared error of the contribution predictor.
    pub(super) contribution: Tensor,
}

/// The auxiliary terms of `aux` against `batch` (see the module docs).
pub(super) fn terms(batch: &PpoBatch, aux: &AuxiliaryEvaluation) -> Result<AuxiliaryTerms> {
    let steps = batch.advantages.size();
    if aux.q.size() != steps {
        return Err(shape_error(
            "AuxiliaryEvaluation.q",
            format!("{steps:?}"),
            aux.q.size(),
        ));
    }
    let slots_shape = aux.contribution.size();
    let fits_steps = slots_shape.len() == 3 && slots_shape.get(..2) == Some(steps.as_slice());
    if !fits_steps {
        return Err(shape_error(
            "AuxiliaryEvaluation.contribution",
            format!("{steps:?} + [S]"),
            slots_shape,
        ));
    }
    for (what, tensor) in [
        (
            "AuxiliaryEvaluation.contribution_target",
            &aux.contribution_target,
        ),
        (
            "AuxiliaryEvaluation.contribution_mask",
            &aux.contribution_mask,
        ),
    ] {
        if tensor.size() != slots_shape {
            return Err(shape_error(what, format!("{slots_shape:?}"), tensor.size()));
        }
    }
    let q_error = aux
        .q
        .f_to_kind(Kind::Float)
        .op("q aux")?
        .f_sub(&batch.returns)
        .op("q aux")?
        .f_square()
        .op("q aux")?;
    let q = super::loss::weighted_mean(&q_error, &batch.value_weight, &[0, 1])?
        .f_mul_scalar(0.5)
        .op("q aux")?;
    let mask = aux
        .contribution_mask
        .f_to_kind(Kind::Float)
        .op("contribution aux")?;
    let target = aux
        .contribution_target
        .f_to_kind(Kind::Float)
        .op("contribution aux")?
        .f_clamp(-CONTRIBUTION_TARGET_CLIP, CONTRIBUTION_TARGET_CLIP)
        .op("contribution aux")?
        .f_detach()
        .op("contribution aux")?;
    let error = aux
        .contribution
        .f_to_kind(Kind::Float)
        .op("contribution aux")?
        .f_sub(&target)
        .op("contribution aux")?
        .f_square()
        .op("contribution aux")?;
    let contribution = super::loss::weighted_mean(&error, &mask, &[0, 1, 2])?;
    Ok(AuxiliaryTerms { q, contribution })
}
