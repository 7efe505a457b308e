//! [`Sampler::evaluate_actions`]: log-probabilities and entropies of stored
//! actions, as the PPO update asks for them.

use tch::{Kind, Tensor};

use super::{Sampler, log_prob, normalized_entropy};
use crate::Result;
use crate::error::{TorchResultExt, shape_mismatch};
use crate::heads::{OP, SLOT};
use crate::masks::MaskTensors;
use leyline::NUM_ACTION_HEADS;

impl Sampler {
    /// Log-probabilities and entropies (`[B, 8]` each, fp32) of stored
    /// `actions` (`[B, 8]` i64) under raw `logits` and the base `masks`,
    /// conditioned on the stored ops exactly as [`Sampler::sample`] did.
    /// Masks are checked as everywhere ([`MaskTensors::check`]); the logits'
    /// values are not (the PPO update checks its loss).
    pub fn evaluate_actions(
        &self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        masks: &MaskTensors,
        actions: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let batch = actions.size().first().copied().unwrap_or(0);
        let num_slots = logits
            .get(SLOT)
            .and_then(|logits| logits.size().get(1).copied())
            .and_then(|slots| usize::try_from(slots).ok())
            .unwrap_or(0);
        let expected = [batch, i64::try_from(NUM_ACTION_HEADS).unwrap_or(0)];
        if actions.size() != expected || actions.kind() != Kind::Int64 {
            return Err(shape_mismatch(
                "evaluate_actions.actions",
                format!("Int64 {expected:?}"),
                (actions.kind(), actions.size()),
            ));
        }
        self.check_logits(logits, batch, num_slots)?;
        masks.check(batch, num_slots, self.device)?;
        let ops = actions
            .f_select(1, i64::try_from(OP).unwrap_or(0))
            .op("stored ops")?;
        let conditioned = self.conditioned_masks(masks, &ops)?;
        let mut log_probs = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut entropies = Vec::with_capacity(NUM_ACTION_HEADS);
        for (head, (logits, mask)) in logits.iter().zip(conditioned.iter()).enumerate() {
            let masked = self.head_logits(head, logits, mask)?;
            let action = actions
                .f_select(1, i64::try_from(head).unwrap_or(0))
                .op("stored action")?;
            log_probs.push(log_prob(&masked, &action)?);
            entropies.push(normalized_entropy(&masked, mask)?);
        }
        Ok((
            Tensor::f_stack(&log_probs, 1).op("stack log probs")?,
            Tensor::f_stack(&entropies, 1).op("stack entropies")?,
        ))
    }
}
