//! Staging: where the engine's steps read their samples from.
//!
//! [`StagedData::resident`] copies a [`Dataset`] to the training device once
//! (floating inputs as `f32`, token ids as `i64`, labels `i64`); every epoch is then shuffled on the device
//! and each batch gathered there, so no host-to-device copy happens inside
//! an epoch. On a CUDA device the copy goes through pinned memory and its
//! time is measured with events ([`StagedData::h2d_ms`]).
//!
//! **The shuffle.** Epoch `e`'s order is the stable argsort of a 64-bit
//! integer hash (the SplitMix64 finaliser) of `(run seed, e, sample index)`,
//! computed with device integer ops (`torch_ext::rng`, leyline's hash on the
//! device): a seeded permutation that depends on
//! no global random generator, is the same on the CPU and on CUDA, and
//! needs nothing from the host. [`StagedData::set_epoch`] picks the epoch
//! (a resumed run asks for the epoch it resumes at).
//!
//! [`StagedData::pinned`] is the alternative for a data set that should not
//! live on the device: the samples stay in page-locked host memory, each
//! batch is gathered on the host into one of two pinned buffers and copied
//! to one of two device buffers on a dedicated staging stream, while the
//! previous batch trains (double buffering: the copy of batch `b + 1`
//! overlaps the step of batch `b`; events order the compute stream after
//! the copy and the next copy into a buffer after the step that read it).
//! The order is the same hash, computed on the host. `h2d_copy_ms` is the
//! summed event time of the epoch's copies. Pinned staging runs eager
//! steps; the graph modes need device-resident data (the engine says so).

use std::cell::{Cell, OnceCell};
use std::time::Instant;

use leyline::rng::mix64;
use tch::{Device, Kind, Tensor};

use crate::data::Dataset;
use crate::error::{Error, Result, TorchResultExt};

/// Most bytes of resident data (inputs and labels) that graph-epoch
/// gathers into the epoch's order once an epoch, into a second copy of the
/// data; larger data sets gather each batch inside the graphs instead.
pub const MAX_EPOCH_ORDER_BYTES: usize = 2 << 30;

/// A data set staged for the engine (see the module docs).
#[derive(Debug)]
pub struct StagedData {
    /// All samples: on the device (resident) or in pinned host memory.
    inputs: Tensor,
    labels: Tensor,
    len: i64,
    shuffle: bool,
    seed: u64,
    epoch: Cell<u64>,
    /// The unshuffled order, made once.
    ordered: OnceCell<Tensor>,
    device: Device,
    h2d_ms: Option<f64>,
    /// The double buffers of pinned staging; `None` when resident.
    pinned: Option<Pinned>,
}

/// One of the two buffer pairs of pinned staging.
#[derive(Debug)]
struct Slot {
    host_inputs: Tensor,
    host_labels: Tensor,
    device_inputs: Tensor,
    device_labels: Tensor,
    /// Recorded on the staging stream after this slot's copy.
    copied: Option<torch_ext::CudaEvent>,
    /// Recorded on the compute stream after the step that read the slot.
    consumed: Option<torch_ext::CudaEvent>,
    /// Timing events around the copy.
    timing: Option<(torch_ext::CudaEvent, torch_ext::CudaEvent)>,
    /// Samples in the slot now.
    len: Cell<i64>,
    /// Whether a copy into the slot was queued and not yet timed.
    pending: Cell<bool>,
}

/// Pinned-host staging state (see the module docs).
#[derive(Debug)]
struct Pinned {
    slots: [Slot; 2],
    stream: Option<torch_ext::CudaStream>,
    batch: i64,
    /// Summed copy time of the epoch so far, ms.
    copy_ms: Cell<f64>,
}

