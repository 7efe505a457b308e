//! The settings of a vectorized PPO run ([`SimicConfig`]) and their checks,
//! run by [`super::Simic::new`] before anything is built.

use kasmina::lifecycle::SlotConfig;
use tamiyo::masks::MaskConfig;
use tamiyo::policy::{PolicyConfig, PolicyPrecision, SampleMode, SamplingConfig};
use tch::Device;
use tolaria::engine::trainer::ModelTrainerConfig;

use super::imitation::ImitationConfig;
use crate::counterfactual::FusedConfig;
use crate::ppo::{PpoConfig, ValueNormaliserConfig};
use crate::rewards::{RewardConfig, RewardNormaliserConfig};
use crate::{Error, Result};

/// The named episode lengths. [`Episode::Head`] (150) is every default, as
/// at the reference's HEAD, whose comments make 150 the shortest episode
/// that fits three seeds one after another (G2 needs 10 TRAINING epochs and
/// the D3 block forbids germinating while any seed is GERMINATED or
/// TRAINING); [`Episode::Medium`] (50) and [`Episode::Short`] (25, the
/// older reference's) stay as presets for quick studies. The ceiling on the
/// mean number of active seeds under HEAD's gates is `3 - 39/L`: 2.74 at
/// 150, 2.22 at 50, 1.44 at 25.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Episode {
    /// 150 epochs (the reference's HEAD).
    Head,
    /// 50 epochs.
    Medium,
    /// 25 epochs (the older reference).
    Short,
}

impl Episode {
    /// Every preset, longest first.
    pub const ALL: [Episode; 3] = [Episode::Head, Episode::Medium, Episode::Short];

    /// Epochs per episode.
    pub fn epochs(self) -> u32 {
        match self {
            Episode::Head => 150,
            Episode::Medium => 50,
            Episode::Short => 25,
        }
    }

    /// The preset's name (`head`, `medium`, `short`).
    pub fn name(self) -> &'static str {
        match self {
            Episode::Head => "head",
            Episode::Medium => "medium",
            Episode::Short => "short",
        }
    }

    /// A preset's name or a number of epochs: `head`, `medium`, `short`,
    /// `150`, `50`, `25` or any other positive count.
    pub fn parse_epochs(text: &str) -> Result<u32> {
        if let Some(preset) = Episode::ALL.into_iter().find(|p| p.name() == text) {
            return Ok(preset.epochs());
        }
        match text.parse::<u32>() {
            Ok(epochs) if epochs > 0 => Ok(epochs),
            _ => Err(Error::InvalidConfig {
                field: "episode",
                reason: format!(
                    "{text:?} is neither a preset (head = 150, medium = 50, short = 25) nor a \
                     positive number of epochs"
                ),
            }),
        }
    }

    /// The mean active seeds no controller can exceed under HEAD's gates
    /// with three slots: `3 - 39/L` (0 below 13 epochs).
    pub fn active_seed_ceiling(epochs: u32) -> f64 {
        (3.0 - 39.0 / f64::from(epochs.max(1))).max(0.0)
    }
}

