//! The rollout collector of one round: it owns the round's environments
//! (each a small state machine, [`super::env`]), the rollout buffer, the
//! feature batch and the policy's recurrent state, and drives one
//! environment step's phases over all environments, in order:
//!
//! 1. [`Collector::train`]: every live environment's epoch queued before
//!    any is read back (the epochs overlap on the GPU), then each read back
//!    and its fused validation + counterfactual pass queued;
//! 2. [`Collector::measure`]: the passes read back, the governor, the
//!    records;
//! 3. [`Collector::observe`]: observations and masks of every environment;
//! 4. [`Collector::act`]: **one** batched policy step for all environments
//!    and one readback of their actions;
//! 5. [`Collector::apply`]: the actions carried out, the rewards, the
//!    lifecycle ticks, the step's host half of the buffer.
//!
//! After the last step, [`Collector::bootstrap`] gives the truncated
//! episodes their bootstrap values and [`Collector::into_report`] closes
//! the round's episodes into its report.

use std::time::Instant;

use tamiyo::features::FeatureBatch;
use tamiyo::heads::FactoredAction;
use tamiyo::masks::{ActionMasks, MaskTensors};
use tamiyo::policy::{LstmHealth, LstmState, Policy, StepSink};
use tch::{Device, Tensor};

use super::actor::Actor;
use super::env::{Env, EnvSpec, StepRules, env_device};
use super::imitation::{ImitationFigures, imitation_target};
use super::learner::Learner;
use super::measure::ms;
use super::outcome::{ActionDistribution, EpisodeOutcome, RewardHackingSuspicion};
use super::report::POLICY_PARTS;
use super::{RoundReport, RoundTimings, SimicConfig};
use crate::buffer::{BufferShape, Demonstration, HostStep, RolloutBuffer};
use crate::{Error, Result};

/// The round's rollout (see the module docs).
pub(super) struct Collector {
    envs: Vec<Env>,
    /// Every step's raw observations `[n_envs, obs_dim]` of a learning
    /// round: the observation normaliser, frozen during the rollout, learns
    /// from them all just before the update (reference §3.3).
    /// Steps whose raw observations the buffer kept (for the normaliser).
    raw_steps: usize,
    rules: StepRules,
    /// Steps per episode.
    steps: usize,
    /// The policy's device (buffer, features, masks).
    device: Device,
    buffer: RolloutBuffer,
    batch: FeatureBatch,
    /// The current step's masks, one per environment.
    masks: Vec<ActionMasks>,
    /// ADVANCE is out of the action space (`MaskConfig::disable_advance`):
    /// Kasmina advances every gate by itself.
    advance_disabled: bool,
    /// The policy's LSTM state after the last step.
    hidden: LstmState,
    env_seeds: Vec<u64>,
    env_epochs: u64,
    captures: usize,
    eager_steps: usize,
    inference_samples: Vec<f64>,
    replay_samples: Vec<f64>,
    /// Host ms of each part of the policy steps so far (`POLICY_PARTS`).
    policy_parts: [f64; POLICY_PARTS.len()],
    reward_hacking: Vec<RewardHackingSuspicion>,
    timings: RoundTimings,
}

