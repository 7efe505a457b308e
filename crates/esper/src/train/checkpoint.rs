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
//! [`latest`] takes the newest checkpoint that verifies (manifest parses,
//! its checksum holds, every file has its recorded size and checksum, every
//! tensor the manifest lists is in the file with its dtype and shape), and
//! returns a warning for each newer one it had to pass over, naming what was
//! wrong.
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

/// Writes the checkpoint of `trainer` after `trainer.epoch()` epochs into
/// `run_dir/checkpoints/<epoch>/` (see the module docs); returns its folder.
pub(crate) fn save(run_dir: &Path, trainer: &ModelTrainer, extras: Extras<'_>) -> Result<PathBuf> {
    let epoch = trainer.epoch();
    let model = trainer.model();
    let mut tensors = Tensors::default();
    for (name, tensor) in sorted(model.host().var_store().variables()) {
        tensors.push(
            format!("model/host/{name}"),
            "host parameter or buffer",
            &tensor,
        )?;
    }
    let slots = slot_states(model, &mut tensors)?;
    let mut optimizers = Vec::new();
    let optim = trainer.step().optimizers();
    for key in optim.keys() {
        let Some(group) = optim.group(key) else {
            continue;
        };
        let prefix = format!("optim/{}", group_name(key));
        let learning_rate = tensors.push(
            format!("{prefix}/lr"),
            "optimizer learning rate",
            group.learning_rate_tensor(),
        )?;
        let step_count = tensors.push(
            format!("{prefix}/step_count"),
            "optimizer step count",
            group.step_count_tensor(),
        )?;
        let state = group
            .state_tensors()
            .iter()
            .enumerate()
            .map(|(index, tensor)| {
                tensors.push(format!("{prefix}/state/{index}"), "optimizer state", tensor)
            })
            .collect::<Result<Vec<_>>>()?;
        optimizers.push(OptimizerGroup {
            group: group_name(key),
            config: group.config(),
            learning_rate,
            step_count,
            state,
        });
    }
    let governor = match trainer.governor() {
        Some(governor) => Some(governor_manifest(
            governor.export_state().context("exporting the governor")?,
            &mut tensors,
        )?),
        None => None,
    };
    let config = extras.config;
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        version: VERSION,
        epoch,
        germinations: trainer.germinations(),
        config: config.clone(),
        rng: RngState {
            libtorch: "manual_seed(epoch_seed(seed, epoch)) before every epoch".to_owned(),
            next_epoch_libtorch_seed: epoch_seed(config.seed, epoch),
            shuffle_seed: trainer.config().seed,
            next_shuffle_epoch: trainer.train_data().epoch(),
        },
        slots,
        controller: extras.controller,
        governor,
        optimizers,
        tensors: tensors.entries,
        epoch_log_records: extras.epoch_log_records,
        telemetry: telemetry_lengths(&run_dir.join(super::TELEMETRY_DIR))?,
        files: Vec::new(),
    };
    write(run_dir, manifest, &tensors.tensors)
}

fn slot_states(model: &MorphogeneticModel, tensors: &mut Tensors) -> Result<Vec<SlotState>> {
    let mut slots = Vec::new();
    for slot in model.slots() {
        let state = slot.state();
        let id = slot.id().to_string();
        if let Some(module) = slot.seed_module() {
            for (name, tensor) in sorted(module.var_store().variables()) {
                tensors.push(
                    format!("model/seed/{id}/{name}"),
                    "seed parameter or buffer",
                    &tensor,
                )?;
            }
        }
        slots.push(SlotState {
            slot: id,
            stage: slot
                .stage()
                .map_or("DORMANT", leyline::SeedStage::name)
                .to_owned(),
            seed_id: state.map(|state| state.seed_id().to_owned()),
            blueprint: state.map(|state| state.blueprint().name().to_owned()),
            alpha: slot.alpha(),
            lifecycle: state.cloned(),
        });
    }
    Ok(slots)
}

