//! One round of vectorized PPO, [`Simic::run_round`]: a short loop over the
//! collector's phases (the steps are listed in the parent module's docs),
//! then the bootstrap, the learner's update and the report; and the round's
//! failure guarantee (what a failed round puts back).

use std::time::Instant;

use tamiyo::policy::PolicyRng;
use tch::Device;

use super::collector::Collector;
use super::env::{EnvSpec, prewarm_blueprints};
use super::learner::NormaliserCheckpoint;
use super::measure::ms;
use super::{RoundReport, Simic, SimicConfig, telemetry};
use crate::ppo::PpoStats;
use crate::{Error, Result};

/// Environment seeds other than the run's own ([`Simic::evaluate_on`]).
#[derive(Debug, Clone, Copy)]
struct EnvSeeds {
    /// The seed the environments derive from.
    seed: u64,
    /// The global index of the first environment (`None` on overflow).
    base: Option<u64>,
}

/// The state [`Simic::run_round`] puts back when a round fails (the policy
/// and its optimizer are put back by the update itself).
struct RoundCheckpoint {
    normalisers: NormaliserCheckpoint,
    sampler_rng: PolicyRng,
    rank_rngs: Vec<super::RankRngs>,
}

impl Simic {
    /// Runs one round on `spec`'s environments: `episode_length` steps of
    /// every environment, then (when `learn`) one PPO update. Without
    /// `learn` the policy only acts (its observation normaliser is frozen).
    ///
    /// A round that fails leaves the learning state as it was before the
    /// round: the policy and its optimizer (the update puts them back
    /// itself), the observation, reward and value normalisers, the
    /// sampler's generator and the round counters. (The round's
    /// environments are its own and are dropped; the compiled policy step
    /// and the blueprint warm-up are caches and stay.) Keeping the
    /// observation normaliser costs one readback of its state at the round's
    /// start when it learns.
    ///
    /// While the run's imitation warm-up lasts ([`SimicConfig::imitation`]:
    /// its first `updates` updates), a learning round is an imitation
    /// round: its demonstrator drives every environment, as in
    /// [`Simic::drive_round`], and the update fits the policy to the
    /// demonstrated actions ([`crate::ppo::Objective::Imitation`];
    /// [`RoundReport::imitation`] says how many).
    pub fn run_round(&mut self, spec: &EnvSpec, learn: bool) -> Result<RoundReport> {
        let imitation = self.config.imitation;
        if learn && imitation.imitates_after(self.learner.updates_done()) {
            let mut demonstrators = imitation.demonstrator.controllers(spec, &self.config);
            return self.guarded(
                |simic| simic.run_round_unguarded(spec, true, None, Some(&mut demonstrators)),
                true,
            );
        }
        self.guarded(
            |simic| simic.run_round_unguarded(spec, learn, None, None),
            learn,
        )
    }

    /// Runs one round on this run's next environments with each
    /// environment's actions taken by a scripted controller
    /// (`controllers[i]` drives environment `i`; Tamiyo's growth
    /// controllers, the heuristic) instead of the policy. The policy still
    /// takes its step every epoch, so the round pays and reports what a
    /// policy-driven round does, but nothing learns (no update, the
    /// observation normaliser frozen). What `simic-growth` measures: the
    /// environments where seeds live. A controller's error is carried out
    /// as WAIT and counted in [`RoundReport::refused_decisions`]; a list of
    /// the wrong length is refused before anything runs.
    pub fn drive_round(
        &mut self,
        spec: &EnvSpec,
        controllers: &mut [Box<dyn tolaria::controller::Controller>],
    ) -> Result<RoundReport> {
        if controllers.len() != self.config.n_envs {
            return Err(Error::InvalidInput {
                field: "Simic.drive_round",
                reason: format!(
                    "{} controllers for {} environments",
                    controllers.len(),
                    self.config.n_envs
                ),
            });
        }
        self.guarded(
            |simic| simic.run_round_unguarded(spec, false, None, Some(controllers)),
            false,
        )
    }

    /// Evaluates the policy without learning (its observation normaliser
    /// frozen) on the environments round `env_round` of a run seeded
    /// `env_seed` would build (`env_seed + (env_round·n_envs + env)·stride`,
    /// data shards as in any round), whatever this run's own seed and round
    /// are: so several trained policies, and the baseline controllers
    /// (`simic::bench`), are compared on the same environments. Sampling
    /// follows [`Simic::set_sample_mode`]. It counts as a round (the round
    /// counter advances) and fails as [`Simic::run_round`] does, leaving
    /// the learning state as it was.
    pub fn evaluate_on(
        &mut self,
        spec: &EnvSpec,
        env_seed: u64,
        env_round: u64,
    ) -> Result<RoundReport> {
        let envs = EnvSeeds {
            seed: env_seed,
            base: env_round.checked_mul(self.config.n_envs as u64),
        };
        self.guarded(
            |simic| simic.run_round_unguarded(spec, false, Some(envs), None),
            false,
        )
    }