impl StagedData {
    /// Copies `dataset` to `device` once. `shuffle` draws a new order every
    /// epoch from `seed`; without it the order is the data set's.
    ///
    /// # Errors
    /// [`Error::InvalidData`] for an empty data set; [`Error::Torch`] when
    /// the copy fails (e.g. the device is out of memory).
    pub fn resident(
        dataset: &Dataset,
        device: Device,
        shuffle: bool,
        seed: u64,
    ) -> Result<StagedData> {
        let len = sample_count(dataset)?;
        let started = Instant::now();
        let (inputs, labels, h2d_ms) = match device {
            Device::Cuda(_) => {
                let start = torch_ext::CudaEvent::new(true)?;
                let end = torch_ext::CudaEvent::new(true)?;
                let index = match device {
                    Device::Cuda(index) => index,
                    _ => 0,
                };
                let stream = torch_ext::CudaStream::current(index)?;
                let pinned = dataset.pin_memory()?;
                start.record(&stream)?;
                let inputs = pinned
                    .images()
                    .f_to_device(device)
                    .op("stage inputs")?
                    .f_to_kind(input_kind(dataset.images()))
                    .op("inputs to f32")?;
                let labels = pinned
                    .labels()
                    .f_to_device(device)
                    .op("stage labels")?
                    .f_to_kind(Kind::Int64)
                    .op("labels to i64")?;
                end.record(&stream)?;
                end.synchronize()?;
                let ms = f64::from(start.elapsed_ms(&end)?);
                (inputs, labels, Some(ms))
            }
            _ => {
                let inputs = dataset
                    .images()
                    .f_to_device(device)
                    .op("stage inputs")?
                    .f_to_kind(input_kind(dataset.images()))
                    .op("inputs to f32")?
                    .f_contiguous()
                    .op("contiguous")?;
                let labels = dataset
                    .labels()
                    .f_to_device(device)
                    .op("stage labels")?
                    .f_to_kind(Kind::Int64)
                    .op("labels to i64")?;
                (inputs, labels, None)
            }
        };
        let _ = started;
        Ok(StagedData {
            inputs,
            labels,
            len,
            shuffle,
            seed,
            epoch: Cell::new(0),
            ordered: OnceCell::new(),
            device,
            h2d_ms,
            pinned: None,
        })
    }

    /// The same data with resident 4-D inputs (`[N, C, H, W]` images) on a
    /// CUDA device stored channels-last, one copy made now: the layout a
    /// channels-last model's first convolution reads as it is, where a
    /// contiguous batch would be converted by every forward (for
    /// validation, every chunk of every pass). Values and shapes do not
    /// change; pinned, CPU and other inputs are returned as they are.
    ///
    /// # Errors
    /// [`Error::Torch`] when the copy fails (e.g. the device is out of
    /// memory).
    pub fn into_channels_last(mut self) -> Result<StagedData> {
        if self.pinned.is_none() && self.device.is_cuda() && self.inputs.dim() == 4 {
            self.inputs = torch_ext::memory::contiguous_channels_last(&self.inputs)?;
        }
        Ok(self)
    }