impl Collector {
    /// The round's `config.n_envs` fresh environments on `spec` (the first
    /// with the global index `env_base`, `None` when it overflows: each
    /// seeded `seed + (env_base + env)·env_seed_stride`), an empty buffer
    /// and a zero LSTM state for `policy` on `device`. The setup time is
    /// counted from `setup`.
    pub(super) fn new(
        config: &SimicConfig,
        spec: &EnvSpec,
        env_base: Option<u64>,
        policy: &Policy,
        device: Device,
        telemetry: &leyline::Telemetry,
        setup: Instant,
    ) -> Result<Collector> {
        let n = config.n_envs;
        let steps = usize::try_from(config.episode_length).unwrap_or(usize::MAX);
        let mut envs = Vec::with_capacity(n);
        let mut env_seeds = Vec::with_capacity(n);
        for index in 0..n {
            let offset = env_base
                .and_then(|base| base.checked_add(index as u64))
                .and_then(|k| k.checked_mul(config.env_seed_stride))
                .ok_or_else(|| Error::InvalidConfig {
                    field: "SimicConfig.env_seed_stride",
                    reason: "environment seeds overflow u64".to_owned(),
                })?;
            let env_seed = config.seed.wrapping_add(offset);
            env_seeds.push(env_seed);
            envs.push(Env::new(
                spec,
                (index, env_seed),
                env_device(config, index, device),
                config,
                telemetry,
            )?);
        }
        let num_slots = envs.first().map_or(0, Env::num_slots);
        let network = policy.network().config();
        if num_slots != network.num_slots {
            return Err(Error::InvalidConfig {
                field: "EnvSpec.slots",
                reason: format!(
                    "{num_slots} slots for a policy built for {} (Simic::new's num_slots)",
                    network.num_slots
                ),
            });
        }
        let buffer = RolloutBuffer::new(
            BufferShape {
                n_envs: n,
                max_steps: steps,
                obs_dim: network.obs_dim(),
                num_slots,
            },
            device,
        )?;
        let batch = FeatureBatch::new(n, num_slots, device)?;
        let hidden = policy.network().initial_state(n)?;
        Ok(Collector {
            envs,
            raw_steps: 0,
            rules: StepRules::of(config),
            steps,
            device,
            buffer,
            batch,
            masks: Vec::with_capacity(n),
            advance_disabled: config.masks.disable_advance,
            hidden,
            env_seeds,
            env_epochs: 0,
            captures: 0,
            eager_steps: 0,
            inference_samples: Vec::with_capacity(steps),
            replay_samples: Vec::with_capacity(steps),
            policy_parts: [0.0; POLICY_PARTS.len()],
            reward_hacking: Vec::new(),
            timings: RoundTimings {
                setup_ms: ms(setup),
                ..RoundTimings::default()
            },
        })
    }

    /// Steps per episode.
    pub(super) fn steps(&self) -> usize {
        self.steps
    }

    /// The rollout so far.
    pub(super) fn buffer(&self) -> &RolloutBuffer {
        &self.buffer
    }

    /// The round's raw observations as one `[steps · n_envs, obs_dim]`
    /// tensor, step after step (none when the round does not learn or
    /// observations are not normalised): kept by the buffer, inside each
    /// step's graph.
    pub(super) fn raw_observations(&self) -> Result<Vec<Tensor>> {
        Ok(self
            .buffer
            .raw_observations(self.raw_steps)?
            .into_iter()
            .filter(|_| self.raw_steps > 0)
            .collect())
    }

    /// Phase 1 of `step`: every live environment's epoch queued before any
    /// readback ([`Env::launch`]); then, as each is read back, its fused
    /// validation + counterfactual pass queued on its stream while the
    /// others still train ([`Env::finish_training`]).
    pub(super) fn train(&mut self, step: usize) -> Result<()> {
        self.train_queueing(step, true)
    }

    /// [`Collector::train`] without queueing the fused passes: the profiled
    /// step trains, lets the device finish, and then queues them with
    /// [`Collector::queue_passes`], so that each phase is profiled alone.
    pub(super) fn train_apart(&mut self, step: usize) -> Result<()> {
        self.train_queueing(step, false)
    }

    /// The fused passes of the epochs [`Collector::train_apart`] read back,
    /// queued ([`Env::queue_pass`]).
    pub(super) fn queue_passes(&mut self, step: usize) -> Result<()> {
        let started = Instant::now();
        for env in &mut self.envs {
            env.queue_pass(step, &self.rules)?;
        }
        self.timings.train_ms += ms(started);
        Ok(())
    }

    fn train_queueing(&mut self, step: usize, queue_passes: bool) -> Result<()> {
        let started = Instant::now();
        for env in &mut self.envs {
            env.launch()?;
        }
        self.timings.launch_ms += ms(started);
        for env in &mut self.envs {
            if let Some(trained) = env.finish_training(step, &self.rules, queue_passes)? {
                self.captures = self.captures.saturating_add(trained.captures);
                self.eager_steps = self.eager_steps.saturating_add(trained.eager_steps);
                self.timings.capture_ms += trained.capture_ms;
                self.env_epochs = self.env_epochs.saturating_add(1);
            }
        }
        self.timings.train_ms += ms(started);
        Ok(())
    }

