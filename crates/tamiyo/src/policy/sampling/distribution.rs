//! The distribution arithmetic of [`super`]: masking, the probability
//! floor, log-probabilities, normalised entropies and the masked argmax /
//! Gumbel-max choice, on libtorch ops (any device). The fused CUDA kernel
//! ([`crate::policy::fused_sampling`]) computes the same.

use tch::{Device, Kind, Tensor};

use super::{MASKED_LOGIT_VALUE, SampleMode};
use crate::Result;
use crate::error::{TorchResultExt, shape_mismatch};
use leyline::NUM_ACTION_HEADS;

/// `logits` (as fp32) with the options `mask` forbids at
/// [`MASKED_LOGIT_VALUE`].
pub fn mask_logits(logits: &Tensor, mask: &Tensor) -> Result<Tensor> {
    logits
        .f_to_kind(Kind::Float)
        .op("mask logits")?
        .f_where_scalarother(mask, MASKED_LOGIT_VALUE)
        .op("mask logits")
}

/// [`mask_logits`] for every head.
pub fn mask_all(
    logits: &[Tensor; NUM_ACTION_HEADS],
    masks: &[Tensor; NUM_ACTION_HEADS],
) -> Result<[Tensor; NUM_ACTION_HEADS]> {
    let masked = logits
        .iter()
        .zip(masks.iter())
        .map(|(logits, mask)| mask_logits(logits, mask))
        .collect::<Result<Vec<_>>>()?;
    masked
        .try_into()
        .map_err(|_| shape_mismatch("mask_all", NUM_ACTION_HEADS, "another count"))
}

/// The reference's floor-preserving renormalisation: every valid option
/// gets at least `min(floor, 0.99 / valid)` probability, the options above
/// it are scaled to fill the rest; returned as masked logits (log
/// probabilities, masked options at [`MASKED_LOGIT_VALUE`]).
pub fn apply_probability_floor(
    masked_logits: &Tensor,
    mask: &Tensor,
    floor: f64,
) -> Result<Tensor> {
    let probs = masked_logits
        .f_softmax(-1, Kind::Float)
        .op("floor softmax")?;
    let mask_f = mask.f_to_kind(Kind::Float).op("floor mask")?;
    let valid = mask_f
        .f_sum_dim_intlist(-1, true, Kind::Float)
        .op("floor count")?
        .f_clamp_min(1.0)
        .op("floor count")?;
    let effective = valid
        .f_reciprocal()
        .op("floor cap")?
        .f_mul_scalar(0.99)
        .op("floor cap")?
        .f_clamp_max(floor)
        .op("floor cap")?;
    let under = probs
        .f_lt_tensor(&effective)
        .op("floor under")?
        .f_logical_and(mask)
        .op("floor under")?;
    let over = probs
        .f_ge_tensor(&effective)
        .op("floor over")?
        .f_logical_and(mask)
        .op("floor over")?;
    let floor_mass = under
        .f_to_kind(Kind::Float)
        .op("floor mass")?
        .f_sum_dim_intlist(-1, true, Kind::Float)
        .op("floor mass")?
        .f_mul(&effective)
        .op("floor mass")?;
    let over_total = probs
        .f_where_scalarother(&over, 0.0)
        .op("floor over total")?
        .f_sum_dim_intlist(-1, true, Kind::Float)
        .op("floor over total")?
        .f_clamp_min(1e-8)
        .op("floor over total")?;
    let scale = floor_mass
        .f_neg()
        .op("floor rest")?
        .f_add_scalar(1.0)
        .op("floor rest")?
        .f_clamp_min(1e-8)
        .op("floor rest")?
        .f_div(&over_total)
        .op("floor scale")?;
    let scaled = probs.f_mul(&scale).op("floor scaled")?;
    let floored = effective
        .f_expand_as(&probs)
        .op("floor expand")?
        .f_where_self(&under, &scaled.f_where_self(&over, &probs).op("floor")?)
        .op("floor")?;
    floored
        .f_clamp_min(1e-8)
        .op("floor log")?
        .f_log()
        .op("floor log")?
        .f_where_scalarother(mask, MASKED_LOGIT_VALUE)
        .op("floor mask")
}

/// fp32 log-probabilities of `actions` (`[B]` i64) under `masked_logits`
/// (`[B, n]`).
pub fn log_prob(masked_logits: &Tensor, actions: &Tensor) -> Result<Tensor> {
    masked_logits
        .f_log_softmax(-1, Kind::Float)
        .op("log softmax")?
        .f_gather(-1, &actions.f_unsqueeze(-1).op("log prob index")?, false)
        .op("log prob gather")?
        .f_squeeze_dim(-1)
        .op("log prob squeeze")
}

/// Entropy over the valid options divided by `ln(valid)` (0 with one valid
/// option), fp32, `[B]`.
pub fn normalized_entropy(masked_logits: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let logits = masked_logits.f_to_kind(Kind::Float).op("entropy")?;
    let probs = logits.f_softmax(-1, Kind::Float).op("entropy softmax")?;
    let log_probs = logits.f_log_softmax(-1, Kind::Float).op("entropy log")?;
    let mask_f = mask.f_to_kind(Kind::Float).op("entropy mask")?;
    let raw = probs
        .f_mul(&log_probs)
        .op("entropy")?
        .f_mul(&mask_f)
        .op("entropy")?
        .f_sum_dim_intlist(-1, false, Kind::Float)
        .op("entropy")?
        .f_neg()
        .op("entropy")?;
    let valid = mask_f
        .f_sum_dim_intlist(-1, false, Kind::Float)
        .op("entropy count")?;
    let several = valid.f_gt(1.0).op("entropy count")?;
    let max_entropy = valid
        .f_clamp_min(1.0)
        .op("entropy max")?
        .f_log()
        .op("entropy max")?
        .f_where_scalarother(&several, 1.0)
        .op("entropy max")?
        .f_clamp_min(1e-8)
        .op("entropy max")?;
    raw.f_div(&max_entropy)
        .op("entropy normalise")?
        .f_where_scalarother(&several, 0.0)
        .op("entropy single")
}

/// The choice of each row: argmax of `masked_logits` (greedy) or of
/// `masked_logits + Gumbel noise` (sampled), over the options `mask`
/// allows only.
/// Where a sample's Gumbel noise comes from: draw `k` of a sample (op
/// first, then the other heads in order) is `noise(k, shape, device)`.
pub(super) type Noise<'a> = dyn FnMut(usize, &[i64], Device) -> Result<Tensor> + 'a;

pub(super) fn choose(
    masked_logits: &Tensor,
    mask: &Tensor,
    mode: SampleMode,
    noise: &mut Noise<'_>,
    draw: &mut usize,
) -> Result<Tensor> {
    let scores = match mode {
        SampleMode::Greedy => masked_logits.shallow_clone(),
        SampleMode::Stochastic => {
            let k = *draw;
            *draw = draw.saturating_add(1);
            let noise = noise(k, &masked_logits.size(), masked_logits.device())?;
            masked_logits.f_add(&noise).op("gumbel scores")?
        }
    };
    scores
        .f_where_scalarother(mask, f64::NEG_INFINITY)
        .op("choose mask")?
        .f_argmax(-1, false)
        .op("choose argmax")
}
