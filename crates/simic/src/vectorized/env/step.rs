//! One environment step as a state machine: the phases the collector drives
//! every environment through, in order, with the step's in-flight state
//! ([`Phase`]) kept on the environment between them (the collector's
//! `train` runs the first two for every environment, then `measure`,
//! `observe`, its batched policy step, and `apply`).
//!
//! 1. [`Env::launch`]: the epoch is queued on the environment's stream
//!    (`Idle` → `Training`; an environment whose episode ended stays `Idle`);
//! 2. [`Env::finish_training`]: the epoch is read back and the fused
//!    validation + counterfactual pass queued (`Training` → `Measuring`);
//! 3. [`Env::judge`]: the pass is read back and the governor judges; a
//!    rollback ends the episode (`Measuring` → `Idle`, done), otherwise the
//!    accuracies and contributions are recorded (`Measuring` → `Deciding`);
//! 4. [`Env::observe`]: the observation and masks (every environment, its
//!    episode ended or not);
//! 5. [`Env::apply`]: the policy's action is carried out, the epoch
//!    concludes, the reward is computed and normalised (`Deciding` →
//!    `Idle`).

use leyline::LifecycleOp;
use tamiyo::features::{RawObservation, slot_extras};
use tamiyo::heads::{FactoredAction, OP};
use tamiyo::masks::{ActionMasks, MaskConfig, action_masks};
use tolaria::controller::{Applied, EpochMetrics, EpochObservation};
use tolaria::engine::trainer::TrainedEpoch;

use super::Env;
use crate::buffer::RolloutBuffer;
use crate::counterfactual::{FusedConfig, ShapleyConfig};
use crate::rewards::{
    RewardConfig, RewardInputs, RewardMode, RewardNormaliserConfig, SeedFacts,
    apply_governor_rollback, compute_reward,
};
use crate::vectorized::SimicConfig;
use crate::vectorized::measure::{Launched, Measured, launch_measure, read_measure};
use crate::vectorized::outcome::RewardHackingSuspicion;
use crate::{Error, Result};

/// What every environment's step follows, from the run's settings.
pub(crate) struct StepRules {
    /// The fused validation + counterfactual pass.
    fused: FusedConfig,
    /// Shapley values at the episode's last epoch.
    shapley: Option<ShapleyConfig>,
    /// The mask rules, with the run's `max_seeds`.
    masks: MaskConfig,
    max_seeds: usize,
    reward: RewardConfig,
    reward_normaliser: RewardNormaliserConfig,
    episode_length: u32,
}

impl StepRules {
    /// The rules of `config`.
    pub(crate) fn of(config: &SimicConfig) -> StepRules {
        StepRules {
            fused: config.fused,
            shapley: config.shapley,
            masks: MaskConfig {
                max_seeds: config.max_seeds,
                ..config.masks
            },
            max_seeds: config.max_seeds,
            reward: config.reward.clone(),
            reward_normaliser: config.reward_normaliser,
            episode_length: config.episode_length,
        }
    }

    /// Whether `step` (from 0) is the episode's last.
    pub(crate) fn is_last(&self, step: usize) -> bool {
        u32::try_from(step.saturating_add(1)).is_ok_and(|epochs| epochs == self.episode_length)
    }
}

/// Where an environment is in its step (see the module docs).
pub(super) enum Phase {
    /// Between steps, and for good once the episode has ended.
    Idle,
    /// The epoch is queued on the environment's stream.
    Training,
    /// The epoch was read back and its fused pass is not yet queued (only
    /// the profiled step stops here: [`Env::finish_training`] with
    /// `queue_pass` off, then [`Env::queue_pass`]).
    Trained { epoch: TrainedEpoch },
    /// The epoch was read back; its fused pass is queued.
    Measuring { epoch: TrainedEpoch, pass: Launched },
    /// The pass was read back and recorded; the environment waits for its
    /// action.
    Deciding {
        epoch: TrainedEpoch,
        measured: Measured,
    },
}

/// What [`Env::finish_training`] read back about the training steps.
pub(crate) struct TrainedSteps {
    /// Graphs captured.
    pub(crate) captures: usize,
    /// Steps run eagerly.
    pub(crate) eager_steps: usize,
    /// The captures' time, ms.
    pub(crate) capture_ms: f64,
}

