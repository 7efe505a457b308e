//! The run configuration of `esper train`: defaults, an optional TOML file
//! over them, the command-line flags over both, and the resolved result
//! written into the run directory as `config.toml`.
//!
//! The file uses the flags' names with underscores (`batch_size`; dashes are
//! accepted too). A key the program does not know is an error that names
//! the key and, when one is close, the nearest valid spelling (Levenshtein
//! distance): `unknown key "epoch" in run.toml; did you mean "epochs"?`. A
//! misspelt key is never ignored, because a run that silently trains with a
//! default the user meant to change wastes hours.
//!
//! Reading the file is [`file`](mod@file)'s part; the default run directory's
//! timestamp is [`stamp`]'s.

mod file;
mod stamp;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kasmina::host::SlotId;
use serde::{Deserialize, Serialize};
use torch_ext::DeviceChoice;

use file::{FileConfig, read_file};
use stamp::default_run_dir;

use super::args::{
    ControllerKind, EpisodeChoice, ModeChoice, PolicyPrecisionChoice, PrecisionChoice,
    RewardChoice, TaskKind, TrainArgs,
};

/// Every key a configuration file may hold, in the order `config.toml` is
/// written.
pub(crate) const KEYS: [&str; 26] = [
    "controller",
    "task",
    "slots",
    "max_seeds",
    "epochs",
    "batch_size",
    "learning_rate",
    "device",
    "precision",
    "seed",
    "run_dir",
    "train_samples",
    "mode",
    "data_dir",
    "checkpoint_every",
    "envs",
    "rounds",
    "policy_precision",
    "devices",
    "metrics_port",
    "ppo_epochs",
    "ppo_learning_rate",
    "entropy_coef",
    "reward_mode",
    "prewarm_blueprints",
    "settings",
];

/// Default seed slots: the CNN host's second and third pre-pool surfaces.
pub(crate) const DEFAULT_SLOTS: [&str; 2] = ["r0c1", "r0c2"];
/// Default number of epochs: enough, on the Fashion-MNIST tasks, for the
/// heuristic to see the host stabilise and plateau (around epoch 15 with the
/// defaults), germinate, and walk one seed through TRAINING (at least 10
/// epochs), BLENDING (5) and HOLDING to FOSSILIZED (around epoch 32), with
/// room to spare; about three minutes on a 2-core CPU.
pub(crate) const DEFAULT_EPOCHS: usize = 50;
/// Default episode of `--controller ppo`: the reference HEAD's 150 epochs
/// (`simic::vectorized::Episode::Head`); `--episode medium` or `short` pick
/// 50 or 25.
pub(crate) const DEFAULT_PPO_EPISODE: usize = 150;
/// Default batch size.
pub(crate) const DEFAULT_BATCH_SIZE: usize = 128;
/// Default SGD learning rate, host and seeds alike (momentum 0.9). Below
/// the reference's 0.01 on purpose: the heuristic germinates only once the
/// validation loss has changed by less than 5% (and accuracy by less than
/// 0.5 points) for three epochs in a row, and at 0.01 the validation loss of
/// a 12,000-sample Fashion-MNIST epoch jitters by 10% or more, so that in 40
/// epochs it never germinated; at 0.003 it germinates around epoch 15.
pub(crate) const DEFAULT_LEARNING_RATE: f64 = 0.003;
/// Default AdamW learning rate of the language-model tasks.
pub(crate) const DEFAULT_LM_LEARNING_RATE: f64 = 0.001;
/// Default training subset of the Fashion-MNIST tasks (a few seconds per
/// epoch on a 2-core CPU; 0 would train on all 60,000).
pub(crate) const DEFAULT_FMNIST_TRAIN_SAMPLES: usize = 12_000;
/// Default training windows of `lm-fortunes`: about a quarter of the corpus
/// (0.5 M tokens), so that an epoch stays short on a CPU; 0 takes them all.
pub(crate) const DEFAULT_LM_TRAIN_WINDOWS: usize = 8_000;
/// Default checkpoint interval, epochs (a checkpoint is also written at the
/// end and at a Ctrl-C).
pub(crate) const DEFAULT_CHECKPOINT_EVERY: usize = 5;
/// Default PPO environments per round (the reference's 4).
pub(crate) const DEFAULT_ENVS: usize = 4;
/// Default PPO rounds.
pub(crate) const DEFAULT_ROUNDS: usize = 10;
/// Samples the synthetic task generates for training by default.
pub(crate) const DEFAULT_SYNTHETIC_TRAIN_SAMPLES: usize =
    tolaria::task::DEFAULT_SYNTHETIC_TRAIN_SAMPLES;

