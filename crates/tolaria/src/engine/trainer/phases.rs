//! The phases of an epoch, for drivers that run many trainers side by side.
//!
//! [`ModelTrainer::train_epoch`] is these phases in order, with the
//! trainer's own validation and decision. A vectorized driver (Simic's
//! environments) calls them itself so that every environment's epoch is
//! queued before any is read back, validation and counterfactuals can come
//! from one fused pass, and one batched policy forward decides for all:
//!
//! 1. [`ModelTrainer::launch_epoch`]: the steps, queued on the trainer's
//!    compute stream, nothing read back;
//! 2. [`ModelTrainer::finish_training`]: the epoch's one readback and the
//!    deferred gradient metrics, recorded on the seeds;
//! 3. validation (the trainer's [`ModelTrainer::validate`], or the driver's
//!    own) and [`ModelTrainer::judge`]: the governor's verdict and rollback;
//! 4. [`ModelTrainer::record_validation`] and, for a driver with its own
//!    counterfactual pass, [`ModelTrainer::set_contributions`] (skipped after
//!    a rollback);
//! 5. the decision, carried out by [`ModelTrainer::apply_decision`];
//! 6. [`ModelTrainer::conclude_epoch`]: Kasmina's epoch tick, telemetry, the
//!    next epoch.

use kasmina::groups::GroupKey;
use kasmina::host::SlotId;

use super::{ModelEpochReport, ModelTrainer, Validation, unusable_as_none};
use crate::controller::{Applied, DeadlineOutcome, Decision};
use crate::engine::EngineEpoch;
use crate::error::{Error, Result};
use crate::governor::{RollbackReport, Verdict};
use crate::grad_agg::GradAggMetrics;

/// An epoch between [`ModelTrainer::finish_training`] and
/// [`ModelTrainer::conclude_epoch`].
#[derive(Debug)]
pub struct TrainedEpoch {
    /// Zero-based epoch.
    pub epoch: usize,
    /// The engine's figures.
    pub train: EngineEpoch,
    /// The aggregation counters (`None` when a non-finite gradient made them
    /// unusable).
    pub grad_agg: Option<GradAggMetrics>,
    /// Validation, once recorded.
    pub validation: Option<Validation>,
    /// The governor's verdict, once judged (`None` without a governor).
    pub verdict: Option<Verdict>,
    /// The rollback, when the governor panicked.
    pub rollback: Option<RollbackReport>,
}

impl TrainedEpoch {
    /// Whether the governor rolled the model back this epoch.
    pub fn rolled_back(&self) -> bool {
        self.rollback.is_some()
    }
}

impl ModelTrainer {
    /// Phase 1: queues the epoch's steps on the compute stream
    /// ([`crate::engine::Engine::launch_epoch`]); nothing is read back.
    pub fn launch_epoch(&mut self) -> Result<()> {
        self.engine.launch_epoch(&mut self.step, &self.train)
    }

    /// Phase 2: reads the launched epoch back (one synchronisation) and
    /// records the deferred gradient metrics on each seed's slot.
    pub fn finish_training(&mut self) -> Result<TrainedEpoch> {
        let train = self.engine.finish_epoch(&self.train)?;
        // A non-finite gradient (a diverged epoch, an fp16 step the scaler
        // skipped) makes the epoch's gradient figures unusable: they are
        // dropped (the accumulators are zeroed either way), the seeds keep
        // their last measurement, and the governor judges the loss.
        let seed_metrics = unusable_as_none(self.step.take_seed_metrics())?;
        let grad_agg = unusable_as_none(self.step.take_grad_agg_metrics())?;
        let seeds = seed_metrics
            .map(|metrics| metrics.seeds)
            .unwrap_or_default();
        for seed in &seeds {
            if let (GroupKey::Seed(slot), Some((seed_norm, host_norm, host_params))) =
                (seed.group.key, seed.record_arguments())
            {
                self.step
                    .model_mut()
                    .slot_mut(slot)
                    .and_then(|slot| slot.record_gradient_norms(seed_norm, host_norm, host_params))
                    .map_err(|source| Error::Lifecycle {
                        op: "record_gradient_norms",
                        source,
                    })?;
            }
        }
        Ok(TrainedEpoch {
            epoch: self.epoch,
            train,
            grad_agg,
            validation: None,
            verdict: None,
            rollback: None,
        })
    }

