//! The PPO loss of one minibatch (reference §4.2), as tensor operations on
//! the device, and its telemetry (approximate KL, clip fraction).
//!
//! With `r` rows of `T` steps and `H` heads, new and old per-head
//! log-probabilities `ℓ`, `ℓ_old` `[r, T, H]`, advantages `A` `[r, T]`,
//! head relevance `h` `[r, T, H]`, actor weights `a` and value weights `c`
//! `[r, T]`, and `w_h = h·a` (a head's weight), every average below is a
//! weighted mean `⟨x⟩_w = Σ w·x / Σ w` (0 when `Σ w = 0`):
//!
//! - per head `ρ_h = exp(clamp(ℓ − ℓ_old, ±20))`, and the policy loss is
//!   `Σ_h −⟨min(ρ_h·A, clip(ρ_h, 1−ε, 1+ε)·A)⟩_{w_h}`: each head's ratio is
//!   clipped separately and averaged over the samples where it mattered
//!   (under [`Objective::Imitation`] it is `Σ_h −⟨ℓ_h⟩_{w_h}`, the
//!   negative log-likelihood of the batch's actions);
//! - the value loss is `0.5·⟨e⟩_c` with `e = (V − R)²`, or with value
//!   clipping `max((V − R)², (V_old + clip(V − V_old, ±κ) − R)²)`;
//! - each head's entropy is `H_h = ⟨entropy_h⟩_{w_h}` and the bonus is
//!   `Σ_h m_h·H_h` (per-head multipliers `m_h`);
//! - the floor penalty is `s·Σ_h k_h·max(0, f_h − H_h)²` over the heads that
//!   had any weight (floors `f_h`, coefficients `k_h`, schedule scale `s`);
//! - the total is `policy + c_v·value − c_e·bonus + penalty`, plus the
//!   auxiliary heads' terms when the evaluation carries them
//!   (`c_v·q + c_aux·contribution`, [`super::auxiliary`]), plus the
//!   anchor's `β·Σ_h −⟨ℓ^a_h⟩_{w^a_h}` when it carries one
//!   ([`super::AnchorEvaluation`]: the log-probabilities `ℓ^a` of a
//!   demonstrator's labels, weighted by the labels' head weights times `a`).
//!
//! Telemetry runs on the joint log-ratio of the relevant heads,
//! `λ = Σ_h h·(ℓ − ℓ_old)` (each term clamped as above): the approximate KL
//! `⟨(e^λ − 1) − λ⟩_a` and the clip fraction `⟨|e^λ − 1| > ε⟩_a`, both
//! without gradient.

use tch::{Device, Kind, Tensor};

use super::{Evaluation, PpoBatch, PpoConfig, shape_error};
use crate::error::TorchResultExt;
use crate::{Error, Result};

/// Per-head log-ratios are clamped to this magnitude before `exp`.
pub const LOG_RATIO_CLAMP: f64 = 20.0;

/// Smallest weight sum a weighted mean divides by (an empty set averages
/// to 0).
const WEIGHT_FLOOR: f64 = 1e-8;

/// The per-head coefficients of the loss, as `[H]` `f32` tensors on the
/// device (built once per trainer).
#[derive(Debug)]
pub struct HeadCoefficients {
    /// Entropy multipliers `m_h`.
    pub multipliers: Tensor,
    /// Entropy floors `f_h`.
    pub floors: Tensor,
    /// Floor-penalty coefficients `k_h`.
    pub floor_coefs: Tensor,
}

impl HeadCoefficients {
    /// The per-head settings of `config` on `device`.
    pub fn new(config: &PpoConfig, device: Device) -> Result<HeadCoefficients> {
        let upload = |values: &[f64]| -> Result<Tensor> {
            Tensor::f_from_slice(values)
                .op("head coefficients")?
                .f_to_kind(Kind::Float)
                .op("head coefficients")?
                .f_to_device(device)
                .op("head coefficients")
        };
        Ok(HeadCoefficients {
            multipliers: upload(&config.head_entropy_multipliers)?,
            floors: upload(&config.entropy_floors)?,
            floor_coefs: upload(&config.entropy_floor_coefs)?,
        })
    }
}

