//! [`StepStaging`]: the host-side inputs of one batched policy step (the raw
//! observations, the slots' blueprint indices, the action masks and the
//! sampler's noise bases) packed into one host buffer and uploaded to the
//! device in one copy.
//!
//! Built separately, those inputs cost the step one blocking host-to-device
//! copy each (four stream synchronisations) and a dozen small tensors. Here
//! they share one byte buffer: on CUDA a page-locked host buffer and one
//! non-blocking copy into a device buffer of the same size, whose typed
//! views ([`StepStaging::obs`], [`StepStaging::blueprints`],
//! [`StepStaging::masks`], [`StepStaging::bases`]) are what the step reads.
//! The views keep their addresses for the life of the staging, so a CUDA
//! graph captured on them replays on every later upload. On the CPU the
//! upload is a plain copy into the device buffer.
//!
//! The layout (bytes): the bases (`i64`), the step index (`i64`), the
//! blueprint indices (`i64`),
//! the observations (`f32`), then the masks (one byte each, in the packed
//! layout of [`MaskTensors::from_masks`]); every part starts on an 8-byte
//! boundary. Everything is checked before anything is written: a refused
//! call leaves the staged inputs as they were. The host buffer is not
//! rewritten until the previous upload has run (an event recorded after it).
//!
//! [`StepStaging::stage`] packs and uploads. A captured step splits the
//! two: [`StepStaging::pack`] writes the page-locked buffer with no libtorch
//! op, and the graph's first node is the raw copy of that buffer to the
//! device ([`StepStaging::upload_captured`]), so each replay uploads what
//! was packed last; [`StepStaging::upload`] sends a packed step when no
//! graph will.

use tch::{Device, Kind, Tensor};
use torch_ext::{CudaEvent, CudaStream};

use crate::error::{TorchResultExt, shape_mismatch};
use crate::features::batch::MAX_ENVS;
use crate::features::{MAX_SLOTS, layout as obs_layout};
use crate::masks::tensors::{pack_masks, packed_row_width};
use crate::masks::{ActionMasks, MaskTensors};
use crate::{Error, Result};

/// Byte offsets of the parts of the packed buffer.
#[derive(Debug, Clone, Copy)]
struct Layout {
    bases: usize,
    step: usize,
    blueprints: usize,
    obs: usize,
    masks: usize,
    total: usize,
}

impl Layout {
    fn new(n_envs: usize, num_slots: usize, obs_dim: usize, draws: usize) -> Option<Layout> {
        let align = |bytes: usize| bytes.checked_next_multiple_of(8);
        let bases = 0usize;
        let step = align(draws.max(1).checked_mul(8)?)?;
        let blueprints = step.checked_add(8)?;
        let obs = align(blueprints.checked_add(n_envs.checked_mul(num_slots)?.checked_mul(8)?)?)?;
        let masks = align(obs.checked_add(n_envs.checked_mul(obs_dim)?.checked_mul(4)?)?)?;
        let total = masks.checked_add(n_envs.checked_mul(packed_row_width(num_slots))?)?;
        Some(Layout {
            bases,
            step,
            blueprints,
            obs,
            masks,
            total,
        })
    }
}

fn to_i64(value: usize, field: &'static str) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::InvalidConfig {
        field,
        reason: format!("{value} does not fit i64"),
    })
}

/// One step's inputs, packed and uploaded together (see the module docs).
#[derive(Debug)]
pub struct StepStaging {
    n_envs: usize,
    num_slots: usize,
    obs_dim: usize,
    draws: usize,
    layout: Layout,
    /// The device side, `Uint8 [total]`.
    device_buffer: Tensor,
    /// The parts one upload copies, `(host, device)`: from the bases on
    /// (with new bases), or from the step index on (keeping the bases). The
    /// host side is page-locked, on CUDA only.
    with_bases: (Option<Tensor>, Tensor),
    without_bases: (Option<Tensor>, Tensor),
    /// The packing scratch, reused by every upload.
    scratch: Vec<u8>,
    /// Recorded after each upload from `host` (CUDA only).
    uploaded: Option<CudaEvent>,
    /// Whether an upload from `host` may still be running.
    pending: bool,
    /// Packed into `host` and not yet uploaded: `Some(start)`, the first
    /// byte the upload must copy (CUDA only; see [`StepStaging::pack`]).
    unsent: Option<usize>,
    /// The whole host buffer (CUDA only), what a captured upload copies.
    host: Option<Tensor>,
    obs: Tensor,
    step: Tensor,
    blueprints: Tensor,
    bases: Tensor,
    masks: MaskTensors,
}