    /// Keeps `dataset` in page-locked host memory and stages batches of at
    /// most `batch` samples to `device` through two buffers (see the module
    /// docs). On the CPU the buffers are plain memory and nothing is copied
    /// asynchronously.
    ///
    /// # Errors
    /// [`Error::InvalidData`] for an empty data set; [`Error::InvalidConfig`]
    /// for a batch of 0; [`Error::Torch`] when a buffer cannot be allocated.
    pub fn pinned(
        dataset: &Dataset,
        device: Device,
        batch: usize,
        shuffle: bool,
        seed: u64,
    ) -> Result<StagedData> {
        let len = sample_count(dataset)?;
        let batch = i64::try_from(batch)
            .ok()
            .filter(|batch| *batch > 0)
            .ok_or_else(|| Error::InvalidConfig {
                field: "batch_size",
                reason: format!("{batch}; pinned staging needs a batch of at least 1"),
            })?
            .min(len);
        let host = dataset.pin_memory()?;
        let inputs = host
            .images()
            .f_to_kind(input_kind(dataset.images()))
            .op("inputs kind")?;
        let inputs = if device.is_cuda() && !torch_ext::memory::is_pinned(&inputs) {
            torch_ext::memory::pin(&inputs)?
        } else {
            inputs
        };
        let labels = host.labels().f_to_kind(Kind::Int64).op("labels kind")?;
        let labels = if device.is_cuda() && !torch_ext::memory::is_pinned(&labels) {
            torch_ext::memory::pin(&labels)?
        } else {
            labels
        };
        let mut sample_shape = inputs.size();
        if let Some(first) = sample_shape.first_mut() {
            *first = batch;
        }
        // `[batch]`, or `[batch, T]` for a language model's targets.
        let mut label_shape = labels.size();
        if let Some(first) = label_shape.first_mut() {
            *first = batch;
        }
        let kind = inputs.kind();
        let slot = || -> Result<Slot> {
            let pin = |tensor: Tensor| -> Result<Tensor> {
                if device.is_cuda() {
                    Ok(torch_ext::memory::pin(&tensor)?)
                } else {
                    Ok(tensor)
                }
            };
            let cuda = device.is_cuda();
            let event = |timing: bool| -> Result<Option<torch_ext::CudaEvent>> {
                Ok(if cuda {
                    Some(torch_ext::CudaEvent::new(timing)?)
                } else {
                    None
                })
            };
            Ok(Slot {
                host_inputs: pin(
                    Tensor::f_empty(sample_shape.as_slice(), (kind, Device::Cpu))
                        .op("host buffer")?,
                )?,
                host_labels: pin(Tensor::f_empty(
                    label_shape.as_slice(),
                    (Kind::Int64, Device::Cpu),
                )
                .op("host buffer")?)?,
                device_inputs: Tensor::f_empty(sample_shape.as_slice(), (kind, device))
                    .op("device buffer")?,
                device_labels: Tensor::f_empty(label_shape.as_slice(), (Kind::Int64, device))
                    .op("device buffer")?,
                copied: event(false)?,
                consumed: event(false)?,
                timing: match (event(true)?, event(true)?) {
                    (Some(start), Some(end)) => Some((start, end)),
                    _ => None,
                },
                len: Cell::new(0),
                pending: Cell::new(false),
            })
        };
        let stream = match device {
            Device::Cuda(index) => Some(torch_ext::CudaStream::from_pool(index, false)?),
            _ => None,
        };
        Ok(StagedData {
            inputs,
            labels,
            len,
            shuffle,
            seed,
            epoch: Cell::new(0),
            ordered: OnceCell::new(),
            device,
            h2d_ms: None,
            pinned: Some(Pinned {
                slots: [slot()?, slot()?],
                stream,
                batch,
                copy_ms: Cell::new(0.0),
            }),
        })
    }

    /// Whether batches are staged from pinned host memory
    /// ([`StagedData::pinned`]).
    pub fn is_pinned_host(&self) -> bool {
        self.pinned.is_some()
    }

    /// Pinned staging: gathers the samples at `indices` (an `i64` CPU
    /// tensor of at most the staging batch) into slot `slot`'s host buffer
    /// and queues its copy to the device buffer on the staging stream.
    pub(crate) fn stage(&self, slot: usize, indices: &Tensor) -> Result<()> {
        let (Some(pinned), Some(buffers)) = (
            self.pinned.as_ref(),
            self.pinned.as_ref().and_then(|p| p.slots.get(slot)),
        ) else {
            return Err(Error::InvalidConfig {
                field: "staging",
                reason: "stage() needs pinned staging and a slot of 0 or 1".to_owned(),
            });
        };
        let len = indices.size().first().copied().unwrap_or(0);
        if len <= 0 || len > pinned.batch {
            return Err(Error::InvalidConfig {
                field: "staging",
                reason: format!("{len} samples for a staging batch of {}", pinned.batch),
            });
        }
        // The copy that last read this host buffer must be done before the
        // host overwrites it, and the step that read the device buffer
        // before the next copy lands there.
        if let Some(copied) = &buffers.copied {
            copied.synchronize()?;
        }
        self.settle_timing(buffers)?;
        let host_inputs = buffers.host_inputs.f_narrow(0, 0, len).op("narrow")?;
        let host_labels = buffers.host_labels.f_narrow(0, 0, len).op("narrow")?;
        let _ = self
            .inputs
            .f_index_select_out(&host_inputs, 0, indices)
            .op("host gather")?;
        let _ = self
            .labels
            .f_index_select_out(&host_labels, 0, indices)
            .op("host gather")?;
        let mut device_inputs = buffers.device_inputs.f_narrow(0, 0, len).op("narrow")?;
        let mut device_labels = buffers.device_labels.f_narrow(0, 0, len).op("narrow")?;
        match &pinned.stream {
            Some(stream) => {
                let _guard = stream.make_current()?;
                if let Some(consumed) = &buffers.consumed {
                    stream.wait_event(consumed)?;
                }
                if let Some((start, _)) = &buffers.timing {
                    start.record(stream)?;
                }
                torch_ext::copy_non_blocking(&mut device_inputs, &host_inputs)?;
                torch_ext::copy_non_blocking(&mut device_labels, &host_labels)?;
                if let Some((_, end)) = &buffers.timing {
                    end.record(stream)?;
                    buffers.pending.set(true);
                }
                if let Some(copied) = &buffers.copied {
                    copied.record(stream)?;
                }
            }
            None => {
                device_inputs.f_copy_(&host_inputs).op("copy")?;
                device_labels.f_copy_(&host_labels).op("copy")?;
            }
        }
        buffers.len.set(len);
        Ok(())
    }

