//! The governor's snapshot of the last good state and the rollback to it.
//!
//! A snapshot holds the host's variables (parameters and buffers, such as
//! BatchNorm running statistics) and the variables of every FOSSILIZED seed
//! (module and gate), each in a host tensor. Live seeds are not kept (the
//! reference excludes them; a rollback prunes them).
//!
//! Buffers are allocated when the layout (host names, shapes and dtypes;
//! which slots hold which fossil) first appears or changes, and reused by
//! every later snapshot of the same layout: a seed fossilized since the last
//! snapshot changes the layout, so the next snapshot allocates afresh. On
//! CUDA the buffers are pinned and the copies are queued on a side stream
//! after the compute stream's work; the compute stream then waits for them
//! on the device (an event), so the host thread does not block and the next
//! epoch cannot overwrite a parameter before it was copied. On the CPU the
//! copies are plain `copy_`.
//!
//! A rollback checks the whole layout before writing anything: the host must
//! match the snapshot exactly, and every snapshotted fossil must still be in
//! its slot with the same seed id and layout ([`Error::Governor`] otherwise,
//! the model untouched). A fossil that appeared after the snapshot is not in
//! it: it keeps its current weights (the reference loads non-strictly) and
//! is listed in [`RollbackReport::unrestored_fossils`].

use super::{Governor, PanicReason};
use crate::error::TorchResultExt;
use crate::optim::GroupOptimizers;
use crate::{Error, Result};
use kasmina::host::SlotId;
use kasmina::lifecycle::PruneInitiator;
use kasmina::model::MorphogeneticModel;
use leyline::telemetry::{
    TOLARIA_ROLLBACK_COMPLETED, TOLARIA_ROLLBACK_CONSECUTIVE_PANICS, TOLARIA_ROLLBACK_FAILED,
    TOLARIA_ROLLBACK_RECOVERY_MS, TOLARIA_ROLLBACK_TOTAL, TOLARIA_ROLLBACK_TRIGGERED,
};
use leyline::{SeedStage, Telemetry, TelemetryLevel};
use std::time::Instant;
use tch::{Device, Kind, Tensor};
use torch_ext::CudaEvent;
use torch_ext::CudaStream;

mod state;

pub use state::{FossilSnapshot, GovernorState, SnapshotState};

/// What a rollback did.
#[derive(Debug, Clone, PartialEq)]
pub struct RollbackReport {
    /// The panic that caused it.
    pub reason: PanicReason,
    /// The epoch of the snapshot restored.
    pub snapshot_epoch: usize,
    /// The loss of the last panic, if [`Governor::check`] saw one.
    pub loss_at_panic: Option<f64>,
    /// Consecutive panics counted when the rollback started.
    pub consecutive_panics: u32,
    /// Tensors restored (host variables and fossils' variables).
    pub restored_tensors: usize,
    /// Slots whose live seed was pruned, in execution order.
    pub pruned: Vec<SlotId>,
    /// Slots holding a fossil that is not in the snapshot (fossilized
    /// since): kept as they are.
    pub unrestored_fossils: Vec<SlotId>,
    /// Wall time from the start of the rollback to the pruned, cleared state.
    pub recovery_ms: f64,
}

/// One variable's layout and its host buffer.
#[derive(Debug)]
struct Entry {
    name: String,
    size: Vec<i64>,
    kind: Kind,
    buffer: Tensor,
}

/// The variables of one fossil.
#[derive(Debug)]
struct Fossil {
    slot: SlotId,
    seed_id: String,
    entries: Vec<Entry>,
}

/// A fossil's slot, seed id and variables (sorted by name).
type FossilSources = (SlotId, String, Vec<(String, Tensor)>);

/// The model's variables to snapshot, in snapshot order.
struct Sources {
    host: Vec<(String, Tensor)>,
    fossils: Vec<FossilSources>,
}

fn sorted(mut variables: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    variables.sort_by(|a, b| a.0.cmp(&b.0));
    variables
}

fn sources(model: &MorphogeneticModel) -> Sources {
    let host = sorted(model.host().var_store().variables().into_iter().collect());
    let fossils = model
        .slots()
        .iter()
        .filter(|slot| slot.stage() == Some(SeedStage::Fossilized))
        .filter_map(|slot| {
            let module = slot.seed_module()?;
            let seed_id = slot.state()?.seed_id().to_owned();
            let variables = sorted(module.var_store().variables().into_iter().collect());
            Some((slot.id(), seed_id, variables))
        })
        .collect();
    Sources { host, fossils }
}

fn same_layout(entries: &[Entry], variables: &[(String, Tensor)]) -> bool {
    entries.len() == variables.len()
        && entries
            .iter()
            .zip(variables)
            .all(|(entry, (name, tensor))| {
                entry.name == *name && entry.size == tensor.size() && entry.kind == tensor.kind()
            })
}

