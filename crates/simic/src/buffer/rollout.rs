//! One round on the device ([`Rollout`]), as [`RolloutBuffer::finish`]
//! hands it over, and the PPO batch built from it.

use tamiyo::masks::MaskTensors;
use tch::{Kind, Tensor};

use crate::error::TorchResultExt;
use crate::ppo::PpoBatch;
use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

#[cfg(doc)]
use super::RolloutBuffer;
use super::shape_error;

/// One round on the device, `[E, T, ...]` (see [`RolloutBuffer::finish`]).
#[derive(Debug)]
pub struct Rollout {
    /// `[E, T, obs_dim]` f32 observations (as the policy saw them).
    pub obs: Tensor,
    /// `[E, T, S]` i64 blueprint indices.
    pub blueprints: Tensor,
    /// `[E, T, 8]` i64 actions.
    pub actions: Tensor,
    /// `[E, T, 8]` f32 log-probabilities at sampling time.
    pub log_probs: Tensor,
    /// `[E, T]` f32 critic values at sampling time.
    pub values: Tensor,
    /// `[E, T, 8]` bool causal relevance of each head.
    pub relevance: Tensor,
    /// `[E, T]` f32 bootstrap values.
    pub bootstrap: Tensor,
    /// Base masks per head, `[E, T, n_head]` bool.
    pub heads: [Tensor; NUM_ACTION_HEADS],
    /// `[E, T, ops, S]` bool.
    pub slot_by_op: Tensor,
    /// `[E, T]` f32 rewards.
    pub rewards: Tensor,
    /// `[E, T]` bool.
    pub terminated: Tensor,
    /// `[E, T]` bool.
    pub truncated: Tensor,
    /// `[E, T]` bool.
    pub forced: Tensor,
    /// `[E, T]` bool.
    pub valid: Tensor,
    /// `[E, T, S]` f32 contributions measured at each step (percentage
    /// points; 0 where none was).
    pub contributions: Tensor,
    /// `[E, T, S]` f32: 1 where a contribution was measured.
    pub contribution_mask: Tensor,
    /// The anchor's labels, when the round recorded any
    /// ([`super::RolloutBuffer::record_anchor`]).
    pub anchor: Option<AnchorTargets>,
}

/// What the demonstrator would have done at each step of a round the policy
/// drove: the anchor's labels (`crate::vectorized::ImitationConfig::anchor_weight`).
#[derive(Debug)]
pub struct AnchorTargets {
    /// `[E, T, 8]` i64 labelled actions (0 where none).
    pub actions: Tensor,
    /// `[E, T, 8]` f32: 1 for each head that matters for the labelled op,
    /// 0 everywhere else (and at steps without a label).
    pub relevance: Tensor,
}

impl Rollout {
    /// The base masks of `rows` (`[r]` i64), flattened to `[r·T, ...]` for
    /// the sampler's `evaluate_actions`.
    pub fn flat_masks(&self, rows: &Tensor) -> Result<MaskTensors> {
        let flat = |tensor: &Tensor| -> Result<Tensor> {
            let picked = tensor.f_index_select(0, rows).op("mask rows")?;
            let mut size = picked.size();
            let (Some(&r), Some(&t)) = (size.first(), size.get(1)) else {
                return Err(shape_error("flat_masks", "[E, T, ...]".to_owned(), tensor));
            };
            let rest = size.split_off(2);
            let mut shape = vec![r.saturating_mul(t)];
            shape.extend(rest);
            picked.f_reshape(&shape).op("mask flatten")
        };
        let heads = self
            .heads
            .iter()
            .map(flat)
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .map_err(|_| Error::ShapeMismatch {
                what: "flat_masks.heads",
                expected: NUM_ACTION_HEADS.to_string(),
                got: "another count".to_owned(),
            })?;
        Ok(MaskTensors {
            heads,
            slot_by_op: flat(&self.slot_by_op)?,
        })
    }

    /// The PPO batch of this round from `advantages` and critic targets
    /// `returns` (`[E, T]` each): head weights are the causal relevance,
    /// the actor weight is 0 on forced and invalid steps, the critic weight
    /// 0.2 on forced and 0 on invalid steps (reference §4.2).
    pub fn ppo_batch(&self, advantages: &Tensor, returns: &Tensor) -> Result<PpoBatch> {
        let valid = self.valid.f_to_kind(Kind::Float).op("valid")?;
        let forced = self.forced.f_to_kind(Kind::Float).op("forced")?;
        let free = forced.f_neg().op("free")?.f_add_scalar(1.0).op("free")?;
        let actor_weight = valid.f_mul(&free).op("actor weight")?;
        let value_weight = valid
            .f_mul(
                &free
                    .f_add(&forced.f_mul_scalar(0.2).op("forced weight")?)
                    .op("value weight")?,
            )
            .op("value weight")?;
        Ok(PpoBatch {
            log_probs: self.log_probs.shallow_clone(),
            advantages: advantages.shallow_clone(),
            returns: returns.shallow_clone(),
            old_values: self.values.shallow_clone(),
            head_weights: self.relevance.f_to_kind(Kind::Float).op("head weights")?,
            actor_weight,
            value_weight,
        })
    }
}
