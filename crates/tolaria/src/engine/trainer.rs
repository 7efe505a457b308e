//! The general trainer: a Kasmina model trained epoch by epoch through the
//! [`Engine`] and the general [`ModelStep`], with everything that happens at
//! an epoch boundary.
//!
//! [`ModelTrainer::train_epoch`] runs, in order:
//!
//! 1. the epoch's steps ([`Engine::run_epoch`]; one readback at its end);
//! 2. validation on the held-out set, under inference mode, in evaluation
//!    mode, with the training precision (one readback);
//! 3. the deferred gradient metrics (one readback), recorded on each seed's
//!    slot ([`kasmina::slot::SeedSlot::record_gradient_norms`]), and the
//!    gradient-aggregation counters;
//! 4. the governor: a non-finite, lobotomised or diverging loss rolls the
//!    model back to its last snapshot (prunes the live seeds, clears every
//!    optimizer's state) and the epoch reports it; otherwise a snapshot is
//!    taken every `snapshot_interval_epochs`;
//! 5. the accuracies recorded on every live seed
//!    ([`MorphogeneticModel::record_accuracy`]);
//! 6. the controller's decision, asked with a deadline
//!    ([`DecisionDeadline`]; a late or failed answer is WAIT, with
//!    `tolaria.timeout.*` telemetry) and carried out through Kasmina
//!    ([`crate::controller::apply`]);
//! 7. Kasmina's epoch tick ([`MorphogeneticModel::step_epoch`]: alpha
//!    schedules, cooldowns) and the epoch's telemetry.
//!
//! The next epoch's [`Step::prepare`](super::Step::prepare) adopts whatever the boundary changed;
//! a changed step shape is captured again.
//!
//! The same steps are public one by one ([`phases`]), for a driver that runs
//! many trainers side by side and decides for all of them at once.
//!
//! Between epochs a trainer's whole state can be exported and a trainer
//! restored from it, to continue bit for bit ([`state`]:
//! [`ModelTrainer::export_state`], [`ModelTrainer::restore`]).

use std::time::Duration;

use kasmina::model::MorphogeneticModel;
use leyline::proto::TelemetryPacket;
use leyline::telemetry as names;
use leyline::{Telemetry, TelemetryLevel, metric};
use tch::Device;

use super::model_step::{ModelStep, ModelStepConfig};
use super::staging::StagedData;
use super::{DataPlacement, Engine, EngineConfig, EngineEpoch};
use crate::amp::{GradScalerConfig, Precision};
use crate::controller::{
    Applied, Controller, DeadlineOutcome, DecisionDeadline, EpochMetrics, EpochObservation,
};
use crate::data::Dataset;
use crate::error::{Error, Result, TorchResultExt};
use crate::governor::{Governor, GovernorConfig, RollbackReport, Verdict};
use crate::grad_agg::GradAggMetrics;

pub mod checkpoint;
mod config;
pub mod phases;
pub mod state;
mod validation;

pub use checkpoint::{TrainerCheckpoint, read_checkpoint};
pub use config::ModelTrainerConfig;
pub use phases::TrainedEpoch;
pub use state::{
    GovernorManifest, OptimizerGroup, SlotState, SnapshotFossil, SnapshotManifest, TensorEntry,
    TrainerManifest, TrainerState, epoch_seed,
};
pub use validation::Validation;

/// What one [`ModelTrainer::train_epoch`] did.
#[derive(Debug, Clone)]
pub struct ModelEpochReport {
    /// Zero-based epoch.
    pub epoch: usize,
    /// The engine's figures (loss, accuracy, timing, graphs).
    pub train: EngineEpoch,
    /// Validation, when the trainer has a validation set.
    pub validation: Option<Validation>,
    /// The governor's verdict (`None` without a governor).
    pub verdict: Option<Verdict>,
    /// The rollback, when the governor panicked.
    pub rollback: Option<RollbackReport>,
    /// The controller's outcome and what was applied (`None` without a
    /// controller, or after a rollback).
    pub decision: Option<(DeadlineOutcome, Applied)>,
    /// The epoch's aggregation counters (`None` when a non-finite gradient
    /// made them unusable).
    pub grad_agg: Option<GradAggMetrics>,
    /// Seeds on the forward path after the boundary.
    pub active_seeds: usize,
}