/// The scalar coefficients of one update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScalars {
    /// Ratio clip ε.
    pub clip: f64,
    /// Value coefficient `c_v` (after the warm-up).
    pub value_coef: f64,
    /// Value clip κ, if any.
    pub value_clip: Option<f64>,
    /// Entropy coefficient `c_e` (after the anneal).
    pub entropy_coef: f64,
    /// Floor-penalty schedule scale `s`.
    pub floor_scale: f64,
    /// Coefficient of the contribution predictor's loss (after its
    /// warm-up).
    pub contribution_coef: f64,
    /// What the policy term optimises (PPO's surrogate, or the imitation
    /// of the batch's actions).
    pub objective: Objective,
}

/// What an update's policy term optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Objective {
    /// PPO's clipped surrogate on the batch's advantages (reference §4.2).
    #[default]
    Ppo,
    /// The negative log-likelihood of the batch's actions (a
    /// demonstrator's: [`crate::vectorized::ImitationConfig`]), per head
    /// over the samples where the head mattered, summed over heads:
    /// `Σ_h −⟨ℓ_h⟩_{w_h}`. No ratio, no clip, no advantages. The stored
    /// log-probabilities are not those of the batch's actions, so the KL
    /// telemetry is not a distance between two policies and the KL early
    /// stop is off. The update makes `epochs` passes over the batch in
    /// place of [`super::PpoConfig::epochs`]: fitting a demonstration takes
    /// more gradient steps than one PPO update makes.
    Imitation {
        /// Passes over the batch (at least 1, at most
        /// [`super::config::MAX_EPOCHS`]).
        epochs: usize,
    },
}

impl LossScalars {
    /// Checks every coefficient: `clip` finite and > 0, `value_clip` (when
    /// set) finite and > 0, the other coefficients finite and >= 0; the
    /// error names the field, e.g. `LossScalars.clip`.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &'static str, value: f64, wanted: &str| Error::InvalidInput {
            field,
            reason: format!("{value} is not {wanted}"),
        };
        let positive = [
            ("LossScalars.clip", Some(self.clip)),
            ("LossScalars.value_clip", self.value_clip),
        ];
        for (field, value) in positive {
            if let Some(value) = value
                && !(super::config::finite_f32(value) && value > 0.0)
            {
                return Err(invalid(field, value, "a number > 0 finite as an f32"));
            }
        }
        for (field, value) in [
            ("LossScalars.value_coef", self.value_coef),
            ("LossScalars.entropy_coef", self.entropy_coef),
            ("LossScalars.floor_scale", self.floor_scale),
            ("LossScalars.contribution_coef", self.contribution_coef),
        ] {
            if !(super::config::finite_f32(value) && value >= 0.0) {
                return Err(invalid(field, value, "a number >= 0 finite as an f32"));
            }
        }
        Ok(())
    }
}

/// The loss of one minibatch and its parts, all 0-dim `f32` device tensors
/// except `head_entropies` (`[H]`). Only `total` carries gradient.
#[derive(Debug)]
pub struct LossTerms {
    /// `policy + c_v·value − c_e·bonus + penalty`.
    pub total: Tensor,
    /// The clipped surrogate summed over heads.
    pub policy: Tensor,
    /// `0.5·` weighted MSE (before `c_v`).
    pub value: Tensor,
    /// `Σ_h m_h·H_h` (before `c_e`).
    pub entropy_bonus: Tensor,
    /// The entropy-floor penalty (scaled).
    pub floor_penalty: Tensor,
    /// `H_h` per head, `[H]`.
    pub head_entropies: Tensor,
    /// Approximate KL on the joint ratio.
    pub approx_kl: Tensor,
    /// Fraction of samples whose joint ratio left `[1−ε, 1+ε]`.
    pub clip_fraction: Tensor,
    /// The Q head's loss `0.5·⟨(Q − R)²⟩_c` (0 without auxiliary heads).
    pub q: Tensor,
    /// The contribution predictor's masked MSE (0 without auxiliary heads).
    pub contribution: Tensor,
    /// The largest joint log-ratio over the samples with an actor weight
    /// (−inf without any).
    pub log_ratio_max: Tensor,
    /// The smallest joint log-ratio over those samples (+inf without any).
    pub log_ratio_min: Tensor,
    /// The anchor's negative log-likelihood before its coefficient (0
    /// without an anchor).
    pub anchor: Tensor,
}

