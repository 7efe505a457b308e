//! Checkpoints of PPO runs: `RUN_DIR/checkpoints/round-<R>/` after round
//! `R` (every `checkpoint_every` rounds, after the last one and at a
//! Ctrl-C), and what `esper train --resume RUN_DIR` restores.
//!
//! A checkpoint holds `tensors.safetensors` (the policy's parameters and the
//! PPO optimizer's state, `simic::vectorized::Simic::export_state`) and
//! `manifest.json`: the run's configuration, Simic's host state (round
//! counter, generators, normalisers), how many lines `rounds.jsonl` and the
//! telemetry files had, and the tensors file's size and FNV-1a checksum. It
//! is written into a `.partial-round-<R>` folder, fsynced, renamed, and the
//! folder fsynced, as the heuristic runs' checkpoints are
//! ([`super::checkpoint`], whose file helpers it uses). On resume the newest
//! checkpoint that verifies and restores is used; a damaged newer one, or
//! one that verifies but cannot be restored, is skipped with a warning, and
//! nothing in the run directory changes until one has been restored. A round does not depend on anything else (its environments are
//! built from `(seed, round)`), so a resumed run continues the trajectory of
//! the run that was never stopped; on the CPU bitwise.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use simic::vectorized::{Simic, SimicState};
use tch::Tensor;

use super::checkpoint::{DIR, FileLength, fnv1a64, sync_path, telemetry_lengths, write_synced};
use super::config::RunConfig;

/// The manifest's format name.
const FORMAT: &str = "esper-ppo-checkpoint";
/// The manifest's version.
const VERSION: u32 = 1;
/// Folder-name prefix of a PPO checkpoint.
const PREFIX: &str = "round-";
/// The tensors' file.
const TENSORS: &str = "tensors.safetensors";
/// The manifest's file.
const MANIFEST: &str = "manifest.json";

/// What a PPO checkpoint's `manifest.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PpoManifest {
    format: String,
    version: u32,
    /// Rounds completed.
    pub(crate) round: u64,
    /// The run's configuration.
    pub(crate) config: RunConfig,
    /// Simic's host state.
    pub(crate) state: SimicState,
    /// Lines of `rounds.jsonl` at the checkpoint.
    pub(crate) rounds_lines: usize,
    /// Telemetry files and their lengths at the checkpoint.
    pub(crate) telemetry: Vec<FileLength>,
    /// Size of `tensors.safetensors`.
    tensors_bytes: u64,
    /// FNV-1a 64 of `tensors.safetensors`, 16 hex digits.
    tensors_fnv1a64: String,
}

/// A checkpoint that verified.
pub(crate) struct PpoLoaded {
    /// Its folder.
    pub(crate) dir: PathBuf,
    /// Its manifest.
    pub(crate) manifest: PpoManifest,
    /// Its tensors, by name.
    pub(crate) tensors: Vec<(String, Tensor)>,
}