impl StepStaging {
    /// A staging for `n_envs` (`1..=MAX_ENVS`) environments with
    /// `num_slots` (`1..=MAX_SLOTS`) slots, observations of
    /// [`crate::features::ObsLayout::obs_dim`] for that slot count, and `draws` noise bases a
    /// step, on `device`. Every staged value starts at zero, the masks at
    /// "nothing allowed": stage before the first step.
    pub fn new(n_envs: usize, num_slots: usize, draws: usize, device: Device) -> Result<Self> {
        if !(1..=MAX_ENVS).contains(&n_envs) {
            return Err(Error::InvalidConfig {
                field: "StepStaging.n_envs",
                reason: format!("{n_envs} is outside [1, {MAX_ENVS}]"),
            });
        }
        if !(1..=MAX_SLOTS).contains(&num_slots) {
            return Err(Error::InvalidConfig {
                field: "StepStaging.num_slots",
                reason: format!("{num_slots} is outside [1, {MAX_SLOTS}]"),
            });
        }
        let obs_dim = obs_layout(num_slots)?.obs_dim();
        let layout =
            Layout::new(n_envs, num_slots, obs_dim, draws).ok_or_else(|| Error::InvalidConfig {
                field: "StepStaging",
                reason: format!(
                    "{n_envs} environments of {num_slots} slots and {draws} draws overflow"
                ),
            })?;
        let total = to_i64(layout.total, "StepStaging.bytes")?;
        let device_buffer =
            Tensor::f_zeros([total], (Kind::Uint8, device)).op("staging device buffer")?;
        let torch_error = |error: torch_ext::Error| Error::InvalidInput {
            field: "StepStaging",
            reason: error.to_string(),
        };
        let (host, uploaded) = match device {
            Device::Cuda(_) => {
                let plain = Tensor::f_zeros([total], (Kind::Uint8, Device::Cpu))
                    .op("staging host buffer")?;
                (
                    Some(torch_ext::memory::pin(&plain).map_err(torch_error)?),
                    Some(CudaEvent::new(false).map_err(torch_error)?),
                )
            }
            _ => (None, None),
        };
        let rows = to_i64(n_envs, "StepStaging.n_envs")?;
        let part = |offset: usize, bytes: usize, kind: Kind, shape: &[i64]| -> Result<Tensor> {
            device_buffer
                .f_narrow(
                    0,
                    to_i64(offset, "StepStaging")?,
                    to_i64(bytes, "StepStaging")?,
                )
                .op("staging view")?
                .f_view_dtype(kind)
                .op("staging view dtype")?
                .f_view(shape)
                .op("staging view shape")
        };
        let step = part(layout.step, 8, Kind::Int64, &[1])?;
        let upload_parts = |start: usize| -> Result<(Option<Tensor>, Tensor)> {
            let start = to_i64(start, "StepStaging")?;
            let length = total.saturating_sub(start);
            let host_part = match &host {
                Some(host) => Some(host.f_narrow(0, start, length).op("staging part")?),
                None => None,
            };
            Ok((
                host_part,
                device_buffer
                    .f_narrow(0, start, length)
                    .op("staging part")?,
            ))
        };
        let with_bases = upload_parts(layout.bases)?;
        let without_bases = upload_parts(layout.step)?;
        let slots = to_i64(num_slots, "StepStaging.num_slots")?;
        let width = to_i64(obs_dim, "StepStaging.obs_dim")?;
        let bases_len = draws.max(1);
        let bases = part(
            layout.bases,
            bases_len.saturating_mul(8),
            Kind::Int64,
            &[to_i64(bases_len, "StepStaging.draws")?],
        )?;
        let blueprints = part(
            layout.blueprints,
            n_envs.saturating_mul(num_slots).saturating_mul(8),
            Kind::Int64,
            &[rows, slots],
        )?;
        let obs = part(
            layout.obs,
            n_envs.saturating_mul(obs_dim).saturating_mul(4),
            Kind::Float,
            &[rows, width],
        )?;
        let row_width = packed_row_width(num_slots);
        let packed = part(
            layout.masks,
            n_envs.saturating_mul(row_width),
            Kind::Bool,
            &[rows, to_i64(row_width, "StepStaging.masks")?],
        )?;
        let masks = MaskTensors::from_packed(&packed, num_slots)?;
        Ok(StepStaging {
            n_envs,
            num_slots,
            obs_dim,
            draws,
            layout,
            device_buffer,
            with_bases,
            without_bases,
            scratch: Vec::with_capacity(layout.total),
            uploaded,
            pending: false,
            unsent: None,
            host,
            obs,
            step,
            blueprints,
            bases,
            masks,
        })
    }

