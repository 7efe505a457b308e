//! [`SampledActions`]: one batch of sampled actions, log-probabilities,
//! entropies, relevance and conditioned masks, on the device.

use tch::{Device, Tensor};

use crate::error::TorchResultExt;
use crate::heads::FactoredAction;
use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

#[cfg(doc)]
use leyline::HEAD_NAMES;

/// One batch of sampled actions (all on the device).
#[derive(Debug)]
pub struct SampledActions {
    /// `[B, 8]` i64, one index per head in [`HEAD_NAMES`] order.
    pub actions: Tensor,
    /// `[B, 8]` fp32 log-probabilities of the chosen options.
    pub log_probs: Tensor,
    /// `[B, 8]` fp32 normalised entropies.
    pub entropies: Tensor,
    /// `[B, 8]` bool: which heads causally matter for each row's op.
    pub relevance: Tensor,
    /// The op-conditioned masks the heads were sampled under.
    pub masks: [Tensor; NUM_ACTION_HEADS],
}

impl SampledActions {
    /// The actions on the host (one readback for the batch).
    pub fn to_host(&self, num_slots: usize) -> Result<Vec<FactoredAction>> {
        let host = self
            .actions
            .f_to_device(Device::Cpu)
            .op("actions readback")?
            .f_contiguous()
            .op("actions readback")?
            .f_view(-1)
            .op("actions readback")?;
        let values = Vec::<i64>::try_from(&host).op("actions readback")?;
        let rows = self.actions.size().first().copied().unwrap_or(0);
        let expected = usize::try_from(rows)
            .unwrap_or(0)
            .saturating_mul(NUM_ACTION_HEADS);
        if values.len() != expected {
            return Err(Error::Readback {
                what: "actions",
                expected,
                got: values.len(),
            });
        }
        values
            .chunks_exact(NUM_ACTION_HEADS)
            .map(|row| {
                let mut indices = [0_i64; NUM_ACTION_HEADS];
                indices.copy_from_slice(row);
                FactoredAction::from_indices(&indices, num_slots)
            })
            .collect()
    }
}
