//! [`train_cartpole`]: PPO on CartPole-v1 with CleanRL's `ppo.py` recipe,
//! through the same [`PpoTrainer`] and [`compute_gae`] that train Tamiyo.
//!
//! Each rollout runs `steps_per_rollout` steps of `n_envs` environments:
//! the actor's logits are softmaxed on the device, the probabilities read
//! back (the environments live on the host), actions drawn with the run's
//! seeded generator, and their log-probabilities gathered on the device.
//! A truncated episode is bootstrapped with the critic's value of its last
//! state; the last column with the value of the next observation. GAE runs
//! on the `[n_envs, steps]` rollout, which is then flattened into a batch of
//! `n_envs · steps` rows with `T = 1` and `H = 1` for the update.

use std::collections::VecDeque;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};
use torch_ext::device::DeviceChoice;

use super::agent::ActorCritic;
use leyline::rng::SplitMix64;

use super::env::{CartPoleVec, states_tensor};
use crate::error::TorchResultExt;
use crate::gae::compute_gae;
use crate::ppo::{Evaluation, PpoBatch, PpoConfig, PpoStats, PpoTrainer};
use crate::{Error, Result};

/// The run's settings; the defaults are CleanRL `ppo.py`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CartpoleConfig {
    /// Parallel environments (4).
    pub n_envs: usize,
    /// Steps per environment per rollout (128).
    pub steps_per_rollout: usize,
    /// Environment steps in all, over every environment (500 000).
    pub total_steps: u64,
    /// Seed of the network, the environments and the action draws (1).
    pub seed: u64,
    /// Where the network runs (the CPU: the network is tiny).
    pub device: DeviceChoice,
    /// Adam learning rate (2.5e-4), annealed linearly to 0 when
    /// `anneal_learning_rate`.
    pub learning_rate: f64,
    /// Anneal the learning rate (on).
    pub anneal_learning_rate: bool,
    /// Discount (0.99).
    pub gamma: f64,
    /// GAE λ (0.95).
    pub gae_lambda: f64,
    /// Minibatches per epoch (4).
    pub minibatches: usize,
    /// Epochs per update (4).
    pub epochs: usize,
    /// Ratio clip (0.2), also the value clip.
    pub clip: f64,
    /// Clip the value loss (on).
    pub value_clipping: bool,
    /// Entropy coefficient (0.01).
    pub entropy_coef: f64,
    /// Value coefficient (0.5).
    pub value_coef: f64,
    /// Gradient clipping norm (0.5).
    pub max_grad_norm: f64,
    /// Target KL (none).
    pub target_kl: Option<f64>,
    /// Episodes the reported mean return is taken over (100).
    pub report_window: usize,
}

impl Default for CartpoleConfig {
    fn default() -> Self {
        CartpoleConfig {
            n_envs: 4,
            steps_per_rollout: 128,
            total_steps: 500_000,
            seed: 1,
            device: DeviceChoice::Cpu,
            learning_rate: 2.5e-4,
            anneal_learning_rate: true,
            gamma: 0.99,
            gae_lambda: 0.95,
            minibatches: 4,
            epochs: 4,
            clip: 0.2,
            value_clipping: true,
            entropy_coef: 0.01,
            value_coef: 0.5,
            max_grad_norm: 0.5,
            target_kl: None,
            report_window: 100,
        }
    }
}

impl CartpoleConfig {
    /// Environment steps per rollout (`n_envs · steps_per_rollout`).
    pub fn batch_size(&self) -> u64 {
        (self.n_envs as u64).saturating_mul(self.steps_per_rollout as u64)
    }

    /// Updates the run makes: `total_steps / batch_size`, rounded down.
    pub fn updates(&self) -> u64 {
        self.total_steps.checked_div(self.batch_size()).unwrap_or(0)
    }

