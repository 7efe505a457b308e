//! Checkpoints of PPO runs: `RUN_DIR/checkpoints/round-<R>/` after round
//! `R` (every `checkpoint_every` rounds, after the last one and at a
//! Ctrl-C), and what `esper train --resume RUN_DIR` restores.
//!
//! The directory, its checksums and its atomic write are simic's
//! (`Simic::save_checkpoint`, `simic::checkpoint::read_checkpoint`, through
//! `durable`'s one checkpoint-directory writer): `tensors.safetensors` holds
//! the policy's parameters and the PPO optimizer's state, `manifest.json`
//! Simic's host state (round counter, generators, normalisers). This module
//! decides when, and adds the run's fields to the manifest: the run's
//! configuration and how many lines `rounds.jsonl` and the telemetry files
//! had. On resume the newest checkpoint that verifies and restores is used;
//! a damaged newer one, or one that verifies but cannot be restored, is
//! skipped with a warning, and nothing in the run directory changes until
//! one has been restored. A round does not depend on anything else (its
//! environments are built from `(seed, round)`), so a resumed run continues
//! the trajectory of the run that was never stopped; on the CPU bitwise.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use simic::vectorized::{Simic, SimicState};
use tch::Tensor;

use super::checkpoint::{DIR, FileLength, telemetry_lengths};
use super::config::RunConfig;

/// Folder-name prefix of a PPO checkpoint.
const PREFIX: &str = "round-";

/// The run's fields of a PPO checkpoint's manifest, beside Simic's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PpoRunFields {
    /// The run's configuration.
    config: RunConfig,
    /// Lines of `rounds.jsonl` at the checkpoint.
    rounds_lines: usize,
    /// Telemetry files and their lengths at the checkpoint.
    telemetry: Vec<FileLength>,
}

/// What a PPO checkpoint's manifest holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PpoManifest {
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
    let fields = PpoRunFields {
        config: config.clone(),
        rounds_lines,
        telemetry: telemetry_lengths(&run_dir.join(super::TELEMETRY_DIR))?,
    };
    let serde_json::Value::Object(extra) =
        serde_json::to_value(&fields).context("encoding the run's checkpoint fields")?
    else {
        bail!("the run's checkpoint fields do not encode as a JSON object");
    };
    let round = simic.rounds();
    simic
        .save_checkpoint(&run_dir.join(DIR), &format!("{PREFIX}{round:06}"), extra)
        .with_context(|| format!("writing the checkpoint of round {round}"))
}

/// Reads and verifies one checkpoint folder.
pub(crate) fn verify(dir: &Path) -> Result<PpoLoaded> {
    let saved = simic::checkpoint::read_checkpoint(dir)
        .with_context(|| format!("checkpoint {}", dir.display()))?;
    let fields: PpoRunFields = serde_json::from_value(serde_json::Value::Object(saved.extra))
        .with_context(|| format!("{}: the manifest's run fields", dir.display()))?;
    Ok(PpoLoaded {
        dir: saved.dir,
        manifest: PpoManifest {
            round: saved.round,
            config: fields.config,
            state: saved.state,
            rounds_lines: fields.rounds_lines,
            telemetry: fields.telemetry,
        },
        tensors: saved.tensors,
    })
}

/// The PPO checkpoint folders of `run_dir`, newest first; `None` when the
/// run has none (it is not a PPO run, or wrote no checkpoint yet). The
/// caller verifies ([`verify`]) and restores them in this order and takes
/// the first that does both.
pub(crate) fn candidates(run_dir: &Path) -> Option<Vec<PathBuf>> {
    let root = run_dir.join(DIR);
    let listing = durable::list(&root).ok()?;
    let mut dirs: Vec<PathBuf> = listing
        .complete
        .iter()
        .filter(|name| name.starts_with(PREFIX))
        .map(|name| root.join(name))
        .collect();
    if dirs.is_empty() {
        return None;
    }
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

    /// Writes the kept lines back, atomically (`durable::write_file`).
    pub(crate) fn apply(self) -> Result<()> {
        durable::write_file(&self.path, self.body.as_bytes())
            .with_context(|| format!("rewriting {}", self.path.display()))
    }
}

/// The trained policy of a PPO run, for `esper bench simic-growth --policy
/// PATH`: PATH is one checkpoint folder (`RUN_DIR/checkpoints/round-<R>/`)
/// or a run directory, of which the newest checkpoint that verifies is
/// taken (a damaged newer one is skipped, and `warn` says so). The policy
/// keeps its run's settings and episode length; a run of other slots or
/// another seed budget than the simic workloads' (`slots`: three, max
/// seeds three) is refused, since its policy acts on another action space.
pub(crate) fn learned_policy(
    path: &Path,
    slots: usize,
    max_seeds: usize,
    warn: &mut dyn FnMut(&str),
) -> Result<simic::bench::LearnedPolicy> {
    let loaded = if path.join(durable::MANIFEST).is_file() {
        verify(path)?
    } else {
        let Some(folders) = candidates(path) else {
            bail!(
                "{} holds no PPO checkpoint: give a run directory of `esper train --controller \
                 ppo` or one of its `{DIR}/{PREFIX}<R>` folders",
                path.display()
            );
        };
        let mut found = None;
        for folder in folders {
            match verify(&folder) {
                Ok(loaded) => {
                    found = Some(loaded);
                    break;
                }
                Err(error) => warn(&format!("skipping {}: {error:#}", folder.display())),
            }
        }
        found.with_context(|| format!("no checkpoint of {} verifies", path.join(DIR).display()))?
    };
    let config = &loaded.manifest.config;
    if config.slots.len() != slots || config.max_seeds != max_seeds {
        bail!(
            "{}: a policy of {} slots ({}) and max seeds {}; the simic workloads have {slots} \
             slots and max seeds {max_seeds}",
            loaded.dir.display(),
            config.slots.len(),
            config.slots.join(","),
            config.max_seeds
        );
    }
    let episode = u32::try_from(config.epochs)
        .with_context(|| format!("{}: epochs does not fit u32", loaded.dir.display()))?;
    let source = format!(
        "{}, trained on {}",
        loaded.dir.display(),
        config.task.name()
    );
    Ok(simic::bench::LearnedPolicy::new(
        source,
        episode,
        loaded.manifest.state,
        loaded.tensors,
        config.settings.clone(),
    )?)
}
