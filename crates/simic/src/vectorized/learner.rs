//! The learner of vectorized PPO: what learns from the rollouts and
//! persists between rounds besides the policy itself. It owns the PPO
//! update ([`PpoTrainer`]: the policy's optimizer and its schedules), the
//! three running normalisers (observations, critic targets, rewards), the
//! thresholds a PPO update's statistics are judged by, and, when the
//! trainer is one rank of a data-parallel group, that group
//! ([`DataParallel`]: gradients averaged inside the update, the normalisers
//! pooled over the ranks each round).
//!
//! The collector asks it to normalise each step's observations and each
//! reward; the round asks it for one update at the end
//! ([`Learner::update`]: GAE on the device, the critic's targets, the PPO
//! update, the Q head's estimate per op) and to put its normalisers back
//! when a round fails ([`Learner::checkpoint`], [`Learner::restore`]).

use tamiyo::normaliser::{NormaliserConfig, NormaliserState, RunningMeanStd};
use tamiyo::policy::{Policy, PolicyRng, Sampler};
use tch::{Device, Kind, Tensor};

use super::SimicConfig;
use super::state::SimicState;
use crate::agent;
use crate::buffer::RolloutBuffer;
use crate::distributed::DataParallel;
use crate::error::TorchResultExt;
use crate::gae::compute_gae;
use crate::ppo::{
    AnomalyThresholds, Objective, PpoAnomaly, PpoStats, PpoTrainer, ValueNormaliser,
    ValueNormaliserState,
};
use crate::rewards::{RewardNormaliser, RewardNormaliserState};
use crate::{Error, Result};

/// Prefix of the PPO optimizer's state among a checkpoint's tensors.
const OPTIMIZER: &str = "optimizer/";

/// The running normalisers: observations (when they are normalised),
/// critic targets, rewards.
pub(super) struct Normalisers {
    obs: Option<RunningMeanStd>,
    value: ValueNormaliser,
    reward: RewardNormaliser,
}

/// The normalisers as a round found them (see [`Learner::checkpoint`]).
pub(super) struct NormaliserCheckpoint {
    /// The observation normaliser's state, when it learns this round.
    obs: Option<NormaliserState>,
    value: ValueNormaliser,
    reward: RewardNormaliser,
}

/// The learner's host-side state, for [`SimicState`].
pub(super) struct LearnerState {
    pub(super) ppo_updates: u64,
    pub(super) ppo_rng: PolicyRng,
    pub(super) obs_normaliser: Option<NormaliserState>,
    pub(super) value_normaliser: ValueNormaliserState,
    pub(super) reward_normaliser: RewardNormaliserState,
}

/// The learner (see the module docs).
pub(super) struct Learner {
    device: Device,
    ppo: PpoTrainer,
    normalisers: Normalisers,
    normalise_observations: bool,
    gamma: f64,
    gae_lambda: f64,
    anomaly_thresholds: AnomalyThresholds,
    data_parallel: Option<DataParallel>,
}

impl Learner {
    /// A learner for `policy` on `device`: the PPO optimizer over the
    /// policy's trainable parameters and fresh normalisers (observations of
    /// `obs_dim` features).
    pub(super) fn new(
        config: &SimicConfig,
        policy: &Policy,
        obs_dim: usize,
        device: Device,
    ) -> Result<Learner> {
        let parameters = policy.var_store().trainable_variables();
        let ppo = PpoTrainer::new(parameters, config.ppo.clone(), device)?;
        let obs = if config.normalise_observations {
            Some(RunningMeanStd::new(
                obs_dim,
                NormaliserConfig::default(),
                device,
            )?)
        } else {
            None
        };
        Ok(Learner {
            device,
            ppo,
            normalisers: Normalisers {
                obs,
                value: ValueNormaliser::new(config.value_normaliser, device)?,
                reward: RewardNormaliser::new(config.reward_normaliser)?,
            },
            normalise_observations: config.normalise_observations,
            gamma: config.ppo.gamma,
            gae_lambda: config.ppo.gae_lambda,
            anomaly_thresholds: AnomalyThresholds::default(),
            data_parallel: None,
        })
    }