    /// Phase 2 of `step`: the fused passes read back, the governor, the
    /// accuracies and contributions recorded ([`Env::judge`]).
    pub(super) fn measure(&mut self, step: usize) -> Result<()> {
        let started = Instant::now();
        for env in &mut self.envs {
            env.judge(step, &mut self.buffer, &self.rules)?;
        }
        self.timings.counterfactual_ms += ms(started);
        Ok(())
    }

    /// Phase 3: every environment's observation into the feature batch and
    /// its masks ([`Env::observe`]).
    pub(super) fn observe(&mut self) -> Result<()> {
        let started = Instant::now();
        self.observe_all()?;
        self.timings.observe_ms += ms(started);
        Ok(())
    }

    fn observe_all(&mut self) -> Result<()> {
        self.masks.clear();
        for env in &mut self.envs {
            let (raw, masks) = env.observe(&self.rules)?;
            self.batch.set(env.index(), &raw)?;
            self.masks.push(masks);
        }
        Ok(())
    }

    /// Phase 4 of `step`: the batched policy step for every environment
    /// (its host inputs uploaded in one copy, [`Actor::stage`]; the
    /// observations normalised by `learner` with its statistics frozen for
    /// the rollout, as the reference does; when `learn` the raw rows are kept
    /// for the normaliser's update before the PPO update), its outputs into
    /// the buffer on the device, and the one readback of the actions.
    pub(super) fn act(
        &mut self,
        step: usize,
        actor: &mut Actor,
        learner: &mut Learner,
        learn: bool,
    ) -> Result<Vec<FactoredAction>> {
        let started = Instant::now();
        let mut part = started;
        let mut lap = |index: usize, parts: &mut [f64; POLICY_PARTS.len()]| {
            let now = Instant::now();
            if let Some(total) = parts.get_mut(index) {
                *total += now.duration_since(part).as_secs_f64() * 1e3;
            }
            part = now;
        };
        // The column the step writes, checked on the host first.
        self.buffer.check_step(step)?;
        // One upload of the step's host inputs, straight into the buffers
        // the captured step reads.
        actor.stage(
            self.batch.host_obs(),
            self.batch.host_blueprints(),
            &self.masks,
            step,
        )?;
        lap(0, &mut self.policy_parts);
        if learn && learner.normalises_observations() {
            // The step keeps its raw observations in the buffer, inside
            // its graph: what the normaliser learns from after the rollout.
            self.buffer.keep_raw_observations()?;
            self.raw_steps = step.saturating_add(1).max(self.raw_steps);
        }
        lap(1, &mut self.policy_parts);
        // Normalisation, the step and the buffer's writes: one replay.
        let act = actor.act_staged(
            learner.obs_normaliser(),
            &self.hidden,
            Some(&self.buffer as &dyn StepSink),
        )?;
        lap(2, &mut self.policy_parts);
        self.buffer.mark_recorded(step)?;
        self.hidden = act.hidden;
        lap(3, &mut self.policy_parts);
        let num_slots = self.envs.first().map_or(0, Env::num_slots);
        let actions = actor.read_actions(&act.sample, num_slots)?;
        lap(4, &mut self.policy_parts);
        if let Some(replay) = actor.take_replay_ms() {
            self.replay_samples.push(replay);
        }
        let inference = ms(started);
        self.inference_samples.push(inference);
        self.timings.policy_ms += inference;
        Ok(actions)
    }

    /// Phase 5 of `step`: each environment carries its action out, its
    /// epoch concludes and its reward is computed and normalised by
    /// `learner` (which learns from it when `learn`) ([`Env::apply`]); the
    /// step's host half goes into the buffer.
    pub(super) fn apply(
        &mut self,
        step: usize,
        actions: &[FactoredAction],
        learner: &mut Learner,
        learn: bool,
    ) -> Result<()> {
        let started = Instant::now();
        let n = self.envs.len();
        let mut host = HostStep {
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
            forced: self.envs.iter().map(Env::forced).collect(),
            valid: vec![false; n],
        };
        for (i, env) in self.envs.iter_mut().enumerate() {
            let Some(action) = actions.get(i) else {
                continue;
            };
            let normalise = |reward| learner.normalise_reward(reward, learn);
            let Some(transition) = env.apply(step, action, &self.rules, normalise)? else {
                continue;
            };
            self.reward_hacking.extend(transition.suspicions);
            if let Some(value) = host.rewards.get_mut(i) {
                *value = transition.reward as f32;
            }
            if let Some(value) = host.valid.get_mut(i) {
                *value = true;
            }
            if let Some(value) = host.truncated.get_mut(i) {
                *value = transition.truncated;
            }
        }
        self.buffer.record_host(step, &host)?;
        self.timings.boundary_ms += ms(started);
        Ok(())
    }

