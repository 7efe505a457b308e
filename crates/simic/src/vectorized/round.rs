//! One round of vectorized PPO (the steps are listed in the parent module's
//! docs): [`Simic::run_round`].

use std::time::Instant;

use leyline::LifecycleOp;
use tamiyo::features::{FeatureBatch, slot_extras};
use tamiyo::heads::OP;
use tamiyo::masks::{ActionMasks, MaskTensors, action_masks};
use tamiyo::normaliser::RunningMeanStd;
use tamiyo::policy::LstmState;
use tch::Tensor;
use tolaria::controller::{Applied, EpochMetrics, EpochObservation};
use tolaria::engine::trainer::TrainedEpoch;

use super::env::{Env, EnvSpec};
use super::measure::{Launched, Measured, launch_measure, ms, read_measure};
use super::outcome::{ActionDistribution, EpisodeOutcome, RewardHackingSuspicion};
use super::{RoundReport, RoundTimings, Simic};
use crate::buffer::{BufferShape, HostStep, RolloutBuffer};
use crate::rewards::{RewardInputs, compute_reward};
use crate::{Error, Result};

/// The state [`Simic::run_round`] puts back when a round fails (the policy
/// and its optimizer are put back by the update itself).
struct RoundCheckpoint {
    /// The observation normaliser's state, when it learns this round.
    obs_normaliser: Option<tamiyo::normaliser::NormaliserState>,
    value_normaliser: crate::ppo::ValueNormaliser,
    reward_normaliser: crate::rewards::RewardNormaliser,
    sampler_rng: tamiyo::policy::PolicyRng,
}

/// Finite epoch figures for an observation (a diverged epoch's NaN loss
/// becomes the last finite one).
fn metrics_of(train: Option<&TrainedEpoch>, last: EpochMetrics) -> EpochMetrics {
    let Some(trained) = train else { return last };
    let pick = |value: f64, fallback: f64| if value.is_finite() { value } else { fallback };
    let validation = trained.validation;
    EpochMetrics {
        train_loss: pick(trained.train.loss, last.train_loss),
        train_accuracy: pick(trained.train.accuracy, last.train_accuracy).clamp(0.0, 100.0),
        val_loss: pick(validation.map_or(f64::NAN, |v| v.loss), last.val_loss),
        val_accuracy: pick(
            validation.map_or(f64::NAN, |v| v.accuracy),
            last.val_accuracy,
        )
        .clamp(0.0, 100.0),
    }
}

/// The observation row and masks of `env` now.
fn observe(
    env: &mut Env,
    epoch: u32,
    metrics: EpochMetrics,
    simic: &Simic,
) -> Result<(tamiyo::features::RawObservation, ActionMasks)> {
    let model = env.trainer.model();
    let observation = EpochObservation::from_model(model, epoch, metrics)?;
    let extras = slot_extras(model);
    let availability = model.op_availability(simic.config.max_seeds);
    let masks = action_masks(&observation, &availability, &simic.mask_config())?;
    let raw = env.tracker.observe(&observation, &extras)?;
    Ok((raw, masks))
}

impl Simic {
    fn mask_config(&self) -> tamiyo::masks::MaskConfig {
        tamiyo::masks::MaskConfig {
            max_seeds: self.config.max_seeds,
            ..self.config.masks
        }
    }

    /// The policy's input for every environment: normalised observations
    /// (the normaliser learns from every batch when `learn`), blueprint
    /// indices and the base masks on the device.
    fn policy_input(
        &mut self,
        batch: &mut FeatureBatch,
        masks: &[ActionMasks],
        learn: bool,
    ) -> Result<(Tensor, MaskTensors)> {
        batch.upload()?;
        let obs = match self.obs_normaliser.as_mut() {
            Some(normaliser) => {
                if learn {
                    normaliser.update(batch.obs())?;
                }
                normaliser.normalize(batch.obs())?
            }
            None => batch.obs().shallow_clone(),
        };
        Ok((obs, MaskTensors::from_masks(masks, self.device)?))
    }

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
    pub fn run_round(&mut self, spec: &EnvSpec, learn: bool) -> Result<RoundReport> {
        let saved = self.round_checkpoint(learn)?;
        let result = self.run_round_unguarded(spec, learn);
        if result.is_err() {
            self.restore_round_checkpoint(saved)?;
        }
        result
    }