    /// The policy's input from a step's observations `[n_envs, obs_dim]`:
    /// normalised when observations are (the normaliser learns from the
    /// batch first when `learn`), as they are otherwise.
    pub(super) fn normalise_observations(&mut self, obs: &Tensor, learn: bool) -> Result<Tensor> {
        match self.normalisers.obs.as_mut() {
            Some(normaliser) => {
                if learn {
                    normaliser.update(obs)?;
                }
                Ok(normaliser.normalize(obs)?)
            }
            None => Ok(obs.shallow_clone()),
        }
    }

    /// The observation normaliser, its statistics as they are (frozen for
    /// a rollout: the staged policy step normalises with it inside its
    /// graph).
    pub(super) fn obs_normaliser(&self) -> Option<&tamiyo::normaliser::RunningMeanStd> {
        self.normalisers.obs.as_ref()
    }

    /// Whether observations are normalised.
    pub(super) fn normalises_observations(&self) -> bool {
        self.normalisers.obs.is_some()
    }

    /// The observation normaliser learns from a rollout's raw observations
    /// (one `[n_envs, obs_dim]` tensor per step), all at once: it was
    /// frozen during the rollout and is updated just before the PPO update
    /// (reference §3.3). Nothing happens without observations or without a
    /// normaliser.
    pub(super) fn learn_observations(&mut self, raw: &[Tensor]) -> Result<()> {
        let Some(normaliser) = self.normalisers.obs.as_mut() else {
            return Ok(());
        };
        if raw.is_empty() {
            return Ok(());
        }
        let all = Tensor::f_cat(raw, 0).op("the rollout's observations")?;
        normaliser.update(&all)?;
        Ok(())
    }

    /// A raw reward scaled by the reward normaliser, which learns from it
    /// first when `learn`.
    pub(super) fn normalise_reward(&mut self, reward: f64, learn: bool) -> Result<f64> {
        if learn {
            self.normalisers.reward.update_and_normalise(reward)
        } else {
            self.normalisers.reward.normalise(reward)
        }
    }

    /// What a round changes in the learner besides the policy and its
    /// optimizer (those the update puts back itself): the normalisers.
    /// Keeping the observation normaliser costs one readback of its state,
    /// and only when it learns (`learn`).
    pub(super) fn checkpoint(&self, learn: bool) -> Result<NormaliserCheckpoint> {
        let obs = match (&self.normalisers.obs, learn) {
            (Some(normaliser), true) => Some(normaliser.state()?),
            _ => None,
        };
        Ok(NormaliserCheckpoint {
            obs,
            value: self.normalisers.value.shallow_copy(),
            reward: self.normalisers.reward.clone(),
        })
    }

    /// Puts back what [`Learner::checkpoint`] kept.
    pub(super) fn restore(&mut self, saved: NormaliserCheckpoint) -> Result<()> {
        if let Some(state) = &saved.obs {
            self.normalisers.obs = Some(RunningMeanStd::from_state(state, self.device)?);
        }
        self.normalisers.value = saved.value;
        self.normalisers.reward = saved.reward;
        Ok(())
    }

    /// GAE on the device and one PPO update of `policy` (sampled by
    /// `sampler`) on `buffer`, with the anchor's labels in the buffer at
    /// `anchor_coef` (0: none). Returns the update's statistics and the Q
    /// head's estimate per op after it (`None` without auxiliary heads). On
    /// an error the policy, its optimizer state and the value normaliser are
    /// as they were before (the other normalisers are the round's to put
    /// back, [`Learner::restore`]).
    pub(super) fn update(
        &mut self,
        policy: &Policy,
        sampler: &Sampler,
        buffer: &RolloutBuffer,
        objective: Objective,
        anchor_coef: f64,
    ) -> Result<(PpoStats, Option<Vec<f64>>)> {
        let value_normaliser = self.normalisers.value.shallow_copy();
        let snapshot = self.ppo.snapshot()?;
        let result = self.update_unguarded(policy, sampler, buffer, objective, anchor_coef);
        if result.is_err() {
            self.normalisers.value = value_normaliser;
            self.ppo.restore(&snapshot)?;
        }
        result
    }

