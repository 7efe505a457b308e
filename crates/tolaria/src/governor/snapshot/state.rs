//! The governor's state for a checkpoint: [`Governor::export_state`] copies
//! the loss history, panic counters and the snapshot's buffers out to the
//! CPU; [`Governor::import_state`] checks such a state and puts it back in
//! fresh buffers.

use super::super::Governor;
use super::{Entry, Snapshot, Sources};
use crate::error::TorchResultExt;
use crate::{Error, Result};
use kasmina::host::SlotId;
use tch::{Device, Tensor};

/// A fossil's part of an exported snapshot.
#[derive(Debug)]
pub struct FossilSnapshot {
    /// The slot holding the fossil.
    pub slot: SlotId,
    /// The fossil's seed id.
    pub seed_id: String,
    /// Its variables (module and gate), sorted by name, on the CPU.
    pub variables: Vec<(String, Tensor)>,
}

/// An exported snapshot (see [`GovernorState`]).
#[derive(Debug)]
pub struct SnapshotState {
    /// The epoch it was taken at.
    pub epoch: usize,
    /// The host's variables, sorted by name, on the CPU.
    pub host: Vec<(String, Tensor)>,
    /// The fossils' variables, in execution order.
    pub fossils: Vec<FossilSnapshot>,
}

/// Everything a [`Governor`] remembers, for a checkpoint: the loss history,
/// the panic count, the last panic's loss, the rollbacks done and the
/// snapshot (copies of its buffers). [`Governor::import_state`] of
/// [`Governor::export_state`] judges and rolls back exactly as the original.
#[derive(Debug)]
pub struct GovernorState {
    /// The losses kept, oldest first.
    pub history: Vec<f64>,
    /// Anomalies (or panics) in a row.
    pub consecutive_panics: u32,
    /// The loss of the last panic.
    pub last_panic_loss: Option<f64>,
    /// Rollbacks completed.
    pub rollbacks: u64,
    /// The snapshot held, if one was taken.
    pub snapshot: Option<SnapshotState>,
}

fn copied(entries: &[Entry]) -> Result<Vec<(String, Tensor)>> {
    entries
        .iter()
        .map(|entry| {
            let mut copy = Tensor::f_empty(entry.size.as_slice(), (entry.kind, Device::Cpu))
                .op("governor export buffer")?;
            copy.f_copy_(&entry.buffer).op("governor export copy_")?;
            Ok((entry.name.clone(), copy))
        })
        .collect()
}

fn check_variables(field: &'static str, variables: &[(String, Tensor)]) -> Result<()> {
    for pair in variables.windows(2) {
        if let [(before, _), (after, _)] = pair
            && before >= after
        {
            return Err(Error::Governor {
                field,
                reason: format!(
                    "variable names must be sorted and unique: `{before}` before `{after}`"
                ),
            });
        }
    }
    Ok(())
}

/// Every floating-point variable of an imported snapshot finite: the
/// rollback copies them into the model, so a NaN here would put NaN weights
/// back into the host it is meant to rescue. The variables are on the CPU
/// (an exported state's copies), so this reads nothing back from a device.
fn check_finite_variables(field: &'static str, variables: &[(String, Tensor)]) -> Result<()> {
    for (name, tensor) in variables {
        if !tensor.is_floating_point() || tensor.numel() == 0 {
            continue;
        }
        let finite = tensor
            .f_isfinite()
            .and_then(|finite| finite.f_all())
            .and_then(|all| all.f_int64_value(&[]))
            .op("governor import isfinite")?;
        if finite == 0 {
            return Err(Error::Governor {
                field,
                reason: format!("variable `{name}` holds NaN or an infinity"),
            });
        }
    }
    Ok(())
}

impl Governor {
    /// The governor's state (see [`GovernorState`]); waits for the
    /// snapshot's queued copies on CUDA.
    pub fn export_state(&self) -> Result<GovernorState> {
        let snapshot = match self.snapshot.as_ref().filter(|snapshot| snapshot.taken) {
            Some(snapshot) => {
                snapshot.settle()?;
                Some(SnapshotState {
                    epoch: snapshot.epoch,
                    host: copied(&snapshot.host)?,
                    fossils: snapshot
                        .fossils
                        .iter()
                        .map(|fossil| {
                            Ok(FossilSnapshot {
                                slot: fossil.slot,
                                seed_id: fossil.seed_id.clone(),
                                variables: copied(&fossil.entries)?,
                            })
                        })
                        .collect::<Result<_>>()?,
                })
            }
            None => None,
        };
        Ok(GovernorState {
            history: self.history(),
            consecutive_panics: self.consecutive_panics,
            last_panic_loss: self.last_panic_loss,
            rollbacks: self.rollbacks,
            snapshot,
        })
    }

    /// Replaces the governor's state with `state`, its snapshot held in
    /// fresh buffers for a model on `device`. A history longer than the
    /// window or with a non-finite loss, a non-finite last panic loss,
    /// snapshot variables not sorted by unique name or holding NaN or an
    /// infinity, is [`Error::Governor`] and nothing is changed. The
    /// snapshot's layout is checked against the model at a rollback, as
    /// always.
    pub fn import_state(&mut self, state: GovernorState, device: Device) -> Result<()> {
        if state.history.len() > self.config.history_window {
            return Err(Error::Governor {
                field: "history",
                reason: format!(
                    "{} losses, the window keeps {}",
                    state.history.len(),
                    self.config.history_window
                ),
            });
        }
        if let Some(loss) = state.history.iter().find(|loss| !loss.is_finite()) {
            return Err(Error::Governor {
                field: "history",
                reason: format!("loss {loss} is not finite"),
            });
        }
        if let Some(loss) = state.last_panic_loss.filter(|loss| !loss.is_finite()) {
            return Err(Error::Governor {
                field: "last_panic_loss",
                reason: format!("loss {loss} is not finite"),
            });
        }
        let snapshot = match state.snapshot {
            Some(exported) => {
                check_variables("snapshot.host", &exported.host)?;
                check_finite_variables("snapshot.host", &exported.host)?;
                for fossil in &exported.fossils {
                    check_variables("snapshot.fossils", &fossil.variables)?;
                    check_finite_variables("snapshot.fossils", &fossil.variables)?;
                }
                let sources = Sources {
                    host: exported.host,
                    fossils: exported
                        .fossils
                        .into_iter()
                        .map(|fossil| (fossil.slot, fossil.seed_id, fossil.variables))
                        .collect(),
                };
                let mut snapshot = Snapshot::allocate(device, &sources)?;
                snapshot.copy_from(&sources)?;
                snapshot.settle()?;
                snapshot.taken = true;
                snapshot.epoch = exported.epoch;
                Some(snapshot)
            }
            None => None,
        };
        // Settle the old snapshot's queued copies before anything is
        // replaced, so a failure here leaves the governor as it was.
        if let Some(old) = self.snapshot.as_ref() {
            old.settle()?;
        }
        self.history = state.history.into_iter().collect();
        self.consecutive_panics = state.consecutive_panics;
        self.last_panic_loss = state.last_panic_loss;
        self.rollbacks = state.rollbacks;
        self.snapshot = snapshot;
        Ok(())
    }
}