    /// The PPO configuration this run trains with (one head, no value
    /// warm-up, no floors, CleanRL's tiny advantage-std floor).
    pub fn ppo_config(&self) -> PpoConfig {
        PpoConfig {
            learning_rate: self.learning_rate,
            adam_eps: 1e-5,
            clip: self.clip,
            gamma: self.gamma,
            gae_lambda: self.gae_lambda,
            target_kl: self.target_kl,
            entropy_coef: self.entropy_coef,
            value_coef: self.value_coef,
            value_warmup_updates: 0,
            value_clip: self.value_clipping.then_some(self.clip),
            max_grad_norm: self.max_grad_norm,
            epochs: self.epochs,
            minibatches: self.minibatches,
            shuffle_seed: self.seed,
            normalize_advantages: true,
            advantage_std_floor: 1e-8,
            anneal_learning_rate: self.anneal_learning_rate,
            total_updates: Some(self.updates().max(1)),
            ..PpoConfig::default()
        }
    }

    /// Checks the sizes and every PPO setting (through
    /// [`PpoConfig::validate`]); the error names the `CartpoleConfig` field,
    /// e.g. `CartpoleConfig.learning_rate` for a NaN learning rate.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &'static str, reason: String| Error::InvalidConfig { field, reason };
        if !(1..=super::env::MAX_ENVS).contains(&self.n_envs) {
            return Err(invalid(
                "CartpoleConfig.n_envs",
                format!("{} is outside [1, {}]", self.n_envs, super::env::MAX_ENVS),
            ));
        }
        if !(1..=1_000_000).contains(&self.steps_per_rollout) {
            return Err(invalid(
                "CartpoleConfig.steps_per_rollout",
                format!("{} is outside [1, 1000000]", self.steps_per_rollout),
            ));
        }
        if self.updates() == 0 {
            return Err(invalid(
                "CartpoleConfig.total_steps",
                format!(
                    "{} is less than one rollout ({} steps)",
                    self.total_steps,
                    self.batch_size()
                ),
            ));
        }
        if (self.minibatches as u64) > self.batch_size() {
            return Err(invalid(
                "CartpoleConfig.minibatches",
                format!(
                    "{} minibatches for {} samples",
                    self.minibatches,
                    self.batch_size()
                ),
            ));
        }
        if self.report_window == 0 {
            return Err(invalid(
                "CartpoleConfig.report_window",
                "0 must be >= 1".into(),
            ));
        }
        self.ppo_config().validate().map_err(|error| match error {
            Error::InvalidConfig { field, reason } => Error::InvalidConfig {
                field: cartpole_field(field),
                reason,
            },
            other => other,
        })
    }
}