/// The general trainer (see the module docs).
pub struct ModelTrainer {
    config: ModelTrainerConfig,
    precision: Precision,
    engine: Engine,
    step: ModelStep,
    train: StagedData,
    validation: Option<StagedData>,
    governor: Option<Governor>,
    deadline: Option<DecisionDeadline>,
    telemetry: Telemetry,
    epoch: usize,
    germinations: u64,
}

impl std::fmt::Debug for ModelTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTrainer")
            .field("config", &self.config)
            .field("precision", &self.precision)
            .field("epoch", &self.epoch)
            .field("step", &self.step)
            .finish()
    }
}

impl ModelTrainer {
    /// A trainer of `model` on `train` (validated on `validation`), staged
    /// on the model's device. The data's sample shape must be the host's
    /// input shape and its classes the host's outputs (checked on a probe
    /// batch before anything trains).
    pub fn new(
        model: MorphogeneticModel,
        train: &Dataset,
        validation: Option<&Dataset>,
        config: ModelTrainerConfig,
        telemetry: Telemetry,
    ) -> Result<ModelTrainer> {
        let device = model.device();
        crate::amp::apply_precision(&config.matmul)?;
        if matches!(device, Device::Cuda(_)) {
            torch_ext::precision::set_cudnn_benchmark(config.cudnn_benchmark);
        }
        let precision = match config.precision {
            Some(precision) => precision,
            None => Precision::auto(device)?,
        };
        if config.validation_batch_size == 0 {
            return Err(Error::InvalidConfig {
                field: "validation_batch_size",
                reason: "0; a batch needs at least one sample".to_owned(),
            });
        }
        // The epoch's batch plan over the training set, checked before
        // anything is staged: a batch size that leaves no batch (larger than
        // the data with `drop_last`) is refused here, not at the first epoch.
        let samples = i64::try_from(train.len()).unwrap_or(i64::MAX);
        let batch = i64::try_from(config.batch_size).unwrap_or(i64::MAX);
        let _ = crate::engine::batches::batch_sizes(samples, batch, config.drop_last)?;
        let expected = model.host().input_shape();
        for (name, data) in
            std::iter::once(("train", train)).chain(validation.map(|v| ("validation", v)))
        {
            if data.sample_shape() != expected {
                return Err(Error::InvalidData {
                    field: "sample shape",
                    reason: format!(
                        "the {name} set's samples are {:?}, the host `{}` takes {:?}",
                        data.sample_shape(),
                        model.host().name(),
                        expected
                    ),
                });
            }
        }
        let step_config = ModelStepConfig {
            precision,
            scaler: GradScalerConfig::default(),
            microbatches: config.microbatches,
            clip_grad_norm: config.clip_grad_norm,
            gradient_telemetry_stride: config.gradient_telemetry_stride,
            max_seeds: config.max_seeds,
            optimizer: config.optimizer,
            channels_last: config.channels_last,
            overlap_weight_grads: config.overlap_weight_grads,
        };
        let governor = if config.governor {
            let mut governor_config = GovernorConfig::for_classes(train.n_classes())?;
            governor_config.snapshot_interval_epochs = config.snapshot_interval_epochs;
            Some(Governor::new(governor_config)?)
        } else {
            None
        };
        let mut step = ModelStep::new(model, step_config)?;
        let staged = match config.data_placement {
            DataPlacement::Device => {
                StagedData::resident(train, device, config.shuffle, config.seed)?
            }
            DataPlacement::PinnedHost => StagedData::pinned(
                train,
                device,
                config.batch_size,
                config.shuffle,
                config.seed,
            )?,
        };
        let probe_len = i64::try_from(staged.len().min(32)).unwrap_or(1);
        let probe = staged
            .inputs()
            .f_narrow(0, 0, probe_len)
            .op("probe")?
            .f_to_device(device)
            .op("probe to device")?;
        let logits = tch::no_grad(|| step.model().forward(&probe, false)).map_err(|source| {
            Error::Lifecycle {
                op: "probe forward",
                source,
            }
        })?;
        let outputs = logits.size().last().copied().unwrap_or(0);
        if usize::try_from(outputs).ok() != Some(train.n_classes()) {
            return Err(Error::InvalidData {
                field: "n_classes",
                reason: format!(
                    "the data set has {} classes, the host outputs {outputs}",
                    train.n_classes()
                ),
            });
        }
        step.set_probe(probe);
        // Validation reads chunks of the staged inputs straight into the
        // model: stored in the step's layout, they need no conversion.
        let channels_last = step.channels_last();
        let validation = validation
            .map(|data| {
                let staged = StagedData::resident(data, device, false, config.seed)?;
                if channels_last {
                    staged.into_channels_last()
                } else {
                    Ok(staged)
                }
            })
            .transpose()?;
        let engine = Engine::new(
            device,
            EngineConfig {
                mode: config.mode,
                warmup_steps: config.graph_warmup_steps,
                epoch_graph_steps: config.epoch_graph_steps,
                batch_size: config.batch_size,
                drop_last: config.drop_last,
                forbid_syncs: config.forbid_syncs,
                pool_lane: config.graph_pool_lane,
            },
        )?;
        Ok(ModelTrainer {
            config,
            precision,
            engine,
            step,
            train: staged,
            validation,
            governor,
            deadline: None,
            telemetry,
            epoch: 0,
            germinations: 0,
        })
    }