    /// [`Learner::update`] without the checkpoint.
    fn update_unguarded(
        &mut self,
        policy: &Policy,
        sampler: &Sampler,
        buffer: &RolloutBuffer,
        objective: Objective,
        anchor_coef: f64,
    ) -> Result<(PpoStats, Option<Vec<f64>>)> {
        self.pool_rollout_statistics()?;
        let rollout = buffer.finish()?;
        let values = self.normalisers.value.denormalise(&rollout.values)?;
        let bootstrap = self.normalisers.value.denormalise(&rollout.bootstrap)?;
        let (advantages, returns) = compute_gae(
            &rollout.rewards,
            &values,
            &rollout.terminated,
            &rollout.truncated,
            &bootstrap,
            self.gamma,
            self.gae_lambda,
        )?;
        let valid = rollout.valid.f_to_kind(Kind::Float).op("valid")?;
        self.normalisers.value.update(&returns, Some(&valid))?;
        self.pool_value_statistics()?;
        let targets = self.normalisers.value.normalise(&returns)?;
        let batch = rollout.ppo_batch(&advantages, &targets)?;
        let stats = self.ppo.update_unguarded(
            &batch,
            |rows| agent::evaluate_rows(policy, sampler, &rollout, rows, anchor_coef),
            self.data_parallel.as_mut(),
            objective,
        )?;
        let q_per_op = agent::q_per_op(policy, &rollout)?;
        Ok((stats, q_per_op))
    }

    /// PPO updates made so far (the schedules' clock).
    pub(super) fn updates_done(&self) -> u64 {
        self.ppo.updates()
    }

    /// What looks wrong in an update's statistics, by the thresholds.
    pub(super) fn anomalies(&self, stats: &PpoStats) -> Vec<PpoAnomaly> {
        PpoAnomaly::detect(stats, &self.anomaly_thresholds)
    }

    /// The thresholds a PPO update's statistics are judged by.
    pub(super) fn anomaly_thresholds(&self) -> AnomalyThresholds {
        self.anomaly_thresholds
    }

    /// New thresholds, checked ([`AnomalyThresholds::validate`]); refused
    /// ones leave the current ones.
    pub(super) fn set_anomaly_thresholds(&mut self, thresholds: AnomalyThresholds) -> Result<()> {
        thresholds.validate()?;
        self.anomaly_thresholds = thresholds;
        Ok(())
    }

    // --- data parallel -------------------------------------------------------

    /// Makes the learner one rank of `group`: the policy's parameters
    /// become rank 0's (checked identical, with the group's collectives
    /// warmed up); from then on every update averages gradients over the
    /// ranks and the normalisers are pooled. A join that fails puts this
    /// rank's parameters back and keeps no group.
    pub(super) fn join(&mut self, mut group: DataParallel) -> Result<()> {
        // The broadcast writes rank 0's parameters into this rank's: a
        // failed join puts this rank's back.
        let snapshot = self.ppo.snapshot()?;
        let joined = group
            .broadcast_parameters(self.ppo.parameters())
            .and_then(|()| group.warm_up(self.ppo.parameters()));
        if let Err(error) = joined {
            self.ppo.restore(&snapshot)?;
            return Err(error);
        }
        self.data_parallel = Some(group);
        Ok(())
    }

    /// The PPO minibatches' row-order generator.
    pub(super) fn ppo_rng(&self) -> tamiyo::policy::PolicyRng {
        self.ppo.rng().clone()
    }

    /// Continues with `rng` as the row-order generator (a rank restoring
    /// its own).
    pub(super) fn set_ppo_rng(&mut self, rng: tamiyo::policy::PolicyRng) {
        let updates = self.ppo.updates();
        self.ppo.resume_at(updates, rng);
    }

    /// The group, when data-parallel.
    pub(super) fn group(&self) -> Option<&DataParallel> {
        self.data_parallel.as_ref()
    }