/// What [`Env::apply`] did with an environment's action.
pub(crate) struct Transition {
    /// The normalised reward.
    pub(crate) reward: f64,
    /// The step was the episode's last (truncated: bootstrapped).
    pub(crate) truncated: bool,
    /// The anti-gaming patterns the reward matched.
    pub(crate) suspicions: Vec<RewardHackingSuspicion>,
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

impl Env {
    /// Phase 1: queues the epoch on the environment's stream, without a
    /// readback. Returns whether it did (not once the episode has ended).
    pub(crate) fn launch(&mut self) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        self.trainer.launch_epoch()?;
        // The twin's epoch is queued beside the environment's; it is read
        // back in `judge`.
        if let Some(twin) = self.twin.as_mut() {
            twin.launch_epoch()?;
        }
        self.phase = Phase::Training;
        Ok(true)
    }

    /// Phase 2: reads the queued epoch back and, with `queue_pass`, queues
    /// the fused validation and counterfactual pass on the environment's
    /// stream ([`Env::queue_pass`]). `None` when no epoch was queued.
    /// Without `queue_pass` the pass waits for an explicit
    /// [`Env::queue_pass`] (the profiled step keeps training and
    /// validation apart that way).
    pub(crate) fn finish_training(
        &mut self,
        step: usize,
        rules: &StepRules,
        queue_pass: bool,
    ) -> Result<Option<TrainedSteps>> {
        if !matches!(self.phase, Phase::Training) {
            return Ok(None);
        }
        let epoch = self.trainer.finish_training()?;
        let steps = TrainedSteps {
            captures: epoch.train.captures,
            eager_steps: epoch.train.eager_steps,
            capture_ms: epoch.train.capture_ms.unwrap_or(0.0),
        };
        self.phase = Phase::Trained { epoch };
        if queue_pass {
            self.queue_pass(step, rules)?;
        }
        Ok(Some(steps))
    }