/// Most epochs a run (or a PPO episode) may have: 2,000 times the default,
/// and the end of the run picture's epoch axis ([`crate::plot`]).
pub(crate) const MAX_EPOCHS: usize = 100_000;
/// Most PPO rounds a run may have (the end of the PPO picture's round axis,
/// [`crate::plot_rounds`]).
pub(crate) const MAX_ROUNDS: usize = 100_000;
/// Most PPO environments per round (per process).
pub(crate) const MAX_ENVS: usize = 256;
/// Most environment-epochs in one PPO round (`envs` x `epochs`): the
/// rollout buffer holds one transition per environment-epoch.
pub(crate) const MAX_ROUND_STEPS: usize = 1_000_000;
/// Most PPO passes over a round's rollout per update.
pub(crate) const MAX_PPO_EPOCHS: usize = 1_000;
/// Most seed slots a run may name.
pub(crate) const MAX_SLOTS: usize = 64;

/// Checks a learning rate: finite, above 0 (also as an `f32`, which the
/// optimizers keep on the device) and at most tolaria's `MAX_LEARNING_RATE`
/// (the optimizers refuse anything else; refused here, it is refused before
/// the data is loaded).
fn learning_rate(key: &str, value: f64) -> Result<()> {
    let limit = tolaria::optim::MAX_LEARNING_RATE;
    if !(value.is_finite() && value > 0.0 && value <= limit && (value as f32) > 0.0) {
        bail!(
            "{key} {value} must be a finite number above 0 (and above 0 as an f32) and at most \
             {limit}"
        );
    }
    Ok(())
}

/// The resolved configuration of one run (written as `config.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunConfig {
    /// Who decides.
    pub(crate) controller: ControllerKind,
    /// Task and host.
    pub(crate) task: TaskKind,
    /// Enabled seed slots, in the order given.
    pub(crate) slots: Vec<String>,
    /// Most seeds alive or fossilized at once.
    pub(crate) max_seeds: usize,
    /// Epochs to train.
    pub(crate) epochs: usize,
    /// Samples per training batch.
    pub(crate) batch_size: usize,
    /// SGD learning rate of the host and the seeds.
    pub(crate) learning_rate: f64,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub(crate) device: String,
    /// Autocast precision.
    pub(crate) precision: PrecisionChoice,
    /// Seed of weights, shuffle and subset.
    pub(crate) seed: u64,
    /// The run directory (written as text: a path that is not UTF-8 is
    /// written with replacement characters, see [`lossy_path`]).
    #[serde(serialize_with = "lossy_path")]
    pub(crate) run_dir: PathBuf,
    /// Training samples (0: the whole training set).
    pub(crate) train_samples: usize,
    /// Execution mode.
    pub(crate) mode: ModeChoice,
    /// Folder of the data set files, when not the data set's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Write a checkpoint every this many epochs (0: only at the end and at
    /// a Ctrl-C).
    #[serde(default = "default_checkpoint_every")]
    pub(crate) checkpoint_every: usize,
    /// PPO: environments per round (each one a whole host-training run of
    /// `epochs` epochs).
    #[serde(default = "default_envs")]
    pub(crate) envs: usize,
    /// PPO: rounds (one PPO update each).
    #[serde(default = "default_rounds")]
    pub(crate) rounds: usize,
    /// PPO: the policy's forward precision.
    #[serde(default = "default_policy_precision")]
    pub(crate) policy_precision: PolicyPrecisionChoice,
    /// PPO: the environments' devices, round-robin (`cuda:0`, `cuda:1`,
    /// ...); the policy stays on `device`. Empty: everything on `device`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) devices: Vec<String>,
    /// Serve the telemetry as Prometheus metrics on this port (`/metrics`
    /// on all interfaces); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) metrics_port: Option<u16>,
    /// PPO: passes over each round's rollout per update (the reference's
    /// `recurrent_n_epochs`, 1); the KL early stop still ends an update.
    #[serde(default = "default_ppo_epochs")]
    pub(crate) ppo_epochs: usize,
    /// PPO: the policy's Adam learning rate (the reference's 3e-4).
    #[serde(default = "default_ppo_learning_rate")]
    pub(crate) ppo_learning_rate: f64,
    /// PPO: the entropy bonus coefficient (the reference's 0.05; its CLI's
    /// `cifar_baseline` preset uses 0.1).
    #[serde(default = "default_entropy_coef")]
    pub(crate) entropy_coef: f64,
    /// PPO: the reward the policy learns from (the reference's SHAPED).
    #[serde(default = "default_reward_mode")]
    pub(crate) reward_mode: RewardChoice,
    /// PPO: run every blueprint at every slot once before the first round
    /// (`SimicConfig::prewarm_blueprints`; CUDA only).
    #[serde(default = "default_prewarm_blueprints")]
    pub(crate) prewarm_blueprints: bool,
    /// PPO: settings over the reference's defaults
    /// (`simic::vectorized::settings`), in order, a `--preset` expanded
    /// into its own; none by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) settings: Vec<String>,
}