    /// Pinned staging: the device tensors of slot `slot`, with the current
    /// stream made to wait for their copy.
    pub(crate) fn staged(&self, slot: usize) -> Result<(Tensor, Tensor)> {
        let buffers = self
            .pinned
            .as_ref()
            .and_then(|pinned| pinned.slots.get(slot))
            .ok_or_else(|| Error::InvalidConfig {
                field: "staging",
                reason: "staged() needs pinned staging and a slot of 0 or 1".to_owned(),
            })?;
        if let (Some(copied), Device::Cuda(index)) = (&buffers.copied, self.device) {
            torch_ext::CudaStream::current(index)?.wait_event(copied)?;
        }
        let len = buffers.len.get();
        Ok((
            buffers.device_inputs.f_narrow(0, 0, len).op("narrow")?,
            buffers.device_labels.f_narrow(0, 0, len).op("narrow")?,
        ))
    }

    /// Pinned staging: marks slot `slot` read by everything queued on the
    /// current stream so far.
    pub(crate) fn consumed(&self, slot: usize) -> Result<()> {
        if let (Some(buffers), Device::Cuda(index)) = (
            self.pinned
                .as_ref()
                .and_then(|pinned| pinned.slots.get(slot)),
            self.device,
        ) && let Some(consumed) = &buffers.consumed
        {
            consumed.record(&torch_ext::CudaStream::current(index)?)?;
        }
        Ok(())
    }

    /// Adds a finished copy's time to the epoch's sum.
    fn settle_timing(&self, buffers: &Slot) -> Result<()> {
        if let (Some(pinned), Some((start, end))) = (self.pinned.as_ref(), &buffers.timing)
            && buffers.pending.get()
        {
            end.synchronize()?;
            let ms = f64::from(start.elapsed_ms(end)?);
            pinned.copy_ms.set(pinned.copy_ms.get() + ms);
            buffers.pending.set(false);
        }
        Ok(())
    }

    /// Pinned staging: the summed copy time since the last call, ms (waits
    /// for the copies still in flight); `None` when resident.
    pub(crate) fn take_copy_ms(&self) -> Result<Option<f64>> {
        let Some(pinned) = &self.pinned else {
            return Ok(None);
        };
        for buffers in &pinned.slots {
            self.settle_timing(buffers)?;
        }
        Ok(Some(pinned.copy_ms.replace(0.0)))
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        usize::try_from(self.len).unwrap_or(0)
    }

    /// Whether no sample is held (never: construction refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the samples live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Time of the one host-to-device copy, from CUDA events (CUDA only).
    pub fn h2d_ms(&self) -> Option<f64> {
        self.h2d_ms
    }

    /// All inputs, `[N, ...]`.
    pub fn inputs(&self) -> &Tensor {
        &self.inputs
    }

    /// All labels, `[N]`.
    pub fn labels(&self) -> &Tensor {
        &self.labels
    }

