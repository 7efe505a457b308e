//! `RUN_DIR/epochs.jsonl`: one JSON object per epoch, written (and flushed)
//! as each epoch ends, so that a run cut short keeps every finished epoch,
//! and read back by `esper plot`.
//!
//! A line holds the epoch's figures (`train_loss`, `train_accuracy`,
//! `val_loss`, `val_accuracy`, `epoch_ms`, `samples_per_s`), every enabled
//! slot's stage name and alpha after the epoch boundary, the controller's
//! decision with what applying it did, and the governor's rollback if one
//! happened. A loss that is not finite (a diverged epoch the governor rolled
//! back) is written as `null`, since JSON has no NaN.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kasmina::model::MorphogeneticModel;
use leyline::{LifecycleOp, SeedStage};
use serde::{Deserialize, Serialize};
use tolaria::controller::{Applied, DeadlineOutcome};
use tolaria::engine::trainer::ModelEpochReport;

/// The file name inside the run directory.
pub(crate) const FILE_NAME: &str = "epochs.jsonl";

/// One slot after an epoch boundary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SlotRecord {
    /// Slot id, e.g. `r0c1`.
    pub(crate) slot: String,
    /// Stage name (leyline's, e.g. `BLENDING`); `DORMANT` for an empty slot.
    pub(crate) stage: String,
    /// Blend amplitude in `[0, 1]`.
    pub(crate) alpha: f64,
    /// Blueprint of the seed in the slot, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) blueprint: Option<String>,
    /// Id of the seed in the slot, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) seed_id: Option<String>,
}

/// The controller's decision at an epoch boundary and what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DecisionRecord {
    /// Lifecycle operation (leyline's name, e.g. `GERMINATE`).
    pub(crate) op: String,
    /// Target slot (every operation but WAIT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) slot: Option<String>,
    /// Blueprint (GERMINATE only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) blueprint: Option<String>,
    /// The controller's reason (e.g. `plateau`), or `timeout` /
    /// `controller_failed` when the deadline turned it into WAIT.
    pub(crate) reason: String,
    /// What applying it did: `waited`, `germinated`, `advanced`,
    /// `fossilized`, `pruned`, `kept` (a prune Kasmina declined), or the
    /// gate's refusal (`refused: G2 failed: ...`).
    pub(crate) outcome: String,
}

/// One line of `epochs.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EpochRecord {
    /// Zero-based epoch.
    pub(crate) epoch: usize,
    /// Mean training loss (`null` when not finite).
    pub(crate) train_loss: Option<f64>,
    /// Training accuracy, percent.
    pub(crate) train_accuracy: f64,
    /// Validation loss (`null` when not finite).
    pub(crate) val_loss: Option<f64>,
    /// Validation accuracy, percent.
    pub(crate) val_accuracy: f64,
    /// Wall time of the whole epoch (steps, validation, boundary), ms.
    pub(crate) epoch_ms: f64,
    /// Training samples per second of wall time.
    pub(crate) samples_per_s: f64,
    /// Seeds on the forward path after the boundary.
    pub(crate) active_seeds: usize,
    /// Every enabled slot, in execution order.
    pub(crate) slots: Vec<SlotRecord>,
    /// The decision applied at the boundary (`null` without one, e.g.
    /// after a rollback).
    pub(crate) decision: Option<DecisionRecord>,
    /// The governor's rollback reason (e.g. `governor_nan`), if it rolled
    /// back this epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rollback: Option<String>,
    /// A language model's validation perplexity, `exp(val_loss)` (absent on
    /// the image tasks and when not finite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) val_perplexity: Option<f64>,
}

fn finite(value: f64) -> Option<f64> {
    value.is_finite().then_some(value)
}

impl EpochRecord {
    /// The record of `report`, with the slots of `model` as they are after
    /// the boundary and `epoch_ms` of wall time.
    pub(crate) fn new(
        report: &ModelEpochReport,
        model: &MorphogeneticModel,
        epoch_ms: f64,
    ) -> EpochRecord {
        let (val_loss, val_accuracy) = report
            .validation
            .map_or((report.train.loss, report.train.accuracy), |validation| {
                (validation.loss, validation.accuracy)
            });
        let seconds = epoch_ms / 1000.0;
        EpochRecord {
            epoch: report.epoch,
            train_loss: finite(report.train.loss),
            train_accuracy: report.train.accuracy,
            val_loss: finite(val_loss),
            val_accuracy,
            epoch_ms,
            samples_per_s: if seconds > 0.0 {
                report.train.samples as f64 / seconds
            } else {
                0.0
            },
            active_seeds: report.active_seeds,
            slots: slot_records(model),
            decision: report
                .decision
                .as_ref()
                .map(|(outcome, applied)| decision_record(outcome, applied)),
            rollback: report
                .rollback
                .as_ref()
                .map(|rollback| rollback.reason.as_str().to_owned()),
            val_perplexity: None,
        }
    }