    /// Environments per step.
    pub fn n_envs(&self) -> usize {
        self.n_envs
    }

    /// Slots per environment.
    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Noise bases per step.
    pub fn draws(&self) -> usize {
        self.draws
    }

    /// Packs and uploads one step's inputs: `obs` (`n_envs × obs_dim`, row
    /// after row, finite), `blueprints` (`n_envs × num_slots`), `masks`
    /// (one per environment, checked as [`MaskTensors::from_masks`] checks
    /// them), `bases` (`draws` of them, or none to keep the staged ones)
    /// and the step's index in its episode (`step`, non-negative: where a
    /// captured step records its outputs, [`StepStaging::step`]). All or
    /// nothing: a refused call uploads nothing.
    pub fn stage(
        &mut self,
        obs: &[f32],
        blueprints: &[i64],
        masks: &[ActionMasks],
        bases: &[i64],
        step: i64,
    ) -> Result<()> {
        self.pack(obs, blueprints, masks, bases, step)?;
        self.upload()
    }

    /// [`StepStaging::stage`] without the upload on CUDA: the inputs are
    /// checked and packed into the page-locked host buffer, and either a
    /// graph that holds [`StepStaging::upload_captured`] copies them at its
    /// replay (then [`StepStaging::mark_read`]), or [`StepStaging::upload`]
    /// does. Until one of them has, the device views hold the previous
    /// step's inputs. On the CPU this is [`StepStaging::stage`].
    pub fn pack(
        &mut self,
        obs: &[f32],
        blueprints: &[i64],
        masks: &[ActionMasks],
        bases: &[i64],
        step: i64,
    ) -> Result<()> {
        if step < 0 {
            return Err(Error::InvalidInput {
                field: "StepStaging.step",
                reason: format!("{step} is negative"),
            });
        }
        let expect = |field: &'static str, want: usize, got: usize| -> Result<()> {
            if want == got {
                Ok(())
            } else {
                Err(shape_mismatch(field, want, got))
            }
        };
        expect(
            "StepStaging.obs",
            self.n_envs.saturating_mul(self.obs_dim),
            obs.len(),
        )?;
        if let Some((position, value)) =
            obs.iter().enumerate().find(|(_, value)| !value.is_finite())
        {
            let width = self.obs_dim.max(1);
            return Err(Error::NonFinite {
                field: "StepStaging.obs",
                value: f64::from(*value),
                index: vec![
                    position.checked_div(width).unwrap_or(0),
                    position.checked_rem(width).unwrap_or(0),
                ],
            });
        }
        expect(
            "StepStaging.blueprints",
            self.n_envs.saturating_mul(self.num_slots),
            blueprints.len(),
        )?;
        expect("StepStaging.masks", self.n_envs, masks.len())?;
        if !bases.is_empty() {
            expect("StepStaging.bases", self.draws.max(1), bases.len())?;
        }
        let (num_slots, mask_bytes) = pack_masks(masks)?;
        expect("StepStaging.masks.slots", self.num_slots, num_slots)?;

