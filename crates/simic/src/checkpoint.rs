//! A vectorized PPO run's checkpoint directory: [`Simic::export_state`] on
//! disk, written and read through `durable`'s one checkpoint-directory
//! writer, so a library user saves and resumes a PPO run without file code.
//!
//! `ROOT/NAME/` holds `tensors.safetensors` ([`TENSORS_FILE`]: the policy's
//! parameters as `policy/<name>`, the PPO optimizer's state as
//! `optimizer/<index>` and `optimizer/step_count`) and `manifest.json`: one
//! JSON object with `format` ([`CHECKPOINT_FORMAT`]), `version`
//! ([`CHECKPOINT_VERSION`]), `round` (rounds completed), `state` (the
//! host-side [`SimicState`]: counters, generators, normalisers), the
//! caller's own fields beside them, and `durable`'s `files` list with each
//! file's size and FNV-1a 64 checksum; the manifest carries the checksum of
//! its own body. It is written under `ROOT/.partial-NAME/` and renamed into
//! place when complete. A round depends on nothing else (its environments
//! are built from `(seed, round)`), so a run resumed from it continues the
//! trajectory of the run that was never stopped; on the CPU bitwise.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tch::Tensor;

use crate::error::TorchResultExt;
use crate::vectorized::{Simic, SimicState};
use crate::{Error, Result};

/// The `format` field of a PPO checkpoint's manifest.
pub const CHECKPOINT_FORMAT: &str = "esper-ppo-checkpoint";
/// The manifest version this build writes and reads (2: the manifest went
/// through `durable`, with a checksum of its own).
pub const CHECKPOINT_VERSION: u32 = 2;
/// The tensors' file inside a checkpoint directory.
pub const TENSORS_FILE: &str = "tensors.safetensors";
/// The manifest keys Simic writes; a caller's extra fields use others (and
/// not `durable`'s `files`).
pub const SIMIC_KEYS: [&str; 4] = ["format", "version", "round", "state"];

fn refuse(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        field,
        reason: reason.into(),
    }
}

/// A PPO checkpoint that checked: the state for [`Simic::import_state`] and
/// the caller's extra fields.
#[derive(Debug)]
pub struct PpoCheckpoint {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// Rounds completed.
    pub round: u64,
    /// The host-side state.
    pub state: SimicState,
    /// The tensors, by name.
    pub tensors: Vec<(String, Tensor)>,
    /// The fields the caller saved beside them.
    pub extra: Map<String, Value>,
}

impl Simic {
    /// Saves the state after the last round as `root/name/` (see the module
    /// docs), with `extra`'s fields in the manifest; returns the directory.
    /// Refused, with nothing left behind, when an extra key is one of
    /// [`SIMIC_KEYS`] or `files`, or when a write fails.
    pub fn save_checkpoint(
        &self,
        root: &Path,
        name: &str,
        extra: Map<String, Value>,
    ) -> Result<PathBuf> {
        self.save_checkpoint_with(root, name, extra, &[])
    }

    /// [`Simic::save_checkpoint`] with the caller's own tensors beside the
    /// trainer's, in the same file and the same atomic write ([`read_checkpoint`]
    /// returns them among [`PpoCheckpoint::tensors`];
    /// [`Simic::import_state`] takes only its own). Refused, with nothing
    /// left behind, when a name of `more` is taken by the trainer's
    /// (`policy/...`, `optimizer/...`) or repeated.
    pub fn save_checkpoint_with(
        &self,
        root: &Path,
        name: &str,
        extra: Map<String, Value>,
        more: &[(String, Tensor)],
    ) -> Result<PathBuf> {
        for (index, (key, _)) in more.iter().enumerate() {
            if key.starts_with("policy/")
                || key.starts_with("optimizer/")
                || more.iter().take(index).any(|(other, _)| other == key)
            {
                return Err(refuse(
                    "more",
                    format!("the tensor name {key:?} is the trainer's own or repeated"),
                ));
            }
        }
        if let Some(key) = extra
            .keys()
            .find(|key| SIMIC_KEYS.contains(&key.as_str()) || *key == durable::FILES_KEY)
        {
            return Err(refuse(
                "extra",
                format!("{key:?} is Simic's own manifest key"),
            ));
        }
        let (state, tensors) = self.export_state()?;
        let cpu = tensors
            .iter()
            .chain(more)
            .map(|(name, tensor)| {
                tensor
                    .f_detach()
                    .and_then(|t| t.f_to_device(tch::Device::Cpu))
                    .and_then(|t| t.f_contiguous())
                    .map(|t| (name.clone(), t))
                    .op("checkpoint copy to the CPU")
            })
            .collect::<Result<Vec<_>>>()?;
        let mut body = Map::new();
        body.insert("format".to_owned(), CHECKPOINT_FORMAT.into());
        body.insert("version".to_owned(), CHECKPOINT_VERSION.into());
        body.insert("round".to_owned(), state.rounds.into());
        body.insert(
            "state".to_owned(),
            serde_json::to_value(&state).map_err(|error| refuse("state", error.to_string()))?,
        );
        body.extend(extra);
        let mut writer = durable::CheckpointWriter::begin(root, name)?;
        let path = writer.file_path(TENSORS_FILE)?;
        Tensor::write_safetensors(&cpu, &path).op("write_safetensors")?;
        writer.adopt(TENSORS_FILE)?;
        Ok(writer.commit(Value::Object(body))?)
    }
}

/// Reads the checkpoint directory `dir` written by
/// [`Simic::save_checkpoint`]: refused with [`Error::Durable`] when a
/// checksum or size does not hold, with [`Error::Checkpoint`] when it is
/// another format or version or does not parse. Whether it fits a run is
/// [`Simic::import_state`]'s to check.
pub fn read_checkpoint(dir: &Path) -> Result<PpoCheckpoint> {
    let checked = durable::read_checked(dir)?;
    let mut body = checked.body;
    let format = body.remove("format");
    let version = body.remove("version");
    if format.as_ref().and_then(Value::as_str) != Some(CHECKPOINT_FORMAT)
        || version.as_ref().and_then(Value::as_u64) != Some(u64::from(CHECKPOINT_VERSION))
    {
        return Err(refuse(
            "format",
            format!(
                "format {format:?} version {version:?}; this build reads \
                 {CHECKPOINT_FORMAT:?} version {CHECKPOINT_VERSION}"
            ),
        ));
    }
    let round = body
        .remove("round")
        .and_then(|value| value.as_u64())
        .ok_or_else(|| refuse("round", "missing or not a count"))?;
    let state: SimicState = serde_json::from_value(
        body.remove("state")
            .ok_or_else(|| refuse("state", "missing"))?,
    )
    .map_err(|error| refuse("state", error.to_string()))?;
    if state.rounds != round {
        return Err(refuse(
            "round",
            format!("{round}, but the state has run {} rounds", state.rounds),
        ));
    }
    if checked.files.iter().all(|file| file.name != TENSORS_FILE) {
        return Err(refuse(
            "files",
            format!("the manifest lists no {TENSORS_FILE}"),
        ));
    }
    let tensors = Tensor::read_safetensors(dir.join(TENSORS_FILE))
        .map_err(|error| refuse("tensors", format!("{TENSORS_FILE} does not parse: {error}")))?;
    Ok(PpoCheckpoint {
        dir: checked.dir,
        round,
        state,
        tensors,
        extra: body,
    })
}