    /// The epoch whose order the next [`StagedData::permutation`] draws.
    pub fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Sets the epoch of the next permutation.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.set(epoch);
    }

    /// `(start, len)` of each batch of `batch` samples in the permutation.
    pub(crate) fn plan(&self, batch: i64, drop_last: bool) -> Result<Vec<(i64, i64)>> {
        super::batches::plan(self.len, batch, drop_last)
    }

    /// The sample order of the current epoch (an `i64 [N]` tensor on the
    /// device, or on the host for pinned staging), then advances the epoch.
    pub fn permutation(&self) -> Result<Tensor> {
        let epoch = self.epoch.get();
        self.epoch.set(epoch.wrapping_add(1));
        let order_device = if self.pinned.is_some() {
            Device::Cpu
        } else {
            self.device
        };
        if !self.shuffle {
            if let Some(order) = self.ordered.get() {
                return Ok(order.shallow_clone());
            }
            let order = Tensor::f_arange(self.len, (Kind::Int64, order_device)).op("arange")?;
            return Ok(self.ordered.get_or_init(|| order).shallow_clone());
        }
        let order = Tensor::f_arange(self.len, (Kind::Int64, order_device)).op("arange")?;
        let base = mix64(self.seed ^ mix64(epoch.wrapping_add(0x5EED))) as i64;
        // x = base + (i + 1) * GOLDEN, then the SplitMix64 finaliser.
        let x = torch_ext::rng::golden_steps(&order)?
            .f_add_scalar(base)
            .op("hash")?;
        let x = torch_ext::rng::mix64(&x)?;
        x.f_argsort_stable(true, 0, false).op("argsort")
    }

    /// Whether batches are plain ranges of the resident data (resident and
    /// not shuffled): then a batch is a view, with no gather kernel.
    pub(crate) fn is_ordered(&self) -> bool {
        self.pinned.is_none() && !self.shuffle
    }

    /// Batch `(start, len)` of the epoch whose order is `permutation`: a view
    /// of the resident data when [`StagedData::is_ordered`], else gathered.
    pub(crate) fn batch(
        &self,
        permutation: &Tensor,
        (start, len): (i64, i64),
    ) -> Result<(Tensor, Tensor)> {
        if self.is_ordered() {
            return Ok((
                self.inputs.f_narrow(0, start, len).op("batch view")?,
                self.labels.f_narrow(0, start, len).op("batch view")?,
            ));
        }
        self.gather(&permutation.f_narrow(0, start, len).op("narrow")?)
    }

    /// Buffers for a whole epoch of resident, shuffled samples in the
    /// epoch's order (see [`StagedData::gather_epoch`]), as large as the
    /// data; `None` when batches are views already, the data is pinned, or
    /// it holds more than [`MAX_EPOCH_ORDER_BYTES`].
    pub(crate) fn epoch_order_buffers(&self) -> Result<Option<(Tensor, Tensor)>> {
        let bytes = |t: &Tensor| t.numel().saturating_mul(t.kind().elt_size_in_bytes());
        let total = bytes(&self.inputs).saturating_add(bytes(&self.labels));
        if self.is_ordered() || self.pinned.is_some() || total > MAX_EPOCH_ORDER_BYTES {
            return Ok(None);
        }
        let empty = |t: &Tensor| Tensor::f_empty(t.size(), (t.kind(), t.device()));
        Ok(Some((
            empty(&self.inputs).op("epoch order buffer")?,
            empty(&self.labels).op("epoch order buffer")?,
        )))
    }

    /// Every sample in the order `permutation` gives, into `buffers` (from
    /// [`StagedData::epoch_order_buffers`]): two gathers for the epoch, after
    /// which each batch is a view, where [`StagedData::batch`] gathers
    /// two kernels a batch.
    pub(crate) fn gather_epoch(
        &self,
        permutation: &Tensor,
        buffers: &(Tensor, Tensor),
    ) -> Result<()> {
        let _ = self
            .inputs
            .f_index_select_out(&buffers.0, 0, permutation)
            .op("epoch gather")?;
        let _ = self
            .labels
            .f_index_select_out(&buffers.1, 0, permutation)
            .op("epoch gather")?;
        Ok(())
    }

    /// The samples at `indices` (an `i64` device tensor): `(inputs, labels)`.
    pub(crate) fn gather(&self, indices: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.inputs.f_index_select(0, indices).op("gather inputs")?,
            self.labels.f_index_select(0, indices).op("gather labels")?,
        ))
    }
}

/// The number of samples of `dataset` as `i64`; an empty set is an error.
fn sample_count(dataset: &Dataset) -> Result<i64> {
    let len = i64::try_from(dataset.len()).map_err(|_| Error::InvalidData {
        field: "dataset",
        reason: format!("{} samples do not fit i64", dataset.len()),
    })?;
    if len == 0 {
        return Err(Error::InvalidData {
            field: "dataset",
            reason: format!("`{}` holds no sample", dataset.name()),
        });
    }
    Ok(len)
}

/// Floating inputs train in `f32`; integer inputs (token ids) stay `i64`.
fn input_kind(inputs: &Tensor) -> Kind {
    if inputs.is_floating_point() {
        Kind::Float
    } else {
        Kind::Int64
    }
}
