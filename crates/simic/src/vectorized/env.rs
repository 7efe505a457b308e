//! One environment of a vectorized round: a Kasmina model trained by its own
//! Tolaria [`ModelTrainer`] (its own compute stream on CUDA), the
//! observation history Tamiyo's features need, its last epoch figures, its
//! episode's outcome, what the reward needs to remember between steps
//! (accuracy at each seed's germination, each slot's alpha and size at the
//! previous step), and the step in flight: the environment is a small state
//! machine whose phases ([`step`]) the collector drives.
//!
//! Also here: the round's data ([`EnvSpec`]), which device each environment
//! runs on, and the blueprint warm-up before the first round.

use std::collections::{HashMap, VecDeque};

mod step;

pub(super) use step::StepRules;

use kasmina::host::SlotId;
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::{SeedStage, Telemetry};
use tamiyo::features::ObservationTracker;
use tch::Device;
use tolaria::controller::EpochMetrics;
use tolaria::data::Dataset;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use tolaria::task::TaskHost;

use super::SimicConfig;
use super::outcome::EpisodeOutcome;
use crate::counterfactual::{CounterfactualReport, ShapleyValue};
use crate::rewards::{EscrowInputs, SeedFacts, SlotFacts, StagePoint};
use crate::{Error, Result};

/// The data and host of every environment of a round.
#[derive(Debug)]
pub struct EnvSpec {
    /// The host every environment starts from (fresh weights per round): a
    /// CNN for the image tasks, a transformer for the language-model ones.
    pub host: TaskHost,
    /// Enabled seed slots, by name (`r0c0`, …), execution order.
    pub slots: Vec<String>,
    /// One disjoint training shard per environment.
    pub train: Vec<Dataset>,
    /// The validation set every environment scores on (with the
    /// counterfactual configurations).
    pub validation: Dataset,
}

