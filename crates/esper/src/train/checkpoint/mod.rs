//! Crash-safe checkpoints of `esper train`: `RUN_DIR/checkpoints/<epoch>/`
//! after that many finished epochs. The trainer's state is tolaria's
//! (`ModelTrainer::export_state`, `ModelTrainer::restore`, in
//! `tolaria::engine::trainer::state`); this module decides where it goes,
//! adds what the run knows beside the trainer (configuration, controller,
//! log and telemetry lengths), and owns the directory format, the checksums
//! and the atomic writes. A checkpoint holds
//!
//! - `tensors.safetensors`: every tensor of the trainer's state, loadable
//!   from Python (`safetensors.torch.load_file`), named as tolaria names
//!   them: the host's parameters and buffers (`model/host/<name>`), each
//!   live seed's variables (`model/seed/<slot>/<name>`), each optimizer
//!   group's learning rate, step count and state (`optim/<group>/lr`,
//!   `optim/<group>/step_count`, `optim/<group>/state/<i>`), and the
//!   governor's snapshot (`governor/host/<name>`,
//!   `governor/fossil/<slot>/<name>`);
//! - `manifest.json`: the format and version, the run configuration, the
//!   epoch, the random state, every slot's lifecycle state, the
//!   controller's state, the governor's counters, what each tensor is
//!   (role, dtype, shape), how far `epochs.jsonl` and the telemetry files
//!   had got, and the size and FNV-1a 64 checksum of `tensors.safetensors`;
//!   the manifest carries the checksum of its own body too.
//!
//! A checkpoint is written into `checkpoints/.partial-<epoch>/` (each file
//! written, then `fsync`ed; then the folder `fsync`ed), renamed to
//! `checkpoints/<epoch>/`, and `checkpoints/` is `fsync`ed: a crash leaves
//! either the whole checkpoint or a `.partial-` folder that is ignored.
//! A resume goes through the checkpoints newest first ([`candidates`]) and
//! takes the first that verifies ([`verify`]: manifest parses, its checksum
//! holds, every file has its recorded size and checksum, every tensor the
//! manifest lists is in the file with its dtype and shape) *and* restores
//! into a fresh model and trainer (`ModelTrainer::restore` with
//! [`Loaded::trainer_state`]);
//! every newer one passed over gets a warning naming what was wrong. Only
//! then are `epochs.jsonl` and the telemetry files cut back to it
//! ([`TelemetryRewind`], planned before and carried out after).
//!
//! The random state: libtorch's generator is seeded at the start of every
//! epoch from the run's seed and the epoch (tolaria's `epoch_seed`), so
//! nothing has to be read out of it; the device shuffle is seeded per epoch
//! by tolaria (`StagedData::set_epoch`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tamiyo::heuristic::HeuristicState;
use tch::Tensor;
use tolaria::engine::trainer::{
    GovernorManifest, ModelTrainer, OptimizerGroup, SlotState, TensorEntry, TrainerManifest,
    TrainerState,
};

use super::config::RunConfig;

/// The folder of the checkpoints inside the run directory.
pub(crate) const DIR: &str = "checkpoints";
/// The manifest's file name inside a checkpoint.
pub(crate) const MANIFEST: &str = "manifest.json";
/// The tensors' file name inside a checkpoint.
pub(crate) const TENSORS: &str = "tensors.safetensors";
/// The `format` field of every manifest.
pub(crate) const FORMAT: &str = "esper-checkpoint";
/// The manifest version this program writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Prefix of a checkpoint folder being written.
const PARTIAL_PREFIX: &str = ".partial-";

/// FNV-1a, 64 bits, of `bytes`.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A file of the checkpoint with its size and checksum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileChecksum {
    /// File name inside the checkpoint folder.
    pub(crate) name: String,
    /// Size in bytes.
    pub(crate) bytes: u64,
    /// FNV-1a 64 of the contents, 16 hex digits.
    pub(crate) fnv1a64: String,
}

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

/// The manifest body (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    /// Always [`FORMAT`].
    pub(crate) format: String,
    /// [`VERSION`].
    pub(crate) version: u32,
    /// Epochs finished.
    pub(crate) epoch: usize,
    /// Seeds germinated so far.
    pub(crate) germinations: u64,
    /// The run configuration.
    pub(crate) config: RunConfig,
    /// The random state.
    pub(crate) rng: RngState,
    /// Every enabled slot, in execution order.
    pub(crate) slots: Vec<SlotState>,
    /// The heuristic controller's state.
    pub(crate) controller: HeuristicState,
    /// The governor, if on.
    pub(crate) governor: Option<GovernorManifest>,
    /// Every optimizer group.
    pub(crate) optimizers: Vec<OptimizerGroup>,
    /// Every tensor of `tensors.safetensors`.
    pub(crate) tensors: Vec<TensorEntry>,
    /// Lines of `epochs.jsonl` belonging to this checkpoint.
    pub(crate) epoch_log_records: usize,
    /// The telemetry files and their lengths.
    pub(crate) telemetry: Vec<FileLength>,
    /// The checkpoint's other files.
    pub(crate) files: Vec<FileChecksum>,
}

/// `manifest.json`: the body and the checksum of its JSON.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    /// `fnv1a64:<16 hex digits>` of the compact JSON of `manifest`.
    checksum: String,
    /// The body.
    manifest: serde_json::Value,
}

impl Manifest {
    /// The trainer's part of the manifest.
    pub(crate) fn trainer(&self) -> TrainerManifest {
        TrainerManifest {
            epoch: self.epoch,
            germinations: self.germinations,
            slots: self.slots.clone(),
            governor: self.governor.clone(),
            optimizers: self.optimizers.clone(),
            tensors: self.tensors.clone(),
        }
    }
}

/// What the epoch loop knows at a checkpoint beside the trainer.
pub(crate) struct Extras<'a> {
    /// The run configuration.
    pub(crate) config: &'a RunConfig,
    /// The controller's state.
    pub(crate) controller: HeuristicState,
    /// Records in `epochs.jsonl`.
    pub(crate) epoch_log_records: usize,
}

mod load;
mod save;

pub(crate) use load::*;
pub(crate) use save::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