    /// After the last step: the bootstrap values of the truncated episodes,
    /// the critic on the final observations (normalised by `learner`
    /// without learning).
    pub(super) fn bootstrap(&mut self, actor: &Actor, learner: &mut Learner) -> Result<()> {
        self.observe_all()?;
        self.batch.upload()?;
        let obs = learner.normalise_observations(self.batch.obs(), false)?;
        let masks = MaskTensors::from_masks(&self.masks, self.device)?;
        let bootstrap = actor.values(&obs, self.batch.blueprint_indices(), &self.hidden, &masks)?;
        if let Some(last) = self.steps.checked_sub(1) {
            self.buffer.set_bootstrap(last, &bootstrap)?;
        }
        Ok(())
    }

    /// The recurrent state at the episodes' end (reference §6.3's LSTM
    /// health; one readback).
    pub(super) fn lstm_health(&self) -> Result<LstmHealth> {
        Ok(self.hidden.health()?)
    }

    /// Closes every environment's episode into the round's report (round
    /// `round`): outcomes, their action distribution, the figures of the
    /// episodes and of the policy steps. The update's figures, the LSTM
    /// health and the last timings are the round's to fill in.
    pub(super) fn into_report(self, round: u64) -> RoundReport {
        let envs_f = self.envs.len() as f64;
        let steps_f = self.steps.max(1) as f64;
        let mean_episode_reward = self.envs.iter().map(Env::episode_reward).sum::<f64>() / envs_f;
        let final_accuracies = self.envs.iter().map(Env::val_accuracy).collect();
        let seed_steps: u64 = self.envs.iter().map(Env::active_seed_steps).sum();
        let counterfactual_configs = self
            .envs
            .iter()
            .map(Env::counterfactual_configs)
            .fold(0_u64, u64::saturating_add);
        let rollbacks = self.envs.iter().filter(|env| env.done()).count();
        let (outcomes, shapley): (Vec<_>, Vec<_>) =
            self.envs.into_iter().map(Env::into_outcome).unzip();
        let actions = ActionDistribution::of(&outcomes);
        let sum = |count: fn(&EpisodeOutcome) -> u64| {
            outcomes.iter().map(count).fold(0_u64, u64::saturating_add)
        };
        let germinations = sum(|outcome| {
            outcome
                .germinated
                .values()
                .fold(0_u64, |total, &count| total.saturating_add(count))
        });
        let fossilizations = sum(|outcome| outcome.fossilizations);
        let prunes = sum(|outcome| outcome.prunes);
        let inference_total: f64 = self.inference_samples.iter().sum();
        RoundReport {
            round,
            env_seeds: self.env_seeds,
            env_epochs: self.env_epochs,
            mean_episode_reward,
            final_accuracies,
            mean_active_seeds: seed_steps as f64 / (envs_f * steps_f),
            rollbacks,
            germinations,
            fossilizations,
            prunes,
            inference_ms: inference_total / steps_f,
            inference_samples: self.inference_samples,
            replay_samples: self.replay_samples,
            policy_parts_ms: self.policy_parts.map(|total| total / steps_f),
            ppo: None,
            shapley,
            outcomes,
            actions,
            lstm: None,
            anomalies: Vec::new(),
            reward_hacking: self.reward_hacking,
            q_per_op: None,
            captures: self.captures,
            eager_steps: self.eager_steps,
            timings: self.timings,
            steps: Vec::new(),
            counterfactual_configs,
            refused_decisions: 0,
            imitation: None,
            anchor: None,
            step_profiles: Vec::new(),
        }
    }

    /// Graphs captured and eager steps run so far, all environments.
    pub(super) fn graph_work(&self) -> (usize, usize) {
        (self.captures, self.eager_steps)
    }