    /// Runs `round`, putting the learning state back when it fails.
    fn guarded(
        &mut self,
        round: impl FnOnce(&mut Simic) -> Result<RoundReport>,
        learn: bool,
    ) -> Result<RoundReport> {
        let saved = RoundCheckpoint {
            normalisers: self.learner.checkpoint(learn)?,
            sampler_rng: self.actor.rng().clone(),
            rank_rngs: self.rank_rngs.clone(),
        };
        let result = round(self);
        if result.is_err() {
            self.learner.restore(saved.normalisers)?;
            self.actor.restore_rng(saved.sampler_rng);
            self.rank_rngs = saved.rank_rngs;
        }
        result
    }

    /// [`Simic::run_round`] without the checkpoint; `envs` overrides this
    /// run's own environment seeds, `driver` the policy's actions. A driven
    /// round that learns is an imitation round (the driver demonstrates).
    fn run_round_unguarded(
        &mut self,
        spec: &EnvSpec,
        learn: bool,
        envs: Option<EnvSeeds>,
        mut driver: Option<&mut [Box<dyn tolaria::controller::Controller>]>,
    ) -> Result<RoundReport> {
        if let Some(rngs) = &self.restored_rank_rngs {
            return Err(Error::InvalidInput {
                field: "Simic.run_round",
                reason: format!(
                    "the imported checkpoint is of a group of {} ranks: join a group of that \
                     size first (Simic::join)",
                    rngs.len()
                ),
            });
        }
        let round_started = Instant::now();
        self.progress.start(round_started);
        // The group's calls between rounds are not this round's update.
        if let Some(group) = self.learner.group() {
            let _ = group.take_collective_ms();
        }
        let n = self.config.n_envs;
        if spec.n_envs() < n {
            return Err(Error::InvalidConfig {
                field: "EnvSpec.train",
                reason: format!("{} shards for {n} environments", spec.n_envs()),
            });
        }
        let setup = Instant::now();
        if self.config.prewarm_blueprints && self.prewarm.is_none() {
            // Before the environments seed tch's generator: the scratch
            // modules' draws change nothing they draw.
            self.prewarm = Some(prewarm_blueprints(&self.config, spec, self.device)?);
        }
        let own;
        let (config, env_base) = match envs {
            None => (&self.config, self.env_index_base()),
            Some(envs) => {
                own = SimicConfig {
                    seed: envs.seed,
                    ..self.config.clone()
                };
                (&own, envs.base)
            }
        };
        let mut collector = Collector::new(
            config,
            spec,
            env_base,
            self.actor.policy(),
            self.device,
            &self.telemetry,
            setup,
        )?;
        let mut steps = Vec::with_capacity(collector.steps());
        let mut refused_decisions = 0_u64;
        let mut imitation = (learn && driver.is_some()).then(|| super::ImitationFigures {
            demonstrator: self.config.imitation.demonstrator,
            ..super::ImitationFigures::default()
        });
        let mut step_profiles: Vec<super::StepProfile> = Vec::new();
        // Profiling on: the first step of each live-seed count trains and
        // validates apart (the same work, in two phases), and on CUDA each
        // phase is profiled alone.
        let profiling = self.step_profiling;
        let cuda = match self.device {
            Device::Cuda(index) => Some(index),
            _ => None,
        };
        // A PPO round with the anchor: the demonstrator labels the states
        // the policy reaches, beside it.
        let anchor_coef = if learn && imitation.is_none() {
            self.config
                .imitation
                .anchor_coef_after(self.learner.updates_done())
        } else {
            0.0
        };
        let mut anchor = (anchor_coef > 0.0).then(|| {
            (
                self.config.imitation.demonstrator.controllers(spec, config),
                super::ImitationFigures {
                    demonstrator: self.config.imitation.demonstrator,
                    ..super::ImitationFigures::default()
                },
            )
        });
        let mut apart_buckets: Vec<usize> = Vec::new();
        for step in 0..collector.steps() {
            let step_started = Instant::now();
            // The seeds the step trains with: those before its action.
            let live_seeds = collector.live_seeds();
            let bucket = live_seeds.round().clamp(0.0, 3.0) as usize;
            let profiled = profiling && !apart_buckets.contains(&bucket);
            if profiled {
                let graph_work = collector.graph_work();
                // Training, then validation: the fused passes are queued
                // only once the device has finished the training (the
                // profiler keeps only the kernels that completed while it
                // ran).
                let profiler = cuda
                    .map(|_| torch_ext::profile::KernelProfiler::start())
                    .transpose()?;
                collector.train_apart(step)?;
                if let Some(index) = cuda {
                    torch_ext::cuda::synchronize(index)?;
                }
                let training = profiler.map(|p| p.stop()).transpose()?;
                let profiler = cuda
                    .map(|_| torch_ext::profile::KernelProfiler::start())
                    .transpose()?;
                collector.queue_passes(step)?;
                collector.measure(step)?;
                let validation = profiler.map(|p| p.stop()).transpose()?;
                // A step that captured or ran eagerly is not the replayed
                // step the profile is for: the next one of its kind is.
                if collector.graph_work() == graph_work {
                    apart_buckets.push(bucket);
                    if let (Some(training), Some(validation)) = (training, validation) {
                        step_profiles.push(super::StepProfile {
                            live_seeds: bucket,
                            envs: n,
                            training,
                            validation,
                        });
                    }
                }
            } else {
                collector.train(step)?;
                collector.measure(step)?;
            }
            collector.observe()?;
            let mut actions = collector.act(step, &mut self.actor, &mut self.learner, learn)?;
            if let Some((labellers, figures)) = anchor.as_mut() {
                collector.label_anchor(step, labellers, figures)?;
            }
            if let Some(controllers) = driver.as_deref_mut() {
                let refused =
                    collector.drive(step, &mut actions, controllers, imitation.as_mut())?;
                refused_decisions = refused_decisions.saturating_add(refused);
            }
            collector.apply(step, &actions, &mut self.learner, learn)?;
            steps.push(super::StepFigures {
                ms: ms(step_started),
                live_seeds,
            });
        }
        let started = Instant::now();
        collector.bootstrap(&self.actor, &mut self.learner)?;
        // The recurrent state at the episodes' end, before the update reads
        // back anyway (reference §6.3's LSTM health).
        let lstm = collector.lstm_health()?;
        let mut update_wait_ms = 0.0;
        let update = if learn {
            // In a group, the ranks meet first: the wait for the slowest
            // rank's rollout is timed apart from the update's own work.
            if self.learner.group().is_some_and(|g| g.world_size() > 1) {
                let waited = Instant::now();
                self.barrier()?;
                update_wait_ms = ms(waited);
            }
            self.learner
                .learn_observations(&collector.raw_observations()?)?;
            let objective = if imitation.is_some() {
                self.config.imitation.objective()
            } else {
                crate::ppo::Objective::Ppo
            };
            let update = self.update(&collector, objective, anchor_coef)?;
            self.gather_rank_rngs()?;
            Some(update)
        } else {
            None
        };
        let update_ms = ms(started);
        let update_collective_ms = self
            .learner
            .group()
            .map_or(0.0, |group| group.take_collective_ms());
        let mut report = collector.into_report(self.progress.rounds);
        report.steps = steps;
        report.refused_decisions = refused_decisions;
        report.imitation = imitation;
        report.anchor = anchor.map(|(_, figures)| figures);
        step_profiles.sort_by_key(|p| p.live_seeds);
        report.step_profiles = step_profiles;
        report.lstm = Some(lstm);
        if let Some((stats, q_per_op)) = update {
            report.anomalies = self.learner.anomalies(&stats);
            report.q_per_op = q_per_op;
            report.ppo = Some(stats);
        }
        report.timings.update_ms = update_ms;
        report.timings.update_wait_ms = update_wait_ms;
        report.timings.update_collective_ms = update_collective_ms;
        report.timings.total_ms = ms(round_started);
        self.progress.count(report.env_epochs);
        telemetry::emit_round(
            &self.telemetry,
            self.device,
            &report,
            self.eps(),
            &self.learner.anomaly_thresholds(),
        );
        Ok(report)
    }

    /// The learner's update on the round's rollout (with the anchor's
    /// labels at `anchor_coef`); a non-finite update is reported before it
    /// ends the round.
    fn update(
        &mut self,
        collector: &Collector,
        objective: crate::ppo::Objective,
        anchor_coef: f64,
    ) -> Result<(PpoStats, Option<Vec<f64>>)> {
        let result = self.learner.update(
            self.actor.policy(),
            self.actor.sampler(),
            collector.buffer(),
            objective,
            anchor_coef,
        );
        if let Err(Error::NonFinite { what, value }) = &result {
            telemetry::emit_numerical_instability(
                &self.telemetry,
                self.progress.rounds,
                what,
                *value,
            );
        }
        result
    }

    /// The global index of this round's first environment, in units of
    /// environments: `(round·world + rank)·n_envs` (`None` on overflow).
    fn env_index_base(&self) -> Option<u64> {
        let (rank, world) = self.rank_and_world();
        self.progress
            .rounds
            .checked_mul(world as u64)
            .and_then(|k| k.checked_add(rank as u64))
            .and_then(|k| k.checked_mul(self.config.n_envs as u64))
    }
}
