//! Vectorized PPO (reference §4.1): rounds of `n_envs` fresh environments,
//! each a Kasmina model trained by Tolaria one epoch per step, Tamiyo's
//! policy choosing one lifecycle operation per environment per step, and
//! one PPO update per round.
//!
//! [`Simic`] is a thin composition of four parts, each in its own file:
//!
//! - the **collector** (`collector`): one round's rollout. It owns the
//!   round's environments, the rollout buffer, the feature batch and the
//!   policy's recurrent state, and drives one environment step's phases over
//!   every environment. Each environment (`env`) is a small state machine:
//!   its trainer, its observation tracker, its last epoch figures, its
//!   episode's outcome and the step in flight (the trained epoch, the
//!   launched and then measured counterfactual pass, waiting for its
//!   action), with one method per phase (`env/step`);
//! - the **actor** (`actor`): the policy being trained, its sampler and the
//!   captured policy step: one batched step for all environments;
//! - the **learner** (`learner`): the PPO update, the observation, value and
//!   reward normalisers, the anomaly thresholds and the data-parallel group;
//! - the round (`round`): [`Simic::run_round`], a short loop over the
//!   collector's phases, then the update and the report; a failed round
//!   puts the normalisers and the sampler's generator back.
//!
//! One step of a round, for every environment still in its episode:
//!
//! 1. every environment's epoch is queued on its own compute stream
//!    ([`tolaria::engine::trainer::ModelTrainer::launch_epoch`]) before any is read back, so the
//!    epochs overlap on the GPU; then each is read back
//!    ([`tolaria::engine::trainer::ModelTrainer::finish_training`]) and its
//!    fused validation + counterfactual pass
//!    ([`crate::counterfactual::launch_fused_validation`]) queued on the
//!    validation set, on the environment's stream: validation accuracy and
//!    loss, each seed's contribution, the clean total, pairwise
//!    interactions;
//! 2. the passes are read back and the governor judges; a rollback ends
//!    that environment's episode (the death penalty on its last transition,
//!    earlier rewards forfeited, reference §4.4); otherwise the accuracies
//!    and contributions are recorded on the seeds;
//! 3. observations (Obs V3) and masks for all environments;
//! 4. one batched policy forward, and **one** readback of the actions for
//!    all of them; the policy's outputs go to the device rollout buffer
//!    without a readback;
//! 5. each environment carries its action out through Kasmina, the epoch
//!    concludes (lifecycle tick), the reward is computed and normalised.
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

mod actor;
mod collector;
mod config;
mod env;
pub mod imitation;
mod learner;
mod measure;
mod outcome;
mod report;
mod round;
pub mod settings;
mod state;
mod telemetry;

use std::time::Instant;

use leyline::Telemetry;
use tamiyo::policy::{Policy, PolicyPrecision, SampleMode, Sampler};
use tch::Device;
use torch_ext::dist::ProcessGroup;

use crate::distributed::DataParallel;
use crate::{Error, Result};
use actor::Actor;
use learner::Learner;

pub use config::{Episode, SimicConfig};
pub use env::EnvSpec;
pub use imitation::{Demonstrator, ImitationConfig, ImitationFigures};
pub use outcome::{
    ActionDistribution, EpisodeOutcome, NUM_OPS, OpCounts, OutcomeKind, RewardHackingSuspicion,
    TraceEpoch, TraceSlot,
};
pub use report::{POLICY_PARTS, RoundReport, RoundTimings, StepFigures, StepProfile};
pub use state::{RankRngs, SimicState};
pub use telemetry::SOURCE;

/// Spreads the ranks' sampling streams apart (the 64-bit golden ratio).
const RANK_SEED_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

/// Rounds and environment-epochs run, and since when (the "eps" clock).
#[derive(Debug, Default)]
struct Progress {
    rounds: u64,
    env_epochs: u64,
    started: Option<Instant>,
}