    /// Phase 3: the governor judges the epoch's training loss. A panic rolls
    /// the model back to its last snapshot (recorded in `trained`); a
    /// healthy epoch takes the snapshot when one is due. Without a governor
    /// a non-finite loss is [`Error::NonFiniteLoss`].
    pub fn judge(&mut self, trained: &mut TrainedEpoch) -> Result<()> {
        let epoch = trained.epoch;
        let loss = trained.train.loss;
        if let Some(governor) = self.governor.as_mut() {
            let judged = governor.check(loss);
            trained.verdict = Some(judged);
            match judged {
                Verdict::Panic(reason) => {
                    let (model, optimizers) = self.step.model_and_optimizers();
                    let report = self.engine.on_compute_stream(|| {
                        governor.rollback(model, optimizers, &self.telemetry, reason)
                    })?;
                    trained.rollback = Some(report);
                }
                Verdict::Healthy if governor.snapshot_due(epoch) => {
                    let model = self.step.model();
                    self.engine
                        .on_compute_stream(|| governor.snapshot(model, epoch))?;
                }
                Verdict::Healthy | Verdict::Anomaly { .. } => {}
            }
            Ok(())
        } else if loss.is_finite() {
            Ok(())
        } else {
            Err(Error::NonFiniteLoss {
                phase: "training",
                epoch,
                value: loss,
            })
        }
    }

    /// Phase 4: keeps `validation` with the epoch and, unless the epoch was
    /// rolled back, records the accuracies on every live seed
    /// ([`kasmina::model::MorphogeneticModel::record_accuracy`]; validation
    /// accuracy, or the training accuracy without validation). Non-finite
    /// figures are not recorded.
    pub fn record_validation(
        &mut self,
        trained: &mut TrainedEpoch,
        validation: Option<Validation>,
    ) -> Result<()> {
        trained.validation = validation;
        if trained.rolled_back() {
            return Ok(());
        }
        let val_accuracy = validation.map_or(trained.train.accuracy, |v| v.accuracy);
        let val_loss = validation.map_or(trained.train.loss, |v| v.loss);
        if trained.train.loss.is_finite() && val_loss.is_finite() && val_accuracy.is_finite() {
            self.step
                .model_mut()
                .record_accuracy(trained.train.accuracy, val_accuracy)
                .map_err(|source| Error::Lifecycle {
                    op: "record_accuracy",
                    source,
                })?;
        }
        Ok(())
    }

    /// Sets counterfactual contributions (accuracy with the seed minus
    /// without it, percentage points) measured by the driver, e.g. from a
    /// fused counterfactual pass, instead of the trainer's own
    /// measurement. Kasmina refuses a slot without a seed or a value that
    /// is not finite or outside ±100 percentage points; every pair is
    /// checked before any is recorded, so a refused call records nothing.
    pub fn set_contributions(&mut self, contributions: &[(SlotId, f64)]) -> Result<()> {
        for &(slot, contribution) in contributions {
            let model = self.step.model();
            model
                .slot(slot)
                .and_then(|found| {
                    if found.state().is_none() {
                        return Err(kasmina::Error::NoSeed {
                            slot: slot.to_string(),
                        });
                    }
                    kasmina::validate::in_range(
                        "counterfactual_contribution",
                        contribution,
                        -leyline::codec::MAX_ABS_PERCENTAGE_POINTS,
                        leyline::codec::MAX_ABS_PERCENTAGE_POINTS,
                    )
                })
                .map_err(|source| Error::Lifecycle {
                    op: "set_counterfactual_contribution",
                    source,
                })?;
        }
        for &(slot, contribution) in contributions {
            self.step
                .model_mut()
                .slot_mut(slot)
                .and_then(|slot| slot.set_counterfactual_contribution(contribution))
                .map_err(|source| Error::Lifecycle {
                    op: "set_counterfactual_contribution",
                    source,
                })?;
        }
        Ok(())
    }

    /// Phase 5: carries `decision` out through Kasmina
    /// ([`crate::controller::apply`]); germinated seeds are named
    /// `seed-<n>` in order. Kasmina's typed errors refuse illegal
    /// decisions, and the model is unchanged then.
    pub fn apply_decision(&mut self, decision: &Decision) -> Result<Applied> {
        let seed_id = format!("seed-{}", self.germinations);
        let applied = crate::controller::apply(decision, self.step.model_mut(), &seed_id)?;
        if matches!(applied, Applied::Germinated { .. }) {
            self.germinations = self.germinations.saturating_add(1);
        }
        Ok(applied)
    }

    /// Phase 6: Kasmina's epoch tick (alpha schedules, cooldowns), the
    /// epoch's telemetry, and the next epoch.
    pub fn conclude_epoch(
        &mut self,
        trained: TrainedEpoch,
        decision: Option<(DeadlineOutcome, Applied)>,
    ) -> Result<ModelEpochReport> {
        self.step
            .model_mut()
            .step_epoch()
            .map_err(|source| Error::Lifecycle {
                op: "step_epoch",
                source,
            })?;
        self.emit(
            &trained.train,
            trained.validation.as_ref(),
            trained.grad_agg.as_ref(),
        );
        self.epoch = self.epoch.saturating_add(1);
        Ok(ModelEpochReport {
            epoch: trained.epoch,
            train: trained.train,
            validation: trained.validation,
            verdict: trained.verdict,
            rollback: trained.rollback,
            decision,
            grad_agg: trained.grad_agg,
            active_seeds: self.step.model().active_seed_count(),
        })
    }
}
