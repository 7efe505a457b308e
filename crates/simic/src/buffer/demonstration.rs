//! A demonstrator's actions in place of the policy's samples
//! ([`RolloutBuffer::record_demonstration`]), for the imitation warm-up
//! (`crate::vectorized::ImitationConfig`), and its labels beside the
//! policy's own actions ([`RolloutBuffer::record_anchor`]), for the anchor
//! after it.

use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;
use crate::{Error, Result};
use leyline::{LifecycleOp, NUM_ACTION_HEADS};

use super::{RolloutBuffer, dim};

/// What one environment's row of a driven step holds for the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demonstration {
    /// The demonstrator's action (head indices in `leyline::HEAD_NAMES`
    /// order, as [`tamiyo::heads::FactoredAction::indices`]), which the
    /// policy's masks allow: it replaces the policy's sample, and the heads
    /// that matter for its op become the row's relevance.
    Imitate([i64; NUM_ACTION_HEADS]),
    /// A demonstrated action the policy's masks forbid: carried out, not
    /// imitated (no head of the row is relevant, so no policy term reads
    /// it; its value target stays).
    Skip,
}

impl RolloutBuffer {
    /// Rewrites the actions and the head relevance of `step` with a
    /// demonstrator's: `rows[e]` is environment `e`'s ([`Demonstration`]),
    /// `None` where no action was demonstrated (the row is left as the
    /// policy wrote it). Call it after the step's policy columns are
    /// written. Two small uploads and two masked copies on the device, no
    /// readback. Every argument is checked before anything is written: the
    /// step, the row count, and each head's index against the head's size
    /// (an index out of range would reach libtorch's gather in the
    /// update).
    pub fn record_demonstration(
        &mut self,
        step: usize,
        rows: &[Option<Demonstration>],
    ) -> Result<()> {
        if step >= self.shape.max_steps || !self.written.get(step).copied().unwrap_or(false) {
            return Err(Error::Buffer(format!(
                "demonstration at step {step}: the step's policy columns are not written ({} \
                 steps per round)",
                self.shape.max_steps
            )));
        }
        if rows.len() != self.shape.n_envs {
            return Err(Error::Buffer(format!(
                "{} demonstrated rows for {} environments",
                rows.len(),
                self.shape.n_envs
            )));
        }
        let heads = NUM_ACTION_HEADS;
        let mut actions = vec![0_i64; rows.len().saturating_mul(heads)];
        let mut relevance = vec![false; rows.len().saturating_mul(heads)];
        let mut replace = vec![false; rows.len()];
        let mut touched = vec![false; rows.len()];
        for (env, row) in rows.iter().enumerate() {
            let span = env.saturating_mul(heads)..env.saturating_add(1).saturating_mul(heads);
            match row {
                None => {}
                Some(Demonstration::Skip) => {
                    if let Some(flag) = touched.get_mut(env) {
                        *flag = true;
                    }
                }
                Some(Demonstration::Imitate(indices)) => {
                    let op = self.demonstrated_op(env, indices)?;
                    if let Some(slice) = actions.get_mut(span.clone()) {
                        slice.copy_from_slice(indices);
                    }
                    if let Some(slice) = relevance.get_mut(span) {
                        slice.copy_from_slice(&tamiyo::heads::relevance(op));
                    }
                    for flags in [&mut replace, &mut touched] {
                        if let Some(flag) = flags.get_mut(env) {
                            *flag = true;
                        }
                    }
                }
            }
        }
        if !touched.contains(&true) {
            return Ok(());
        }
        let device = self.device;
        let width = dim(heads);
        let actions = upload(&actions, width, device)?;
        let relevance = upload(&relevance, width, device)?;
        let replace = upload(&replace, 1, device)?;
        let touched = upload(&touched, 1, device)?;
        let t = dim(step);
        let action_column = Self::column(&self.actions, t)?;
        let merged = actions
            .f_where_self(&replace, &action_column)
            .op("demonstration")?;
        action_column
            .shallow_clone()
            .f_copy_(&merged)
            .op("demonstration")?;
        let relevance_column = Self::column(&self.relevance, t)?;
        let merged = relevance
            .f_where_self(&touched, &relevance_column)
            .op("demonstration")?
            .f_to_kind(Kind::Bool)
            .op("demonstration")?;
        relevance_column
            .shallow_clone()
            .f_copy_(&merged)
            .op("demonstration")?;
        Ok(())
    }
    /// The op of a demonstrated action `indices` of environment `env`,
    /// after checking each head's index against the head's size (an index
    /// out of range would reach libtorch's gather in the update).
    fn demonstrated_op(
        &self,
        env: usize,
        indices: &[i64; NUM_ACTION_HEADS],
    ) -> Result<LifecycleOp> {
        let sizes = tamiyo::heads::head_sizes(self.shape.num_slots);
        if let Some((head, (index, size))) =
            indices
                .iter()
                .zip(sizes)
                .enumerate()
                .find(|(_, (index, size))| {
                    usize::try_from(**index).map_or(true, |index| index >= *size)
                })
        {
            return Err(Error::Buffer(format!(
                "demonstrated action {indices:?} of environment {env}: index {index} of head {} \
                 is outside its {size} options",
                leyline::HEAD_NAMES.get(head).unwrap_or(&"?")
            )));
        }
        indices
            .get(tamiyo::heads::OP)
            .and_then(|&value| i32::try_from(value).ok())
            .and_then(|value| LifecycleOp::from_value(value).ok())
            .ok_or_else(|| {
                Error::Buffer(format!(
                    "demonstrated action {indices:?} of environment {env} has no op"
                ))
            })
    }