/// `Σ_dims w·x / max(Σ_dims w, floor)` over `dims`.
pub(super) fn weighted_mean(x: &Tensor, weights: &Tensor, dims: &[i64]) -> Result<Tensor> {
    let numerator = x
        .f_mul(weights)
        .op("weighted mean")?
        .f_sum_dim_intlist(dims, false, Kind::Float)
        .op("weighted mean")?;
    let denominator = weights
        .f_sum_dim_intlist(dims, false, Kind::Float)
        .op("weighted mean")?
        .f_clamp_min(WEIGHT_FLOOR)
        .op("weighted mean")?;
    numerator.f_div(&denominator).op("weighted mean")
}

/// Checks that `evaluation` fits `batch` (`[r, T, H]`, `[r, T]`, on the
/// batch's device).
pub(super) fn check_evaluation(batch: &PpoBatch, evaluation: &Evaluation) -> Result<()> {
    let heads_shape = batch.log_probs.size();
    let steps_shape = batch.advantages.size();
    let device = batch.log_probs.device();
    let mut tensors = vec![
        ("Evaluation.log_probs", &evaluation.log_probs, &heads_shape),
        ("Evaluation.entropies", &evaluation.entropies, &heads_shape),
        ("Evaluation.values", &evaluation.values, &steps_shape),
    ];
    if let Some(anchor) = &evaluation.anchor {
        if !(super::config::finite_f32(anchor.coef) && anchor.coef >= 0.0) {
            return Err(Error::InvalidInput {
                field: "AnchorEvaluation.coef",
                reason: format!("{} is not a number >= 0 finite as an f32", anchor.coef),
            });
        }
        tensors.push((
            "AnchorEvaluation.log_probs",
            &anchor.log_probs,
            &heads_shape,
        ));
        tensors.push(("AnchorEvaluation.weights", &anchor.weights, &heads_shape));
    }
    for (what, tensor, expected) in tensors {
        if tensor.size() != *expected {
            return Err(shape_error(what, format!("{expected:?}"), tensor.size()));
        }
        if tensor.device() != device {
            return Err(shape_error(
                what,
                format!("a tensor on {device:?}"),
                tensor.device(),
            ));
        }
        if !tensor.is_floating_point() {
            return Err(shape_error(
                what,
                "a floating-point tensor".to_owned(),
                tensor.kind(),
            ));
        }
    }
    Ok(())
}