impl EnvSpec {
    /// Splits `train` into `n_envs` disjoint, equal shards (the remainder
    /// is dropped), so that each environment-epoch trains on its share of
    /// the set as the reference does.
    pub fn sharded(
        host: impl Into<TaskHost>,
        slots: Vec<String>,
        train: &Dataset,
        validation: Dataset,
        n_envs: usize,
    ) -> Result<EnvSpec> {
        let shard = train.len().checked_div(n_envs).unwrap_or(0);
        if shard == 0 {
            return Err(Error::InvalidConfig {
                field: "EnvSpec.n_envs",
                reason: format!(
                    "{n_envs} environments for {} training samples; each needs at least one",
                    train.len()
                ),
            });
        }
        let shards = (0..n_envs)
            .map(|env| {
                train
                    .slice(env.saturating_mul(shard), shard)
                    .map_err(|error| Error::InvalidConfig {
                        field: "EnvSpec.train",
                        reason: format!("cannot take shard {env}: {error}"),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EnvSpec {
            host: host.into(),
            slots,
            train: shards,
            validation,
        })
    }

    /// Environments this spec has data for.
    pub fn n_envs(&self) -> usize {
        self.train.len()
    }

    /// A fresh model of the spec: its host on `device` (weights from tch's
    /// global generator) with its slots enabled.
    pub(crate) fn model(
        &self,
        device: Device,
        slot: SlotConfig,
        telemetry: Telemetry,
    ) -> Result<MorphogeneticModel> {
        let names: Vec<&str> = self.slots.iter().map(String::as_str).collect();
        Ok(self.host.model(&names, slot, device, telemetry)?)
    }
}

/// What one slot looked like at the previous step (the alpha shock).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct SlotMemory {
    alpha: f64,
    params: u64,
}

/// One environment (see the module docs).
pub(crate) struct Env {
    /// The environment's index in the round (its row of the buffer).
    index: usize,
    pub(crate) trainer: ModelTrainer,
    tracker: ObservationTracker,
    slots: Vec<SlotId>,
    /// The step in flight.
    phase: step::Phase,
    /// The last finite epoch figures the policy saw.
    last_metrics: EpochMetrics,
    /// The masks left the op head one choice at this step's observation.
    forced: bool,
    /// GERMINATE was valid at this step's observation (the germination
    /// delay cost's condition).
    germination_offered: bool,
    /// This step's observation, for a scripted controller that drives the
    /// environment instead of the policy ([`super::Simic::drive_round`]).
    observation: Option<tolaria::controller::EpochObservation>,
    /// The episode ended early (the governor rolled the model back).
    done: bool,
    /// Last step with a transition in the buffer.
    last_step: Option<usize>,
    /// Validation accuracy when each live seed germinated.
    germination_accuracy: HashMap<SlotId, f64>,
    memory: Vec<SlotMemory>,
    /// The raw rewards of this episode (before normalisation), summed.
    episode_reward: f64,
    /// Latest validation accuracy, percent.
    val_accuracy: f64,
    /// The validation accuracy the last reward was computed at (the
    /// accuracy-delta term's reference; none before the first reward).
    rewarded_accuracy: Option<f64>,
    /// The twin: the same host trained beside this one with no seed, when
    /// the reward pays the twin delta
    /// ([`crate::rewards::RewardConfig::twin_delta_weight`]).
    twin: Option<ModelTrainer>,
    /// The twin's latest validation accuracy, percent.
    twin_accuracy: Option<f64>,
    /// The twin's validation accuracy the last reward was computed at.
    rewarded_twin_accuracy: Option<f64>,
    /// ESCROW: each slot's credit, in slot order (0 while the slot holds no
    /// live or fossilized seed).
    escrow_credit: Vec<f64>,
    /// ESCROW: the episode's last validation accuracies, newest last (as
    /// many as the stable window).
    recent_val_acc: VecDeque<f64>,
    /// Active seeds summed over steps (for the mean).
    active_seed_steps: u64,
    /// Configurations the fused passes measured, summed over the steps.
    counterfactual_configs: u64,
    /// The environment's seed (its model, and its Shapley permutations).
    seed: u64,
    /// The ops chosen and carried out so far, and how the episode ended.
    outcome: EpisodeOutcome,
    /// The seeds' Shapley values at the episode's last epoch, by slot.
    shapley: Vec<(SlotId, ShapleyValue)>,
}

impl Env {
    /// A fresh environment: the host built from `seed` on `device`, the
    /// spec's slots under `config.slot`, a trainer over shard `index` with
    /// `config.trainer`, episodes of `config.episode_length` epochs.
    pub(crate) fn new(
        spec: &EnvSpec,
        (index, seed): (usize, u64),
        device: Device,
        config: &SimicConfig,
        telemetry: &Telemetry,
    ) -> Result<Env> {
        let (trainer, max_epochs) = (&config.trainer, config.episode_length);
        let train = spec.train.get(index).ok_or_else(|| Error::InvalidConfig {
            field: "EnvSpec.train",
            reason: format!("no training shard for environment {index}"),
        })?;
        let trainer_config = ModelTrainerConfig {
            seed,
            // Contributions come from Simic's fused pass.
            counterfactual_samples: 0,
            // The environments' epochs overlap on the GPU: one graph pool
            // lane each (a lane's graphs never replay at the same time).
            graph_pool_lane: index,
            ..trainer.clone()
        };
        // The twin (see `twin`), built first from the host's seed and the
        // host then built from it again: the two are one model until the
        // first germination, and the host's generator draws are the ones it
        // makes without a twin.
        let twin = if config.reward.twin_delta_weight > 0.0 {
            tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
            let twin_model = spec.model(device, config.slot, Telemetry::disabled())?;
            Some(ModelTrainer::new(
                twin_model,
                train,
                Some(&spec.validation),
                ModelTrainerConfig {
                    // A lane of its own, after the environments': its
                    // epoch runs at the same time as its environment's.
                    graph_pool_lane: config.n_envs.saturating_add(index),
                    ..trainer_config.clone()
                },
                Telemetry::disabled(),
            )?)
        } else {
            None
        };
        tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
        let model = spec.model(device, config.slot, telemetry.clone())?;
        let slots = model.slot_ids();
        let trainer = ModelTrainer::new(
            model,
            train,
            Some(&spec.validation),
            trainer_config,
            telemetry.clone(),
        )?;
        let slot_count = slots.len();
        Ok(Env {
            index,
            tracker: ObservationTracker::new(&slots, max_epochs)?,
            memory: vec![SlotMemory::default(); slots.len()],
            slots,
            trainer,
            phase: step::Phase::Idle,
            last_metrics: EpochMetrics {
                train_loss: 0.0,
                train_accuracy: 0.0,
                val_loss: 0.0,
                val_accuracy: 0.0,
            },
            forced: false,
            germination_offered: false,
            observation: None,
            done: false,
            last_step: None,
            germination_accuracy: HashMap::new(),
            episode_reward: 0.0,
            val_accuracy: 0.0,
            rewarded_accuracy: None,
            twin,
            twin_accuracy: None,
            rewarded_twin_accuracy: None,
            escrow_credit: vec![0.0; slot_count],
            recent_val_acc: VecDeque::new(),
            active_seed_steps: 0,
            counterfactual_configs: 0,
            seed,
            outcome: EpisodeOutcome::new(index),
            shapley: Vec::new(),
        })
    }

    /// The twin's epoch that [`Env::launch`] queued: read back, validated
    /// (one more readback) and concluded as a plain trainer's epoch is
    /// (`ModelTrainer::train_epoch` without a controller); its validation
    /// accuracy is what this step's twin-delta term pays against. Nothing
    /// without a twin.
    fn finish_twin(&mut self) -> Result<()> {
        let Some(twin) = self.twin.as_mut() else {
            return Ok(());
        };
        let mut trained = twin.finish_training()?;
        let validation = twin.validate()?;
        twin.judge(&mut trained)?;
        if trained.rolled_back() {
            trained.validation = validation;
        } else {
            twin.record_validation(&mut trained, validation)?;
        }
        twin.conclude_epoch(trained, None)?;
        if let Some(validation) = validation {
            self.twin_accuracy = Some(validation.accuracy.clamp(0.0, 100.0));
        }
        Ok(())
    }

    /// The environment's index in the round.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The number of slots (the policy's `num_slots`).
    pub(crate) fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The governor ended the episode early.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Whether the masks left the op head one choice at the last
    /// observation (a forced WAIT).
    pub(crate) fn forced(&self) -> bool {
        self.forced
    }

    /// The episode's summed raw reward.
    pub(crate) fn episode_reward(&self) -> f64 {
        self.episode_reward
    }

    /// Latest validation accuracy, percent.
    pub(crate) fn val_accuracy(&self) -> f64 {
        self.val_accuracy
    }

    /// Live seeds summed over the episode's steps.
    pub(crate) fn active_seed_steps(&self) -> u64 {
        self.active_seed_steps
    }

    /// Configurations the fused passes measured, summed over the steps.
    pub(crate) fn counterfactual_configs(&self) -> u64 {
        self.counterfactual_configs
    }

    /// Closes the episode: its outcome (final accuracy, reward, the model's
    /// fossils and parameter ratio, how it ended) and the Shapley values
    /// measured at its last epoch.
    pub(crate) fn into_outcome(mut self) -> (EpisodeOutcome, Vec<(SlotId, ShapleyValue)>) {
        let (_, fossils, fossil_params) = self.occupancy();
        let host_params = self.host_params();
        self.outcome.finish(
            self.val_accuracy,
            self.episode_reward,
            self.done,
            fossils,
            host_params,
            fossil_params,
        );
        (self.outcome, self.shapley)
    }

    /// The targeted slot's seed as the policy saw it, with this epoch's
    /// counterfactual `report`.
    fn seed_facts(&self, slot: SlotId, report: Option<&CounterfactualReport>) -> Option<SeedFacts> {
        let model = self.trainer.model();
        let state = model.slot(slot).ok()?.state()?;
        let metrics = state.metrics();
        let interaction_sum = report.map_or(0.0, |report| {
            let Some(player) = report.slots.iter().position(|s| *s == slot) else {
                return 0.0;
            };
            report
                .interactions
                .iter()
                .filter(|i| i.first == player || i.second == player)
                .map(|i| i.value)
                .sum()
        });
        let at_germination = self
            .germination_accuracy
            .get(&slot)
            .copied()
            .unwrap_or(self.val_accuracy);
        Some(SeedFacts {
            stage: state.stage(),
            epochs_in_stage: metrics.epochs_in_stage,
            age_epochs: metrics.epochs_total,
            contribution: report.and_then(|report| report.contribution(slot)),
            progress: (self.val_accuracy - at_germination).clamp(-100.0, 100.0),
            stage_improvement: metrics.improvement_since_stage_start().clamp(-100.0, 100.0),
            interaction_sum: interaction_sum.clamp(-100.0, 100.0),
        })
    }

    /// The slot's lifecycle position now (after the op and the tick).
    fn stage_point(&self, slot: SlotId) -> Option<StagePoint> {
        let state = self.trainer.model().slot(slot).ok()?.state()?;
        Some(StagePoint {
            stage: state.stage(),
            epochs_in_stage: state.metrics().epochs_in_stage,
        })
    }

    /// Every slot's rent and shock inputs now, against the previous step;
    /// remembers the present for the next step.
    fn slot_facts(&mut self) -> Vec<SlotFacts> {
        let model = self.trainer.model();
        let mut facts = Vec::with_capacity(self.slots.len());
        for (index, slot) in self.slots.iter().enumerate() {
            let state = model.slot(*slot).ok().and_then(|slot| slot.state());
            let stage = state.map(|state| state.stage());
            let live = stage.is_some_and(|stage| !stage.is_failure());
            let alpha = if live {
                state.map_or(0.0, |state| state.alpha().clamp(0.0, 1.0))
            } else {
                0.0
            };
            let params = if live {
                state.map_or(0, |state| u64::try_from(state.param_count()).unwrap_or(0))
            } else {
                0
            };
            let previous = self.memory.get(index).copied().unwrap_or_default();
            facts.push(SlotFacts {
                stage: stage.filter(|_| live),
                alpha,
                params,
                previous_alpha: previous.alpha,
                previous_params: previous.params,
            });
            if let Some(memory) = self.memory.get_mut(index) {
                *memory = SlotMemory { alpha, params };
            }
        }
        facts
    }

    /// ESCROW's inputs for a step targeting slot `target` (an index into the
    /// slots), after the op: notes `val_acc` among the recent accuracies
    /// and takes the stable accuracy over `window` of them.
    fn escrow_inputs(&mut self, target: usize, val_acc: f64, window: u32) -> EscrowInputs {
        let window = usize::try_from(window).unwrap_or(usize::MAX).max(1);
        self.recent_val_acc.push_back(val_acc);
        while self.recent_val_acc.len() > window {
            self.recent_val_acc.pop_front();
        }
        let stable_val_acc = self
            .recent_val_acc
            .iter()
            .copied()
            .reduce(f64::min)
            .unwrap_or(val_acc);
        let others_at_risk = self
            .slots
            .iter()
            .zip(&self.escrow_credit)
            .enumerate()
            .filter(|(index, (slot, _))| {
                *index != target
                    && self
                        .seed_stage(**slot)
                        .is_some_and(|stage| stage != SeedStage::Fossilized)
            })
            .map(|(_, (_, credit))| *credit)
            .sum();
        EscrowInputs {
            stable_val_acc,
            credit: self.escrow_credit.get(target).copied().unwrap_or(0.0),
            others_at_risk,
        }
    }

    /// ESCROW: keeps the targeted slot's credit after the step, and resets
    /// the credit of every slot that holds no live or fossilized seed.
    fn settle_escrow(&mut self, target: usize, credit: f64) {
        if let Some(kept) = self.escrow_credit.get_mut(target) {
            *kept = credit;
        }
        for (index, slot) in self.slots.iter().enumerate() {
            if self.seed_stage(*slot).is_none()
                && let Some(kept) = self.escrow_credit.get_mut(index)
            {
                *kept = 0.0;
            }
        }
    }

    /// The stage of `slot`'s seed when it is live or fossilized; `None` for
    /// an empty slot or a seed in a failure stage.
    fn seed_stage(&self, slot: SlotId) -> Option<SeedStage> {
        let stage = self.trainer.model().slot(slot).ok()?.state()?.stage();
        (!stage.is_failure()).then_some(stage)
    }

    /// Notes the validation accuracy at a germination in `slot`.
    fn note_germination(&mut self, slot: SlotId) {
        self.germination_accuracy.insert(slot, self.val_accuracy);
    }

    /// The host's parameter count (seeds excluded).
    fn host_params(&self) -> u64 {
        self.trainer
            .model()
            .host_parameters()
            .iter()
            .map(|(_, tensor)| u64::try_from(tensor.numel()).unwrap_or(0))
            .sum()
    }

    /// Slots holding a live or fossilised seed, fossils, and the fossils'
    /// parameters.
    fn occupancy(&self) -> (u32, u32, u64) {
        let mut occupied = 0_u32;
        let mut fossils = 0_u32;
        let mut fossil_params = 0_u64;
        for slot in self.trainer.model().slots() {
            let Some(state) = slot.state() else { continue };
            if state.stage().is_failure() {
                continue;
            }
            occupied = occupied.saturating_add(1);
            if state.stage() == SeedStage::Fossilized {
                fossils = fossils.saturating_add(1);
                fossil_params =
                    fossil_params.saturating_add(u64::try_from(state.param_count()).unwrap_or(0));
            }
        }
        (occupied, fossils, fossil_params)
    }
}

/// The device of environment `index` ([`SimicConfig::env_devices`],
/// round-robin; `policy_device` when the list is empty).
pub(crate) fn env_device(config: &SimicConfig, index: usize, policy_device: Device) -> Device {
    let devices = &config.env_devices;
    index
        .checked_rem(devices.len())
        .and_then(|slot| devices.get(slot))
        .copied()
        .unwrap_or(policy_device)
}

/// Runs every blueprint at every slot of `spec`'s host once at the
/// environments' training batch shapes (those of the trainer's epoch plan
/// over a shard: [`tolaria::engine::batches::batch_sizes`]), on a scratch
/// model per environment CUDA device
/// ([`tolaria::engine::prewarm::prewarm_blueprints`]); nothing on the CPU.
pub(crate) fn prewarm_blueprints(
    config: &SimicConfig,
    spec: &EnvSpec,
    policy_device: Device,
) -> Result<tolaria::engine::prewarm::Prewarm> {
    let trainer = &config.trainer;
    let batch = i64::try_from(trainer.batch_size).unwrap_or(i64::MAX);
    let shard = spec
        .train
        .first()
        .map_or(0, |data| i64::try_from(data.len()).unwrap_or(i64::MAX));
    let sizes = tolaria::engine::batches::batch_sizes(shard, batch, trainer.drop_last)?;
    let mut devices: Vec<Device> = Vec::new();
    for index in 0..config.n_envs {
        let device = env_device(config, index, policy_device);
        if !devices.contains(&device) {
            devices.push(device);
        }
    }
    let mut total = tolaria::engine::prewarm::Prewarm::default();
    for device in devices {
        if !device.is_cuda() {
            continue;
        }
        let precision = match trainer.precision {
            Some(precision) => precision,
            None => tolaria::amp::Precision::auto(device)?,
        };
        let model = spec.model(device, config.slot, Telemetry::disabled())?;
        let done = tolaria::engine::prewarm::prewarm_blueprints(
            &model,
            precision,
            trainer.channels_last,
            &sizes,
        )?;
        total.absorb(&done);
    }
    Ok(total)
}
