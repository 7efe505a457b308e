//! Crash-safe checkpoints of `esper train`: `RUN_DIR/checkpoints/<epoch>/`
//! after that many finished epochs, holding
//!
//! - `tensors.safetensors`: every tensor of the run's state, loadable from
//!   Python (`safetensors.torch.load_file`): the host's parameters and
//!   buffers (`model/host/<name>`), each live seed's variables
//!   (`model/seed/<slot>/<name>`), each optimizer group's learning rate,
//!   step count and state (`optim/<group>/lr`, `optim/<group>/step_count`,
//!   `optim/<group>/state/<i>`), and the governor's snapshot
//!   (`governor/host/<name>`, `governor/fossil/<slot>/<name>`);
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
//! into a fresh model and trainer ([`restore_model`], [`restore_trainer`]);
//! every newer one passed over gets a warning naming what was wrong. Only
//! then are `epochs.jsonl` and the telemetry files cut back to it
//! ([`TelemetryRewind`], planned before and carried out after).
//!
//! The random state: libtorch's generator is seeded at the start of every
//! epoch from the run's seed and the epoch ([`epoch_seed`]), so nothing has
//! to be read out of it; the device shuffle is seeded per epoch by tolaria
//! (`StagedData::set_epoch`).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kasmina::groups::GroupKey;
use kasmina::host::SlotId;
use kasmina::lifecycle::SeedState;
use kasmina::model::MorphogeneticModel;
use serde::{Deserialize, Serialize};
use tamiyo::heuristic::HeuristicState;
use tch::{Device, Tensor};
use tolaria::engine::trainer::ModelTrainer;
use tolaria::governor::{FossilSnapshot, GovernorState, SnapshotState};
use tolaria::optim::GroupOptimizerConfig;

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

/// The libtorch seed of epoch `epoch` of a run seeded `seed` (set before
/// the epoch's steps, so that anything drawing from libtorch's generator,
/// e.g. a germinated seed's initial weights, draws the same numbers in a
/// resumed run).
pub(crate) fn epoch_seed(seed: u64, epoch: usize) -> i64 {
    let mut mixed = seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed ^= mixed >> 31;
    mixed = mixed.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed ^= mixed >> 29;
    i64::from_ne_bytes(mixed.to_ne_bytes())
}

/// One tensor of `tensors.safetensors`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TensorEntry {
    /// Its name in the file.
    pub(crate) name: String,
    /// What it is, e.g. `host parameter or buffer`, `optimizer state`.
    pub(crate) role: String,
    /// libtorch dtype, e.g. `Float`.
    pub(crate) dtype: String,
    /// Shape.
    pub(crate) shape: Vec<i64>,
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

/// One slot's lifecycle at the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SlotState {
    /// Slot id, e.g. `r0c1`.
    pub(crate) slot: String,
    /// Stage name; `DORMANT` for an empty slot.
    pub(crate) stage: String,
    /// The seed's id, if the slot holds a state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) seed_id: Option<String>,
    /// The seed's blueprint, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) blueprint: Option<String>,
    /// Alpha.
    pub(crate) alpha: f64,
    /// Kasmina's whole lifecycle state of the seed (stage, history, alpha
    /// controller, blend settings, metrics, cooldown), if the slot holds
    /// one; checked by Kasmina when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lifecycle: Option<SeedState>,
}

/// One optimizer group's tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OptimizerGroup {
    /// `host` or `seed/<slot>`.
    pub(crate) group: String,
    /// The group's optimizer configuration.
    pub(crate) config: GroupOptimizerConfig,
    /// Tensor name of the learning rate.
    pub(crate) learning_rate: String,
    /// Tensor name of the step count.
    pub(crate) step_count: String,
    /// Tensor names of the state, in the optimizer's order.
    pub(crate) state: Vec<String>,
}

/// A fossil in the governor's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotFossil {
    /// Its slot.
    pub(crate) slot: String,
    /// Its seed id.
    pub(crate) seed_id: String,
    /// Tensor names of its variables, sorted by variable name.
    pub(crate) tensors: Vec<String>,
}

/// The governor's snapshot: which tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotManifest {
    /// The epoch it was taken at.
    pub(crate) epoch: usize,
    /// Tensor names of the host's variables, sorted by variable name.
    pub(crate) host: Vec<String>,
    /// The fossils.
    pub(crate) fossils: Vec<SnapshotFossil>,
}

/// The governor's counters and snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GovernorManifest {
    /// Losses kept, oldest first.
    pub(crate) history: Vec<f64>,
    /// Anomalies in a row.
    pub(crate) consecutive_panics: u32,
    /// The last panic's loss.
    pub(crate) last_panic_loss: Option<f64>,
    /// Rollbacks done.
    pub(crate) rollbacks: u64,
    /// The snapshot, if one was taken.
    pub(crate) snapshot: Option<SnapshotManifest>,
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

fn group_name(key: GroupKey) -> String {
    match key {
        GroupKey::Host => "host".to_owned(),
        GroupKey::Seed(slot) => format!("seed/{slot}"),
    }
}

fn sorted(variables: HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    let mut variables: Vec<(String, Tensor)> = variables.into_iter().collect();
    variables.sort_by(|a, b| a.0.cmp(&b.0));
    variables
}

/// A contiguous CPU copy of `tensor`, detached.
fn cpu_copy(tensor: &Tensor) -> Result<Tensor> {
    let mut copy = Tensor::f_empty(tensor.size().as_slice(), (tensor.kind(), Device::Cpu))
        .context("allocating a checkpoint tensor")?;
    tch::no_grad(|| copy.f_copy_(tensor)).context("copying a tensor for the checkpoint")?;
    Ok(copy)
}

/// Collects tensors and their manifest entries.
#[derive(Default)]
struct Tensors {
    tensors: Vec<(String, Tensor)>,
    entries: Vec<TensorEntry>,
}

impl Tensors {
    fn push(&mut self, name: String, role: &str, tensor: &Tensor) -> Result<String> {
        if self.entries.iter().any(|entry| entry.name == name) {
            bail!("checkpoint tensor {name} is named twice");
        }
        self.entries.push(TensorEntry {
            name: name.clone(),
            role: role.to_owned(),
            dtype: format!("{:?}", tensor.kind()),
            shape: tensor.size(),
        });
        self.tensors.push((name.clone(), cpu_copy(tensor)?));
        Ok(name)
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

    #[test]
    fn epoch_seeds_differ_per_epoch_and_run() {
        assert_ne!(epoch_seed(0, 0), epoch_seed(0, 1));
        assert_ne!(epoch_seed(0, 1), epoch_seed(1, 1));
        assert_eq!(epoch_seed(7, 3), epoch_seed(7, 3));
    }
}