/// Writes the checkpoint after `simic`'s last round (see the module docs).
pub(crate) fn save(
    run_dir: &Path,
    config: &RunConfig,
    simic: &Simic,
    rounds_lines: usize,
) -> Result<PathBuf> {
    let (state, tensors) = simic.export_state().context("exporting the PPO state")?;
    let round = state.rounds;
    let cpu: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(name, tensor)| {
            tensor
                .f_detach()
                .and_then(|t| t.f_to_device(tch::Device::Cpu))
                .and_then(|t| t.f_contiguous())
                .map(|t| (name.clone(), t))
                .with_context(|| format!("copying {name}"))
        })
        .collect::<Result<_>>()?;
    let root = run_dir.join(DIR);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let partial = root.join(format!(".partial-{PREFIX}{round}"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("removing {}", partial.display()))?;
    }
    std::fs::create_dir(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let tensors_path = partial.join(TENSORS);
    Tensor::write_safetensors(&cpu, &tensors_path)
        .with_context(|| format!("writing {}", tensors_path.display()))?;
    sync_path(&tensors_path)?;
    let bytes = std::fs::read(&tensors_path)
        .with_context(|| format!("reading back {}", tensors_path.display()))?;
    let manifest = PpoManifest {
        format: FORMAT.to_owned(),
        version: VERSION,
        round,
        config: config.clone(),
        state,
        rounds_lines,
        telemetry: telemetry_lengths(&run_dir.join(super::TELEMETRY_DIR))?,
        tensors_bytes: bytes.len() as u64,
        tensors_fnv1a64: format!("{:016x}", fnv1a64(&bytes)),
    };
    let mut text = serde_json::to_vec_pretty(&manifest).context("encoding the manifest")?;
    text.push(b'\n');
    write_synced(&partial.join(MANIFEST), &text)?;
    sync_path(&partial)?;
    let target = root.join(format!("{PREFIX}{round:06}"));
    if target.exists() {
        std::fs::remove_dir_all(&target)
            .with_context(|| format!("replacing {}", target.display()))?;
    }
    std::fs::rename(&partial, &target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    sync_path(&root)?;
    Ok(target)
}

/// Reads and verifies one checkpoint folder.
pub(crate) fn verify(dir: &Path) -> Result<PpoLoaded> {
    let manifest_path = dir.join(MANIFEST);
    let text = std::fs::read(&manifest_path)
        .with_context(|| format!("reading {}", manifest_path.display()))?;
    let manifest: PpoManifest = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a PPO manifest", manifest_path.display()))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        bail!(
            "{}: format {} v{}, expected {FORMAT} v{VERSION}",
            manifest_path.display(),
            manifest.format,
            manifest.version
        );
    }
    let tensors_path = dir.join(TENSORS);
    let bytes = std::fs::read(&tensors_path)
        .with_context(|| format!("reading {}", tensors_path.display()))?;
    let checksum = format!("{:016x}", fnv1a64(&bytes));
    if bytes.len() as u64 != manifest.tensors_bytes || checksum != manifest.tensors_fnv1a64 {
        bail!(
            "{}: {} bytes with checksum {checksum}, the manifest says {} bytes with {}",
            tensors_path.display(),
            bytes.len(),
            manifest.tensors_bytes,
            manifest.tensors_fnv1a64
        );
    }
    let tensors = Tensor::read_safetensors(&tensors_path)
        .with_context(|| format!("reading {}", tensors_path.display()))?;
    Ok(PpoLoaded {
        dir: dir.to_owned(),
        manifest,
        tensors,
    })
}

/// The PPO checkpoint folders of `run_dir`, newest first; `None` when the
/// run has none (it is not a PPO run, or wrote no checkpoint yet). The
/// caller verifies ([`verify`]) and restores them in this order and takes
/// the first that does both.
pub(crate) fn candidates(run_dir: &Path) -> Option<Vec<PathBuf>> {
    let entries = std::fs::read_dir(run_dir.join(DIR)).ok()?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.is_dir()
                && path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(PREFIX))
        })
        .collect();
    if dirs.is_empty() {
        return None;
    }
    dirs.sort();
    dirs.reverse();
    Some(dirs)
}

/// Cutting `rounds.jsonl` back to the lines of a checkpoint: planned
/// ([`RoundsRewind::plan`]) by reading the file only, carried out
/// ([`RoundsRewind::apply`]) once the run is known to resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoundsRewind {
    path: PathBuf,
    body: String,
}

impl RoundsRewind {
    /// Keeps the first `lines` lines of `path`; fewer is an error.
    pub(crate) fn plan(path: &Path, lines: usize) -> Result<RoundsRewind> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let kept: Vec<&str> = text.lines().take(lines).collect();
        if kept.len() < lines {
            bail!(
                "{} has {} lines, fewer than the {lines} the checkpoint recorded",
                path.display(),
                kept.len()
            );
        }
        let mut body = kept.join("\n");
        if !body.is_empty() {
            body.push('\n');
        }
        Ok(RoundsRewind {
            path: path.to_owned(),
            body,
        })
    }

    /// Writes the kept lines back.
    pub(crate) fn apply(self) -> Result<()> {
        write_synced(&self.path, self.body.as_bytes())
    }
}
