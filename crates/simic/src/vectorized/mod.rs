//! Vectorized PPO (reference §4.1): rounds of `n_envs` fresh environments,
//! each a Kasmina model trained by Tolaria one epoch per step, Tamiyo's
//! policy choosing one lifecycle operation per environment per step, and
//! one PPO update per round.
//!
//! One step of a round, for every environment still in its episode:
//!
//! 1. every environment's epoch is queued on its own compute stream
//!    ([`tolaria::engine::trainer::ModelTrainer::launch_epoch`]) before any is read back, so the
//!    epochs overlap on the GPU; then each is read back
//!    ([`tolaria::engine::trainer::ModelTrainer::finish_training`]);
//! 2. the fused validation + counterfactual pass
//!    ([`crate::counterfactual::fused_validation_staged`]) on the validation
//!    set, on the environment's stream: validation accuracy and loss, each
//!    seed's contribution, the clean total, pairwise interactions;
//! 3. the governor judges; a rollback ends that environment's episode (the
//!    death penalty on its last transition, earlier rewards forfeited,
//!    reference §4.4); otherwise the accuracies and contributions are
//!    recorded on the seeds;
//! 4. observations (Obs V3) and masks for all environments, one batched
//!    policy forward, and **one** readback of the actions for all of them;
//! 5. each environment carries its action out through Kasmina, the reward
//!    is computed and normalised, and the epoch concludes (lifecycle tick);
//!    the policy's outputs go to the device rollout buffer without a
//!    readback.
//!
//! After the last step, the bootstrap values of the truncated episodes come
//! from one more policy forward on the final observations; GAE runs on the
//! device with the critic's values denormalised; the critic learns the
//! normalised returns; one PPO update trains the policy
//! ([`crate::ppo::PpoTrainer`], each environment's row unrolled as one
//! sequence from a zero LSTM state, [`crate::agent::evaluate_rows`]).
//!
//! Precision: the environments train in `trainer.precision` (`None` = auto:
//! bf16 where the GPU supports it); the policy's rollout, bootstrap and
//! update run under bf16 autocast exactly when that precision is bf16, in
//! fp32 otherwise (reference §4.6; [`Simic::policy_precision`]), unless
//! [`SimicConfig::policy_precision`] chooses.
//!
//! Throughput is counted as the reference counts "eps": environment-epochs
//! over the whole run's wall time, PPO updates included (reference §4.8).

mod data_parallel;
mod env;
mod measure;
mod outcome;
mod round;
mod state;
mod telemetry;
mod update;

use std::time::Instant;

use leyline::Telemetry;
use tamiyo::masks::MaskConfig;
use tamiyo::normaliser::{NormaliserConfig, RunningMeanStd};
use tamiyo::policy::{Policy, PolicyConfig, PolicyPrecision, SampleMode, Sampler, SamplingConfig};
use tch::Device;
use tolaria::engine::trainer::ModelTrainerConfig;

use crate::counterfactual::FusedConfig;
use crate::ppo::{PpoConfig, PpoStats, PpoTrainer, ValueNormaliser, ValueNormaliserConfig};
use crate::rewards::{RewardConfig, RewardNormaliser, RewardNormaliserConfig};
use crate::{Error, Result};

pub use env::EnvSpec;
pub use outcome::{
    ActionDistribution, EpisodeOutcome, NUM_OPS, OpCounts, OutcomeKind, RewardHackingSuspicion,
};
pub use state::SimicState;
pub use telemetry::SOURCE;

/// Settings of a vectorized PPO run.
#[derive(Debug, Clone)]
pub struct SimicConfig {
    /// Environments per round (4).
    pub n_envs: usize,
    /// Epochs per episode (25 in the benchmarks; HEAD's default is 150).
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
            normalise_observations: true,
            graph_policy: true,
            policy_precision: None,
            shapley: Some(crate::counterfactual::ShapleyConfig::default()),
            env_devices: Vec::new(),
            // Measured on the H100 (simic-throughput): 0.5 - 1.3 s once per
            // process, and no round slower than the others after it (before,
            // 0.7 - 2.6 s more in the rounds that first met a blueprint).
            prewarm_blueprints: true,
        }
    }

    /// Checks what can be checked before a round starts, so that a bad
    /// value is refused by [`Simic::new`] and not in the middle of a round:
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
        self.value_normaliser.validate()?;
        self.sampling.validate()?;
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