    /// Asks `controller` for a decision at every epoch boundary, waiting at
    /// most `deadline`.
    pub fn with_controller(
        mut self,
        controller: impl Controller + 'static,
        deadline: Duration,
    ) -> Result<ModelTrainer> {
        self.deadline = Some(DecisionDeadline::new(
            controller,
            deadline,
            self.telemetry.clone(),
        )?);
        Ok(self)
    }

    /// The model.
    pub fn model(&self) -> &MorphogeneticModel {
        self.step.model()
    }

    /// Ends training and hands the model back (its parameters and seeds as
    /// trained; the optimizer state is dropped).
    pub fn into_model(self) -> MorphogeneticModel {
        self.step.into_model()
    }

    /// The model, for lifecycle calls between epochs.
    pub fn model_mut(&mut self) -> &mut MorphogeneticModel {
        self.step.model_mut()
    }

    /// The step (optimizers, scaler).
    pub fn step(&self) -> &ModelStep {
        &self.step
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The configuration.
    pub fn config(&self) -> &ModelTrainerConfig {
        &self.config
    }

    /// The precision in force.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Epochs trained.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// The governor, if on.
    pub fn governor(&self) -> Option<&Governor> {
        self.governor.as_ref()
    }

    /// The governor, if on, for exporting or importing its state
    /// ([`Governor::export_state`], [`Governor::import_state`]).
    pub fn governor_mut(&mut self) -> Option<&mut Governor> {
        self.governor.as_mut()
    }

    /// Seeds germinated so far (the next one is `seed-<n>`).
    pub fn germinations(&self) -> u64 {
        self.germinations
    }

    /// Continues a run from a checkpoint taken after `epoch` epochs with
    /// `germinations` seeds germinated: the next epoch is `epoch`, it
    /// shuffles as that epoch of the original run did
    /// ([`StagedData::set_epoch`]), and the next seed is
    /// `seed-<germinations>`. [`ModelTrainer::restore`] calls it after it
    /// has put the model, optimizer and governor state back.
    pub fn resume_at(&mut self, epoch: usize, germinations: u64) {
        self.epoch = epoch;
        self.germinations = germinations;
        self.train
            .set_epoch(u64::try_from(epoch).unwrap_or(u64::MAX));
    }

    /// The training data as staged.
    pub fn train_data(&self) -> &StagedData {
        &self.train
    }

    /// The validation data as staged, if any.
    pub fn validation_data(&self) -> Option<&StagedData> {
        self.validation.as_ref()
    }

    /// Trains one epoch and runs its boundary (see the module docs).
    pub fn train_epoch(&mut self) -> Result<ModelEpochReport> {
        self.launch_epoch()?;
        let mut trained = self.finish_training()?;
        let validation = self.validate()?;
        self.judge(&mut trained)?;
        let mut decision = None;
        if !trained.rolled_back() {
            self.record_validation(&mut trained, validation)?;
            self.measure_contributions()?;
            if let Some(deadline) = self.deadline.as_mut() {
                let metrics = EpochMetrics {
                    train_loss: trained.train.loss,
                    train_accuracy: trained.train.accuracy,
                    val_loss: validation.map_or(trained.train.loss, |v| v.loss),
                    val_accuracy: validation.map_or(trained.train.accuracy, |v| v.accuracy),
                };
                let epoch_u32 = u32::try_from(trained.epoch).unwrap_or(u32::MAX);
                let observation =
                    EpochObservation::from_model(self.step.model(), epoch_u32, metrics)?;
                let outcome = deadline.decide(&observation);
                let applied = self.apply_or_refuse(&outcome.decision(), epoch_u32);
                decision = Some((outcome, applied));
            }
        } else {
            trained.validation = validation;
        }
        self.conclude_epoch(trained, decision)
    }

    /// Carries out a controller's decision; a refused one changes nothing,
    /// is reported as [`Applied::Refused`] and emits
    /// `tolaria.decision.refused`, and the epoch goes on as WAIT.
    fn apply_or_refuse(&mut self, decision: &crate::controller::Decision, epoch: u32) -> Applied {
        match self.apply_decision(decision) {
            Ok(applied) => applied,
            Err(error) => {
                let reason = error.to_string();
                self.telemetry.emit_event(
                    leyline::telemetry::sources::TOLARIA,
                    names::TOLARIA_DECISION_REFUSED,
                    "controller decision refused; WAIT applied",
                    vec![
                        ("epoch", epoch.to_string()),
                        ("op", decision.op.name().to_owned()),
                        ("reason", reason.clone()),
                    ],
                );
                Applied::Refused {
                    op: decision.op,
                    reason,
                }
            }
        }
    }

    fn emit(
        &self,
        train: &EngineEpoch,
        validation: Option<&Validation>,
        grad_agg: Option<&GradAggMetrics>,
    ) {
        if !self.telemetry.is_enabled() {
            return;
        }
        let fallbacks = train
            .events
            .iter()
            .filter(|event| event.name == names::TOLARIA_GRAPH_FALLBACK)
            .count();
        let level = if fallbacks > 0 {
            TelemetryLevel::Warning
        } else {
            TelemetryLevel::Info
        };
        let mut packet = TelemetryPacket::new(leyline::telemetry::sources::TOLARIA, level)
            .with_metric(metric(names::TOLARIA_TRAINING_LATENCY_MS, train.epoch_ms))
            .with_metric(metric(
                names::TOLARIA_TRAIN_GRAPH_ENABLED,
                f64::from(u8::from(train.graph_enabled())),
            ));
        let h2d = train
            .h2d_ms
            .or_else(|| self.train.h2d_ms().filter(|_| self.epoch == 0));
        if let Some(h2d) = h2d {
            packet = packet.with_metric(metric(names::TOLARIA_H2D_COPY_MS, h2d));
        }
        if let Some(validation) = validation {
            packet = packet
                .with_metric(metric(
                    names::TOLARIA_VALIDATION_LATENCY_MS,
                    validation.elapsed_ms,
                ))
                .with_metric(metric(names::TOLARIA_VALIDATION_LOSS, validation.loss))
                .with_metric(metric(
                    names::TOLARIA_VALIDATION_ACCURACY,
                    validation.accuracy,
                ));
            let sequences = self
                .validation
                .as_ref()
                .is_some_and(|data| data.labels().dim() == 2);
            let perplexity = validation.loss.exp();
            if sequences && perplexity.is_finite() {
                packet =
                    packet.with_metric(metric(names::TOLARIA_VALIDATION_PERPLEXITY, perplexity));
            }
        }
        if let Some(capture_ms) = train.capture_ms {
            packet = packet.with_metric(metric(names::TOLARIA_GRAPH_CAPTURE_MS, capture_ms));
        }
        if fallbacks > 0 {
            packet = packet.with_metric(metric(
                names::TOLARIA_GRAPH_FALLBACK_TOTAL,
                fallbacks as f64,
            ));
        }
        for grad_metric in grad_agg.map(GradAggMetrics::telemetry).unwrap_or_default() {
            packet = packet.with_metric(grad_metric);
        }
        for event in &train.events {
            packet = packet.with_event(event.clone());
        }
        self.telemetry.emit_packet(packet);
        self.step.model().emit_seed_metrics();
    }
}

/// `Ok(None)` for gradient figures refused as non-finite or impossible;
/// other errors pass.
fn unusable_as_none<T>(result: Result<T>) -> Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(Error::SeedMetrics { .. } | Error::InvalidMetric { .. } | Error::GradAgg { .. }) => {
            Ok(None)
        }
        Err(other) => Err(other),
    }
}
