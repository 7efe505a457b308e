//! A configuration file of `esper train`: TOML whose keys are [`KEYS`]
//! (dashes accepted), every one optional; an unknown key is refused with
//! the nearest valid spelling.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::KEYS;
use crate::train::args::{
    ControllerKind, ModeChoice, PolicyPrecisionChoice, PrecisionChoice, RewardChoice, TaskKind,
};

/// The longest configuration file read (every key with a long value fits
/// in a few kilobytes; this stops `--config /dev/zero` from filling the
/// memory).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// What a configuration file may say: every key optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) controller: Option<ControllerKind>,
    pub(super) task: Option<TaskKind>,
    pub(super) slots: Option<Vec<String>>,
    pub(super) max_seeds: Option<usize>,
    pub(super) epochs: Option<usize>,
    pub(super) batch_size: Option<usize>,
    pub(super) learning_rate: Option<f64>,
    pub(super) device: Option<String>,
    pub(super) precision: Option<PrecisionChoice>,
    pub(super) seed: Option<u64>,
    pub(super) run_dir: Option<PathBuf>,
    pub(super) train_samples: Option<usize>,
    pub(super) mode: Option<ModeChoice>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) checkpoint_every: Option<usize>,
    pub(super) envs: Option<usize>,
    pub(super) rounds: Option<usize>,
    pub(super) policy_precision: Option<PolicyPrecisionChoice>,
    pub(super) devices: Option<Vec<String>>,
    pub(super) metrics_port: Option<u16>,
    pub(super) ppo_epochs: Option<usize>,
    pub(super) ppo_learning_rate: Option<f64>,
    pub(super) entropy_coef: Option<f64>,
    pub(super) reward_mode: Option<RewardChoice>,
    pub(super) prewarm_blueprints: Option<bool>,
    pub(super) settings: Option<Vec<String>>,
}

/// Reads a configuration file: TOML, every key known (see the module docs).
pub(super) fn read_file(path: &Path) -> Result<FileConfig> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        bail!(
            "the configuration file {} is longer than {MAX_FILE_BYTES} bytes; is it one?",
            path.display()
        );
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!(
            "the configuration file {} is not UTF-8 text",
            path.display()
        )
    })?;
    parse_file(&text, &path.display().to_string())
}

/// Parses the text of a configuration file called `name` (for messages).
pub(super) fn parse_file(text: &str, name: &str) -> Result<FileConfig> {
    let table: toml::Table =
        toml::from_str(text).with_context(|| format!("{name} is not valid TOML"))?;
    let mut normalised = toml::Table::new();
    for (key, value) in table {
        let canonical = key.replace('-', "_");
        if !KEYS.contains(&canonical.as_str()) {
            bail!("{}", unknown_key_message(&key, name));
        }
        if normalised.insert(canonical.clone(), value).is_some() {
            bail!("{canonical:?} is given twice in {name} (once with dashes)");
        }
    }
    toml::Value::Table(normalised)
        .try_into::<FileConfig>()
        .with_context(|| format!("in {name}"))
}

/// `unknown key "KEY" in NAME; did you mean "NEAREST"?`, or the list of
/// valid keys when none is close.
pub(crate) fn unknown_key_message(key: &str, name: &str) -> String {
    match nearest_key(key) {
        Some(nearest) => format!("unknown key {key:?} in {name}; did you mean {nearest:?}?"),
        None => format!(
            "unknown key {key:?} in {name}; the valid keys are {}",
            KEYS.join(", ")
        ),
    }
}

/// The valid key nearest to `key` in edit distance (ignoring case and
/// dashes), if within a third of its length (at least 2 edits allowed).
pub(crate) fn nearest_key(key: &str) -> Option<&'static str> {
    let wanted = key.to_lowercase().replace('-', "_");
    let allowed = (wanted.chars().count() / 3).max(2);
    KEYS.iter()
        .map(|candidate| (strsim::levenshtein(&wanted, candidate), *candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}
