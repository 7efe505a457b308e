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
//! computed with device integer ops: a seeded permutation that depends on
//! no global random generator, is the same on the CPU and on CUDA, and
//! needs nothing from the host. [`StagedData::set_epoch`] picks the epoch
//! (a resumed run asks for the epoch it resumes at).
//!
//! The host-resident alternative (pinned batches prefetched on a staging
//! stream) is not built; a data set too large for the device is an error
//! naming its size.

use std::cell::Cell;
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::data::Dataset;
use crate::error::{Error, Result, TorchResultExt};

/// A data set staged for the engine (see the module docs).
#[derive(Debug)]
pub struct StagedData {
    inputs: Tensor,
    labels: Tensor,
    len: i64,
    shuffle: bool,
    seed: u64,
    epoch: Cell<u64>,
    device: Device,
    h2d_ms: Option<f64>,
}

/// SplitMix64 increment (the golden-ratio constant), as two's-complement
/// `i64` for device arithmetic.
const GOLDEN: i64 = 0x9E37_79B9_7F4A_7C15_u64 as i64;
const MIX1: i64 = 0xBF58_476D_1CE4_E5B9_u64 as i64;
const MIX2: i64 = 0x94D0_49BB_1331_11EB_u64 as i64;

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
            device,
            h2d_ms,
        })
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
        if batch <= 0 {
            return Err(Error::InvalidConfig {
                field: "batch_size",
                reason: format!("{batch}; must be at least 1"),
            });
        }
        if drop_last && batch > self.len {
            return Err(Error::InvalidConfig {
                field: "batch_size",
                reason: format!(
                    "{batch} with drop_last leaves no batch of a data set of {} samples",
                    self.len
                ),
            });
        }
        let mut plan = Vec::new();
        let mut start = 0_i64;
        while start < self.len {
            let len = batch.min(self.len.saturating_sub(start));
            if len < batch && drop_last {
                break;
            }
            plan.push((start, len));
            start = start.saturating_add(len);
        }
        Ok(plan)
    }

    /// The sample order of the current epoch (an `i64 [N]` device tensor),
    /// then advances the epoch.
    pub fn permutation(&self) -> Result<Tensor> {
        let epoch = self.epoch.get();
        self.epoch.set(epoch.wrapping_add(1));
        let order = Tensor::f_arange(self.len, (Kind::Int64, self.device)).op("arange")?;
        if !self.shuffle {
            return Ok(order);
        }
        let base = mix(self.seed ^ mix(epoch.wrapping_add(0x5EED))) as i64;
        // x = base + (i + 1) * GOLDEN, then the SplitMix64 finaliser.
        let mut x = order
            .f_add_scalar(1)
            .op("hash")?
            .f_mul_scalar(GOLDEN)
            .op("hash")?
            .f_add_scalar(base)
            .op("hash")?;
        for (shift, multiplier) in [(30, Some(MIX1)), (27, Some(MIX2)), (31, None)] {
            let shifted = logical_shift_right(&x, shift)?;
            x = x.f_bitwise_xor_tensor(&shifted).op("hash xor")?;
            if let Some(multiplier) = multiplier {
                x = x.f_mul_scalar(multiplier).op("hash mul")?;
            }
        }
        x.f_argsort_stable(true, 0, false).op("argsort")
    }

    /// The samples at `indices` (an `i64` device tensor): `(inputs, labels)`.
    pub(crate) fn gather(&self, indices: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.inputs.f_index_select(0, indices).op("gather inputs")?,
            self.labels.f_index_select(0, indices).op("gather labels")?,
        ))
    }
}

/// Floating inputs train in `f32`; integer inputs (token ids) stay `i64`.
fn input_kind(inputs: &Tensor) -> Kind {
    if inputs.is_floating_point() {
        Kind::Float
    } else {
        Kind::Int64
    }
}

/// `x >>> shift` on `i64` (arithmetic shift, then the sign bits cleared).
fn logical_shift_right(x: &Tensor, shift: i64) -> Result<Tensor> {
    let mask = i64::MAX >> shift.saturating_sub(1);
    x.f_bitwise_right_shift_tensor_scalar(shift)
        .op("hash shift")?
        .f_bitwise_and(mask)
        .op("hash mask")
}

/// The SplitMix64 finaliser on the host.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