        let torch_error = |error: torch_ext::Error| Error::InvalidInput {
            field: "StepStaging.upload",
            reason: error.to_string(),
        };
        // The host buffer may still be read by the last upload.
        if self.pending
            && let Some(event) = &self.uploaded
        {
            event.synchronize().map_err(torch_error)?;
        }
        self.pending = false;
        let layout = self.layout;
        let scratch = &mut self.scratch;
        scratch.clear();
        scratch.resize(layout.total, 0);
        let mut write = |offset: usize, bytes: &mut dyn Iterator<Item = u8>| {
            if let Some(target) = scratch.get_mut(offset..) {
                for (slot, byte) in target.iter_mut().zip(bytes) {
                    *slot = byte;
                }
            }
        };
        write(
            layout.bases,
            &mut bases.iter().flat_map(|v| v.to_ne_bytes()),
        );
        write(layout.step, &mut step.to_ne_bytes().into_iter());
        write(
            layout.blueprints,
            &mut blueprints.iter().flat_map(|v| v.to_ne_bytes()),
        );
        write(layout.obs, &mut obs.iter().flat_map(|v| v.to_ne_bytes()));
        write(layout.masks, &mut mask_bytes.iter().copied());
        // Without new bases, the staged ones stay: upload only what follows.
        let (start, (host_part, device_part)) = if bases.is_empty() {
            (layout.step, &self.without_bases)
        } else {
            (layout.bases, &self.with_bases)
        };
        let packed = scratch.get(start..).unwrap_or_default();
        match host_part {
            Some(pinned) => {
                // Straight into the page-locked buffer (no libtorch op); the
                // upload follows (`upload`, or a captured one).
                torch_ext::write_host_bytes(pinned, packed).map_err(torch_error)?;
                // Bytes before `start` (the kept bases) are already there.
                self.unsent = Some(self.unsent.map_or(start, |kept| kept.min(start)));
            }
            None => {
                let source = Tensor::f_from_slice(packed).op("staging from host")?;
                device_part
                    .shallow_clone()
                    .f_copy_(&source)
                    .op("staging upload")?;
            }
        }
        Ok(())
    }

    /// Uploads what [`StepStaging::pack`] packed and no graph has copied
    /// yet, in one queued copy (nothing when nothing is pending, and always
    /// nothing on the CPU).
    pub fn upload(&mut self) -> Result<()> {
        let Some(start) = self.unsent else {
            return Ok(());
        };
        let torch_error = |error: torch_ext::Error| Error::InvalidInput {
            field: "StepStaging.upload",
            reason: error.to_string(),
        };
        let (host_part, device_part) = if start == self.layout.bases {
            &self.with_bases
        } else {
            &self.without_bases
        };
        if let (Some(pinned), Some(event), Device::Cuda(index)) =
            (host_part, &self.uploaded, self.device_buffer.device())
        {
            let mut target = device_part.shallow_clone();
            torch_ext::copy_non_blocking(&mut target, pinned).map_err(torch_error)?;
            let stream = CudaStream::current(index).map_err(torch_error)?;
            event.record(&stream).map_err(torch_error)?;
            self.pending = true;
        }
        self.unsent = None;
        Ok(())
    }

    /// Queues the copy of the whole host buffer to the device as one raw
    /// `cudaMemcpyAsync` ([`torch_ext::memcpy_async`]), for the body of a
    /// CUDA graph capture: each replay uploads what the last
    /// [`StepStaging::pack`] wrote. CUDA only.
    pub fn upload_captured(&self) -> Result<()> {
        let Some(host) = &self.host else {
            return Err(Error::InvalidConfig {
                field: "StepStaging.upload_captured",
                reason: "a captured upload needs a CUDA staging".to_owned(),
            });
        };
        torch_ext::memcpy_async(&self.device_buffer, host).map_err(|error| Error::InvalidInput {
            field: "StepStaging.upload_captured",
            reason: error.to_string(),
        })
    }

    /// After a replay that holds [`StepStaging::upload_captured`] was
    /// queued on `stream`: the packed inputs count as uploaded, and the
    /// next [`StepStaging::pack`] waits for that replay's copy before it
    /// writes the host buffer again.
    pub fn mark_read(&mut self, stream: &CudaStream) -> Result<()> {
        if let Some(event) = &self.uploaded {
            event.record(stream).map_err(|error| Error::InvalidInput {
                field: "StepStaging.mark_read",
                reason: error.to_string(),
            })?;
            self.pending = true;
        }
        self.unsent = None;
        Ok(())
    }

    /// The staged observations, `[n_envs, obs_dim]` `f32` on the device.
    pub fn obs(&self) -> &Tensor {
        &self.obs
    }

    /// The staged step index, `[1]` `i64` on the device (an index tensor
    /// for `index_copy_` into a rollout's step column, read by the device
    /// only).
    pub fn step(&self) -> &Tensor {
        &self.step
    }

    /// The staged blueprint indices, `[n_envs, num_slots]` `i64`.
    pub fn blueprints(&self) -> &Tensor {
        &self.blueprints
    }

    /// The staged masks (views of the packed buffer).
    pub fn masks(&self) -> &MaskTensors {
        &self.masks
    }

    /// The staged noise bases, `[max(draws, 1)]` `i64`.
    pub fn bases(&self) -> &Tensor {
        &self.bases
    }
}