fn describe(variables: &[(String, Tensor)]) -> String {
    variables
        .iter()
        .map(|(name, tensor)| format!("{name}{:?}:{:?}", tensor.size(), tensor.kind()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_entries(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|entry| format!("{}{:?}:{:?}", entry.name, entry.size, entry.kind))
        .collect::<Vec<_>>()
        .join(", ")
}

fn allocate(variables: &[(String, Tensor)], device: Device) -> Result<Vec<Entry>> {
    variables
        .iter()
        .map(|(name, tensor)| {
            let size = tensor.size();
            let kind = tensor.kind();
            let buffer = Tensor::f_empty(size.as_slice(), (kind, Device::Cpu))
                .op("governor snapshot buffer")?;
            let buffer = match device {
                Device::Cuda(_) => torch_ext::memory::pin(&buffer)?,
                _ => buffer,
            };
            Ok(Entry {
                name: name.clone(),
                size,
                kind,
                buffer,
            })
        })
        .collect()
}

/// The last good state in host memory.
#[derive(Debug)]
pub(super) struct Snapshot {
    epoch: usize,
    taken: bool,
    device: Device,
    host: Vec<Entry>,
    fossils: Vec<Fossil>,
    /// CUDA only: the side stream the copies run on and the event after
    /// the last batch of copies.
    side: Option<(CudaStream, CudaEvent)>,
}

impl Snapshot {
    pub(super) fn epoch(&self) -> usize {
        self.epoch
    }

    pub(super) fn is_taken(&self) -> bool {
        self.taken
    }

    pub(super) fn data_ptrs(&self) -> Vec<usize> {
        self.host
            .iter()
            .chain(self.fossils.iter().flat_map(|fossil| fossil.entries.iter()))
            .map(|entry| entry.buffer.data_ptr() as usize)
            .collect()
    }

    fn matches(&self, device: Device, sources: &Sources) -> bool {
        self.device == device
            && same_layout(&self.host, &sources.host)
            && self.fossils.len() == sources.fossils.len()
            && self.fossils.iter().zip(&sources.fossils).all(
                |(fossil, (slot, seed_id, variables))| {
                    fossil.slot == *slot
                        && fossil.seed_id == *seed_id
                        && same_layout(&fossil.entries, variables)
                },
            )
    }

    fn allocate(device: Device, sources: &Sources) -> Result<Snapshot> {
        let host = allocate(&sources.host, device)?;
        let fossils = sources
            .fossils
            .iter()
            .map(|(slot, seed_id, variables)| {
                Ok(Fossil {
                    slot: *slot,
                    seed_id: seed_id.clone(),
                    entries: allocate(variables, device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let side = match device {
            Device::Cuda(index) => {
                Some((CudaStream::from_pool(index, false)?, CudaEvent::new(false)?))
            }
            _ => None,
        };
        Ok(Snapshot {
            epoch: 0,
            taken: false,
            device,
            host,
            fossils,
            side,
        })
    }

    /// Pairs of (buffer, source) in snapshot order.
    fn pairs<'a>(
        &'a mut self,
        sources: &'a Sources,
    ) -> impl Iterator<Item = (&'a mut Tensor, &'a Tensor)> {
        let host = self
            .host
            .iter_mut()
            .zip(&sources.host)
            .map(|(entry, (_, tensor))| (&mut entry.buffer, tensor));
        let fossils = self.fossils.iter_mut().zip(&sources.fossils).flat_map(
            |(fossil, (_, _, variables))| {
                fossil
                    .entries
                    .iter_mut()
                    .zip(variables)
                    .map(|(entry, (_, tensor))| (&mut entry.buffer, tensor))
            },
        );
        host.chain(fossils)
    }

    fn copy_from(&mut self, sources: &Sources) -> Result<()> {
        match self.side.take() {
            Some((side, event)) => {
                let outcome = self.copy_on_side_stream(&side, &event, sources);
                self.side = Some((side, event));
                outcome
            }
            None => tch::no_grad(|| {
                for (buffer, source) in self.pairs(sources) {
                    buffer
                        .f_copy_(&source.detach())
                        .op("governor snapshot copy_")?;
                }
                Ok(())
            }),
        }
    }

    fn copy_on_side_stream(
        &mut self,
        side: &CudaStream,
        event: &CudaEvent,
        sources: &Sources,
    ) -> Result<()> {
        let compute = CudaStream::current(side.device())?;
        // The copies see every write queued so far on the compute stream.
        side.wait_stream(&compute)?;
        {
            let _guard = side.make_current()?;
            for (buffer, source) in self.pairs(sources) {
                torch_ext::copy_non_blocking(buffer, &source.detach())?;
            }
        }
        event.record(side)?;
        // Later work on the compute stream (the next epoch's updates) waits
        // for the copies on the device; the host thread goes on at once.
        compute.wait_event(event)?;
        Ok(())
    }

    /// Blocks until the queued copies are done (CUDA) and the device is idle.
    fn settle(&self) -> Result<()> {
        if let Some((side, event)) = &self.side {
            event.synchronize()?;
            torch_ext::cuda::synchronize(side.device())?;
        }
        Ok(())
    }

    /// Checks the model against the snapshot; returns the fossils not in it.
    fn check_layout(&self, model: &MorphogeneticModel, sources: &Sources) -> Result<Vec<SlotId>> {
        if self.device != model.device() {
            return Err(Error::Governor {
                field: "device",
                reason: format!(
                    "snapshot taken on {:?}, the model is on {:?}",
                    self.device,
                    model.device()
                ),
            });
        }
        if !same_layout(&self.host, &sources.host) {
            return Err(Error::Governor {
                field: "host",
                reason: format!(
                    "the host's variables [{}] do not match the snapshot's [{}]",
                    describe(&sources.host),
                    describe_entries(&self.host)
                ),
            });
        }
        for fossil in &self.fossils {
            let current = sources
                .fossils
                .iter()
                .find(|(slot, _, _)| *slot == fossil.slot);
            let Some((_, seed_id, variables)) = current else {
                return Err(Error::Governor {
                    field: "fossils",
                    reason: format!(
                        "slot {} held fossil `{}` at the snapshot and holds no fossil now",
                        fossil.slot, fossil.seed_id
                    ),
                });
            };
            if *seed_id != fossil.seed_id || !same_layout(&fossil.entries, variables) {
                return Err(Error::Governor {
                    field: "fossils",
                    reason: format!(
                        "slot {}: fossil `{}` [{}] does not match the snapshot's `{}` [{}]",
                        fossil.slot,
                        seed_id,
                        describe(variables),
                        fossil.seed_id,
                        describe_entries(&fossil.entries)
                    ),
                });
            }
        }
        Ok(sources
            .fossils
            .iter()
            .map(|(slot, _, _)| *slot)
            .filter(|slot| !self.fossils.iter().any(|fossil| fossil.slot == *slot))
            .collect())
    }

    /// Writes the snapshot into the model's variables; returns the count.
    fn restore(&self, sources: &Sources) -> Result<usize> {
        let mut restored = 0usize;
        tch::no_grad(|| {
            for (entry, (_, variable)) in self.host.iter().zip(&sources.host) {
                variable
                    .shallow_clone()
                    .f_copy_(&entry.buffer)
                    .op("governor restore copy_")?;
                restored = restored.saturating_add(1);
            }
            for fossil in &self.fossils {
                let variables = sources
                    .fossils
                    .iter()
                    .find(|(slot, _, _)| *slot == fossil.slot)
                    .map(|(_, _, variables)| variables.as_slice())
                    .unwrap_or_default();
                for (entry, (_, variable)) in fossil.entries.iter().zip(variables) {
                    variable
                        .shallow_clone()
                        .f_copy_(&entry.buffer)
                        .op("governor restore copy_")?;
                    restored = restored.saturating_add(1);
                }
            }
            Ok(restored)
        })
    }
}

impl Governor {
    /// Copies the host's variables and the FOSSILIZED seeds' variables into
    /// the snapshot buffers (allocated on the first snapshot and whenever the
    /// layout changed, reused otherwise), recording `epoch`. On CUDA the
    /// copies are queued on a side stream (see the module docs); on the CPU
    /// they are done on return. Call it at an epoch boundary, outside any
    /// captured graph.
    pub fn snapshot(&mut self, model: &MorphogeneticModel, epoch: usize) -> Result<()> {
        let device = model.device();
        let sources = sources(model);
        let reusable = self
            .snapshot
            .as_ref()
            .is_some_and(|snapshot| snapshot.matches(device, &sources));
        let mut snapshot = match self.snapshot.take() {
            Some(snapshot) if reusable => snapshot,
            Some(old) => {
                // The old buffers may still be read by queued copies.
                old.settle()?;
                Snapshot::allocate(device, &sources)?
            }
            None => Snapshot::allocate(device, &sources)?,
        };
        // Until the copies are queued the buffers hold no consistent state.
        snapshot.taken = false;
        let outcome = snapshot.copy_from(&sources);
        if outcome.is_ok() {
            snapshot.taken = true;
            snapshot.epoch = epoch;
        }
        self.snapshot = Some(snapshot);
        outcome
    }

    /// Rolls the model back after a panic for `reason`: restores the last
    /// snapshot bitwise, prunes every live (non-fossilized) seed with
    /// `reason`'s string and initiator `governor`, drops the pruned seeds'
    /// optimizer state and zeroes every other group's
    /// ([`GroupOptimizers::sync`], [`GroupOptimizers::rollback`]), resets
    /// the panic count and emits `tolaria.rollback.triggered`, then
    /// `.completed` with the `tolaria.rollback.*` metrics (or `.failed`).
    /// Telemetry cannot stop it: the handle contains emitter panics.
    ///
    /// Without a snapshot, or with one the model no longer matches (see the
    /// module docs), it is [`Error::Governor`] and nothing is changed.
    /// Blocks until the device is idle (a rollback is not on the hot path).
    pub fn rollback(
        &mut self,
        model: &mut MorphogeneticModel,
        optimizers: &mut GroupOptimizers,
        telemetry: &Telemetry,
        reason: PanicReason,
    ) -> Result<RollbackReport> {
        let started = Instant::now();
        telemetry.emit_event(
            leyline::telemetry::sources::TOLARIA,
            TOLARIA_ROLLBACK_TRIGGERED,
            "governor rollback started",
            vec![
                ("reason", reason.as_str().to_owned()),
                ("consecutive_panics", self.consecutive_panics.to_string()),
            ],
        );
        match self.rollback_inner(model, optimizers, reason, started) {
            Ok(report) => {
                telemetry.emit_event(
                    leyline::telemetry::sources::TOLARIA,
                    TOLARIA_ROLLBACK_COMPLETED,
                    "governor rollback finished",
                    vec![
                        ("reason", reason.as_str().to_owned()),
                        ("recovery_ms", report.recovery_ms.to_string()),
                        ("snapshot_epoch", report.snapshot_epoch.to_string()),
                        ("pruned", report.pruned.len().to_string()),
                    ],
                );
                telemetry.emit_metrics(
                    leyline::telemetry::sources::TOLARIA,
                    TelemetryLevel::Warning,
                    [
                        leyline::metric(TOLARIA_ROLLBACK_TOTAL, self.rollbacks as f64),
                        leyline::metric(TOLARIA_ROLLBACK_RECOVERY_MS, report.recovery_ms),
                        leyline::metric(
                            TOLARIA_ROLLBACK_CONSECUTIVE_PANICS,
                            f64::from(report.consecutive_panics),
                        ),
                    ],
                );
                Ok(report)
            }
            Err(error) => {
                telemetry.emit_event(
                    leyline::telemetry::sources::TOLARIA,
                    TOLARIA_ROLLBACK_FAILED,
                    "governor rollback failed",
                    vec![
                        ("reason", reason.as_str().to_owned()),
                        ("error", error.to_string()),
                    ],
                );
                Err(error)
            }
        }
    }

    fn rollback_inner(
        &mut self,
        model: &mut MorphogeneticModel,
        optimizers: &mut GroupOptimizers,
        reason: PanicReason,
        started: Instant,
    ) -> Result<RollbackReport> {
        let Some(snapshot) = self.snapshot.as_ref().filter(|s| s.is_taken()) else {
            return Err(Error::Governor {
                field: "snapshot",
                reason: "no snapshot has been taken; call snapshot before rollback".to_owned(),
            });
        };
        snapshot.settle()?;
        let sources = sources(model);
        let unrestored_fossils = snapshot.check_layout(model, &sources)?;
        let restored_tensors = snapshot.restore(&sources)?;
        let snapshot_epoch = snapshot.epoch();
        let live: Vec<SlotId> = model
            .slots()
            .iter()
            .filter(|slot| {
                slot.seed_module().is_some() && slot.stage() != Some(SeedStage::Fossilized)
            })
            .map(|slot| slot.id())
            .collect();
        let mut pruned = Vec::with_capacity(live.len());
        for slot in live {
            let done = model
                .prune(slot, reason.as_str(), PruneInitiator::Governor)
                .map_err(|error| Error::Governor {
                    field: "prune",
                    reason: format!("slot {slot}: {error}"),
                })?;
            if done {
                pruned.push(slot);
            }
        }
        optimizers.sync(model)?;
        optimizers.rollback()?;
        let consecutive_panics = self.consecutive_panics;
        self.consecutive_panics = 0;
        self.rollbacks = self.rollbacks.saturating_add(1);
        Ok(RollbackReport {
            reason,
            snapshot_epoch,
            loss_at_panic: self.last_panic_loss.take(),
            consecutive_panics,
            restored_tensors,
            pruned,
            unrestored_fossils,
            recovery_ms: started.elapsed().as_secs_f64() * 1000.0,
        })
    }
}
