//! The trainer's evaluation at an epoch boundary: validation on the
//! held-out set (inference mode, evaluation-mode forward, the training
//! precision, one readback) and the counterfactual contribution of every
//! blending or holding seed.

use std::time::Instant;

use leyline::SeedStage;
use tch::{Device, Kind, Reduction, Tensor};

use super::ModelTrainer;
use crate::error::{Error, Result, TorchResultExt};

/// Validation figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validation {
    /// Mean loss.
    pub loss: f64,
    /// Accuracy, percent.
    pub accuracy: f64,
    /// Wall time, ms.
    pub elapsed_ms: f64,
}

impl ModelTrainer {
    /// Sets the counterfactual contribution (accuracy with the seed minus
    /// without it, percentage points) of every seed in BLENDING or later, on
    /// the first `counterfactual_samples` validation samples (training
    /// samples without a validation set).
    pub(super) fn measure_contributions(&mut self) -> Result<()> {
        let samples = self.config.counterfactual_samples;
        if samples == 0 {
            return Ok(());
        }
        let data = self.validation.as_ref().unwrap_or(&self.train);
        let len = i64::try_from(samples.min(data.len())).unwrap_or(1);
        let device = self.step.model().device();
        let inputs = data
            .inputs()
            .f_narrow(0, 0, len)
            .op("narrow")?
            .f_to_device(device)
            .op("to device")?;
        let labels = data
            .labels()
            .f_narrow(0, 0, len)
            .op("narrow")?
            .f_to_device(device)
            .op("to device")?;
        let slots: Vec<_> = self
            .step
            .model()
            .slots()
            .iter()
            .filter(|slot| {
                slot.stage()
                    .is_some_and(|stage| matches!(stage, SeedStage::Blending | SeedStage::Holding))
            })
            .map(|slot| slot.id())
            .collect();
        for slot in slots {
            let model = self.step.model();
            let contribution = self.engine.on_compute_stream(|| {
                let _inference = torch_ext::InferenceModeGuard::new()?;
                kasmina::attribution::counterfactual_contribution(model, slot, &inputs, &labels)
                    .map_err(|source| Error::Lifecycle {
                        op: "counterfactual_contribution",
                        source,
                    })
            })?;
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

    /// Validation loss and accuracy on the validation set (`None` without
    /// one): inference mode, evaluation-mode forward, the training
    /// precision, one readback.
    pub fn validate(&mut self) -> Result<Option<Validation>> {
        let Some(data) = &self.validation else {
            return Ok(None);
        };
        let started = Instant::now();
        let model = self.step.model();
        let batch = i64::try_from(self.config.validation_batch_size).unwrap_or(i64::MAX);
        let precision = self.precision;
        let device = model.device();
        let (loss, correct, samples) = self.engine.on_compute_stream(|| {
            let _inference = torch_ext::InferenceModeGuard::new()?;
            let _autocast = precision.autocast(device, true)?;
            let sums = Tensor::f_zeros([2], (Kind::Float, device)).op("validation sums")?;
            for (start, len) in data.plan(batch, false)? {
                let inputs = data.inputs().f_narrow(0, start, len).op("narrow")?;
                let labels = data.labels().f_narrow(0, start, len).op("narrow")?;
                let logits = model
                    .forward(&inputs, false)
                    .map_err(|source| Error::Lifecycle {
                        op: "validation forward",
                        source,
                    })?
                    .f_to_kind(Kind::Float)
                    .op("to f32")?;
                // A language model's logits `[B, T, V]` and targets `[B, T]`:
                // one prediction per token.
                let classes = logits.size().last().copied().unwrap_or(1);
                let logits = logits.f_reshape([-1, classes]).op("flatten logits")?;
                let labels = labels.f_reshape([-1]).op("flatten labels")?;
                let loss = logits
                    .f_cross_entropy_loss::<Tensor>(&labels, None, Reduction::Sum, -100, 0.0)
                    .op("validation loss")?;
                let hits = logits
                    .f_argmax(-1, false)
                    .op("argmax")?
                    .f_eq_tensor(&labels)
                    .op("eq")?
                    .f_sum(Kind::Float)
                    .op("sum")?;
                let row = Tensor::f_stack(&[loss, hits], 0).op("stack")?;
                let _ = sums.shallow_clone().f_add_(&row).op("add")?;
            }
            let values = Vec::<f32>::try_from(&sums.f_to_device(Device::Cpu).op("readback")?)
                .op("to vec")?;
            match values.as_slice() {
                [loss, correct] => Ok((
                    f64::from(*loss),
                    f64::from(*correct),
                    // Predictions: samples, or tokens for a language model.
                    data.labels().numel() as f64,
                )),
                other => Err(Error::Readback {
                    what: "validation sums",
                    expected: 2,
                    got: other.len(),
                }),
            }
        })?;
        Ok(Some(Validation {
            loss: loss / samples,
            accuracy: 100.0 * correct / samples,
            elapsed_ms: started.elapsed().as_secs_f64() * 1000.0,
        }))
    }
}