    /// What a round changes besides the policy and its optimizer (see
    /// [`Simic::run_round`]).
    fn round_checkpoint(&self, learn: bool) -> Result<RoundCheckpoint> {
        let obs_normaliser = match (&self.obs_normaliser, learn) {
            (Some(normaliser), true) => Some(normaliser.state()?),
            _ => None,
        };
        Ok(RoundCheckpoint {
            obs_normaliser,
            value_normaliser: self.value_normaliser.shallow_copy(),
            reward_normaliser: self.reward_normaliser.clone(),
            sampler_rng: self.sampler.rng().clone(),
        })
    }

    /// Puts back what [`Simic::round_checkpoint`] kept.
    fn restore_round_checkpoint(&mut self, saved: RoundCheckpoint) -> Result<()> {
        if let Some(state) = &saved.obs_normaliser {
            self.obs_normaliser = Some(RunningMeanStd::from_state(state, self.device)?);
        }
        self.value_normaliser = saved.value_normaliser;
        self.reward_normaliser = saved.reward_normaliser;
        self.sampler.set_rng(saved.sampler_rng);
        Ok(())
    }

    /// [`Simic::run_round`] without the checkpoint.
    fn run_round_unguarded(&mut self, spec: &EnvSpec, learn: bool) -> Result<RoundReport> {
        let round_started = Instant::now();
        if self.started.is_none() {
            self.started = Some(round_started);
        }
        let n = self.config.n_envs;
        if spec.n_envs() < n {
            return Err(Error::InvalidConfig {
                field: "EnvSpec.train",
                reason: format!("{} shards for {n} environments", spec.n_envs()),
            });
        }
        let steps = usize::try_from(self.config.episode_length).unwrap_or(usize::MAX);
        let mut timings = RoundTimings::default();
        let setup = Instant::now();
        if self.config.prewarm_blueprints && self.prewarm.is_none() {
            // Before the environments seed tch's generator: the scratch
            // modules' draws change nothing they draw.
            self.prewarm = Some(self.prewarm_blueprints(spec)?);
        }
        let mut envs = Vec::with_capacity(n);
        let mut env_seeds = Vec::with_capacity(n);
        let env_base = self.env_index_base();
        for index in 0..n {
            let offset = env_base
                .and_then(|base| base.checked_add(index as u64))
                .and_then(|k| k.checked_mul(self.config.env_seed_stride))
                .ok_or_else(|| Error::InvalidConfig {
                    field: "SimicConfig.env_seed_stride",
                    reason: "environment seeds overflow u64".to_owned(),
                })?;
            let env_seed = self.config.seed.wrapping_add(offset);
            env_seeds.push(env_seed);
            envs.push(Env::new(
                spec,
                index,
                env_seed,
                self.env_device(index),
                &self.config.trainer,
                self.config.episode_length,
                &self.telemetry,
            )?);
        }
        let num_slots = envs.first().map_or(0, |env| env.slots.len());
        let network_slots = self.policy.network().config().num_slots;
        if num_slots != network_slots {
            return Err(Error::InvalidConfig {
                field: "EnvSpec.slots",
                reason: format!(
                    "{num_slots} slots for a policy built for {network_slots} (Simic::new's num_slots)"
                ),
            });
        }
        let obs_dim = self.policy.network().config().obs_dim();
        let mut buffer = RolloutBuffer::new(
            BufferShape {
                n_envs: n,
                max_steps: steps,
                obs_dim,
                num_slots,
            },
            self.device,
        )?;
        let mut batch = FeatureBatch::new(n, num_slots, self.device)?;
        let mut hidden: LstmState = self.policy.network().initial_state(n)?;
        let mut last_metrics = vec![
            EpochMetrics {
                train_loss: 0.0,
                train_accuracy: 0.0,
                val_loss: 0.0,
                val_accuracy: 0.0,
            };
            n
        ];
        timings.setup_ms = ms(setup);

        let mut report = RoundReport {
            round: self.rounds,
            env_seeds,
            env_epochs: 0,
            mean_episode_reward: 0.0,
            final_accuracies: Vec::new(),
            mean_active_seeds: 0.0,
            rollbacks: 0,
            germinations: 0,
            fossilizations: 0,
            prunes: 0,
            inference_ms: 0.0,
            inference_samples: Vec::with_capacity(steps),
            replay_samples: Vec::with_capacity(steps),
            ppo: None,
            shapley: vec![Vec::new(); n],
            outcomes: (0..n).map(EpisodeOutcome::new).collect(),
            actions: ActionDistribution::default(),
            lstm: None,
            anomalies: Vec::new(),
            reward_hacking: Vec::new(),
            q_per_op: None,
            captures: 0,
            eager_steps: 0,
            timings,
        };
        let mut inference_total = 0.0;
        for step in 0..steps {
            // 1. Every live environment's epoch, queued before any readback.
            let started = Instant::now();
            let live: Vec<usize> = (0..n)
                .filter(|&i| envs.get(i).is_some_and(|env| !env.done))
                .collect();
            for &i in &live {
                if let Some(env) = envs.get_mut(i) {
                    env.trainer.launch_epoch()?;
                }
            }
            report.timings.launch_ms += ms(started);
            // 2. Each environment's fused validation + counterfactual pass is
            // queued on its stream as soon as its epoch is read back, while
            // the others still train.
            let mut trained: Vec<Option<TrainedEpoch>> = (0..n).map(|_| None).collect();
            let mut launched: Vec<Option<Launched>> = (0..n).map(|_| None).collect();
            for &i in &live {
                if let (Some(env), Some(slot), Some(pass)) =
                    (envs.get_mut(i), trained.get_mut(i), launched.get_mut(i))
                {
                    let epoch = env.trainer.finish_training()?;
                    report.captures = report.captures.saturating_add(epoch.train.captures);
                    report.eager_steps = report.eager_steps.saturating_add(epoch.train.eager_steps);
                    report.timings.capture_ms += epoch.train.capture_ms.unwrap_or(0.0);
                    *slot = Some(epoch);
                    // Shapley values at the episode's last epoch.
                    let shapley = self
                        .config
                        .shapley
                        .filter(|_| step.saturating_add(1) == steps)
                        .map(|config| crate::counterfactual::ShapleyConfig {
                            seed: config.seed ^ env.seed,
                            ..config
                        });
                    *pass = Some(launch_measure(env, &self.config.fused, shapley.as_ref())?);
                }
            }
            report.env_epochs = report.env_epochs.saturating_add(live.len() as u64);
            report.timings.train_ms += ms(started);

            // 3. The passes read back; the governor.
            let started = Instant::now();
            let mut measured: Vec<Option<Measured>> = (0..n).map(|_| None).collect();
            for &i in &live {
                let (Some(env), Some(slot)) = (envs.get_mut(i), trained.get_mut(i)) else {
                    continue;
                };
                let Some(epoch) = slot.as_mut() else { continue };
                let Some(pass) = launched.get_mut(i).and_then(Option::take) else {
                    continue;
                };
                let result = read_measure(env, pass)?;
                env.trainer.judge(epoch)?;
                if epoch.rolled_back() {
                    epoch.validation = Some(result.validation);
                    self.end_by_rollback(env, i, &mut buffer)?;
                    report.rollbacks = report.rollbacks.saturating_add(1);
                    if let Some(epoch) = slot.take() {
                        env.trainer.conclude_epoch(epoch, None)?;
                    }
                    continue;
                }
                env.trainer
                    .record_validation(epoch, Some(result.validation))?;
                let contributions: Vec<_> = result
                    .report
                    .slots
                    .iter()
                    .filter_map(|&slot| result.report.contribution(slot).map(|c| (slot, c)))
                    .collect();
                env.trainer.set_contributions(&contributions)?;
                if let (Some(values), Some(entry)) =
                    (result.report.shapley.as_ref(), report.shapley.get_mut(i))
                {
                    *entry = result
                        .report
                        .slots
                        .iter()
                        .copied()
                        .zip(values.iter().copied())
                        .collect();
                }
                // The contribution predictor's targets, in the policy's slot
                // order.
                let targets: Vec<Option<f64>> = env
                    .slots
                    .iter()
                    .map(|&slot| result.report.contribution(slot))
                    .collect();
                buffer.record_contributions(step, i, &targets)?;
                env.val_accuracy = result.validation.accuracy;
                if let Some(entry) = measured.get_mut(i) {
                    *entry = Some(result);
                }
            }
            report.timings.counterfactual_ms += ms(started);

            // 4. Observations, masks, one batched forward, one readback.
            let started = Instant::now();
            let mut masks = Vec::with_capacity(n);
            let mut forced = vec![false; n];
            for (i, env) in envs.iter_mut().enumerate() {
                let last = last_metrics
                    .get(i)
                    .copied()
                    .ok_or_else(|| Error::Buffer(format!("no metrics slot for environment {i}")))?;
                let metrics = metrics_of(trained.get(i).and_then(Option::as_ref), last);
                if let Some(entry) = last_metrics.get_mut(i) {
                    *entry = metrics;
                }
                let epoch = u32::try_from(env.trainer.epoch()).unwrap_or(u32::MAX);
                let (raw, mask) = observe(env, epoch, metrics, self)?;
                batch.set(i, &raw)?;
                if let Some(flag) = forced.get_mut(i) {
                    *flag = mask.head(OP).iter().filter(|&&allowed| allowed).count() <= 1;
                }
                masks.push(mask);
            }
            report.timings.observe_ms += ms(started);
            let started = Instant::now();
            let (obs, mask_tensors) = self.policy_input(&mut batch, &masks, learn)?;
            if self.config.graph_policy && self.graphed.is_none() {
                self.graphed = Some(tamiyo::policy::GraphedAct::new(
                    &self.policy,
                    &self.sampler,
                    n,
                )?);
            }
            // The graphed step falls back to the eager one by itself (CPU,
            // failed capture); without it, the eager step.
            let act = match self.graphed.as_mut() {
                Some(graphed) => graphed.act(
                    &self.policy,
                    &mut self.sampler,
                    &obs,
                    batch.blueprint_indices(),
                    &hidden,
                    &mask_tensors,
                )?,
                None => self.policy.act(
                    &obs,
                    batch.blueprint_indices(),
                    &hidden,
                    &mask_tensors,
                    &mut self.sampler,
                )?,
            };
            buffer.record_policy(
                step,
                &obs,
                batch.blueprint_indices(),
                &act.value,
                &act.sample,
                &mask_tensors,
            )?;
            hidden = act.hidden;
            let actions = act.sample.to_host(num_slots)?;
            if let Some(replay) = self.graphed.as_mut().and_then(|g| g.take_replay_ms()) {
                report.replay_samples.push(replay);
            }
            let inference = ms(started);
            inference_total += inference;
            report.inference_samples.push(inference);
            report.timings.policy_ms += inference;

            // 5. Actions carried out, rewards, the lifecycle tick.
            let started = Instant::now();
            let mut host = HostStep {
                rewards: vec![0.0; n],
                terminated: vec![false; n],
                truncated: vec![false; n],
                forced,
                valid: vec![false; n],
            };
            let terminal = step.saturating_add(1) == steps;
            for (i, env) in envs.iter_mut().enumerate() {
                let Some(epoch) = trained.get_mut(i).and_then(Option::take) else {
                    continue;
                };
                let (Some(action), Some(measured)) = (actions.get(i), measured.get(i)) else {
                    continue;
                };
                let measured = measured.as_ref().ok_or_else(|| {
                    Error::Buffer(format!("environment {i} was not measured this step"))
                })?;
                let decision = tamiyo::controller::to_decision(action, &env.slots, 1.0)?;
                let target = env.slots.get(action.slot).copied().ok_or_else(|| {
                    Error::Buffer(format!("slot index {} out of range", action.slot))
                })?;
                let seed_before = env.seed_facts(target, Some(&measured.report));
                let outcome = report.outcomes.get_mut(i).ok_or_else(|| {
                    Error::Buffer(format!("no outcome record for environment {i}"))
                })?;
                let mut germinated = None;
                let (op, succeeded) = match env.trainer.apply_decision(&decision) {
                    Ok(Applied::Waited) => (LifecycleOp::Wait, true),
                    Ok(Applied::Germinated { slot, blueprint }) => {
                        env.note_germination(slot);
                        report.germinations = report.germinations.saturating_add(1);
                        germinated = Some(blueprint);
                        (LifecycleOp::Germinate, true)
                    }
                    Ok(Applied::GateEvaluated { op, passed, .. }) => {
                        if op == LifecycleOp::Fossilize && passed {
                            report.fossilizations = report.fossilizations.saturating_add(1);
                            outcome.fossilizations = outcome.fossilizations.saturating_add(1);
                        }
                        (op, passed)
                    }
                    Ok(Applied::Pruned { pruned, .. }) => {
                        if pruned {
                            report.prunes = report.prunes.saturating_add(1);
                            outcome.prunes = outcome.prunes.saturating_add(1);
                        }
                        (LifecycleOp::Prune, pruned)
                    }
                    // Refused by Kasmina: executed (and rewarded) as WAIT.
                    Err(_) => (LifecycleOp::Wait, false),
                };
                outcome.record_step(
                    action.op,
                    op,
                    germinated,
                    host.forced.get(i).copied().unwrap_or(false),
                );
                env.tracker.record_action(op, succeeded);
                let val_acc = measured.validation.accuracy;
                let _ = env.trainer.conclude_epoch(epoch, None)?;
                let (occupied, fossils, fossil_params) = env.occupancy();
                let host_params = env.host_params();
                let inputs = RewardInputs {
                    op,
                    op_succeeded: succeeded,
                    seed: seed_before,
                    seed_after: env.stage_point(target),
                    val_acc: val_acc.clamp(0.0, 100.0),
                    clean_total: measured.report.reward.total,
                    solo_off_accuracies: Vec::new(),
                    host_params,
                    slots: env.slot_facts(),
                    occupied_slots: occupied,
                    fossil_count: fossils,
                    committed_val_acc: measured.committed,
                    fossil_params,
                    auto_prunes: 0,
                    epoch: u32::try_from(step.saturating_add(1)).unwrap_or(u32::MAX),
                    max_epochs: self.config.episode_length,
                    terminal,
                };
                let breakdown = compute_reward(&self.config.reward, &inputs)?;
                report.reward_hacking.extend(RewardHackingSuspicion::of(
                    i,
                    step,
                    target,
                    inputs.seed.as_ref().and_then(|seed| seed.contribution),
                    &breakdown,
                ));
                let reward = breakdown.total;
                let normalised = if learn {
                    self.reward_normaliser.update_and_normalise(reward)?
                } else {
                    self.reward_normaliser.normalise(reward)?
                };
                env.episode_reward += reward;
                env.last_step = Some(step);
                env.active_seed_steps = env
                    .active_seed_steps
                    .saturating_add(env.trainer.model().active_seed_count() as u64);
                if let Some(value) = host.rewards.get_mut(i) {
                    *value = normalised as f32;
                }
                if let Some(value) = host.valid.get_mut(i) {
                    *value = true;
                }
                if let Some(value) = host.truncated.get_mut(i) {
                    *value = terminal;
                }
            }
            buffer.record_host(step, &host)?;
            report.timings.boundary_ms += ms(started);
        }

        // Bootstrap values for the truncated episodes: the critic on the
        // final observations.
        let started = Instant::now();
        let mut masks = Vec::with_capacity(n);
        for (i, env) in envs.iter_mut().enumerate() {
            let metrics = last_metrics
                .get(i)
                .copied()
                .ok_or_else(|| Error::Buffer(format!("no metrics slot for environment {i}")))?;
            let epoch = u32::try_from(env.trainer.epoch()).unwrap_or(u32::MAX);
            let (raw, mask) = observe(env, epoch, metrics, self)?;
            batch.set(i, &raw)?;
            masks.push(mask);
        }
        let (obs, mask_tensors) = self.policy_input(&mut batch, &masks, false)?;
        let bootstrap = {
            let _guard = tch::no_grad_guard();
            self.policy
                .network()
                .forward(&obs, batch.blueprint_indices(), &hidden, &mask_tensors)?
                .value
        };
        if let Some(last) = steps.checked_sub(1) {
            buffer.set_bootstrap(last, &bootstrap)?;
        }

        // The recurrent state at the episode's end, before the update reads
        // back anyway (reference §6.3's LSTM health).
        report.lstm = Some(hidden.health()?);
        if learn {
            match self.update(&buffer) {
                Ok((stats, q_per_op)) => {
                    report.q_per_op = q_per_op;
                    report.anomalies =
                        crate::ppo::PpoAnomaly::detect(&stats, &self.anomaly_thresholds);
                    report.ppo = Some(stats);
                }
                Err(error) => {
                    // A non-finite update is reported before it ends the round.
                    if let Error::NonFinite { what, value } = &error {
                        self.emit_numerical_instability(report.round, what, *value);
                    }
                    return Err(error);
                }
            }
        }
        report.timings.update_ms = ms(started);

        let envs_f = n as f64;
        report.mean_episode_reward =
            envs.iter().map(|env| env.episode_reward).sum::<f64>() / envs_f;
        report.final_accuracies = envs.iter().map(|env| env.val_accuracy).collect();
        for (env, outcome) in envs.iter().zip(report.outcomes.iter_mut()) {
            let (_, fossils, fossil_params) = env.occupancy();
            outcome.finish(
                env.val_accuracy,
                env.episode_reward,
                env.done,
                fossils,
                env.host_params(),
                fossil_params,
            );
        }
        report.actions = ActionDistribution::of(&report.outcomes);
        let seed_steps: u64 = envs.iter().map(|env| env.active_seed_steps).sum();
        report.mean_active_seeds = seed_steps as f64 / (envs_f * steps.max(1) as f64);
        report.inference_ms = inference_total / steps.max(1) as f64;
        report.timings.total_ms = ms(round_started);
        self.rounds = self.rounds.saturating_add(1);
        self.env_epochs = self.env_epochs.saturating_add(report.env_epochs);
        self.emit(&report);
        Ok(report)
    }
}
