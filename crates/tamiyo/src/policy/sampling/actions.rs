//! [`SampledActions`]: one batch of sampled actions, log-probabilities,
//! entropies, relevance and conditioned masks, on the device; and
//! [`ActionReadback`], the reusable page-locked buffer a rollout reads its
//! actions back through.

use tch::{Device, Kind, Tensor};
use torch_ext::{CudaEvent, CudaStream};

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
        self.decode(&values, num_slots)
    }

    /// [`SampledActions::to_host`] through `readback`'s page-locked buffer:
    /// one queued copy, one event wait and a plain read of host memory,
    /// where `to_host` allocates a host tensor and runs four libtorch ops.
    /// The same actions, in the same order.
    pub fn to_host_via(
        &self,
        readback: &mut ActionReadback,
        num_slots: usize,
    ) -> Result<Vec<FactoredAction>> {
        let values = readback.read(&self.actions)?;
        self.decode(values, num_slots)
    }

    /// The actions of `values` (row-major `[B, 8]`), checked against the
    /// batch's rows.
    pub(crate) fn decode(&self, values: &[i64], num_slots: usize) -> Result<Vec<FactoredAction>> {
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

/// A reusable readback of one `[B, 8]` `i64` action tensor: on CUDA a
/// page-locked host buffer of that shape, filled by one non-blocking copy
/// and read after an event recorded behind it; elsewhere a plain copy. Made
/// once per rollout shape ([`ActionReadback::new`]), so a step allocates
/// nothing.
#[derive(Debug)]
pub struct ActionReadback {
    rows: i64,
    /// `(pinned host buffer, event behind its copy)`, on CUDA only.
    pinned: Option<(Tensor, CudaEvent, usize)>,
    values: Vec<i64>,
}

impl ActionReadback {
    /// A readback of `rows` rows of actions from `device`.
    pub fn new(rows: usize, device: Device) -> Result<Self> {
        let rows_i64 = i64::try_from(rows).map_err(|_| Error::InvalidConfig {
            field: "ActionReadback.rows",
            reason: format!("{rows} rows do not fit an i64"),
        })?;
        let heads = i64::try_from(NUM_ACTION_HEADS).unwrap_or(i64::MAX);
        let torch_error = |error: torch_ext::Error| Error::InvalidInput {
            field: "ActionReadback",
            reason: error.to_string(),
        };
        let pinned = match device {
            Device::Cuda(index) => {
                let plain = Tensor::f_zeros([rows_i64, heads], (Kind::Int64, Device::Cpu))
                    .op("readback host buffer")?;
                Some((
                    torch_ext::memory::pin(&plain).map_err(torch_error)?,
                    CudaEvent::new(false).map_err(torch_error)?,
                    index,
                ))
            }
            _ => None,
        };
        Ok(Self {
            rows: rows_i64,
            pinned,
            values: vec![0; rows.saturating_mul(NUM_ACTION_HEADS)],
        })
    }

    /// Rows per read.
    pub fn rows(&self) -> usize {
        usize::try_from(self.rows).unwrap_or(0)
    }

    /// The values of `actions` (`[rows, 8]` `i64`), row after row. A tensor
    /// of another shape or kind is refused before any copy.
    pub fn read(&mut self, actions: &Tensor) -> Result<&[i64]> {
        let heads = i64::try_from(NUM_ACTION_HEADS).unwrap_or(i64::MAX);
        if actions.size() != [self.rows, heads] || actions.kind() != Kind::Int64 {
            return Err(Error::InvalidInput {
                field: "ActionReadback.actions",
                reason: format!(
                    "expected [{}, {heads}] Int64, got {:?} {:?}",
                    self.rows,
                    actions.size(),
                    actions.kind()
                ),
            });
        }
        let torch_error = |error: torch_ext::Error| Error::InvalidInput {
            field: "ActionReadback",
            reason: error.to_string(),
        };
        let count = self.values.len();
        match &mut self.pinned {
            Some((host, event, index)) if actions.device() == Device::Cuda(*index) => {
                torch_ext::copy_non_blocking(host, actions).map_err(torch_error)?;
                let stream = CudaStream::current(*index).map_err(torch_error)?;
                event.record(&stream).map_err(torch_error)?;
                event.synchronize().map_err(torch_error)?;
                host.f_copy_data(&mut self.values, count)
                    .op("actions readback")?;
            }
            _ => {
                actions
                    .f_copy_data(&mut self.values, count)
                    .op("actions readback")?;
            }
        }
        Ok(&self.values)
    }
}

/// The readback inside a captured step (crate-internal, used by
/// [`crate::policy::GraphedAct`]): the copy into the page-locked buffer is
/// part of the graph, and the host waits for the replay, then reads.
impl ActionReadback {
    /// Queues the raw copy of `actions` into the page-locked buffer
    /// ([`torch_ext::memcpy_async`], capturable). `false`, with nothing
    /// queued, where that cannot serve: not on CUDA, or `actions` not a
    /// contiguous `[rows, 8]` `i64` on the buffer's device.
    pub(crate) fn capture_copy(&self, actions: &Tensor) -> Result<bool> {
        let heads = i64::try_from(NUM_ACTION_HEADS).unwrap_or(i64::MAX);
        let Some((host, _, index)) = &self.pinned else {
            return Ok(false);
        };
        if actions.device() != Device::Cuda(*index)
            || actions.size() != [self.rows, heads]
            || actions.kind() != Kind::Int64
            || !actions.is_contiguous()
        {
            return Ok(false);
        }
        torch_ext::memcpy_async(host, actions).map_err(|error| Error::InvalidInput {
            field: "ActionReadback.capture_copy",
            reason: error.to_string(),
        })?;
        Ok(true)
    }

    /// Marks the end of the work that fills the buffer (a replay queued on
    /// `stream`); [`ActionReadback::read_filled`] waits for it.
    pub(crate) fn mark_filled(&self, stream: &CudaStream) -> Result<()> {
        if let Some((_, event, _)) = &self.pinned {
            event.record(stream).map_err(|error| Error::InvalidInput {
                field: "ActionReadback.mark_filled",
                reason: error.to_string(),
            })?;
        }
        Ok(())
    }

    /// The buffer's values once the marked work has run.
    pub(crate) fn read_filled(&mut self) -> Result<&[i64]> {
        let count = self.values.len();
        let Some((host, event, _)) = &self.pinned else {
            return Err(Error::InvalidInput {
                field: "ActionReadback.read_filled",
                reason: "no page-locked buffer (not on CUDA)".to_owned(),
            });
        };
        event.synchronize().map_err(|error| Error::InvalidInput {
            field: "ActionReadback.read_filled",
            reason: error.to_string(),
        })?;
        host.f_copy_data(&mut self.values, count)
            .op("actions readback")?;
        Ok(&self.values)
    }
}