/// The [`CartpoleConfig`] field a [`PpoConfig`] field comes from (see
/// [`CartpoleConfig::ppo_config`]), so that an error names the field the
/// caller set.
fn cartpole_field(ppo_field: &'static str) -> &'static str {
    match ppo_field {
        "PpoConfig.learning_rate" => "CartpoleConfig.learning_rate",
        "PpoConfig.clip" | "PpoConfig.value_clip" => "CartpoleConfig.clip",
        "PpoConfig.gamma" => "CartpoleConfig.gamma",
        "PpoConfig.gae_lambda" => "CartpoleConfig.gae_lambda",
        "PpoConfig.target_kl" => "CartpoleConfig.target_kl",
        "PpoConfig.entropy_coef" => "CartpoleConfig.entropy_coef",
        "PpoConfig.value_coef" => "CartpoleConfig.value_coef",
        "PpoConfig.max_grad_norm" => "CartpoleConfig.max_grad_norm",
        "PpoConfig.epochs" => "CartpoleConfig.epochs",
        "PpoConfig.minibatches" => "CartpoleConfig.minibatches",
        "PpoConfig.total_updates" => "CartpoleConfig.total_steps",
        other => other,
    }
}

/// One rollout and its update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// Index of the update (0-based).
    pub update: u64,
    /// Environment steps so far.
    pub steps: u64,
    /// Episodes finished so far.
    pub episodes: u64,
    /// Mean return of the last `report_window` finished episodes (`None`
    /// before the first one).
    pub mean_return: Option<f64>,
    /// The update's policy loss.
    pub policy_loss: f64,
    /// The update's value loss.
    pub value_loss: f64,
    /// The update's mean entropy.
    pub entropy: f64,
    /// The update's approximate KL.
    pub approx_kl: f64,
    /// The update's clip fraction.
    pub clip_fraction: f64,
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CartpoleReport {
    /// The run's settings.
    pub config: CartpoleConfig,
    /// Mean return of the last `report_window` finished episodes at the end.
    pub mean_return: f64,
    /// The best such mean seen after any rollout.
    pub best_mean_return: f64,
    /// Mean return of the first `report_window` finished episodes (the
    /// untrained policy's level).
    pub initial_mean_return: f64,
    /// Episodes finished.
    pub episodes: u64,
    /// Environment steps taken.
    pub steps: u64,
    /// Wall-clock seconds of the run.
    pub wall_time_s: f64,
    /// One record per rollout.
    pub history: Vec<RolloutRecord>,
}

/// One rollout on the device, `[n_envs, steps]` per field.
struct Rollout {
    observations: Tensor,
    actions: Tensor,
    log_probs: Tensor,
    values: Tensor,
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    bootstrap: Tensor,
}

fn readback(what: &'static str, tensor: &Tensor) -> Result<Vec<f64>> {
    let host = tensor
        .f_to_kind(Kind::Double)
        .op("readback")?
        .f_to_device(Device::Cpu)
        .op("readback")?
        .f_flatten(0, -1)
        .op("readback")?;
    Vec::<f64>::try_from(&host).map_err(|source| Error::Readback {
        what,
        reason: source.to_string(),
    })
}

fn host_tensor(values: &[f32], device: Device) -> Result<Tensor> {
    Tensor::f_from_slice(values)
        .op("rollout column")?
        .f_to_device(device)
        .op("rollout column")
}

/// The returns of finished episodes: the last `window` and the first
/// `window`.
struct EpisodeLog {
    window: usize,
    recent: VecDeque<f64>,
    first: Vec<f64>,
    finished: u64,
}

impl EpisodeLog {
    fn new(window: usize) -> EpisodeLog {
        EpisodeLog {
            window,
            recent: VecDeque::with_capacity(window),
            first: Vec::with_capacity(window),
            finished: 0,
        }
    }

    fn push(&mut self, episodic_return: f64) {
        self.finished = self.finished.saturating_add(1);
        if self.first.len() < self.window {
            self.first.push(episodic_return);
        }
        if self.recent.len() == self.window {
            self.recent.pop_front();
        }
        self.recent.push_back(episodic_return);
    }

    fn recent_mean(&self) -> Option<f64> {
        (!self.recent.is_empty())
            .then(|| self.recent.iter().sum::<f64>() / self.recent.len() as f64)
    }

    fn first_mean(&self) -> Option<f64> {
        (!self.first.is_empty()).then(|| self.first.iter().sum::<f64>() / self.first.len() as f64)
    }
}

/// The rollout's columns as they are collected, one tensor per step each.
#[derive(Default)]
struct Columns {
    observations: Vec<Tensor>,
    actions: Vec<Tensor>,
    log_probs: Vec<Tensor>,
    values: Vec<Tensor>,
    rewards: Vec<Tensor>,
    terminated: Vec<Tensor>,
    truncated: Vec<Tensor>,
    bootstrap: Vec<Tensor>,
}

fn flags(flags: &[bool]) -> Vec<f32> {
    flags
        .iter()
        .map(|flag| f32::from(u8::from(*flag)))
        .collect()
}

/// Runs one rollout: `steps` steps of every environment.
fn collect(
    agent: &ActorCritic,
    envs: &mut CartPoleVec,
    rng: &mut SplitMix64,
    steps: usize,
    log: &mut EpisodeLog,
) -> Result<Rollout> {
    let device = agent.device();
    let n_envs = i64::try_from(envs.len()).unwrap_or(i64::MAX);
    let mut columns = Columns::default();
    let _guard = tch::no_grad_guard();
    for _ in 0..steps {
        let observations = envs.observations(device)?;
        let log_softmax = agent
            .logits(&observations)?
            .f_log_softmax(-1, Kind::Float)
            .op("policy")?;
        let right = log_softmax
            .f_select(1, 1)
            .op("policy")?
            .f_exp()
            .op("policy")?;
        // The one readback of a step: the environments need the actions.
        let probabilities = readback("cartpole.action_probabilities", &right)?;
        // A NaN probability would silently pick action 0.
        if let Some(bad) = probabilities
            .iter()
            .find(|p| !(p.is_finite() && (0.0..=1.0).contains(*p)))
        {
            return Err(Error::NonFinite {
                what: "cartpole.action_probabilities",
                value: *bad,
            });
        }
        let actions: Vec<i64> = probabilities
            .iter()
            .map(|p| i64::from(rng.next_f64() < *p))
            .collect();
        let action_tensor = Tensor::f_from_slice(&actions)
            .op("actions")?
            .f_to_device(device)
            .op("actions")?;
        let log_probs = log_softmax
            .f_gather(1, &action_tensor.f_unsqueeze(1).op("actions")?, false)
            .op("log prob")?
            .f_squeeze_dim(1)
            .op("log prob")?;
        let values = agent.values(&observations)?;
        let step = envs.step(&actions)?;
        for episode in &step.episodes {
            log.push(episode.episodic_return);
        }
        // V(s') of a truncated episode's last state, zero elsewhere.
        let bootstrap = if step.truncated.iter().any(|flag| *flag) {
            let finals: Vec<[f64; 4]> = step
                .final_states
                .iter()
                .map(|state| state.unwrap_or([0.0; 4]))
                .collect();
            agent
                .values(&states_tensor(&finals, device)?)?
                .f_mul(&host_tensor(&flags(&step.truncated), device)?)
                .op("bootstrap")?
        } else {
            Tensor::f_zeros([n_envs], (Kind::Float, device)).op("bootstrap")?
        };
        columns.observations.push(observations);
        columns.actions.push(action_tensor);
        columns.log_probs.push(log_probs);
        columns.values.push(values);
        columns.rewards.push(host_tensor(&step.rewards, device)?);
        columns
            .terminated
            .push(host_tensor(&flags(&step.terminated), device)?);
        columns
            .truncated
            .push(host_tensor(&flags(&step.truncated), device)?);
        columns.bootstrap.push(bootstrap);
    }
    // The last column: where the episode was not truncated, V(s') is the
    // value of the next observation (GAE ignores it after a terminal step).
    let next_values = agent.values(&envs.observations(device)?)?;
    if let (Some(last), Some(truncated)) = (columns.bootstrap.last_mut(), columns.truncated.last())
    {
        let cut = truncated.f_ne(0).op("bootstrap")?;
        *last = last.f_where_self(&cut, &next_values).op("bootstrap")?;
    }
    let stack = |column: &[Tensor]| Tensor::f_stack(column, 1).op("rollout stack");
    Ok(Rollout {
        observations: stack(&columns.observations)?,
        actions: stack(&columns.actions)?,
        log_probs: stack(&columns.log_probs)?,
        values: stack(&columns.values)?,
        rewards: stack(&columns.rewards)?,
        terminated: stack(&columns.terminated)?,
        truncated: stack(&columns.truncated)?,
        bootstrap: stack(&columns.bootstrap)?,
    })
}

/// Trains CartPole with `config` (see the module docs).
pub fn train_cartpole(config: CartpoleConfig) -> Result<CartpoleReport> {
    train_cartpole_with(config, |_| {})
}

/// [`train_cartpole`], calling `on_rollout` after every update.
pub fn train_cartpole_with(
    config: CartpoleConfig,
    mut on_rollout: impl FnMut(&RolloutRecord),
) -> Result<CartpoleReport> {
    config.validate()?;
    let started = Instant::now();
    let device = torch_ext::device::select(config.device)?;
    let agent = ActorCritic::new(device, config.seed)?;
    let mut trainer = PpoTrainer::new(agent.parameters(), config.ppo_config(), device)?;
    let mut envs = CartPoleVec::new(config.n_envs, config.seed.wrapping_add(1))?;
    let mut rng = SplitMix64::new(config.seed.wrapping_add(2));
    let mut log = EpisodeLog::new(config.report_window);
    let mut steps: u64 = 0;
    let mut best = f64::NEG_INFINITY;
    let mut history = Vec::new();
    for update in 0..config.updates() {
        let rollout = collect(
            &agent,
            &mut envs,
            &mut rng,
            config.steps_per_rollout,
            &mut log,
        )?;
        steps = steps.saturating_add(config.batch_size());
        let (advantages, returns) = compute_gae(
            &rollout.rewards,
            &rollout.values,
            &rollout.terminated,
            &rollout.truncated,
            &rollout.bootstrap,
            config.gamma,
            config.gae_lambda,
        )?;
        let stats = update_policy(&agent, &mut trainer, &rollout, &advantages, &returns)?;
        let mean_return = log.recent_mean();
        if let Some(mean_return) = mean_return {
            best = best.max(mean_return);
        }
        let record = RolloutRecord {
            update,
            steps,
            episodes: log.finished,
            mean_return,
            policy_loss: stats.policy_loss,
            value_loss: stats.value_loss,
            entropy: stats.head_entropies.first().copied().unwrap_or(f64::NAN),
            approx_kl: stats.approx_kl,
            clip_fraction: stats.clip_fraction,
        };
        on_rollout(&record);
        history.push(record);
    }
    Ok(CartpoleReport {
        mean_return: log.recent_mean().unwrap_or(f64::NAN),
        best_mean_return: best,
        initial_mean_return: log.first_mean().unwrap_or(f64::NAN),
        episodes: log.finished,
        steps,
        wall_time_s: started.elapsed().as_secs_f64(),
        history,
        config,
    })
}

/// Flattens the rollout into `n_envs · steps` rows and runs one update.
fn update_policy(
    agent: &ActorCritic,
    trainer: &mut PpoTrainer,
    rollout: &Rollout,
    advantages: &Tensor,
    returns: &Tensor,
) -> Result<PpoStats> {
    let rows_of = |tensor: &Tensor| tensor.f_reshape([-1, 1]).op("flatten rollout");
    let observations = rollout
        .observations
        .f_reshape([-1, 4])
        .op("flatten rollout")?;
    let actions = rollout.actions.f_reshape([-1, 1]).op("flatten rollout")?;
    let rows = actions.size().first().copied().unwrap_or(0);
    let ones = Tensor::f_ones([rows, 1], (Kind::Float, agent.device())).op("weights")?;
    let batch = PpoBatch {
        log_probs: rollout
            .log_probs
            .f_reshape([-1, 1, 1])
            .op("flatten rollout")?,
        advantages: rows_of(advantages)?,
        returns: rows_of(returns)?,
        old_values: rows_of(&rollout.values)?,
        head_weights: ones.f_unsqueeze(-1).op("weights")?,
        actor_weight: ones.shallow_clone(),
        value_weight: ones,
    };
    trainer.update(&batch, |indices| {
        let x = observations.f_index_select(0, indices).op("minibatch")?;
        let chosen = actions.f_index_select(0, indices).op("minibatch")?;
        let log_softmax = agent
            .logits(&x)?
            .f_log_softmax(-1, Kind::Float)
            .op("evaluate")?;
        let log_probs = log_softmax
            .f_gather(1, &chosen, false)
            .op("evaluate")?
            .f_unsqueeze(-1)
            .op("evaluate")?;
        let entropies = log_softmax
            .f_exp()
            .op("entropy")?
            .f_mul(&log_softmax)
            .op("entropy")?
            .f_sum_dim_intlist(&[-1_i64][..], true, Kind::Float)
            .op("entropy")?
            .f_neg()
            .op("entropy")?
            .f_unsqueeze(-1)
            .op("entropy")?;
        let values = agent.values(&x)?.f_unsqueeze(-1).op("evaluate")?;
        Ok(Evaluation {
            anchor: None,
            log_probs,
            entropies,
            values,
            auxiliary: None,
        })
    })
}