    /// The same record with the validation perplexity of a language model
    /// (`exp` of its per-token validation loss).
    pub(crate) fn with_perplexity(mut self) -> EpochRecord {
        self.val_perplexity = self.val_loss.map(f64::exp).and_then(finite);
        self
    }

    /// The record of one epoch of a PPO episode (simic's trace: no wall
    /// time, the decision as the op carried out).
    pub(crate) fn from_trace(epoch: &simic::vectorized::TraceEpoch) -> EpochRecord {
        let op = epoch.op;
        let outcome = match (op, epoch.succeeded) {
            (LifecycleOp::Wait, _) => "waited".to_owned(),
            (LifecycleOp::Germinate, true) => "germinated".to_owned(),
            (LifecycleOp::Advance, true) => "advanced".to_owned(),
            (LifecycleOp::Fossilize, true) => "fossilized".to_owned(),
            (LifecycleOp::Prune, true) => "pruned".to_owned(),
            (LifecycleOp::Prune, false) => "kept".to_owned(),
            (_, false) => "refused".to_owned(),
            (_, true) => "applied".to_owned(),
        };
        EpochRecord {
            epoch: epoch.epoch,
            train_loss: finite(epoch.train.0),
            train_accuracy: epoch.train.1,
            val_loss: finite(epoch.validation.0),
            val_accuracy: epoch.validation.1,
            epoch_ms: 0.0,
            samples_per_s: 0.0,
            active_seeds: epoch.active_seeds,
            slots: epoch
                .slots
                .iter()
                .map(|slot| SlotRecord {
                    slot: slot.slot.clone(),
                    stage: slot.stage.name().to_owned(),
                    alpha: slot.alpha,
                    blueprint: slot.blueprint.clone(),
                    seed_id: slot.seed_id.clone(),
                })
                .collect(),
            decision: Some(DecisionRecord {
                op: op.name().to_owned(),
                slot: epoch.slot.clone(),
                blueprint: epoch.blueprint.map(str::to_owned),
                reason: "policy".to_owned(),
                outcome,
            }),
            rollback: None,
            val_perplexity: None,
        }
    }

    /// The decision, if it changed the model (a WAIT, a gate that refused
    /// and a declined prune did not).
    pub(crate) fn acted(&self) -> Option<&DecisionRecord> {
        self.decision.as_ref().filter(|decision| {
            !matches!(decision.outcome.as_str(), "waited" | "kept")
                && !decision.outcome.starts_with("refused")
        })
    }
}

/// Every enabled slot of `model`, in execution order.
pub(crate) fn slot_records(model: &MorphogeneticModel) -> Vec<SlotRecord> {
    model
        .slots()
        .iter()
        .map(|slot| SlotRecord {
            slot: slot.id().to_string(),
            stage: slot.stage().unwrap_or(SeedStage::Dormant).name().to_owned(),
            alpha: slot.alpha(),
            blueprint: slot
                .state()
                .map(|state| state.blueprint().name().to_owned()),
            seed_id: slot.state().map(|state| state.seed_id().to_owned()),
        })
        .collect()
}

fn decision_record(outcome: &DeadlineOutcome, applied: &Applied) -> DecisionRecord {
    let decision = outcome.decision();
    let result = match applied {
        Applied::Waited => "waited".to_owned(),
        Applied::Germinated { .. } => "germinated".to_owned(),
        Applied::GateEvaluated {
            op, passed: true, ..
        } => {
            if *op == leyline::LifecycleOp::Fossilize {
                "fossilized".to_owned()
            } else {
                "advanced".to_owned()
            }
        }
        Applied::GateEvaluated {
            passed: false,
            message,
            ..
        } => format!("refused: {message}"),
        Applied::Pruned { pruned: true, .. } => "pruned".to_owned(),
        Applied::Pruned { pruned: false, .. } => "kept".to_owned(),
        Applied::Refused { reason, .. } => format!("refused: {reason}"),
    };
    DecisionRecord {
        op: decision.op.name().to_owned(),
        slot: decision.slot.map(|slot| slot.to_string()),
        blueprint: decision
            .blueprint
            .map(|blueprint| blueprint.blueprint_id().to_owned()),
        reason: decision.reason.to_owned(),
        outcome: result,
    }
}

/// Appends records to `epochs.jsonl`, one flushed line each.
#[derive(Debug)]
pub(crate) struct EpochLog {
    path: PathBuf,
    file: File,
}

impl EpochLog {
    /// Creates (or truncates) `dir/epochs.jsonl`.
    pub(crate) fn create(dir: &Path) -> Result<EpochLog> {
        let path = dir.join(FILE_NAME);
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(EpochLog { path, file })
    }

    /// Opens `dir/epochs.jsonl` to append (a resumed run, after
    /// [`Rewind::apply`]).
    pub(crate) fn append_to(dir: &Path) -> Result<EpochLog> {
        let path = dir.join(FILE_NAME);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(EpochLog { path, file })
    }