/// Timings of a round, milliseconds of wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoundTimings {
    /// Building the environments (hosts, trainers, staging).
    pub setup_ms: f64,
    /// Queuing every environment's epoch (host time of the launches).
    pub launch_ms: f64,
    /// Training epochs, launch to readback, all environments (each
    /// environment's counterfactual pass is queued as its epoch is read).
    pub train_ms: f64,
    /// The rest of the fused validation + counterfactual passes (their
    /// readbacks) and the governor.
    pub counterfactual_ms: f64,
    /// Observations and masks built on the host (every environment).
    pub observe_ms: f64,
    /// The batched policy step: upload, normalisation, forward, sampling
    /// and the one action readback.
    pub policy_ms: f64,
    /// Carrying actions out, rewards, lifecycle ticks.
    pub boundary_ms: f64,
    /// GAE and the PPO update.
    pub update_ms: f64,
    /// The training steps' graph captures (part of `launch_ms`): their
    /// summed time, all environments.
    pub capture_ms: f64,
    /// The whole round.
    pub total_ms: f64,
}

/// What one round did.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    /// Zero-based round.
    pub round: u64,
    /// The seed each of the round's environments was built and trained
    /// with (`seed + ((round·world + rank)·n_envs + env)·env_seed_stride`):
    /// which environments a round (and a rank) trained on.
    pub env_seeds: Vec<u64>,
    /// Environment-epochs trained.
    pub env_epochs: u64,
    /// Mean over environments of the episode's summed raw reward.
    pub mean_episode_reward: f64,
    /// Each environment's final validation accuracy, percent.
    pub final_accuracies: Vec<f64>,
    /// Mean live seeds per environment per step.
    pub mean_active_seeds: f64,
    /// Environments whose episode the governor ended.
    pub rollbacks: usize,
    /// Germinations, fossilizations and prunes carried out.
    pub germinations: u64,
    /// Seeds fossilized.
    pub fossilizations: u64,
    /// Seeds pruned.
    pub prunes: u64,
    /// Mean policy-inference time per step (upload, forward and sampling
    /// for all environments, the one action readback), ms.
    pub inference_ms: f64,
    /// Policy-inference time of each step, ms.
    pub inference_samples: Vec<f64>,
    /// Device time of each replay of the captured policy step, ms (empty
    /// when the step runs eagerly).
    pub replay_samples: Vec<f64>,
    /// The PPO update's figures (`None` when the round was not trained on).
    pub ppo: Option<PpoStats>,
    /// Per environment, the seeds' Shapley values at the episode's last
    /// epoch, by slot (empty where none was measured: no seed, an episode
    /// ended early, or `SimicConfig::shapley` off).
    pub shapley: Vec<Vec<(kasmina::host::SlotId, crate::counterfactual::ShapleyValue)>>,
    /// How each environment's episode ended, with its op counts.
    pub outcomes: Vec<EpisodeOutcome>,
    /// The round's decisions summed over the environments.
    pub actions: ActionDistribution,
    /// The policy's LSTM state at the end of the round's episodes.
    pub lstm: Option<tamiyo::policy::LstmHealth>,
    /// What looked wrong in the round's PPO update
    /// ([`Simic::set_anomaly_thresholds`]); empty without an update.
    pub anomalies: Vec<crate::ppo::PpoAnomaly>,
    /// Steps whose reward matched an anti-gaming pattern.
    pub reward_hacking: Vec<RewardHackingSuspicion>,
    /// After the update, the Q head's mean estimate per lifecycle op over
    /// the rollout's valid steps, in `LifecycleOp::ALL` order (`None`
    /// without an update or without auxiliary heads).
    pub q_per_op: Option<Vec<f64>>,
    /// Training-step graphs captured this round, all environments (a new
    /// batch shape or active-seed set meets its first capture).
    pub captures: usize,
    /// Training steps run eagerly this round (warm-up steps before a
    /// capture, fallbacks), all environments.
    pub eager_steps: usize,
    /// Timings.
    pub timings: RoundTimings,
}

/// The vectorized PPO trainer (see the module docs).
pub struct Simic {
    config: SimicConfig,
    device: Device,
    policy: Policy,
    sampler: Sampler,
    ppo: PpoTrainer,
    obs_normaliser: Option<RunningMeanStd>,
    value_normaliser: ValueNormaliser,
    reward_normaliser: RewardNormaliser,
    telemetry: Telemetry,
    graphed: Option<tamiyo::policy::GraphedAct>,
    data_parallel: Option<crate::distributed::DataParallel>,
    anomaly_thresholds: crate::ppo::AnomalyThresholds,
    rounds: u64,
    env_epochs: u64,
    started: Option<Instant>,
    prewarm: Option<tolaria::engine::prewarm::Prewarm>,
}

impl std::fmt::Debug for Simic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simic")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("rounds", &self.rounds)
            .finish()
    }
}

