//! Crash-safe checkpoints of `esper train`: `RUN_DIR/checkpoints/<epoch>/`
//! after that many finished epochs. The directory, its checksums and its
//! atomic write are tolaria's (`ModelTrainer::save_checkpoint`,
//! `tolaria::engine::trainer::read_checkpoint`, through `durable`'s one
//! checkpoint-directory writer); this module decides where and when, and
//! adds what the run knows beside the trainer as the manifest's extra
//! fields:
//!
//! - `config`: the run configuration;
//! - `rng`: how libtorch's generator and the device shuffle are seeded;
//! - `controller`: the controller's state (the heuristic's, or a scripted
//!   baseline's name and whether it has germinated);
//! - `epoch_log_records`, `telemetry`: how far `epochs.jsonl` and the
//!   telemetry files had got.
//!
//! Beside them the manifest holds the trainer's fields (`epoch`,
//! `germinations`, `slots`, `governor`, `optimizers`, `tensors`), `format`
//! and `version`, and `durable`'s `files` list; `tensors.safetensors` holds
//! the tensors (see tolaria's `engine::trainer::state` for their names).
//!
//! A resume goes through the checkpoints newest first ([`candidates`]) and
//! takes the first that verifies ([`verify`]: every checksum holds, the
//! fields parse) *and* restores into a fresh model and trainer
//! (`ModelTrainer::restore` with [`Loaded::state`]); every newer one passed
//! over gets a warning naming what was wrong. Only then are `epochs.jsonl`
//! and the telemetry files cut back to it ([`TelemetryRewind`], planned
//! before and carried out after).
//!
//! The random state: libtorch's generator is seeded at the start of every
//! epoch from the run's seed and the epoch (tolaria's `epoch_seed`), so
//! nothing has to be read out of it; the device shuffle is seeded per epoch
//! by tolaria (`StagedData::set_epoch`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tamiyo::heuristic::HeuristicState;
use tolaria::engine::trainer::{ModelTrainer, TrainerState};

use super::config::RunConfig;

/// The folder of the checkpoints inside the run directory.
pub(crate) const DIR: &str = "checkpoints";

/// A telemetry file and how long it was at the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileLength {
    /// File name inside `RUN_DIR/telemetry/`.
    pub(crate) file: String,
    /// Its length in bytes.
    pub(crate) bytes: u64,
}

/// The random state of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RngState {
    /// How libtorch's generator is seeded.
    pub(crate) libtorch: String,
    /// The libtorch seed of the next epoch.
    pub(crate) next_epoch_libtorch_seed: i64,
    /// The seed of the device shuffle.
    pub(crate) shuffle_seed: u64,
    /// The shuffle epoch of the next epoch.
    pub(crate) next_shuffle_epoch: u64,
}

/// A controller's state in a checkpoint: the heuristic's (its tracker,
/// embargo and penalties), or a scripted baseline's (its name and whether
/// it has germinated: only germinate-once keeps anything).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum ControllerState {
    /// `--controller heuristic`.
    Heuristic(HeuristicState),
    /// `--controller no-growth`, `max-growth` or `germinate-once`.
    Scripted(ScriptedState),
}

/// A scripted baseline controller's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptedState {
    /// The controller's command-line name.
    pub(crate) scripted: String,
    /// Whether it has seen its seed (germinate-once).
    pub(crate) germinated: bool,
}

/// The run's fields of a checkpoint's manifest, beside the trainer's (see
/// the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunFields {
    /// The run configuration.
    pub(crate) config: RunConfig,
    /// The random state.
    pub(crate) rng: RngState,
    /// The controller's state.
    pub(crate) controller: ControllerState,
    /// Lines of `epochs.jsonl` belonging to this checkpoint.
    pub(crate) epoch_log_records: usize,
    /// The telemetry files and their lengths.
    pub(crate) telemetry: Vec<FileLength>,
}

/// What the epoch loop knows at a checkpoint beside the trainer.
pub(crate) struct Extras<'a> {
    /// The run configuration.
    pub(crate) config: &'a RunConfig,
    /// The controller's state.
    pub(crate) controller: ControllerState,
    /// Records in `epochs.jsonl`.
    pub(crate) epoch_log_records: usize,
}

mod load;
mod save;

pub(crate) use load::*;
pub(crate) use save::*;