impl Progress {
    /// Starts the clock at the first round.
    fn start(&mut self, now: Instant) {
        self.started.get_or_insert(now);
    }

    /// Counts a round that trained `env_epochs` environment-epochs.
    fn count(&mut self, env_epochs: u64) {
        self.rounds = self.rounds.saturating_add(1);
        self.env_epochs = self.env_epochs.saturating_add(env_epochs);
    }
}

/// The vectorized PPO trainer (see the module docs).
pub struct Simic {
    config: SimicConfig,
    /// The policy's device (the rollout buffer and the update run there).
    device: Device,
    actor: Actor,
    learner: Learner,
    telemetry: Telemetry,
    progress: Progress,
    /// The blueprint warm-up, run once before the first round.
    prewarm: Option<tolaria::engine::prewarm::Prewarm>,
    /// Every rank's generators after the last round that learned (empty
    /// when not data-parallel): what rank 0's checkpoint carries.
    rank_rngs: Vec<state::RankRngs>,
    /// A data-parallel checkpoint's generators, imported before the group
    /// is joined: [`Simic::join`] takes this rank's.
    restored_rank_rngs: Option<Vec<state::RankRngs>>,
    /// Whether rounds profile a step for each number of live seeds
    /// ([`Simic::set_step_profiling`]).
    step_profiling: bool,
}