impl Simic {
    /// A trainer for environments with `num_slots` slots on `device`: a
    /// fresh policy (seeded from `config.seed`), its PPO optimizer and the
    /// normalisers.
    pub fn new(
        config: SimicConfig,
        num_slots: usize,
        device: Device,
        telemetry: Telemetry,
    ) -> Result<Simic> {
        config.validate()?;
        tch::manual_seed(i64::from_ne_bytes(config.seed.to_ne_bytes()));
        let policy_config = PolicyConfig {
            num_slots,
            ..config.policy
        };
        let mut policy = Policy::new(policy_config, device)?;
        // Unless chosen, the reference's rule (§4.6): the policy's rollout,
        // bootstrap and update run under bf16 autocast only when the
        // environments train in bf16.
        let policy_precision = match (config.policy_precision, config.trainer.precision) {
            (Some(chosen), _) => chosen,
            (None, Some(training)) => PolicyPrecision::for_training(training),
            (None, None) => PolicyPrecision::for_training(tolaria::amp::Precision::auto(device)?),
        };
        policy.set_precision(policy_precision);
        if policy_precision == PolicyPrecision::Bf16
            && device == Device::Cpu
            && let Some(reason) = tamiyo::policy::cpu_bf16_lstm_fallback_reason()
        {
            // Once per trainer: the policy still runs, its LSTM outside bf16.
            telemetry.emit_event(
                SOURCE,
                leyline::telemetry::TAMIYO_PRECISION_FALLBACK,
                "bf16 policy on a CPU without oneDNN's bf16 LSTM: the LSTM runs outside bf16",
                vec![("reason", reason)],
            );
        }
        let parameters = policy.var_store().trainable_variables();
        let ppo = PpoTrainer::new(parameters, config.ppo.clone(), device)?;
        let sampler = Sampler::new(config.sampling, config.seed, device)?;
        let obs_dim = policy_config.obs_dim();
        let obs_normaliser = if config.normalise_observations {
            Some(RunningMeanStd::new(
                obs_dim,
                NormaliserConfig::default(),
                device,
            )?)
        } else {
            None
        };
        Ok(Simic {
            value_normaliser: ValueNormaliser::new(config.value_normaliser, device)?,
            reward_normaliser: RewardNormaliser::new(config.reward_normaliser)?,
            config,
            device,
            policy,
            sampler,
            ppo,
            obs_normaliser,
            telemetry,
            graphed: None,
            anomaly_thresholds: crate::ppo::AnomalyThresholds::default(),
            data_parallel: None,
            rounds: 0,
            env_epochs: 0,
            prewarm: None,
            started: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &SimicConfig {
        &self.config
    }

    /// What the blueprint warm-up ran ([`SimicConfig::prewarm_blueprints`];
    /// `None` before the first round or with it off).
    pub fn prewarm(&self) -> Option<&tolaria::engine::prewarm::Prewarm> {
        self.prewarm.as_ref()
    }

    /// The policy being trained.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The precision of the policy's forward passes (bf16 autocast when the
    /// environments train in bf16, fp32 otherwise).
    pub fn policy_precision(&self) -> PolicyPrecision {
        self.policy.network().precision()
    }

    /// Samples the policy's actions in `mode` from the next step on:
    /// [`SampleMode::Stochastic`] (training) or [`SampleMode::Greedy`] (the
    /// most likely valid option of each head: evaluation rounds, run with
    /// `learn = false`). A policy step captured for the other mode runs
    /// eagerly until the mode is switched back.
    pub fn set_sample_mode(&mut self, mode: SampleMode) {
        self.sampler.set_mode(mode);
    }

    /// Where a PPO update's statistics count as anomalies
    /// ([`crate::ppo::PpoAnomaly`]: reported in `RoundReport::anomalies` and
    /// as `simic.ppo.*` warning events; the defaults are
    /// [`crate::ppo::AnomalyThresholds::default`]). Thresholds that are
    /// not finite and positive are refused
    /// ([`crate::ppo::AnomalyThresholds::validate`]) and the current ones
    /// kept.
    pub fn set_anomaly_thresholds(
        &mut self,
        thresholds: crate::ppo::AnomalyThresholds,
    ) -> Result<()> {
        thresholds.validate()?;
        self.anomaly_thresholds = thresholds;
        Ok(())
    }

    /// The thresholds a PPO update's statistics are judged by
    /// ([`Simic::set_anomaly_thresholds`]).
    pub fn anomaly_thresholds(&self) -> crate::ppo::AnomalyThresholds {
        self.anomaly_thresholds
    }

    /// The action sampler (its generator and whether it runs fused).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Why the policy step runs eagerly, when it does (`None` while it
    /// replays a graph or before the first step).
    pub fn policy_fallback(&self) -> Option<&str> {
        if !self.config.graph_policy {
            return Some("graph_policy is off");
        }
        self.graphed.as_ref().and_then(|graphed| graphed.fallback())
    }

    /// Rounds run.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Environment-epochs per second over every round so far (the
    /// reference's "eps"), `None` before the first round.
    pub fn eps(&self) -> Option<f64> {
        let started = self.started?;
        let seconds = started.elapsed().as_secs_f64();
        (seconds > 0.0).then(|| self.env_epochs as f64 / seconds)
    }
}
