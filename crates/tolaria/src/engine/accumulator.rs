//! The engine's per-epoch device accumulator: the summed loss and hits every
//! step adds into, read back once at the end of the epoch.

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, TorchResultExt};

/// The engine's device accumulator of an epoch: `f32 [2]` holding the sum
/// of per-sample losses and the number of correct predictions (the sample
/// count is the host's: the batch plan). A step adds into it with
/// [`EpochAccumulator::add`]: five kernels, no readback.
#[derive(Debug)]
pub struct EpochAccumulator {
    values: Tensor,
    loss: Tensor,
    hits: Tensor,
    /// Pinned host memory the CUDA readback lands in (a copy into pinned
    /// memory is one DMA; into pageable memory it is staged).
    host: Option<Tensor>,
}

impl EpochAccumulator {
    /// A zeroed accumulator on `device` (the engine holds one; a test
    /// driving a [`Step`](super::Step) by hand makes its own).
    pub fn new(device: Device) -> Result<EpochAccumulator> {
        let values = Tensor::f_zeros([2], (Kind::Float, device)).op("accumulator zeros")?;
        let host = match device {
            Device::Cuda(_) => Some(torch_ext::memory::pin(
                &Tensor::f_zeros([2], (Kind::Float, Device::Cpu)).op("accumulator host")?,
            )?),
            _ => None,
        };
        Ok(EpochAccumulator {
            loss: values.f_select(0, 0).op("select")?,
            hits: values.f_select(0, 1).op("select")?,
            values,
            host,
        })
    }

    /// Adds one batch of `samples` samples: `mean_loss` (0-dim `f32`) times
    /// `samples`, and the hits of `logits` `[N, classes]` against `labels`
    /// `[N]`, scaled by `samples / N` (token models predict `N = B x T`
    /// labels; a sample then counts its fraction of correct tokens). Device
    /// work only.
    pub fn add(
        &self,
        mean_loss: &Tensor,
        logits: &Tensor,
        labels: &Tensor,
        samples: i64,
    ) -> Result<()> {
        let predictions = logits.size().first().copied().unwrap_or(0).max(1);
        let hits = logits
            .f_argmax(-1, false)
            .op("argmax")?
            .f_eq_tensor(labels)
            .op("eq")?
            .f_sum(Kind::Float)
            .op("sum")?;
        let loss = mean_loss
            .f_detach()
            .op("detach")?
            .f_to_kind(Kind::Float)
            .op("to_kind")?;
        torch_ext::fused::foreach_add_(
            std::slice::from_ref(&self.loss),
            std::slice::from_ref(&loss),
            samples as f64,
        )?;
        torch_ext::fused::foreach_add_(
            std::slice::from_ref(&self.hits),
            std::slice::from_ref(&hits),
            samples as f64 / predictions as f64,
        )?;
        Ok(())
    }

    /// The `[2]` f32 device buffer of both sums (loss, hits), for kernels
    /// that add into it themselves (the fused loss).
    pub(crate) fn values(&self) -> &Tensor {
        &self.values
    }

    /// Zeroes both sums (device work only).
    pub(super) fn zero(&self) -> Result<()> {
        let _ = self.values.shallow_clone().f_zero_().op("zero")?;
        Ok(())
    }

    /// Reads the sums back (one transfer): `(loss_sum, correct)`.
    pub(super) fn read(&self) -> Result<(f64, f64)> {
        let host = match &self.host {
            Some(host) => {
                // Blocking copy: it waits for the compute stream.
                host.shallow_clone()
                    .f_copy_(&self.values)
                    .op("accumulator readback")?;
                host.shallow_clone()
            }
            None => self
                .values
                .f_to_device(Device::Cpu)
                .op("accumulator readback")?,
        };
        let values = Vec::<f32>::try_from(&host).op("accumulator to vec")?;
        match values.as_slice() {
            [loss, correct] => Ok((f64::from(*loss), f64::from(*correct))),
            other => Err(Error::Readback {
                what: "epoch accumulator",
                expected: 2,
                got: other.len(),
            }),
        }
    }
}