    /// Queues the fused validation and counterfactual pass of the epoch
    /// [`Env::finish_training`] read back (with the Shapley plan at the
    /// episode's last `step`); nothing when no epoch waits for it.
    pub(crate) fn queue_pass(&mut self, step: usize, rules: &StepRules) -> Result<()> {
        let Phase::Trained { epoch } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return Ok(());
        };
        let shapley = rules
            .shapley
            .filter(|_| rules.is_last(step))
            .map(|config| ShapleyConfig {
                seed: config.seed ^ self.seed,
                ..config
            });
        match launch_measure(self, &rules.fused, shapley.as_ref()) {
            Ok(pass) => {
                self.phase = Phase::Measuring { epoch, pass };
                Ok(())
            }
            Err(error) => {
                self.phase = Phase::Trained { epoch };
                Err(error)
            }
        }
    }

    /// Phase 3: reads the fused pass back and lets the governor judge the
    /// epoch. A rollback ends the episode (the death penalty on its last
    /// transition in `buffer`, earlier rewards forfeited) and concludes the
    /// epoch; otherwise the validation figures and the seeds'
    /// contributions are recorded on the trainer, the contribution
    /// predictor's targets for `step` in `buffer`, and the Shapley values.
    pub(crate) fn judge(
        &mut self,
        step: usize,
        buffer: &mut RolloutBuffer,
        rules: &StepRules,
    ) -> Result<()> {
        let Phase::Measuring { mut epoch, pass } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return Ok(());
        };
        let result = read_measure(self, pass)?;
        self.finish_twin()?;
        self.counterfactual_configs = self
            .counterfactual_configs
            .saturating_add(u64::try_from(result.configs).unwrap_or(u64::MAX));
        self.trainer.judge(&mut epoch)?;
        if epoch.rolled_back() {
            epoch.validation = Some(result.validation);
            self.end_by_rollback(buffer, rules)?;
            self.trainer.conclude_epoch(epoch, None)?;
            return Ok(());
        }
        self.trainer
            .record_validation(&mut epoch, Some(result.validation))?;
        let report = &result.report;
        let contributions: Vec<_> = report
            .slots
            .iter()
            .filter_map(|&slot| report.contribution(slot).map(|c| (slot, c)))
            .collect();
        self.trainer.set_contributions(&contributions)?;
        if let Some(values) = report.shapley.as_ref() {
            self.shapley = report
                .slots
                .iter()
                .copied()
                .zip(values.iter().copied())
                .collect();
        }
        // The contribution predictor's targets, in the policy's slot order.
        let targets: Vec<Option<f64>> = self
            .slots
            .iter()
            .map(|&slot| report.contribution(slot))
            .collect();
        buffer.record_contributions(step, self.index, &targets)?;
        self.val_accuracy = result.validation.accuracy;
        self.phase = Phase::Deciding {
            epoch,
            measured: result,
        };
        Ok(())
    }

    /// Ends the episode after a governor rollback: the death penalty on
    /// its last transition (a true terminal), earlier rewards forfeited.
    fn end_by_rollback(&mut self, buffer: &mut RolloutBuffer, rules: &StepRules) -> Result<()> {
        self.done = true;
        let Some(last) = self.last_step else {
            return Ok(());
        };
        let mut rewards: Vec<f64> = buffer
            .row_rewards(self.index)
            .map(|row| {
                row.iter()
                    .take(last.saturating_add(1))
                    .map(|&r| f64::from(r))
                    .collect()
            })
            .unwrap_or_default();
        apply_governor_rollback(&rules.reward, &rules.reward_normaliser, &mut rewards)?;
        for (step, value) in rewards.iter().enumerate() {
            buffer.set_reward(self.index, step, *value as f32)?;
        }
        buffer.set_terminal(self.index, last)
    }

    /// Phase 4: the observation row and masks now (every environment, its
    /// episode ended or not: the tracker sees every step). The epoch figures
    /// are this step's when it has one, the last finite ones otherwise;
    /// notes whether the masks force the op.
    pub(crate) fn observe(&mut self, rules: &StepRules) -> Result<(RawObservation, ActionMasks)> {
        let trained = match &self.phase {
            Phase::Deciding { epoch, .. } => Some(epoch),
            _ => None,
        };
        let metrics = metrics_of(trained, self.last_metrics);
        self.last_metrics = metrics;
        let epoch = u32::try_from(self.trainer.epoch()).unwrap_or(u32::MAX);
        let model = self.trainer.model();
        let observation = EpochObservation::from_model(model, epoch, metrics)?;
        let extras = slot_extras(model);
        let availability = model.op_availability(rules.max_seeds);
        // The blueprint head offers the blueprints of this host's topology.
        let mask_config = MaskConfig {
            topology: model.host().topology(),
            ..rules.masks
        };
        let masks = action_masks(&observation, &availability, &mask_config)?;
        let raw = self.tracker.observe(&observation, &extras)?;
        self.forced = masks.head(OP).iter().filter(|&&allowed| allowed).count() <= 1;
        self.germination_offered = masks.allows(LifecycleOp::Germinate);
        self.observation = Some(observation);
        Ok((raw, masks))
    }

    /// The action `controller` takes on this step's observation, when the
    /// environment waits for one (`None` once its episode has ended). A
    /// controller's error is carried out as WAIT, as Tolaria's decision
    /// deadline does; the second value says whether it was one.
    pub(crate) fn scripted_action(
        &self,
        controller: &mut dyn tolaria::controller::Controller,
    ) -> Result<Option<(FactoredAction, bool)>> {
        let (Phase::Deciding { .. }, Some(observation)) = (&self.phase, &self.observation) else {
            return Ok(None);
        };
        let (decision, refused) = match controller.decide(observation) {
            Ok(decision) => (decision, false),
            Err(_) => (tolaria::controller::Decision::wait(), true),
        };
        let action = tamiyo::controller::to_action(&decision, &self.slots)?;
        Ok(Some((action, refused)))
    }

    /// Phase 5: carries `action` out through Kasmina (a refused op is
    /// carried out and rewarded as WAIT), concludes the epoch (the
    /// lifecycle tick), and computes the step's reward, scaled by
    /// `normalise`. `None` when the environment has no epoch waiting for an
    /// action (its episode ended).
    pub(crate) fn apply(
        &mut self,
        step: usize,
        action: &FactoredAction,
        rules: &StepRules,
        normalise: impl FnOnce(f64) -> Result<f64>,
    ) -> Result<Option<Transition>> {
        let Phase::Deciding { epoch, measured } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return Ok(None);
        };
        let terminal = rules.is_last(step);
        let decision = tamiyo::controller::to_decision(action, &self.slots, 1.0)?;
        let target = self
            .slots
            .get(action.slot)
            .copied()
            .ok_or_else(|| Error::Buffer(format!("slot index {} out of range", action.slot)))?;
        let seed_before = self.seed_facts(target, Some(&measured.report));
        // The other slots' seeds, only where the reward reads them.
        let other_seeds: Vec<SeedFacts> = if rules.reward.attribute_all_seeds {
            self.slots
                .iter()
                .filter(|slot| **slot != target)
                .filter_map(|slot| self.seed_facts(*slot, Some(&measured.report)))
                .collect()
        } else {
            Vec::new()
        };
        let mut germinated = None;
        let (op, succeeded) = match self.trainer.apply_decision(&decision) {
            Ok(Applied::Waited) => (LifecycleOp::Wait, true),
            Ok(Applied::Germinated { slot, blueprint }) => {
                self.note_germination(slot);
                germinated = Some(blueprint);
                (LifecycleOp::Germinate, true)
            }
            Ok(Applied::GateEvaluated { op, passed, .. }) => {
                if op == LifecycleOp::Fossilize && passed {
                    self.outcome.fossilizations = self.outcome.fossilizations.saturating_add(1);
                }
                (op, passed)
            }
            Ok(Applied::Pruned { pruned, .. }) => {
                if pruned {
                    self.outcome.prunes = self.outcome.prunes.saturating_add(1);
                }
                (LifecycleOp::Prune, pruned)
            }
            // Refused by Kasmina: executed (and rewarded) as WAIT.
            Ok(Applied::Refused { .. }) | Err(_) => (LifecycleOp::Wait, false),
        };
        self.outcome
            .record_step(action.op, op, germinated, self.forced);
        self.tracker.record_action(op, succeeded);
        let _ = self.trainer.conclude_epoch(epoch, None)?;
        let model = self.trainer.model();
        let trace = super::super::outcome::TraceEpoch {
            epoch: step,
            train: (
                self.last_metrics.train_loss,
                self.last_metrics.train_accuracy,
            ),
            validation: (self.last_metrics.val_loss, self.last_metrics.val_accuracy),
            slots: super::super::outcome::TraceSlot::of(model),
            op,
            slot: (op != LifecycleOp::Wait).then(|| target.to_string()),
            blueprint: germinated,
            succeeded,
            active_seeds: model.active_seed_count(),
        };
        self.outcome.trace.push(trace);
        let (occupied, fossils, fossil_params) = self.occupancy();
        let host_params = self.host_params();
        let val_acc = measured.validation.accuracy.clamp(0.0, 100.0);
        let escrow = (rules.reward.mode == RewardMode::Escrow)
            .then(|| self.escrow_inputs(action.slot, val_acc, rules.reward.escrow_stable_window));
        let inputs = RewardInputs {
            op,
            op_succeeded: succeeded,
            seed: seed_before,
            seed_after: self.stage_point(target),
            other_seeds,
            val_acc,
            previous_val_acc: self.rewarded_accuracy,
            twin_val_acc: self
                .twin_accuracy
                .map(|twin| (twin, self.rewarded_twin_accuracy)),
            clean_total: measured.report.reward.total,
            solo_off_accuracies: Vec::new(),
            host_params,
            slots: self.slot_facts(),
            occupied_slots: occupied,
            fossil_count: fossils,
            committed_val_acc: measured.committed,
            fossil_params,
            auto_prunes: 0,
            germination_offered: self.germination_offered,
            epoch: u32::try_from(step.saturating_add(1)).unwrap_or(u32::MAX),
            max_epochs: rules.episode_length,
            terminal,
            escrow,
        };
        let breakdown = compute_reward(&rules.reward, &inputs)?;
        if inputs.escrow.is_some() {
            self.settle_escrow(action.slot, breakdown.escrow_credit);
        }
        self.rewarded_accuracy = Some(inputs.val_acc);
        self.rewarded_twin_accuracy = self.twin_accuracy;
        let suspicions = RewardHackingSuspicion::of(
            self.index,
            step,
            target,
            inputs.seed.as_ref().and_then(|seed| seed.contribution),
            &breakdown,
        );
        let reward = breakdown.total;
        let normalised = normalise(reward)?;
        self.episode_reward += reward;
        self.last_step = Some(step);
        self.active_seed_steps = self
            .active_seed_steps
            .saturating_add(self.trainer.model().active_seed_count() as u64);
        Ok(Some(Transition {
            reward: normalised,
            truncated: terminal,
            suspicions,
        }))
    }
}
