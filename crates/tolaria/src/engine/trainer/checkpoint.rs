//! A [`ModelTrainer`]'s checkpoint directory: the state of
//! [`ModelTrainer::export_state`] on disk, written and read through
//! `durable`'s one checkpoint-directory writer, so a library user saves and
//! resumes a trainer without writing any file code.
//!
//! `ROOT/NAME/` holds
//!
//! - `tensors.safetensors` ([`TENSORS_FILE`]): every state tensor, named as
//!   [`super::state`] names them, loadable from Python
//!   (`safetensors.torch.load_file`);
//! - `manifest.json`: one JSON object with `format` ([`CHECKPOINT_FORMAT`]),
//!   `version` ([`CHECKPOINT_VERSION`]), the [`TrainerManifest`]'s fields
//!   (`epoch`, `germinations`, `slots`, `governor`, `optimizers`,
//!   `tensors`), the caller's own fields beside them (a run's configuration,
//!   its controller's state, how far its logs had got) and `durable`'s
//!   `files` list with each file's size and FNV-1a 64 checksum; the manifest
//!   carries the checksum of its own body.
//!
//! The directory is written under `ROOT/.partial-NAME/` and renamed into
//! place when complete ([`durable::CheckpointWriter`]); [`read_checkpoint`]
//! hands a state back only when every checksum holds, and
//! [`ModelTrainer::restore`] then checks that it fits the model.
//!
//! ```ignore
//! # fn demo(
//! #     trainer: &tolaria::engine::trainer::ModelTrainer,
//! #     fresh_model: kasmina::model::MorphogeneticModel,
//! #     train: &tolaria::data::Dataset,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use tolaria::engine::trainer::{ModelTrainer, read_checkpoint};
//!
//! let mut extra = serde_json::Map::new();
//! extra.insert("note".into(), "after warm-up".into());
//! let dir = trainer.save_checkpoint("run/checkpoints".as_ref(), "4", extra)?;
//! // ... later, in another process, with a model built as the first was:
//! let saved = read_checkpoint(&dir)?;
//! let resumed = ModelTrainer::restore(
//!     fresh_model,
//!     &saved.state,
//!     train,
//!     None,
//!     trainer.config().clone(),
//!     leyline::Telemetry::disabled(),
//! )?;
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tch::Tensor;

use super::ModelTrainer;
use super::state::{TrainerManifest, TrainerState};
use crate::error::{Error, Result, TorchResultExt};

/// The `format` field of a trainer checkpoint's manifest.
pub const CHECKPOINT_FORMAT: &str = "esper-checkpoint";
/// The manifest version this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 1;
/// The tensors' file inside a checkpoint directory.
pub const TENSORS_FILE: &str = "tensors.safetensors";
/// The manifest keys the trainer writes; a caller's extra fields use others
/// (and not `durable`'s `files`).
pub const TRAINER_KEYS: [&str; 8] = [
    "format",
    "version",
    "epoch",
    "germinations",
    "slots",
    "governor",
    "optimizers",
    "tensors",
];

fn refuse(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        field,
        reason: reason.into(),
    }
}

/// A checkpoint that checked: the trainer's state (for
/// [`ModelTrainer::restore`]) and the caller's extra fields.
#[derive(Debug)]
pub struct TrainerCheckpoint {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// The trainer's state.
    pub state: TrainerState,
    /// The fields the caller saved beside it.
    pub extra: Map<String, Value>,
}

impl ModelTrainer {
    /// Saves the trainer's state as `root/name/` (see the module docs), with
    /// `extra`'s fields in the manifest beside the trainer's; returns the
    /// directory. Refused, with nothing left behind, when an extra key is
    /// one of [`TRAINER_KEYS`] or `files`, or when a write fails (the
    /// directory of an earlier save of that name is then kept).
    pub fn save_checkpoint(
        &self,
        root: &Path,
        name: &str,
        extra: Map<String, Value>,
    ) -> Result<PathBuf> {
        if let Some(key) = extra
            .keys()
            .find(|key| TRAINER_KEYS.contains(&key.as_str()) || *key == durable::FILES_KEY)
        {
            return Err(refuse(
                "extra",
                format!("{key:?} is the trainer's own manifest key"),
            ));
        }
        let state = self.export_state()?;
        let Value::Object(trainer) = serde_json::to_value(&state.manifest)
            .map_err(|error| refuse("manifest", error.to_string()))?
        else {
            return Err(refuse("manifest", "does not encode as a JSON object"));
        };
        let mut body = Map::new();
        body.insert("format".to_owned(), CHECKPOINT_FORMAT.into());
        body.insert("version".to_owned(), CHECKPOINT_VERSION.into());
        body.extend(trainer);
        body.extend(extra);
        let mut writer = durable::CheckpointWriter::begin(root, name)?;
        let path = writer.file_path(TENSORS_FILE)?;
        Tensor::write_safetensors(&state.tensors, &path).op("write_safetensors")?;
        writer.adopt(TENSORS_FILE)?;
        Ok(writer.commit(Value::Object(body))?)
    }
}

/// Reads the checkpoint directory `dir` written by
/// [`ModelTrainer::save_checkpoint`]: refused with [`Error::Durable`] when a
/// checksum or size does not hold, with [`Error::Checkpoint`] when it is
/// another format or version or its tensors file does not parse.
pub fn read_checkpoint(dir: &Path) -> Result<TrainerCheckpoint> {
    let checked = durable::read_checked(dir)?;
    let mut body = checked.body;
    let format = body.get("format").and_then(Value::as_str);
    let version = body.get("version").and_then(Value::as_u64);
    if format != Some(CHECKPOINT_FORMAT) || version != Some(u64::from(CHECKPOINT_VERSION)) {
        return Err(refuse(
            "format",
            format!(
                "format {format:?} version {version:?}; this build reads \
                 {CHECKPOINT_FORMAT:?} version {CHECKPOINT_VERSION}"
            ),
        ));
    }
    let mut trainer = Map::new();
    for key in TRAINER_KEYS {
        if let Some(value) = body.remove(key)
            && key != "format"
            && key != "version"
        {
            trainer.insert(key.to_owned(), value);
        }
    }
    let manifest: TrainerManifest = serde_json::from_value(Value::Object(trainer))
        .map_err(|error| refuse("manifest", error.to_string()))?;
    if checked.files.iter().all(|file| file.name != TENSORS_FILE) {
        return Err(refuse(
            "files",
            format!("the manifest lists no {TENSORS_FILE}"),
        ));
    }
    let tensors = Tensor::read_safetensors(dir.join(TENSORS_FILE))
        .map_err(|error| refuse("tensors", format!("{TENSORS_FILE} does not parse: {error}")))?;
    Ok(TrainerCheckpoint {
        dir: checked.dir,
        state: TrainerState { manifest, tensors },
        extra: body,
    })
}
