//! The policy heads as one packed computation (see
//! [`PolicyNetwork::outputs`](super::PolicyNetwork)): the concatenated
//! first layers in one product, the blueprint head's middle layer, every
//! head's output layer as one product of its hidden slice with all output
//! weights, and a gather of each head's own block.

use tch::Tensor;

use super::{PolicyNetwork, as_i64};
use crate::Result;
use crate::error::{TorchResultExt, shape_mismatch};
use crate::heads::BLUEPRINT;
use leyline::NUM_ACTION_HEADS;

impl PolicyNetwork {
    /// Every head's logits, packed `[..., total]` in [`leyline::HEAD_NAMES`]
    /// order (see [`PolicyNetwork::outputs`]).
    pub(super) fn packed_logits(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = self.config.hidden_dim;
        let half = hidden / 2;
        let mut first_w = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut first_b = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut out_w = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut out_b = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut middle = None;
        for (head, mlp) in self.heads.iter().enumerate() {
            let layers = mlp.linears();
            let (Some(first), Some(last)) = (layers.first(), layers.last()) else {
                return Err(shape_mismatch("policy head layers", "at least 2", 0));
            };
            first_w.push(first.weight());
            first_b.push(first.bias());
            out_w.push(last.weight());
            out_b.push(last.bias());
            if head == BLUEPRINT {
                middle = layers.get(1).copied();
            }
        }
        let middle = middle.ok_or_else(|| shape_mismatch("blueprint head", "3 layers", 2))?;
        let first = x
            .f_linear(
                &Tensor::f_cat(&first_w, 0).op("head weights")?,
                Some(&Tensor::f_cat(&first_b, 0).op("head biases")?),
            )
            .op("heads first layer")?
            .f_relu()
            .op("heads relu")?;
        // The blueprint head's first layer is `hidden` wide, the others
        // `half`; its middle layer brings it to `half` like the rest.
        let before = as_i64(BLUEPRINT).saturating_mul(half);
        let after = as_i64(NUM_ACTION_HEADS - 1 - BLUEPRINT).saturating_mul(half);
        let blueprint = middle
            .forward(&first.f_narrow(-1, before, hidden).op("blueprint slice")?)?
            .f_relu()
            .op("blueprint relu")?;
        let mut parts = Vec::with_capacity(3);
        if before > 0 {
            parts.push(first.f_narrow(-1, 0, before).op("heads before")?);
        }
        parts.push(blueprint);
        if after > 0 {
            parts.push(
                first
                    .f_narrow(-1, before.saturating_add(hidden), after)
                    .op("heads after")?,
            );
        }
        let mut shape = x.size();
        shape.pop();
        let lead = shape.clone();
        shape.extend([as_i64(NUM_ACTION_HEADS), half]);
        let per_head = Tensor::f_cat(&parts, -1)
            .op("heads hidden")?
            .f_reshape(&shape)
            .op("heads hidden")?;
        let all = per_head
            .f_linear(
                &Tensor::f_cat(&out_w, 0).op("output weights")?,
                Some(&Tensor::f_cat(&out_b, 0).op("output biases")?),
            )
            .op("heads output layer")?;
        let total = self.head_of.size().first().copied().unwrap_or(0);
        let mut index_shape = vec![1_i64; lead.len()];
        index_shape.extend([1, total]);
        let mut expanded = lead;
        expanded.extend([1, total]);
        let index = self
            .head_of
            .f_view(index_shape.as_slice())
            .op("head index")?
            .f_expand(expanded.as_slice(), false)
            .op("head index")?;
        all.f_gather(-2, &index, false)
            .op("heads gather")?
            .f_squeeze_dim(-2)
            .op("heads gather")
    }
}