    /// Records the anchor's labels at `step` ([`crate::vectorized::ImitationConfig::anchor_weight`]):
    /// `rows[e]` is what the demonstrator would have done in environment
    /// `e`'s state, where the policy acted ([`Demonstration::Imitate`]: the
    /// heads that matter for its op become the label's weights;
    /// [`Demonstration::Skip`] or `None`: no label). The labels stay on the
    /// host until [`RolloutBuffer::finish`] uploads them with the rewards
    /// ([`super::Rollout::anchor`]). Checked as
    /// [`RolloutBuffer::record_demonstration`] checks its rows; a refused
    /// call records nothing.
    pub fn record_anchor(&mut self, step: usize, rows: &[Option<Demonstration>]) -> Result<()> {
        if step >= self.shape.max_steps {
            return Err(Error::Buffer(format!(
                "anchor labels at step {step}: past the last column ({} steps per round)",
                self.shape.max_steps
            )));
        }
        if rows.len() != self.shape.n_envs {
            return Err(Error::Buffer(format!(
                "{} anchor rows for {} environments",
                rows.len(),
                self.shape.n_envs
            )));
        }
        let mut labels = Vec::with_capacity(rows.len());
        for (env, row) in rows.iter().enumerate() {
            if let Some(Demonstration::Imitate(indices)) = row {
                let op = self.demonstrated_op(env, indices)?;
                labels.push((env, *indices, tamiyo::heads::relevance(op)));
            }
        }
        let heads = NUM_ACTION_HEADS;
        let cells = self
            .shape
            .n_envs
            .saturating_mul(self.shape.max_steps)
            .saturating_mul(heads);
        let anchor = self.anchor.get_or_insert_with(|| super::AnchorLabels {
            actions: vec![0; cells],
            relevance: vec![false; cells],
        });
        for (env, indices, relevant) in labels {
            let start = env
                .saturating_mul(self.shape.max_steps)
                .saturating_add(step)
                .saturating_mul(heads);
            let span = start..start.saturating_add(heads);
            if let Some(slice) = anchor.actions.get_mut(span.clone()) {
                slice.copy_from_slice(&indices);
            }
            if let Some(slice) = anchor.relevance.get_mut(span) {
                slice.copy_from_slice(&relevant);
            }
        }
        Ok(())
    }
}

impl RolloutBuffer {
    /// The anchor's labels as device tensors (`None` when none was
    /// recorded this round): actions `[E, T, 8]` i64, relevance
    /// `[E, T, 8]` f32.
    pub(super) fn anchor_targets(&self) -> Result<Option<super::AnchorTargets>> {
        let Some(anchor) = &self.anchor else {
            return Ok(None);
        };
        let (e, t, h) = (
            dim(self.shape.n_envs),
            dim(self.shape.max_steps),
            dim(NUM_ACTION_HEADS),
        );
        let reshape = |tensor: Tensor| tensor.f_reshape([e, t, h]).op("anchor labels");
        let actions = reshape(upload(&anchor.actions, h, self.device)?)?;
        let relevance: Vec<f32> = anchor
            .relevance
            .iter()
            .map(|&relevant| if relevant { 1.0 } else { 0.0 })
            .collect();
        let relevance = reshape(upload(&relevance, h, self.device)?)?;
        Ok(Some(super::AnchorTargets { actions, relevance }))
    }
}

/// `values` as a `[len / width, width]` tensor on `device`.
fn upload<T: tch::kind::Element>(values: &[T], width: i64, device: Device) -> Result<Tensor> {
    let rows = dim(values.len()).checked_div(width).unwrap_or(0);
    Tensor::f_from_slice(values)
        .op("demonstration")?
        .f_reshape([rows, width])
        .op("demonstration")?
        .f_to_device(device)
        .op("demonstration upload")
}