/// Settings of a vectorized PPO run.
#[derive(Debug, Clone)]
pub struct SimicConfig {
    /// Environments per round (4).
    pub n_envs: usize,
    /// Epochs per episode ([`Episode::Head`]'s 150 by default; see
    /// [`Episode`] for the presets).
    pub episode_length: u32,
    /// Live seeds allowed per environment (3).
    pub max_seeds: usize,
    /// Root seed: policy initialisation, sampling, and every environment's
    /// seed (`seed + (round·n_envs + env)·env_seed_stride`).
    pub seed: u64,
    /// Distance between environment seeds.
    pub env_seed_stride: u64,
    /// How each environment's trainer runs (batch size, execution mode,
    /// precision, optimizers, governor). Its `seed` and
    /// `counterfactual_samples` are set per environment.
    pub trainer: ModelTrainerConfig,
    /// The fused counterfactual pass.
    pub fused: FusedConfig,
    /// Rewards.
    pub reward: RewardConfig,
    /// Reward normalisation.
    pub reward_normaliser: RewardNormaliserConfig,
    /// The PPO update.
    pub ppo: PpoConfig,
    /// Critic target normalisation.
    pub value_normaliser: ValueNormaliserConfig,
    /// Policy network sizes (`num_slots` is taken from the environments).
    pub policy: PolicyConfig,
    /// Sampling during rollouts (stochastic, with the reference's
    /// probability floors).
    pub sampling: SamplingConfig,
    /// Mask rules (`max_seeds` is taken from above).
    pub masks: MaskConfig,
    /// Every environment slot's lifecycle settings: gates and the
    /// reference's auto-forward flags (all off by default, as at the
    /// reference's HEAD). With all three on, set
    /// `masks.disable_advance` too, as the reference removes ADVANCE from
    /// the action space then ([`super::settings`]'s `slot.` section does
    /// both).
    pub slot: SlotConfig,
    /// Normalise observations with a running mean and variance.
    pub normalise_observations: bool,
    /// Replay the batched policy step from a CUDA graph
    /// ([`tamiyo::policy::GraphedAct`]; eager on the CPU or when capture
    /// fails).
    pub graph_policy: bool,
    /// The policy's forward precision; `None` (the default) follows the
    /// reference rule: bf16 autocast exactly when the environments train in
    /// bf16. A bf16 policy step of four environments costs more device time
    /// than an fp32 one (its captured graph casts every weight at each
    /// replay), so `Some(PolicyPrecision::Fp32)` is the faster choice there.
    pub policy_precision: Option<PolicyPrecision>,
    /// Shapley values of the seeds at the last epoch of each episode
    /// (reference §4.5: the factorial plan up to four seeds, antithetic
    /// permutations above), measured in the same fused pass; the plan's
    /// seed is mixed with each environment's. `None`: never.
    pub shapley: Option<crate::counterfactual::ShapleyConfig>,
    /// Devices of the environments, assigned round-robin (environment `i`
    /// on `env_devices[i % len]`): environments spread over the GPUs of a
    /// host in one process, each with its model, data and stream on its
    /// device, while the policy, the rollout buffer and the update stay on
    /// the policy's device. Empty: every environment on the policy's device.
    pub env_devices: Vec<Device>,
    /// Before the first round's environments are built, run every
    /// blueprint at every slot once at the training batch shapes
    /// ([`tolaria::engine::prewarm::prewarm_blueprints`]), so that the
    /// first germination of a blueprint does not also pay its kernels'
    /// first use (a cost per process, not per round). The time is part of
    /// the first round (its setup). On by default; nothing happens on the
    /// CPU.
    pub prewarm_blueprints: bool,
    /// The imitation warm-up: how many of the first PPO updates learn from
    /// a demonstrator's actions instead of the policy's own samples
    /// ([`super::imitation`]). None by default, as in the reference.
    pub imitation: ImitationConfig,
}

impl SimicConfig {
    /// The reference's settings for `episode_length` epochs: 4
    /// environments, 3 seeds, batch 512 per environment (one graph warm-up
    /// step, no cuDNN benchmarking), the reference PPO
    /// and reward defaults (γ 0.995 shared by both), stochastic sampling
    /// with the reference floors, SET_ALPHA_TARGET masked (Tolaria's apply
    /// does not carry it out yet).
    pub fn reference(episode_length: u32) -> SimicConfig {
        let ppo = PpoConfig::tamiyo_reference();
        SimicConfig {
            n_envs: 4,
            episode_length,
            max_seeds: 3,
            seed: 0,
            env_seed_stride: 1_000,
            trainer: ModelTrainerConfig {
                batch_size: 512,
                // Environments are short-lived and their seeds change the
                // step's shape every few epochs: one warm-up step before a
                // capture, and no cuDNN algorithm timing at every new shape
                // (measured on the H100: 29 against 13 eps on simic-cifar).
                graph_warmup_steps: 1,
                cudnn_benchmark: false,
                // The environments' captured steps already run side by
                // side on the GPU: the weight gradients' side stream adds a
                // fork and a join and gains nothing (simic-growth on an
                // H200: 77.0 eps with it, 79.7 without, h200-2026-12-04p).
                overlap_weight_grads: false,
                ..ModelTrainerConfig::default()
            },
            // The environments' models are small: the whole validation
            // set under several configurations fits one forward.
            fused: FusedConfig {
                max_fused_samples: 1 << 15,
                ..FusedConfig::default()
            },
            reward: RewardConfig::default(),
            reward_normaliser: RewardNormaliserConfig::default(),
            ppo,
            value_normaliser: ValueNormaliserConfig::default(),
            policy: PolicyConfig::default(),
            sampling: SamplingConfig {
                mode: SampleMode::Stochastic,
                floors: Some(tamiyo::policy::sampling::reference_probability_floors()),
            },
            masks: MaskConfig {
                disable_set_alpha_target: true,
                ..MaskConfig::default()
            },
            slot: SlotConfig::default(),
            normalise_observations: true,
            graph_policy: true,
            policy_precision: None,
            shapley: Some(crate::counterfactual::ShapleyConfig::default()),
            env_devices: Vec::new(),
            // Measured on the H100 (simic-throughput): 0.5 - 1.3 s once per
            // process, and no round slower than the others after it (before,
            // 0.7 - 2.6 s more in the rounds that first met a blueprint).
            prewarm_blueprints: true,
            imitation: ImitationConfig::default(),
        }
    }