fn governor_manifest(state: GovernorState, tensors: &mut Tensors) -> Result<GovernorManifest> {
    let snapshot = match &state.snapshot {
        Some(snapshot) => {
            let host = snapshot
                .host
                .iter()
                .map(|(name, tensor)| {
                    tensors.push(
                        format!("governor/host/{name}"),
                        "governor snapshot (host)",
                        tensor,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let fossils = snapshot
                .fossils
                .iter()
                .map(|fossil| {
                    Ok(SnapshotFossil {
                        slot: fossil.slot.to_string(),
                        seed_id: fossil.seed_id.clone(),
                        tensors: fossil
                            .variables
                            .iter()
                            .map(|(name, tensor)| {
                                tensors.push(
                                    format!("governor/fossil/{}/{name}", fossil.slot),
                                    "governor snapshot (fossil)",
                                    tensor,
                                )
                            })
                            .collect::<Result<Vec<_>>>()?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Some(SnapshotManifest {
                epoch: snapshot.epoch,
                host,
                fossils,
            })
        }
        None => None,
    };
    Ok(GovernorManifest {
        history: state.history,
        consecutive_panics: state.consecutive_panics,
        last_panic_loss: state.last_panic_loss,
        rollbacks: state.rollbacks,
        snapshot,
    })
}

/// Every file of `dir` (none when it does not exist) with its length.
pub(crate) fn telemetry_lengths(dir: &Path) -> Result<Vec<FileLength>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(error) => return Err(error).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let metadata = entry.metadata().context("telemetry file metadata")?;
        if metadata.is_file() {
            files.push(FileLength {
                file: entry.file_name().to_string_lossy().into_owned(),
                bytes: metadata.len(),
            });
        }
    }
    files.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(files)
}

/// Opens `path` and `fsync`s it (a file or a folder).
pub(crate) fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .with_context(|| format!("fsync {}", path.display()))
}

/// Writes `bytes` to `path` and `fsync`s it.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

fn checksum_text(bytes: &[u8]) -> String {
    format!("fnv1a64:{:016x}", fnv1a64(bytes))
}

/// The atomic write (see the module docs).
fn write(run_dir: &Path, mut manifest: Manifest, tensors: &[(String, Tensor)]) -> Result<PathBuf> {
    let root = run_dir.join(DIR);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let epoch = manifest.epoch;
    let partial = root.join(format!("{PARTIAL_PREFIX}{epoch}"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("removing {}", partial.display()))?;
    }
    std::fs::create_dir(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let tensors_path = partial.join(TENSORS);
    Tensor::write_safetensors(tensors, &tensors_path)
        .with_context(|| format!("writing {}", tensors_path.display()))?;
    sync_path(&tensors_path)?;
    let bytes = std::fs::read(&tensors_path)
        .with_context(|| format!("reading back {}", tensors_path.display()))?;
    manifest.files = vec![FileChecksum {
        name: TENSORS.to_owned(),
        bytes: bytes.len() as u64,
        fnv1a64: format!("{:016x}", fnv1a64(&bytes)),
    }];
    let body = serde_json::to_value(&manifest).context("encoding the manifest")?;
    let compact = serde_json::to_vec(&body).context("encoding the manifest")?;
    let file = ManifestFile {
        checksum: checksum_text(&compact),
        manifest: body,
    };
    let mut text = serde_json::to_vec_pretty(&file).context("encoding the manifest")?;
    text.push(b'\n');
    write_synced(&partial.join(MANIFEST), &text)?;
    sync_path(&partial)?;
    let target = root.join(epoch.to_string());
    if target.exists() {
        // A checkpoint of the same epoch from before a resume: replaced.
        let stale = root.join(format!("{PARTIAL_PREFIX}{epoch}-replaced"));
        if stale.exists() {
            std::fs::remove_dir_all(&stale)
                .with_context(|| format!("removing {}", stale.display()))?;
        }
        std::fs::rename(&target, &stale)
            .with_context(|| format!("moving {} aside", target.display()))?;
        std::fs::remove_dir_all(&stale).with_context(|| format!("removing {}", stale.display()))?;
    }
    std::fs::rename(&partial, &target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    sync_path(&root)?;
    Ok(target)
}

/// A checkpoint that verified.
pub(crate) struct Loaded {
    /// Its folder.
    pub(crate) dir: PathBuf,
    /// Its manifest.
    pub(crate) manifest: Manifest,
    /// Its tensors by name.
    pub(crate) tensors: HashMap<String, Tensor>,
}

impl Loaded {
    /// The tensor called `name`.
    pub(crate) fn tensor(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .with_context(|| format!("checkpoint {}: no tensor {name}", self.dir.display()))
    }
}

/// Reads and checks one checkpoint folder.
pub(crate) fn verify(dir: &Path) -> Result<Loaded> {
    let manifest_path = dir.join(MANIFEST);
    let mut text = Vec::new();
    File::open(&manifest_path)
        .and_then(|mut file| file.read_to_end(&mut text))
        .with_context(|| format!("cannot read {MANIFEST}"))?;
    let file: ManifestFile = serde_json::from_slice(&text)
        .with_context(|| format!("{MANIFEST} is not a complete manifest"))?;
    let compact = serde_json::to_vec(&file.manifest).context("re-encoding the manifest")?;
    let actual = checksum_text(&compact);
    if actual != file.checksum {
        bail!(
            "{MANIFEST} checksum mismatch (recorded {}, computed {actual})",
            file.checksum
        );
    }
    let manifest: Manifest =
        serde_json::from_value(file.manifest).with_context(|| format!("{MANIFEST} body"))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        bail!(
            "{MANIFEST} is format {:?} version {}; this program reads {FORMAT:?} version \
             {VERSION}",
            manifest.format,
            manifest.version
        );
    }
    if !manifest.files.iter().any(|file| file.name == TENSORS) {
        bail!("{MANIFEST} lists no {TENSORS}");
    }
    for recorded in &manifest.files {
        if recorded.name.contains(['/', '\\']) || recorded.name.starts_with('.') {
            bail!(
                "{MANIFEST} names a file outside the checkpoint: {:?}",
                recorded.name
            );
        }
        let path = dir.join(&recorded.name);
        let bytes =
            std::fs::read(&path).with_context(|| format!("{} is missing", recorded.name))?;
        if bytes.len() as u64 != recorded.bytes {
            bail!(
                "{} is {} bytes, the manifest recorded {} (cut short?)",
                recorded.name,
                bytes.len(),
                recorded.bytes
            );
        }
        let checksum = format!("{:016x}", fnv1a64(&bytes));
        if checksum != recorded.fnv1a64 {
            bail!(
                "{} checksum mismatch (recorded {}, computed {checksum}): the file is corrupted",
                recorded.name,
                recorded.fnv1a64
            );
        }
    }
    let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join(TENSORS))
        .with_context(|| format!("{TENSORS} does not parse"))?
        .into_iter()
        .collect();
    for entry in &manifest.tensors {
        let Some(tensor) = tensors.get(&entry.name) else {
            bail!("{TENSORS} lacks the tensor {}", entry.name);
        };
        if tensor.size() != entry.shape || format!("{:?}", tensor.kind()) != entry.dtype {
            bail!(
                "{TENSORS}: {} is {:?} {:?}, the manifest says {} {:?}",
                entry.name,
                tensor.kind(),
                tensor.size(),
                entry.dtype,
                entry.shape
            );
        }
    }
    Ok(Loaded {
        dir: dir.to_owned(),
        manifest,
        tensors,
    })
}

/// The newest checkpoint of `run_dir` that verifies, with one warning per
/// newer checkpoint (or folder cut short) passed over. An error when none
/// verifies.
pub(crate) fn latest(run_dir: &Path) -> Result<(Loaded, Vec<String>)> {
    let root = run_dir.join(DIR);
    let entries = std::fs::read_dir(&root).with_context(|| {
        format!(
            "no checkpoints in {} (was the run started with checkpoints on?)",
            root.display()
        )
    })?;
    let mut epochs = BTreeMap::new();
    let mut partial = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(epoch) = name.parse::<usize>() {
            epochs.insert(epoch, entry.path());
        } else if let Some(rest) = name.strip_prefix(PARTIAL_PREFIX) {
            partial.push(rest.to_owned());
        }
    }
    let mut warnings = Vec::new();
    for rest in partial {
        warnings.push(format!(
            "checkpoint {rest} was cut short while being written ({DIR}/{PARTIAL_PREFIX}{rest}); \
             ignored"
        ));
    }
    for (epoch, dir) in epochs.iter().rev() {
        match verify(dir) {
            Ok(loaded) if loaded.manifest.epoch == *epoch => return Ok((loaded, warnings)),
            Ok(loaded) => warnings.push(format!(
                "checkpoint {} is in folder {epoch} but records epoch {}; skipped",
                dir.display(),
                loaded.manifest.epoch
            )),
            Err(error) => warnings.push(format!(
                "checkpoint {} is damaged and was skipped, an earlier one is used: {error:#}",
                dir.display()
            )),
        }
    }
    for warning in &warnings {
        eprintln!("esper: warning: {warning}");
    }
    bail!("no checkpoint in {} verifies", root.display())
}

/// Removes the folders of checkpoints cut short while being written (a
/// resumed run writes them again); returns their names.
pub(crate) fn remove_partial(run_dir: &Path) -> Result<Vec<String>> {
    let root = run_dir.join(DIR);
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let entry = entry.with_context(|| format!("reading {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(PARTIAL_PREFIX) {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// Copies `source` into `target` (same shape and dtype), without autograd.
fn copy_into(target: &Tensor, source: &Tensor, what: &str) -> Result<()> {
    if target.size() != source.size() || target.kind() != source.kind() {
        bail!(
            "resume: {what} is {:?} {:?} in the checkpoint, {:?} {:?} in the model",
            source.kind(),
            source.size(),
            target.kind(),
            target.size()
        );
    }
    tch::no_grad(|| target.shallow_clone().f_copy_(source))
        .with_context(|| format!("resume: copying {what}"))?;
    Ok(())
}

/// Writes the host's variables of `loaded` into `model` and puts every
/// seed back into its slot (Kasmina's [`MorphogeneticModel::restore_seed`]:
/// its lifecycle state, then its variables). Call it on a freshly built
/// model, before the trainer takes it.
pub(crate) fn restore_model(loaded: &Loaded, model: &mut MorphogeneticModel) -> Result<()> {
    copy_all(
        loaded,
        sorted(model.host().var_store().variables()),
        "model/host/",
        "host",
    )?;
    let ids = model.slot_ids();
    if ids.len() != loaded.manifest.slots.len() {
        bail!(
            "resume: the checkpoint has {} slots, the model {}",
            loaded.manifest.slots.len(),
            ids.len()
        );
    }
    for (id, saved) in ids.into_iter().zip(&loaded.manifest.slots) {
        if id.to_string() != saved.slot {
            bail!(
                "resume: slot {} in the checkpoint is {id} in the model",
                saved.slot
            );
        }
        let Some(state) = &saved.lifecycle else {
            continue;
        };
        model
            .restore_seed(id, state.clone())
            .with_context(|| format!("resume: putting seed {} back into {id}", state.seed_id()))?;
        let variables = model
            .slot(id)
            .context("resume: the restored slot")?
            .seed_module()
            .map(|module| sorted(module.var_store().variables()))
            .unwrap_or_default();
        copy_all(
            loaded,
            variables,
            &format!("model/seed/{id}/"),
            &format!("seed {}", state.seed_id()),
        )?;
    }
    Ok(())
}

/// Copies every tensor of `loaded` named `<prefix><variable>` into the
/// variable of that name; the two sets must be the same.
fn copy_all(
    loaded: &Loaded,
    variables: Vec<(String, Tensor)>,
    prefix: &str,
    owner: &str,
) -> Result<()> {
    let expected = loaded
        .manifest
        .tensors
        .iter()
        .filter(|entry| entry.name.starts_with(prefix))
        .count();
    if expected != variables.len() {
        bail!(
            "resume: the checkpoint holds {expected} variables of the {owner}, the model {}",
            variables.len()
        );
    }
    for (name, variable) in variables {
        let source = loaded.tensor(&format!("{prefix}{name}"))?;
        copy_into(&variable, source, &format!("{owner} variable {name}"))?;
    }
    Ok(())
}

/// Writes the optimizer, governor and counters of `loaded` into `trainer`.
pub(crate) fn restore_trainer(loaded: &Loaded, trainer: &mut ModelTrainer) -> Result<()> {
    let manifest = &loaded.manifest;
    let optim = trainer.step().optimizers();
    // A seed germinated at the checkpoint's boundary has no optimizer state
    // in the checkpoint yet: the original run builds it fresh when the next
    // epoch starts, and the resumed trainer has built it fresh already.
    for key in optim.keys() {
        let name = group_name(key);
        let saved = manifest.optimizers.iter().any(|saved| saved.group == name);
        if !saved && key == GroupKey::Host {
            bail!("resume: the checkpoint holds no optimizer state of the host");
        }
    }
    for saved in &manifest.optimizers {
        let key = match saved.group.strip_prefix("seed/") {
            Some(slot) => GroupKey::Seed(
                SlotId::parse(slot).with_context(|| format!("optimizer group {}", saved.group))?,
            ),
            None if saved.group == "host" => GroupKey::Host,
            None => bail!("resume: unknown optimizer group {:?}", saved.group),
        };
        let Some(group) = optim.group(key) else {
            // A seed pruned at the checkpoint's boundary still had its state
            // (the original run drops it when the next epoch starts); the
            // restored slot has no module and so no group.
            let gone = match key {
                GroupKey::Seed(slot) => trainer
                    .model()
                    .slot(slot)
                    .is_ok_and(|slot| slot.seed_module().is_none()),
                GroupKey::Host => false,
            };
            if gone {
                continue;
            }
            bail!("resume: the trainer has no optimizer group {}", saved.group);
        };
        if group.config() != saved.config {
            bail!(
                "resume: optimizer group {} is {:?} in the checkpoint, {:?} now",
                saved.group,
                saved.config,
                group.config()
            );
        }
        copy_into(
            group.learning_rate_tensor(),
            loaded.tensor(&saved.learning_rate)?,
            &saved.learning_rate,
        )?;
        copy_into(
            group.step_count_tensor(),
            loaded.tensor(&saved.step_count)?,
            &saved.step_count,
        )?;
        let state = group.state_tensors();
        if state.len() != saved.state.len() {
            bail!(
                "resume: optimizer group {} has {} state tensors, the checkpoint {}",
                saved.group,
                state.len(),
                saved.state.len()
            );
        }
        for (target, name) in state.iter().zip(&saved.state) {
            copy_into(target, loaded.tensor(name)?, name)?;
        }
    }
    let device = trainer.model().device();
    match (&manifest.governor, trainer.governor_mut()) {
        (Some(saved), Some(governor)) => {
            let snapshot = match &saved.snapshot {
                Some(snapshot) => Some(SnapshotState {
                    epoch: snapshot.epoch,
                    host: named(loaded, &snapshot.host, "governor/host/")?,
                    fossils: snapshot
                        .fossils
                        .iter()
                        .map(|fossil| {
                            Ok(FossilSnapshot {
                                slot: SlotId::parse(&fossil.slot)
                                    .with_context(|| format!("fossil slot {}", fossil.slot))?,
                                seed_id: fossil.seed_id.clone(),
                                variables: named(
                                    loaded,
                                    &fossil.tensors,
                                    &format!("governor/fossil/{}/", fossil.slot),
                                )?,
                            })
                        })
                        .collect::<Result<_>>()?,
                }),
                None => None,
            };
            governor
                .import_state(
                    GovernorState {
                        history: saved.history.clone(),
                        consecutive_panics: saved.consecutive_panics,
                        last_panic_loss: saved.last_panic_loss,
                        rollbacks: saved.rollbacks,
                        snapshot,
                    },
                    device,
                )
                .context("resume: importing the governor's state")?;
        }
        (None, None) => {}
        _ => bail!("resume: the checkpoint and the trainer disagree on the governor"),
    }
    trainer.resume_at(manifest.epoch, manifest.germinations);
    Ok(())
}

/// `(variable name, tensor)` for tensor names under `prefix`.
fn named(loaded: &Loaded, names: &[String], prefix: &str) -> Result<Vec<(String, Tensor)>> {
    names
        .iter()
        .map(|name| {
            let variable = name
                .strip_prefix(prefix)
                .with_context(|| format!("resume: tensor {name} is not under {prefix}"))?;
            Ok((variable.to_owned(), loaded.tensor(name)?.shallow_clone()))
        })
        .collect()
}

/// Cuts the telemetry files back to their lengths at the checkpoint and
/// removes the files begun after it, so that no packet is duplicated when
/// the resumed run emits those epochs again. Returns the files removed.
pub(crate) fn rewind_telemetry(run_dir: &Path, loaded: &Loaded) -> Result<Vec<String>> {
    rewind_telemetry_to(run_dir, &loaded.manifest.telemetry)
}

/// [`rewind_telemetry`] to the lengths `saved` recorded.
pub(crate) fn rewind_telemetry_to(run_dir: &Path, saved: &[FileLength]) -> Result<Vec<String>> {
    let dir = run_dir.join(super::TELEMETRY_DIR);
    let mut removed = Vec::new();
    for current in telemetry_lengths(&dir)? {
        let path = dir.join(&current.file);
        match saved.iter().find(|saved| saved.file == current.file) {
            Some(saved) if saved.bytes <= current.bytes => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                file.set_len(saved.bytes)
                    .and_then(|()| file.sync_all())
                    .with_context(|| format!("truncating {}", path.display()))?;
            }
            Some(saved) => bail!(
                "resume: {} is {} bytes, shorter than the {} recorded at the checkpoint",
                path.display(),
                current.bytes,
                saved.bytes
            ),
            None => {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
                removed.push(current.file);
            }
        }
    }
    Ok(removed)
}

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
