//! [`Sampler::conditioned_masks`]: the base masks conditioned on the chosen
//! ops (see the parent module's docs, step 2).

use tch::{Kind, Tensor};

use super::Sampler;
use crate::Result;
use crate::error::{TorchResultExt, shape_mismatch};
use crate::heads::{OP, SLOT, canonical_action};
use crate::masks::MaskTensors;
use leyline::NUM_ACTION_HEADS;

impl Sampler {
    /// The masks each head is chosen under, given the chosen `ops` (`[B]`):
    /// irrelevant heads forced to their canonical option, the slot head to
    /// `slot_by_op[op]` (see the module docs).
    pub fn conditioned_masks(
        &self,
        masks: &MaskTensors,
        ops: &Tensor,
    ) -> Result<[Tensor; NUM_ACTION_HEADS]> {
        let relevant = self.relevance(ops)?;
        let size = masks.slot_by_op.size();
        let (batch, num_slots) = match size.as_slice() {
            [batch, _, slots] => (*batch, *slots),
            _ => {
                return Err(shape_mismatch(
                    "conditioned_masks.slot_by_op",
                    "[B, ops, S]",
                    size,
                ));
            }
        };
        let index = ops
            .f_view([batch, 1, 1])
            .op("slot by op index")?
            .f_expand([batch, 1, num_slots], false)
            .op("slot by op index")?;
        let slot_base = masks
            .slot_by_op
            .f_gather(1, &index, false)
            .op("slot by op")?
            .f_squeeze_dim(1)
            .op("slot by op")?;
        let mut out = Vec::with_capacity(NUM_ACTION_HEADS);
        for (head, base) in masks.heads.iter().enumerate() {
            if head == OP {
                out.push(base.shallow_clone());
                continue;
            }
            let base = if head == SLOT {
                slot_base.shallow_clone()
            } else {
                base.shallow_clone()
            };
            let width = base.size().get(1).copied().unwrap_or(0);
            let canonical = match canonical_action(head) {
                Some(option) => Tensor::f_full([batch], option, (Kind::Int64, self.device))
                    .op("canonical option")?,
                // First allowed slot.
                None => base
                    .f_to_kind(Kind::Int)
                    .op("first slot")?
                    .f_argmax(-1, false)
                    .op("first slot")?,
            };
            let forced = canonical
                .f_one_hot(width)
                .op("canonical one-hot")?
                .f_to_kind(Kind::Bool)
                .op("canonical one-hot")?;
            let keep = relevant
                .f_select(1, i64::try_from(head).unwrap_or(0))
                .op("relevance column")?
                .f_unsqueeze(1)
                .op("relevance column")?;
            out.push(base.f_where_self(&keep, &forced).op("conditioned mask")?);
        }
        out.try_into()
            .map_err(|_| shape_mismatch("conditioned_masks", NUM_ACTION_HEADS, "another count"))
    }
}