impl std::fmt::Debug for Simic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simic")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("rounds", &self.progress.rounds)
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
        let actor = Actor::new(&config, num_slots, device, &telemetry)?;
        let obs_dim = actor.policy().network().config().obs_dim();
        let learner = Learner::new(&config, actor.policy(), obs_dim, device)?;
        Ok(Simic {
            config,
            device,
            actor,
            learner,
            telemetry,
            progress: Progress::default(),
            prewarm: None,
            rank_rngs: Vec::new(),
            restored_rank_rngs: None,
            step_profiling: false,
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
        self.actor.policy()
    }

    /// The precision of the policy's forward passes (bf16 autocast when the
    /// environments train in bf16, fp32 otherwise).
    pub fn policy_precision(&self) -> PolicyPrecision {
        self.actor.policy().network().precision()
    }

    /// With `on`, every later round profiles one step for each number of
    /// live seeds per environment (the mean rounded, 0 to 3) on the GPU
    /// with libtorch's kernel profiler: the first step of that number
    /// that replays its graphs (captures nothing, runs no eager warm-up
    /// step), its training and validation ([`RoundReport::step_profiles`]).
    /// The profiler adds host time to the steps it watches, so a round
    /// with profiling on is not a throughput measurement. Nothing is
    /// profiled on the CPU.
    pub fn set_step_profiling(&mut self, on: bool) {
        self.step_profiling = on;
    }

    /// Samples the policy's actions in `mode` from the next step on:
    /// [`SampleMode::Stochastic`] (training) or [`SampleMode::Greedy`] (the
    /// most likely valid option of each head: evaluation rounds, run with
    /// `learn = false`). A policy step captured for the other mode runs
    /// eagerly until the mode is switched back.
    pub fn set_sample_mode(&mut self, mode: SampleMode) {
        self.actor.set_sample_mode(mode);
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
        self.learner.set_anomaly_thresholds(thresholds)
    }

    /// The thresholds a PPO update's statistics are judged by
    /// ([`Simic::set_anomaly_thresholds`]).
    pub fn anomaly_thresholds(&self) -> crate::ppo::AnomalyThresholds {
        self.learner.anomaly_thresholds()
    }

    /// The action sampler (its generator and whether it runs fused).
    pub fn sampler(&self) -> &Sampler {
        self.actor.sampler()
    }

    /// Why the policy step runs eagerly, when it does (`None` while it
    /// replays a graph or before the first step).
    pub fn policy_fallback(&self) -> Option<&str> {
        self.actor.fallback()
    }

    /// Rounds run.
    pub fn rounds(&self) -> u64 {
        self.progress.rounds
    }

    /// Environment-epochs per second over every round so far (the
    /// reference's "eps"), `None` before the first round.
    pub fn eps(&self) -> Option<f64> {
        let started = self.progress.started?;
        let seconds = started.elapsed().as_secs_f64();
        (seconds > 0.0).then(|| self.progress.env_epochs as f64 / seconds)
    }

    // --- one rank of a data-parallel group ([`crate::distributed`]) -------

    /// Makes this trainer one rank of `group` before its first round: the
    /// policy's parameters become rank 0's (checked identical, with the
    /// group's collectives warmed up), the sampler is reseeded for
    /// this rank, and environment seeds are drawn as if the group's
    /// environments were one vector of `world_size · n_envs`
    /// (`seed + ((round·world + rank)·n_envs + env)·env_seed_stride`).
    /// From then on every update averages gradients over the ranks and
    /// checks the parameters identical, and the normalisers are pooled. A
    /// join that fails leaves the trainer as it was (its own parameters,
    /// sampler and no group).
    ///
    /// A trainer that imported a data-parallel checkpoint
    /// ([`Simic::import_state`] of rank 0's [`SimicState::rank_rngs`]) joins
    /// after its rounds: the group must have the checkpoint's size, and
    /// every rank continues with its own generators, as the run that was
    /// never stopped. Until it joins, such a trainer refuses to run a round.
    pub fn join(&mut self, group: ProcessGroup) -> Result<()> {
        if self.progress.rounds > 0 && self.restored_rank_rngs.is_none() {
            return Err(Error::InvalidInput {
                field: "Simic.join",
                reason: format!(
                    "{} rounds already ran; join before the first (or after importing a \
                     data-parallel checkpoint)",
                    self.progress.rounds
                ),
            });
        }
        if group.device() != self.device {
            return Err(Error::ShapeMismatch {
                what: "Simic.join",
                expected: format!("a group on the policy's device {:?}", self.device),
                got: format!("{:?}", group.device()),
            });
        }
        let group = DataParallel::new(group);
        let rank = group.rank();
        if let Some(restored) = &self.restored_rank_rngs {
            // A restored run: every rank continues with its own generators.
            let entry = state::rank_entry(restored, rank, group.world_size())?;
            self.learner.join(group)?;
            self.actor.resume(entry.sampler);
            self.learner.set_ppo_rng(entry.ppo);
            self.restored_rank_rngs = None;
            return Ok(());
        }
        let seed = self
            .config
            .seed
            .wrapping_add((rank as u64).wrapping_mul(RANK_SEED_STRIDE));
        let sampler = Sampler::new(self.config.sampling, seed, self.device)?;
        self.learner.join(group)?;
        self.actor.reseed(sampler);
        Ok(())
    }

    /// The size of the group whose checkpoint was imported and which this
    /// trainer must join before its next round ([`Simic::join`]); `None`
    /// when nothing awaits a group.
    pub fn restored_group_size(&self) -> Option<usize> {
        self.restored_rank_rngs.as_ref().map(Vec::len)
    }

    /// Waits for every rank (no-op when not data-parallel).
    pub fn barrier(&self) -> Result<()> {
        match self.learner.group() {
            Some(group) => group.barrier(),
            None => Ok(()),
        }
    }

    /// Whether `flag` is set on any rank (a decision every rank must take
    /// alike, e.g. stopping between rounds); `flag` itself when not
    /// data-parallel.
    pub fn any_rank(&self, flag: bool) -> Result<bool> {
        match self.learner.group() {
            Some(group) => Ok(group.mean_scalar(f64::from(u8::from(flag)))? > 0.0),
            None => Ok(flag),
        }
    }

    /// The rank and group size (`(0, 1)` when not data-parallel).
    pub fn rank_and_world(&self) -> (usize, usize) {
        self.learner
            .group()
            .map_or((0, 1), |group| (group.rank(), group.world_size()))
    }
}