/// Writes `path` as text, with U+FFFD where it is not UTF-8 (serde refuses
/// such a path, which would fail `config.toml` and every checkpoint
/// manifest). Only the run directory is written this way: nothing reads it
/// back to find the run (`--resume RUN_DIR` takes the folder it is given,
/// and `--config` with `--run-dir NEW` replaces it).
fn lossy_path<S: serde::Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

fn default_checkpoint_every() -> usize {
    DEFAULT_CHECKPOINT_EVERY
}

fn default_envs() -> usize {
    DEFAULT_ENVS
}

fn default_rounds() -> usize {
    DEFAULT_ROUNDS
}

fn default_ppo_epochs() -> usize {
    simic::ppo::PpoConfig::default().epochs
}

fn default_ppo_learning_rate() -> f64 {
    simic::ppo::PpoConfig::default().learning_rate
}

fn default_entropy_coef() -> f64 {
    simic::ppo::PpoConfig::default().entropy_coef
}

fn default_prewarm_blueprints() -> bool {
    simic::vectorized::SimicConfig::reference(1).prewarm_blueprints
}

/// The flags' settings (the preset's, then every `--set`) when any is
/// given, else the file's.
fn settings_of(args: &TrainArgs, file: Option<Vec<String>>) -> Result<Vec<String>> {
    if args.preset.is_none() && args.settings.is_empty() {
        return Ok(file.unwrap_or_default());
    }
    let mut settings = Vec::new();
    if let Some(name) = &args.preset {
        let preset = simic::vectorized::settings::preset(name).map_err(anyhow::Error::new)?;
        settings.extend(preset.iter().map(|s| (*s).to_owned()));
    }
    settings.extend(args.settings.iter().cloned());
    Ok(settings)
}

fn default_reward_mode() -> RewardChoice {
    RewardChoice::Shaped
}

fn default_policy_precision() -> PolicyPrecisionChoice {
    PolicyPrecisionChoice::Auto
}