/// The loss of `batch` (a minibatch whose advantages are already
/// normalised) under `evaluation` of the current policy (see the module
/// docs).
///
/// # Shapes
/// `batch` as [`PpoBatch`] with `r` rows; `evaluation.log_probs` and
/// `entropies` `[r, T, H]`, `values` `[r, T]`; `coefficients` `[H]`.
///
/// # Errors
/// [`Error::InvalidInput`] for a coefficient of `scalars` out of range
/// ([`LossScalars::validate`]), [`Error::ShapeMismatch`] for a shape,
/// kind or device that does not fit. The values are not read back: a
/// non-finite input gives a non-finite loss, which
/// [`super::PpoTrainer`] refuses before its step.
pub fn ppo_loss(
    batch: &PpoBatch,
    evaluation: &Evaluation,
    coefficients: &HeadCoefficients,
    scalars: &LossScalars,
) -> Result<LossTerms> {
    scalars.validate()?;
    batch.check()?;
    check_evaluation(batch, evaluation)?;
    let heads = batch.log_probs.size().get(2).copied().unwrap_or(0);
    if coefficients.multipliers.size() != [heads] {
        return Err(shape_error(
            "HeadCoefficients.multipliers",
            format!("[{heads}]"),
            coefficients.multipliers.size(),
        ));
    }
    let float = |tensor: &Tensor| tensor.f_to_kind(Kind::Float).op("loss input");
    let new_log_probs = float(&evaluation.log_probs)?;
    let entropies = float(&evaluation.entropies)?;
    let values = float(&evaluation.values)?;

    // [r, T, H] head weights and [r, T, 1] advantages.
    let actor = batch.actor_weight.f_unsqueeze(-1).op("actor weight")?;
    let head_weights = batch.head_weights.f_mul(&actor).op("head weights")?;
    let advantages = batch.advantages.f_unsqueeze(-1).op("advantages")?;

    let log_ratio = new_log_probs
        .f_sub(&batch.log_probs)
        .op("log ratio")?
        .f_clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        .op("log ratio")?;
    let ratio = log_ratio.f_exp().op("ratio")?;
    let unclipped = ratio.f_mul(&advantages).op("surrogate")?;
    let clipped = ratio
        .f_clamp(1.0 - scalars.clip, 1.0 + scalars.clip)
        .op("surrogate")?
        .f_mul(&advantages)
        .op("surrogate")?;
    let surrogate = match scalars.objective {
        Objective::Ppo => unclipped.f_min_other(&clipped).op("surrogate")?,
        // Maximising the demonstrated actions' log-likelihood.
        Objective::Imitation { .. } => new_log_probs.shallow_clone(),
    };
    // Per head over rows and steps, then summed over heads.
    let policy = weighted_mean(&surrogate, &head_weights, &[0, 1])?
        .f_sum(Kind::Float)
        .op("policy loss")?
        .f_neg()
        .op("policy loss")?;

    let error = values
        .f_sub(&batch.returns)
        .op("value error")?
        .f_square()
        .op("value error")?;
    let error = match scalars.value_clip {
        Some(clip) => {
            let clipped_values = values
                .f_sub(&batch.old_values)
                .op("value clip")?
                .f_clamp(-clip, clip)
                .op("value clip")?
                .f_add(&batch.old_values)
                .op("value clip")?;
            let clipped_error = clipped_values
                .f_sub(&batch.returns)
                .op("value clip")?
                .f_square()
                .op("value clip")?;
            error.f_max_other(&clipped_error).op("value clip")?
        }
        None => error,
    };
    let value = weighted_mean(&error, &batch.value_weight, &[0, 1])?
        .f_mul_scalar(0.5)
        .op("value loss")?;

    let head_entropies = weighted_mean(&entropies, &head_weights, &[0, 1])?;
    let entropy_bonus = head_entropies
        .f_mul(&coefficients.multipliers)
        .op("entropy bonus")?
        .f_sum(Kind::Float)
        .op("entropy bonus")?;
    let seen = head_weights
        .f_sum_dim_intlist(&[0_i64, 1][..], false, Kind::Float)
        .op("floor penalty")?
        .f_gt(0.0)
        .op("floor penalty")?
        .f_to_kind(Kind::Float)
        .op("floor penalty")?;
    let floor_penalty = coefficients
        .floors
        .f_sub(&head_entropies)
        .op("floor penalty")?
        .f_clamp_min(0.0)
        .op("floor penalty")?
        .f_square()
        .op("floor penalty")?
        .f_mul(&coefficients.floor_coefs)
        .op("floor penalty")?
        .f_mul(&seen)
        .op("floor penalty")?
        .f_sum(Kind::Float)
        .op("floor penalty")?
        .f_mul_scalar(scalars.floor_scale)
        .op("floor penalty")?;

    let (q, contribution) = match &evaluation.auxiliary {
        Some(aux) => {
            let terms = super::auxiliary::terms(batch, aux)?;
            (terms.q, terms.contribution)
        }
        None => {
            let zero = || Tensor::f_zeros([], (Kind::Float, values.device())).op("no auxiliary");
            (zero()?, zero()?)
        }
    };
    // The anchor: the labels' negative log-likelihood, per head over the
    // acting samples where the label's head mattered, summed over heads.
    let (anchor, anchor_coef) = match &evaluation.anchor {
        Some(labels) => {
            let weights = labels
                .weights
                .f_to_kind(Kind::Float)
                .op("anchor weights")?
                .f_mul(&actor)
                .op("anchor weights")?;
            let nll = weighted_mean(&float(&labels.log_probs)?, &weights, &[0, 1])?
                .f_sum(Kind::Float)
                .op("anchor loss")?
                .f_neg()
                .op("anchor loss")?;
            (nll, labels.coef)
        }
        None => (
            Tensor::f_zeros([], (Kind::Float, values.device())).op("no anchor")?,
            0.0,
        ),
    };
    let total = policy
        .f_add(&anchor.f_mul_scalar(anchor_coef).op("total loss")?)
        .op("total loss")?
        .f_add(&value.f_mul_scalar(scalars.value_coef).op("total loss")?)
        .op("total loss")?
        .f_add(&q.f_mul_scalar(scalars.value_coef).op("total loss")?)
        .op("total loss")?
        .f_add(
            &contribution
                .f_mul_scalar(scalars.contribution_coef)
                .op("total loss")?,
        )
        .op("total loss")?
        .f_sub(
            &entropy_bonus
                .f_mul_scalar(scalars.entropy_coef)
                .op("total loss")?,
        )
        .op("total loss")?
        .f_add(&floor_penalty)
        .op("total loss")?;

    // Telemetry on the joint ratio of the relevant heads, without gradient.
    let joint = log_ratio
        .f_detach()
        .op("joint log ratio")?
        .f_mul(&batch.head_weights)
        .op("joint log ratio")?
        .f_sum_dim_intlist(&[-1_i64][..], false, Kind::Float)
        .op("joint log ratio")?;
    let joint_ratio_minus_one = joint
        .f_exp()
        .op("joint ratio")?
        .f_sub_scalar(1.0)
        .op("joint ratio")?;
    let kl = joint_ratio_minus_one.f_sub(&joint).op("approx kl")?;
    let approx_kl = weighted_mean(&kl, &batch.actor_weight, &[0, 1])?;
    let outside = joint_ratio_minus_one
        .f_abs()
        .op("clip fraction")?
        .f_gt(scalars.clip)
        .op("clip fraction")?
        .f_to_kind(Kind::Float)
        .op("clip fraction")?;
    let clip_fraction = weighted_mean(&outside, &batch.actor_weight, &[0, 1])?;
    // The extremes of the joint ratio, in log space, over the samples that
    // train the actor.
    let acting = batch.actor_weight.f_gt(0.0).op("ratio extremes")?;
    let log_ratio_max = joint
        .f_masked_fill(
            &acting.f_logical_not().op("ratio extremes")?,
            f64::NEG_INFINITY,
        )
        .op("ratio extremes")?
        .f_max()
        .op("ratio extremes")?;
    let log_ratio_min = joint
        .f_masked_fill(&acting.f_logical_not().op("ratio extremes")?, f64::INFINITY)
        .op("ratio extremes")?
        .f_min()
        .op("ratio extremes")?;

    let detach = |tensor: &Tensor| tensor.f_detach().op("loss detach");
    Ok(LossTerms {
        policy: detach(&policy)?,
        value: detach(&value)?,
        entropy_bonus: detach(&entropy_bonus)?,
        floor_penalty: detach(&floor_penalty)?,
        head_entropies: detach(&head_entropies)?,
        approx_kl,
        clip_fraction,
        q: detach(&q)?,
        contribution: detach(&contribution)?,
        log_ratio_max,
        log_ratio_min,
        anchor: detach(&anchor)?,
        total,
    })
}