    /// Live seeds per environment now, averaged over the round's
    /// environments.
    pub(super) fn live_seeds(&self) -> f64 {
        let total: usize = self
            .envs
            .iter()
            .map(|env| env.trainer.model().active_seed_count())
            .sum();
        total as f64 / self.envs.len().max(1) as f64
    }

    /// Replaces each environment's action at `step` with the one its
    /// scripted controller takes (`controllers[i]` drives environment `i`);
    /// returns how many decisions a controller refused (carried out as
    /// WAIT). Without `imitation` the policy's own outputs stay in the
    /// buffer (a driven round that does not learn); with it (an imitation
    /// round) the buffer takes the demonstrated actions the policy's masks
    /// allow in place of the policy's samples, and `imitation` counts them
    /// and the others.
    pub(super) fn drive(
        &mut self,
        step: usize,
        actions: &mut [FactoredAction],
        controllers: &mut [Box<dyn tolaria::controller::Controller>],
        imitation: Option<&mut ImitationFigures>,
    ) -> Result<u64> {
        let mut refused = 0_u64;
        // The controller's action per environment (`None`: the environment
        // waited for none, its episode had ended).
        let mut demonstrated: Vec<Option<FactoredAction>> = vec![None; actions.len()];
        for (((env, action), controller), shown) in self
            .envs
            .iter()
            .zip(actions.iter_mut())
            .zip(controllers.iter_mut())
            .zip(demonstrated.iter_mut())
        {
            if let Some((scripted, was_refused)) = env.scripted_action(controller.as_mut())? {
                *action = scripted;
                refused = refused.saturating_add(u64::from(was_refused));
                *shown = Some(scripted);
            }
        }
        if let Some(figures) = imitation {
            // What the update imitates: the demonstrated actions the
            // policy's own masks allow.
            let rows = self.imitation_rows(&demonstrated, figures);
            self.buffer.record_demonstration(step, &rows)?;
        }
        Ok(refused)
    }

    /// Records, as the anchor's labels at `step`, what `controllers` (the
    /// demonstrator, `controllers[i]` for environment `i`) would do in the
    /// state each environment is in; the policy's actions stay what they
    /// are ([`crate::buffer::RolloutBuffer::record_anchor`]). The labels
    /// the policy's masks allow count as imitated in `figures`, the others
    /// (and a controller's refusal) as not imitable.
    pub(super) fn label_anchor(
        &mut self,
        step: usize,
        controllers: &mut [Box<dyn tolaria::controller::Controller>],
        figures: &mut ImitationFigures,
    ) -> Result<()> {
        let mut labelled: Vec<Option<FactoredAction>> = vec![None; self.envs.len()];
        for ((env, controller), label) in self
            .envs
            .iter()
            .zip(controllers.iter_mut())
            .zip(labelled.iter_mut())
        {
            match env.scripted_action(controller.as_mut())? {
                Some((_, true)) => {
                    figures.not_imitable = figures.not_imitable.saturating_add(1);
                }
                Some((action, false)) => *label = Some(action),
                None => {}
            }
        }
        let rows = self.imitation_rows(&labelled, figures);
        self.buffer.record_anchor(step, &rows)
    }

    /// What the policy can be taught of each environment's `demonstrated`
    /// action (see [`imitation_target`]), counted in `figures`.
    fn imitation_rows(
        &self,
        demonstrated: &[Option<FactoredAction>],
        figures: &mut ImitationFigures,
    ) -> Vec<Option<Demonstration>> {
        demonstrated
            .iter()
            .zip(&self.masks)
            .map(|(shown, masks)| {
                shown.map(
                    |action| match imitation_target(&action, masks, self.advance_disabled) {
                        Some(target) => {
                            figures.imitated = figures.imitated.saturating_add(1);
                            if target.op != action.op {
                                figures.advances_as_wait =
                                    figures.advances_as_wait.saturating_add(1);
                            }
                            Demonstration::Imitate(target.indices())
                        }
                        None => {
                            figures.not_imitable = figures.not_imitable.saturating_add(1);
                            Demonstration::Skip
                        }
                    },
                )
            })
            .collect()
    }
}