    /// Pools the observation and reward normalisers over the ranks (no-op
    /// when not data-parallel).
    fn pool_rollout_statistics(&mut self) -> Result<()> {
        let Some(group) = self.data_parallel.as_ref() else {
            return Ok(());
        };
        if let Some(normaliser) = self.normalisers.obs.as_ref() {
            let mut state = normaliser.state()?;
            let (mean, var) = group.pool_moments(&state.mean, &state.var)?;
            state.mean = mean;
            state.var = var;
            self.normalisers.obs = Some(RunningMeanStd::from_state(&state, self.device)?);
        }
        let mut state = self.normalisers.reward.state();
        if state.count > 0 {
            let var = state.m2 / state.count as f64;
            let (mean, var) = group.pool_moments(&[state.mean], &[var])?;
            state.mean = mean.first().copied().unwrap_or(state.mean);
            state.m2 = var.first().copied().unwrap_or(0.0) * state.count as f64;
            if state.count == 1 {
                state.m2 = 0.0;
            }
            self.normalisers.reward = RewardNormaliser::from_state(state)?;
        }
        Ok(())
    }

    /// Pools the value normaliser over the ranks (no-op when not
    /// data-parallel).
    fn pool_value_statistics(&mut self) -> Result<()> {
        let Some(group) = self.data_parallel.as_ref() else {
            return Ok(());
        };
        let mut state = self.normalisers.value.state()?;
        let (mean, var) = group.pool_moments(&[state.mean], &[state.var])?;
        state.mean = mean.first().copied().unwrap_or(state.mean);
        state.var = var.first().copied().unwrap_or(state.var);
        self.normalisers.value = ValueNormaliser::from_state(&state, self.device)?;
        Ok(())
    }

    // --- checkpoints ---------------------------------------------------------

    /// The host-side state: the update count and row-order generator, the
    /// normalisers' states.
    pub(super) fn state(&self) -> Result<LearnerState> {
        Ok(LearnerState {
            ppo_updates: self.ppo.updates(),
            ppo_rng: self.ppo.rng().clone(),
            obs_normaliser: match &self.normalisers.obs {
                Some(normaliser) => Some(normaliser.state()?),
                None => None,
            },
            value_normaliser: self.normalisers.value.state()?,
            reward_normaliser: self.normalisers.reward.state(),
        })
    }

    /// The optimizer's state tensors as a checkpoint names them
    /// (`optimizer/<index>`, its step count `optimizer/step_count`), as
    /// handles.
    pub(super) fn optimizer_tensors(&self) -> Vec<(String, Tensor)> {
        let optimizer = self.ppo.optimizer();
        let mut tensors: Vec<(String, Tensor)> = optimizer
            .state_tensors()
            .into_iter()
            .enumerate()
            .map(|(index, tensor)| (format!("{OPTIMIZER}{index}"), tensor))
            .collect();
        tensors.push((
            format!("{OPTIMIZER}step_count"),
            optimizer.step_count_tensor().shallow_clone(),
        ));
        tensors
    }

    /// The normalisers of `state`, checked as their `from_state` checks
    /// them and against this learner's configuration; nothing is changed.
    pub(super) fn normalisers_of(&self, state: &SimicState) -> Result<Normalisers> {
        let obs = match (&state.obs_normaliser, self.normalise_observations) {
            (Some(saved), true) => Some(RunningMeanStd::from_state(saved, self.device)?),
            (None, false) => None,
            _ => {
                return Err(Error::InvalidInput {
                    field: "SimicState.obs_normaliser",
                    reason: "the checkpoint and the configuration disagree on observation \
                             normalisation"
                        .to_owned(),
                });
            }
        };
        Ok(Normalisers {
            obs,
            value: ValueNormaliser::from_state(&state.value_normaliser, self.device)?,
            reward: RewardNormaliser::from_state(state.reward_normaliser)?,
        })
    }

    /// Continues from a checkpoint: `normalisers` (from
    /// [`Learner::normalisers_of`]), and the update count and row-order
    /// generator of `state` (the optimizer's tensors are written by the
    /// caller).
    pub(super) fn resume(&mut self, normalisers: Normalisers, state: &SimicState) {
        self.normalisers = normalisers;
        self.ppo.resume_at(state.ppo_updates, state.ppo_rng.clone());
    }
}