impl RunConfig {
    /// Defaults, under the file `args.config` names (if any), under the
    /// flags of `args`; then checked ([`RunConfig::validate`]). The run
    /// directory defaults to `runs/<UTC timestamp>` (not created here).
    pub(crate) fn resolve(args: &TrainArgs) -> Result<RunConfig> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let task = args.task.or(file.task).unwrap_or(TaskKind::Fmnist);
        let slots = args
            .slots
            .clone()
            .or(file.slots)
            .unwrap_or_else(|| DEFAULT_SLOTS.iter().map(|s| (*s).to_owned()).collect());
        let max_seeds = args.max_seeds.or(file.max_seeds).unwrap_or(slots.len());
        let train_samples = args
            .train_samples
            .or(file.train_samples)
            .unwrap_or(match task {
                TaskKind::Fmnist | TaskKind::FmnistImpaired => DEFAULT_FMNIST_TRAIN_SAMPLES,
                TaskKind::Cifar10 | TaskKind::Cifar10Impaired => 0,
                TaskKind::Synthetic => DEFAULT_SYNTHETIC_TRAIN_SAMPLES,
                TaskKind::LmFortunes => DEFAULT_LM_TRAIN_WINDOWS,
                TaskKind::LmSynthetic => 0,
            });
        let controller = args
            .controller
            .or(file.controller)
            .unwrap_or(ControllerKind::Heuristic);
        let default_epochs = if controller == ControllerKind::Ppo {
            DEFAULT_PPO_EPISODE
        } else {
            DEFAULT_EPOCHS
        };
        let config = RunConfig {
            controller,
            task,
            slots,
            max_seeds,
            epochs: args
                .epochs
                .or(args.episode.map(EpisodeChoice::epochs))
                .or(file.epochs)
                .unwrap_or(default_epochs),
            batch_size: args
                .batch_size
                .or(file.batch_size)
                .unwrap_or(DEFAULT_BATCH_SIZE),
            learning_rate: args.learning_rate.or(file.learning_rate).unwrap_or(
                if task.task().is_language_model() {
                    DEFAULT_LM_LEARNING_RATE
                } else {
                    DEFAULT_LEARNING_RATE
                },
            ),
            device: args
                .device
                .clone()
                .or(file.device)
                .unwrap_or_else(|| DeviceChoice::Auto.to_string()),
            precision: args
                .precision
                .or(file.precision)
                .unwrap_or(PrecisionChoice::Auto),
            seed: args.seed.or(file.seed).unwrap_or(0),
            run_dir: args
                .run_dir
                .clone()
                .or(file.run_dir)
                .unwrap_or_else(default_run_dir),
            train_samples,
            mode: args.mode.or(file.mode).unwrap_or(ModeChoice::Auto),
            data_dir: args.data_dir.clone().or(file.data_dir),
            checkpoint_every: args
                .checkpoint_every
                .or(file.checkpoint_every)
                .unwrap_or(DEFAULT_CHECKPOINT_EVERY),
            envs: args.envs.or(file.envs).unwrap_or(DEFAULT_ENVS),
            rounds: args.rounds.or(file.rounds).unwrap_or(DEFAULT_ROUNDS),
            policy_precision: args
                .policy_precision
                .or(file.policy_precision)
                .unwrap_or(PolicyPrecisionChoice::Auto),
            devices: if args.devices.is_empty() {
                file.devices.unwrap_or_default()
            } else {
                args.devices.clone()
            },
            metrics_port: args.metrics_port.or(file.metrics_port),
            ppo_epochs: args
                .ppo_epochs
                .or(file.ppo_epochs)
                .unwrap_or_else(default_ppo_epochs),
            ppo_learning_rate: args
                .ppo_learning_rate
                .or(file.ppo_learning_rate)
                .unwrap_or_else(default_ppo_learning_rate),
            entropy_coef: args
                .entropy_coef
                .or(file.entropy_coef)
                .unwrap_or_else(default_entropy_coef),
            reward_mode: args
                .reward_mode
                .or(file.reward_mode)
                .unwrap_or_else(default_reward_mode),
            prewarm_blueprints: args
                .prewarm_blueprints
                .or(file.prewarm_blueprints)
                .unwrap_or_else(default_prewarm_blueprints),
            settings: settings_of(args, file.settings)?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks what can be checked before anything is loaded: at least one
    /// epoch (at most [`MAX_EPOCHS`]) and one sample per batch, learning
    /// rates finite and in tolaria's range, PPO sizes within their limits, a
    /// known device, a data folder whose path is text, 1 to [`MAX_SLOTS`]
    /// slots, each a valid slot id given once. What only the data, the host
    /// or the trainer can tell (a slot the host lacks, a batch larger than
    /// the data, a precision or mode the device cannot run) is checked by
    /// building them, still before anything is written.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.epochs == 0 {
            bail!("epochs is 0; a run needs at least one epoch");
        }
        if self.epochs > MAX_EPOCHS {
            bail!(
                "epochs {} is more than the {MAX_EPOCHS} a run may have",
                self.epochs
            );
        }
        if self.batch_size == 0 {
            bail!("batch_size is 0; a batch needs at least one sample");
        }
        if self.envs == 0 {
            bail!("envs is 0; a PPO round needs at least one environment");
        }
        if self.envs > MAX_ENVS {
            bail!(
                "envs {} is more than the {MAX_ENVS} a PPO round may have",
                self.envs
            );
        }
        if self.controller == ControllerKind::Ppo
            && self.envs.saturating_mul(self.epochs) > MAX_ROUND_STEPS
        {
            bail!(
                "envs x epochs is {} x {}, more than the {MAX_ROUND_STEPS} environment-epochs a \
                 PPO round's rollout may hold",
                self.envs,
                self.epochs
            );
        }
        if !self.settings.is_empty() {
            if self.controller != ControllerKind::Ppo {
                bail!(
                    "settings (--preset, --set) apply to --controller ppo only, not {:?}",
                    self.controller
                );
            }
            let episode = u32::try_from(self.epochs).context("epochs does not fit u32")?;
            let mut simic = simic::vectorized::SimicConfig::reference(episode);
            simic::vectorized::settings::apply_all(&mut simic, &self.settings)
                .map_err(anyhow::Error::new)?;
        }
        if self.rounds == 0 {
            bail!("rounds is 0; a PPO run needs at least one round");
        }
        if self.rounds > MAX_ROUNDS {
            bail!(
                "rounds {} is more than the {MAX_ROUNDS} a PPO run may have",
                self.rounds
            );
        }
        learning_rate("learning_rate", self.learning_rate)?;
        if self.ppo_epochs == 0 {
            bail!("ppo_epochs is 0; a PPO update needs at least one pass over the rollout");
        }
        if self.ppo_epochs > MAX_PPO_EPOCHS {
            bail!(
                "ppo_epochs {} is more than the {MAX_PPO_EPOCHS} passes a PPO update may make",
                self.ppo_epochs
            );
        }
        learning_rate("ppo_learning_rate", self.ppo_learning_rate)?;
        if !(self.entropy_coef.is_finite() && self.entropy_coef >= 0.0) {
            bail!(
                "entropy_coef {} must be a finite number, 0 or above",
                self.entropy_coef
            );
        }
        self.device_choice()?;
        self.env_devices()?;
        if let Some(dir) = &self.data_dir
            && dir.to_str().is_none()
        {
            bail!(
                "data_dir {:?} is not valid UTF-8; config.toml and the checkpoints record it as \
                 text, so a run needs a UTF-8 data folder (a link with a UTF-8 name will do)",
                dir.to_string_lossy()
            );
        }
        if self.slots.is_empty() {
            bail!("slots is empty; name at least one seed slot, e.g. r0c1");
        }
        if self.slots.len() > MAX_SLOTS {
            bail!(
                "slots names {} slots, more than the {MAX_SLOTS} a run may have",
                self.slots.len()
            );
        }
        let ids = self.slot_ids()?;
        let mut seen = std::collections::HashSet::new();
        for id in &ids {
            if !seen.insert(*id) {
                bail!("slot {id} is given twice in slots");
            }
        }
        Ok(())
    }

    /// The device choice `device` names.
    pub(crate) fn device_choice(&self) -> Result<DeviceChoice> {
        self.device
            .parse::<DeviceChoice>()
            .with_context(|| format!("device {:?}", self.device))
    }

    /// The environments' devices `devices` names (each `cpu` or `cuda:N`;
    /// `auto` and bare `cuda` are refused: the list names devices).
    pub(crate) fn env_devices(&self) -> Result<Vec<tch::Device>> {
        self.devices
            .iter()
            .map(|text| match text.parse::<DeviceChoice>() {
                Ok(DeviceChoice::Cpu) => Ok(tch::Device::Cpu),
                Ok(DeviceChoice::Cuda(index)) if text.contains(':') => Ok(tch::Device::Cuda(index)),
                _ => bail!("devices: {text:?} is not cpu or cuda:N"),
            })
            .collect()
    }

    /// The slot ids `slots` names, in order.
    pub(crate) fn slot_ids(&self) -> Result<Vec<SlotId>> {
        self.slots
            .iter()
            .map(|text| SlotId::parse(text).with_context(|| format!("slots: {text:?}")))
            .collect()
    }

    /// The configuration as TOML, in [`KEYS`] order.
    pub(crate) fn to_toml(&self) -> Result<String> {
        toml::to_string(self).context("serialising the run configuration")
    }

    /// The text of `config.toml` at `path`: [`RunConfig::to_toml`] under a
    /// header comment. Made before the run directory is, so that a
    /// configuration that cannot be written is refused before anything is.
    pub(crate) fn to_text(&self, path: &Path) -> Result<String> {
        // A path may hold a newline, which would end the comment.
        let shown: String = path
            .display()
            .to_string()
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        Ok(format!(
            "# The resolved configuration of this run (defaults, then the --config file, then \
             the flags).\n# `esper train --config {shown} --run-dir NEW_DIR` repeats it.\n{}",
            self.to_toml()?
        ))
    }
}