    /// Writes `record` as one line and flushes it to the file.
    pub(crate) fn append(&mut self, record: &EpochRecord) -> Result<()> {
        let mut line = serde_json::to_vec(record).context("encoding an epoch record")?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Reads every record of `dir/epochs.jsonl` (blank lines skipped; a line
/// that does not parse is an error naming its number).
pub(crate) fn read(dir: &Path) -> Result<Vec<EpochRecord>> {
    read_file(dir, FILE_NAME)
}

/// The records of `dir/name` (`epochs.jsonl`, or a PPO run's
/// `episode.jsonl`), refused as [`read`] refuses.
pub(crate) fn read_file(dir: &Path, name: &str) -> Result<Vec<EpochRecord>> {
    let path = dir.join(name);
    let file = File::open(&path).with_context(|| {
        format!(
            "opening {} (is {} the directory of an `esper train` run?)",
            path.display(),
            dir.display()
        )
    })?;
    let mut records = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}", path.display(), index + 1))?;
        records.push(record);
        if records.len() > super::config::MAX_EPOCHS {
            anyhow::bail!(
                "{} holds more than the {} epochs a run may have",
                path.display(),
                super::config::MAX_EPOCHS
            );
        }
    }
    Ok(records)
}

/// Cutting `epochs.jsonl` back to the records of a checkpoint: planned
/// ([`Rewind::plan`]) by reading the file only, carried out
/// ([`Rewind::apply`]) once the run is known to resume.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rewind {
    /// The records kept.
    pub(crate) kept: Vec<EpochRecord>,
    /// Their lines, as the file holds them, each ending in a newline.
    bytes: Vec<u8>,
}

impl Rewind {
    /// Keeps the first `records` records of `dir/epochs.jsonl` (those of a
    /// checkpoint) and drops the rest, a line cut short by a crash
    /// included. Fewer than `records` whole records is an error.
    pub(crate) fn plan(dir: &Path, records: usize) -> Result<Rewind> {
        let path = dir.join(FILE_NAME);
        let text = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut kept = Vec::new();
        let mut bytes = Vec::new();
        for (index, line) in text.split(|byte| *byte == b'\n').enumerate() {
            if kept.len() == records {
                break;
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record: EpochRecord = serde_json::from_slice(line)
                .with_context(|| format!("{} line {}", path.display(), index + 1))?;
            bytes.extend_from_slice(line);
            bytes.push(b'\n');
            kept.push(record);
        }
        if kept.len() < records {
            anyhow::bail!(
                "{} holds {} epochs, the checkpoint expects at least {records}",
                path.display(),
                kept.len()
            );
        }
        Ok(Rewind { kept, bytes })
    }

    /// Rewrites `dir/epochs.jsonl` with the kept records, atomically
    /// (`durable::write_file`); returns them.
    pub(crate) fn apply(self, dir: &Path) -> Result<Vec<EpochRecord>> {
        let path = dir.join(FILE_NAME);
        durable::write_file(&path, &self.bytes)
            .with_context(|| format!("replacing {}", path.display()))?;
        Ok(self.kept)
    }
}

/// [`Rewind::plan`] and [`Rewind::apply`] at once.
#[cfg(test)]
pub(crate) fn rewind(dir: &Path, records: usize) -> Result<Vec<EpochRecord>> {
    Rewind::plan(dir, records)?.apply(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(epoch: usize) -> EpochRecord {
        EpochRecord {
            epoch,
            train_loss: Some(1.0),
            train_accuracy: 50.0,
            val_loss: None,
            val_accuracy: 40.0,
            epoch_ms: 10.0,
            samples_per_s: 100.0,
            active_seeds: 0,
            slots: Vec::new(),
            decision: None,
            rollback: None,
            val_perplexity: None,
        }
    }

    #[test]
    fn rewind_keeps_the_checkpoints_records_and_drops_a_line_cut_short() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = EpochLog::create(dir.path()).expect("log");
        for epoch in 0..3 {
            log.append(&record(epoch)).expect("append");
        }
        drop(log);
        let path = dir.path().join(FILE_NAME);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(b"{\"epoch\":3,\"train_lo")
            .expect("a crash mid-line");
        drop(file);
        let kept = rewind(dir.path(), 2).expect("rewind");
        assert_eq!(kept, [record(0), record(1)]);
        assert_eq!(
            read(dir.path()).expect("read"),
            kept,
            "the file holds them only"
        );
        let mut log = EpochLog::append_to(dir.path()).expect("append");
        log.append(&record(2)).expect("append");
        assert_eq!(read(dir.path()).expect("read").len(), 3);
        let before = std::fs::read(&path).expect("read");
        let error = rewind(dir.path(), 5).expect_err("too few");
        assert!(error.to_string().contains("holds 3 epochs"), "{error}");
        assert_eq!(
            std::fs::read(&path).expect("read"),
            before,
            "a refused rewind leaves the file as it was"
        );
    }
}