    /// Checks what can be checked before a round starts, so that a bad
    /// value is refused by [`super::Simic::new`] and not in the middle of a round:
    /// the sizes (`n_envs`, `episode_length`, the rollout buffer they make
    /// within [`crate::buffer::MAX_TRANSITIONS`]), the environments' trainer
    /// settings ([`SimicConfig::trainer`]: batch sizes, microbatches,
    /// clipping, optimizers, the governor's snapshot interval), and every
    /// nested configuration (fused pass, rewards, reward normaliser, PPO,
    /// value normaliser, sampling, Shapley, devices). The error names the
    /// field, e.g. `SimicConfig.trainer.batch_size`.
    pub fn validate(&self) -> Result<()> {
        if self.n_envs == 0 {
            return Err(Error::InvalidConfig {
                field: "SimicConfig.n_envs",
                reason: "0; a round needs at least one environment".to_owned(),
            });
        }
        if self.episode_length == 0 {
            return Err(Error::InvalidConfig {
                field: "SimicConfig.episode_length",
                reason: "0; an episode needs at least one epoch".to_owned(),
            });
        }
        if self.n_envs > crate::buffer::MAX_TRANSITIONS {
            return Err(Error::InvalidConfig {
                field: "SimicConfig.n_envs",
                reason: format!(
                    "{}; at most {} environments",
                    self.n_envs,
                    crate::buffer::MAX_TRANSITIONS
                ),
            });
        }
        let transitions = usize::try_from(self.episode_length)
            .ok()
            .and_then(|steps| steps.checked_mul(self.n_envs));
        if transitions.is_none_or(|cells| cells > crate::buffer::MAX_TRANSITIONS) {
            return Err(Error::InvalidConfig {
                field: "SimicConfig.episode_length",
                reason: format!(
                    "{} epochs × {} environments is more than the rollout buffer's {} \
                     transitions",
                    self.episode_length,
                    self.n_envs,
                    crate::buffer::MAX_TRANSITIONS
                ),
            });
        }
        validate_trainer(&self.trainer)?;
        if let Some(shapley) = &self.shapley {
            shapley.validate()?;
        }
        if (self.ppo.gamma - self.reward.gamma).abs() > 1e-12 {
            return Err(Error::InvalidConfig {
                field: "SimicConfig.ppo.gamma",
                reason: format!(
                    "{} differs from the reward's PBRS gamma {}; they must be equal (reference §4.2)",
                    self.ppo.gamma, self.reward.gamma
                ),
            });
        }
        self.fused.validate()?;
        self.reward.validate()?;
        self.reward_normaliser.validate()?;
        self.ppo.validate()?;
        self.imitation.validate()?;
        self.value_normaliser.validate()?;
        self.sampling.validate()?;
        self.slot.validate()?;
        for device in &self.env_devices {
            if let Device::Cuda(index) = device {
                let count = torch_ext::cuda::device_count();
                if *index >= count {
                    return Err(Error::InvalidConfig {
                        field: "SimicConfig.env_devices",
                        reason: format!("cuda:{index}, but this machine has {count} CUDA devices"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The environments' trainer fields as [`SimicConfig`] names them, for the
/// errors of the checks Tolaria runs on them.
const TRAINER_FIELDS: [(&str, &str); 15] = [
    ("microbatches", "SimicConfig.trainer.microbatches"),
    ("clip_grad_norm", "SimicConfig.trainer.clip_grad_norm"),
    (
        "gradient_telemetry_stride",
        "SimicConfig.trainer.gradient_telemetry_stride",
    ),
    (
        "OptimizerConfig.host.learning_rate",
        "SimicConfig.trainer.optimizer.host.learning_rate",
    ),
    (
        "OptimizerConfig.host.momentum",
        "SimicConfig.trainer.optimizer.host.momentum",
    ),
    (
        "OptimizerConfig.host.beta1",
        "SimicConfig.trainer.optimizer.host.beta1",
    ),
    (
        "OptimizerConfig.host.beta2",
        "SimicConfig.trainer.optimizer.host.beta2",
    ),
    (
        "OptimizerConfig.host.eps",
        "SimicConfig.trainer.optimizer.host.eps",
    ),
    (
        "OptimizerConfig.host.weight_decay",
        "SimicConfig.trainer.optimizer.host.weight_decay",
    ),
    (
        "OptimizerConfig.seed.learning_rate",
        "SimicConfig.trainer.optimizer.seed.learning_rate",
    ),
    (
        "OptimizerConfig.seed.momentum",
        "SimicConfig.trainer.optimizer.seed.momentum",
    ),
    (
        "OptimizerConfig.seed.beta1",
        "SimicConfig.trainer.optimizer.seed.beta1",
    ),
    (
        "OptimizerConfig.seed.beta2",
        "SimicConfig.trainer.optimizer.seed.beta2",
    ),
    (
        "OptimizerConfig.seed.eps",
        "SimicConfig.trainer.optimizer.seed.eps",
    ),
    (
        "OptimizerConfig.seed.weight_decay",
        "SimicConfig.trainer.optimizer.seed.weight_decay",
    ),
];

/// Checks the environments' trainer settings before any environment is
/// built (Tolaria checks some of them only when a trainer is built, in the
/// middle of a round): both batch sizes at least 1 and fitting `i64`, the
/// governor's snapshot interval at least 1 when it runs, and what
/// [`tolaria::engine::model_step::ModelStepConfig::validate`] checks
/// (microbatches, clipping norm, telemetry stride, both optimizers).
fn validate_trainer(trainer: &ModelTrainerConfig) -> Result<()> {
    for (field, value) in [
        ("SimicConfig.trainer.batch_size", trainer.batch_size),
        (
            "SimicConfig.trainer.validation_batch_size",
            trainer.validation_batch_size,
        ),
    ] {
        if value == 0 || i64::try_from(value).is_err() {
            return Err(Error::InvalidConfig {
                field,
                reason: format!("{value}; a batch needs at least one sample (and must fit i64)"),
            });
        }
    }
    if trainer.governor && trainer.snapshot_interval_epochs == 0 {
        return Err(Error::InvalidConfig {
            field: "SimicConfig.trainer.snapshot_interval_epochs",
            reason: "0; the governor needs an interval of at least 1 epoch".to_owned(),
        });
    }
    tolaria::engine::model_step::ModelStepConfig {
        microbatches: trainer.microbatches,
        clip_grad_norm: trainer.clip_grad_norm,
        gradient_telemetry_stride: trainer.gradient_telemetry_stride,
        max_seeds: trainer.max_seeds,
        optimizer: trainer.optimizer,
        channels_last: trainer.channels_last,
        ..tolaria::engine::model_step::ModelStepConfig::default()
    }
    .validate()
    .map_err(|error| match error {
        tolaria::Error::InvalidConfig { field, reason } => {
            match TRAINER_FIELDS.iter().find(|(name, _)| *name == field) {
                Some((_, ours)) => Error::InvalidConfig {
                    field: ours,
                    reason,
                },
                None => Error::InvalidConfig {
                    field: "SimicConfig.trainer",
                    reason: format!("{field}: {reason}"),
                },
            }
        }
        other => Error::from(other),
    })
}
