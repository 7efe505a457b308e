//! The special reference path's training step (`tolaria-reference`): a
//! linear layer, softmax cross-entropy and SGD with momentum with a
//! hand-derived backward, on device-resident state. The general step of
//! every other workload is the engine's
//! [`ModelStep`](crate::engine::model_step::ModelStep).
//!
//! Two implementations share the same state and the same metric buffer:
//!
//! - [`StepKind::Fused`]: the backward is derived by hand. For logits
//!   `z = x W^T` and batch-mean cross-entropy, `dL/dz = (softmax(z) - onehot) / B`,
//!   which is exactly what `_log_softmax_backward_data` computes from the
//!   log-probabilities and the packed `grad_seed = -onehot / B` (one kernel);
//!   the gradient of the `[C, F + 1]` weight-and-bias matrix is one matrix
//!   product, and the momentum update is one fused multi-tensor SGD kernel
//!   where torch-ext provides it (else three elementwise/GEMM kernels).
//! - [`StepKind::Autograd`]: libtorch autograd computes the gradient
//!   (`torch::autograd::grad`, so no `.grad` is ever stored: grads stay None),
//!   followed by the same device-resident SGD update.
//!
//! Neither reads anything back to the host: the batch-mean loss and a
//! `[pred, target]` confusion matrix accumulate in one device buffer that the
//! trainer reads once per epoch. Every op is capturable in a CUDA graph.

use tch::{Kind, Reduction, Tensor};

use super::config::{MAX_TRAINER_CLASSES, MAX_TRAINER_FEATURES, StepKind};
use crate::data::MicrobatchSpan;
use crate::error::{Error, Result, TorchResultExt};

/// The tensors one step reads, as views into a packed microbatch buffer.
#[derive(Debug)]
pub struct StepViews {
    /// `[B, C]`: `-onehot / B`, the loss gradient with respect to the
    /// log-probabilities.
    pub grad_seed: Tensor,
    /// `[B * C, 1]`: the same values as a column, for the loss dot product.
    pub grad_seed_column: Tensor,
    /// `[B, C]`: one-hot targets.
    pub onehot: Tensor,
    /// `[B, F + 1]`: inputs with a constant 1 column for the bias.
    pub inputs: Tensor,
    /// Samples in the microbatch.
    pub batch: usize,
}

impl StepViews {
    /// Views of the microbatch at `span` inside the flat buffer `packed`.
    pub fn new(
        packed: &Tensor,
        span: MicrobatchSpan,
        n_features: usize,
        n_classes: usize,
    ) -> Result<StepViews> {
        let too_large = || Error::InvalidData {
            field: "span",
            reason: format!(
                "{span:?} with {n_features} features and {n_classes} classes does not fit i64 offsets"
            ),
        };
        // The whole span must be counted in usize and lie inside the buffer,
        // whatever the batch (an empty batch with absurd sizes included).
        let end = span
            .len(n_features, n_classes)?
            .checked_add(span.offset)
            .ok_or_else(too_large)?;
        if end > packed.numel() {
            return Err(Error::InvalidData {
                field: "span",
                reason: format!(
                    "{span:?} with {n_features} features and {n_classes} classes ends at {end}, \
                     past the packed buffer's {} values",
                    packed.numel()
                ),
            });
        }
        let to_i64 = |value: usize| i64::try_from(value).map_err(|_| too_large());
        let batch = to_i64(span.batch)?;
        let classes = to_i64(n_classes)?;
        let columns = to_i64(n_features)?.checked_add(1).ok_or_else(too_large)?;
        let offset = to_i64(span.offset)?;
        let block_len = batch.checked_mul(classes).ok_or_else(too_large)?;
        let onehot_at = offset.checked_add(block_len).ok_or_else(too_large)?;
        let inputs_at = onehot_at.checked_add(block_len).ok_or_else(too_large)?;
        batch.checked_mul(columns).ok_or_else(too_large)?;
        let block = |start: i64, rows: i64, cols: i64| -> Result<Tensor> {
            // rows x cols was checked above for every block.
            packed
                .f_narrow(0, start, rows.saturating_mul(cols))
                .op("narrow")?
                .f_view([rows, cols])
                .op("view")
        };
        let grad_seed = block(offset, batch, classes)?;
        let grad_seed_column = block(offset, block_len, 1)?;
        let onehot = block(onehot_at, batch, classes)?;
        let inputs = block(inputs_at, batch, columns)?;
        Ok(StepViews {
            grad_seed,
            grad_seed_column,
            onehot,
            inputs,
            batch: span.batch,
        })
    }

    /// The shape key graphs are captured for.
    pub fn shape(&self) -> Vec<i64> {
        self.inputs.size()
    }
}

/// Parameters, optimizer state and the epoch's metric accumulators.
///
/// This is the reference fast path's own, hand-fused SGD state, the one
/// special path outside [`crate::optim`]: its gradient is written by one
/// matrix product into a buffer (not `.grad`), and without torch-ext's fused
/// kernel the momentum update folds the gradient product in (`addmm_`), so
/// [`crate::optim::GroupOptimizer`] (which adds a device step count and reads
/// `.grad`) would change the `tolaria-reference` kernel count and figures.
/// Every other optimizer state belongs to [`crate::optim::GroupOptimizers`].
#[derive(Debug)]
pub struct LinearCeState {
    kind: StepKind,
    n_classes: usize,
    /// `[C, F + 1]` weight columns then the bias column.
    params: Tensor,
    /// `[C, F + 1]` SGD momentum buffer (zero-initialised, so the first update
    /// equals PyTorch's `buf = grad`).
    momentum: Tensor,
    /// `[C, F + 1]` gradient buffer written by the fused step's matrix product.
    grad: Tensor,
    /// 0-dim `-lr` on the device (the parameter update multiplies by it).
    neg_lr: Tensor,
    learning_rate: f64,
    momentum_factor: f64,
    /// Shallow handles of params, grad and momentum for torch-ext's fused SGD
    /// (`at::_fused_sgd_`, one kernel); `None`: three separate kernels.
    fused_sgd: Option<[Vec<Tensor>; 3]>,
    /// `[1 + C * C]`: summed batch-mean loss, then the confusion matrix.
    metrics: Tensor,
    loss_sum: Tensor,
    confusion: Tensor,
}

/// What a metric buffer holds after an epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochMetrics {
    /// Mean of the microbatch mean losses.
    pub loss: f64,
    /// Correctly classified samples.
    pub correct: usize,
    /// Samples seen.
    pub samples: usize,
}

impl EpochMetrics {
    /// Fraction of samples classified correctly.
    pub fn accuracy(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.correct as f64 / self.samples as f64
        }
    }
}

impl LinearCeState {
    /// State on `device` from row-major `[C, F + 1]` initial parameters.
    pub fn new(
        kind: StepKind,
        initial_parameters: &[f32],
        n_features: usize,
        n_classes: usize,
        learning_rate: f64,
        momentum_factor: f64,
        device: tch::Device,
    ) -> Result<LinearCeState> {
        let invalid = |field: &'static str, reason: String| Error::InvalidConfig { field, reason };
        if !(1..=MAX_TRAINER_FEATURES).contains(&n_features) {
            return Err(invalid(
                "n_features",
                format!("{n_features} is outside 1..={MAX_TRAINER_FEATURES}"),
            ));
        }
        if !(2..=MAX_TRAINER_CLASSES).contains(&n_classes) {
            return Err(invalid(
                "n_classes",
                format!("{n_classes} is outside 2..={MAX_TRAINER_CLASSES}"),
            ));
        }
        let lr_f32 = learning_rate as f32;
        if !(learning_rate > 0.0 && lr_f32.is_finite() && lr_f32 > 0.0) {
            return Err(invalid(
                "learning_rate",
                format!(
                    "{learning_rate} is not a finite positive number representable as a positive f32"
                ),
            ));
        }
        if !(0.0..1.0).contains(&momentum_factor) {
            return Err(invalid(
                "momentum",
                format!("{momentum_factor} is outside [0, 1)"),
            ));
        }
        // Bounded above: C <= 2^10 and F + 1 <= 2^16 + 1, so these fit an
        // i64 and the saturating operations never saturate.
        let n_parameters = n_classes.saturating_mul(n_features.saturating_add(1));
        if initial_parameters.len() != n_parameters {
            return Err(Error::InvalidData {
                field: "initial_parameters",
                reason: format!(
                    "{} values for a [{n_classes}, {} + 1] matrix of {n_parameters}",
                    initial_parameters.len(),
                    n_features
                ),
            });
        }
        if let Some((index, value)) = initial_parameters
            .iter()
            .enumerate()
            .find(|(_, value)| !value.is_finite())
        {
            return Err(Error::InvalidData {
                field: "initial_parameters",
                reason: format!("value {index} is {value}, not finite"),
            });
        }
        let confusion_len = n_classes.saturating_mul(n_classes) as i64;
        let shape = [n_classes as i64, (n_features as i64).saturating_add(1)];
        let params = Tensor::f_from_slice(initial_parameters)
            .op("from_slice")?
            .f_view(shape)
            .op("view")?
            .f_to_device(device)
            .op("to_device")?;
        let params = if kind == StepKind::Autograd {
            params.f_set_requires_grad(true).op("set_requires_grad")?
        } else {
            params
        };
        let zeros = |shape: &[i64]| Tensor::f_zeros(shape, (Kind::Float, device)).op("zeros");
        let momentum = zeros(&shape)?;
        let grad = zeros(&shape)?;
        let neg_lr = Tensor::f_from_slice(&[-lr_f32])
            .op("from_slice")?
            .f_view([] as [i64; 0])
            .op("view")?
            .f_to_device(device)
            .op("to_device")?;
        let metrics = zeros(&[confusion_len.saturating_add(1)])?;
        let loss_sum = metrics
            .f_narrow(0, 0, 1)
            .op("narrow")?
            .f_view([1, 1])
            .op("view")?;
        let confusion = metrics
            .f_narrow(0, 1, confusion_len)
            .op("narrow")?
            .f_view([n_classes as i64, n_classes as i64])
            .op("view")?;
        Ok(LinearCeState {
            kind,
            n_classes,
            params,
            momentum,
            grad,
            neg_lr,
            learning_rate,
            momentum_factor,
            fused_sgd: None,
            metrics,
            loss_sum,
            confusion,
        })
    }

    /// Chooses the fused step's optimizer update: torch-ext's fused SGD
    /// kernel (`at::_fused_sgd_`) or `mul_` + `addmm_` + `addcmul_`. Without
    /// momentum the fused kernel takes no buffer list (libtorch refuses one),
    /// and plain SGD is the same update as the unfused path's.
    pub fn set_fused_sgd(&mut self, enabled: bool) {
        let momentum = if self.momentum_factor == 0.0 {
            Vec::new()
        } else {
            vec![self.momentum.shallow_clone()]
        };
        self.fused_sgd = enabled.then(|| {
            [
                vec![self.params.shallow_clone()],
                vec![self.grad.shallow_clone()],
                momentum,
            ]
        });
    }

    /// Whether the fused step updates with a single fused SGD kernel.
    pub fn uses_fused_sgd(&self) -> bool {
        self.kind == StepKind::Fused && self.fused_sgd.is_some()
    }

    /// The step implementation.
    pub fn kind(&self) -> StepKind {
        self.kind
    }

    /// The `[C, F + 1]` parameter matrix (weight columns, then bias).
    pub fn parameters(&self) -> &Tensor {
        &self.params
    }

    /// The device metric buffer (`[1 + C * C]`).
    pub fn metric_buffer(&self) -> &Tensor {
        &self.metrics
    }

    /// Zeroes the loss and confusion accumulators (one memset).
    pub fn reset_metrics(&mut self) -> Result<()> {
        let _ = self.metrics.f_zero_().op("zero_")?;
        Ok(())
    }

    /// One training step on `views`: forward, loss, backward, SGD update,
    /// metric accumulation. Launches device work only; reads nothing back.
    pub fn step(&mut self, views: &StepViews) -> Result<()> {
        match self.kind {
            StepKind::Fused => self.fused_step(views),
            StepKind::Autograd => self.autograd_step(views),
        }
    }

    fn fused_step(&mut self, views: &StepViews) -> Result<()> {
        // [B, C] = [B, F + 1] x [F + 1, C]
        let logits = views.inputs.f_mm(&self.params.f_tr().op("t")?).op("mm")?;
        let log_probs = logits.f_log_softmax(1, None::<Kind>).op("log_softmax")?;
        // [B, C] = (softmax - onehot) / B
        let grad_logits = Tensor::f_internal_log_softmax_backward_data(
            &views.grad_seed,
            &log_probs,
            1,
            Kind::Float,
        )
        .op("_log_softmax_backward_data")?;
        match &self.fused_sgd {
            Some([params, grad, momentum]) => {
                // [C, F + 1] = [C, B] x [B, F + 1]
                let _ = grad_logits
                    .f_tr()
                    .op("t")?
                    .f_mm_out(&self.grad, &views.inputs)
                    .op("mm_out")?;
                // momentum = m * momentum + grad; params -= lr * momentum.
                torch_ext::fused::sgd_step(
                    params,
                    grad,
                    momentum,
                    self.learning_rate,
                    self.momentum_factor,
                    0.0,
                    0.0,
                    false,
                    false,
                )?;
            }
            None => {
                let _ = self
                    .momentum
                    .f_mul_scalar_(self.momentum_factor)
                    .op("mul_")?;
                let _ = self
                    .momentum
                    .f_addmm_(&grad_logits.f_tr().op("t")?, &views.inputs)
                    .op("addmm_")?;
                let _ = self
                    .params
                    .f_addcmul_(&self.momentum, &self.neg_lr)
                    .op("addcmul_")?;
            }
        }
        // loss_sum += sum(log_probs * -onehot / B) = the batch-mean cross-entropy.
        let _ = self
            .loss_sum
            .f_addmm_(
                &log_probs.f_view([1, -1]).op("view")?,
                &views.grad_seed_column,
            )
            .op("addmm_")?;
        self.accumulate_confusion(&logits, views)
    }

    fn autograd_step(&mut self, views: &StepViews) -> Result<()> {
        let logits = views.inputs.f_mm(&self.params.f_tr().op("t")?).op("mm")?;
        let loss = logits
            .f_cross_entropy_loss::<Tensor>(&views.onehot, None, Reduction::Mean, -100, 0.0)
            .op("cross_entropy")?;
        let mut grads =
            Tensor::f_run_backward(&[&loss], &[&self.params], false, false).op("autograd::grad")?;
        let grad = grads.pop().ok_or(Error::Readback {
            what: "autograd gradient",
            expected: 1,
            got: 0,
        })?;
        let _no_grad = tch::no_grad_guard();
        let _ = self
            .momentum
            .f_mul_scalar_(self.momentum_factor)
            .op("mul_")?;
        let _ = self.momentum.f_add_(&grad).op("add_")?;
        let _ = self
            .params
            .f_addcmul_(&self.momentum, &self.neg_lr)
            .op("addcmul_")?;
        let _ = self
            .loss_sum
            .f_add_(&loss.f_detach().op("detach")?.f_view([1, 1]).op("view")?)
            .op("add_")?;
        self.accumulate_confusion(&logits.f_detach().op("detach")?, views)
    }

    fn accumulate_confusion(&mut self, logits: &Tensor, views: &StepViews) -> Result<()> {
        let predicted = logits.f_argmax(1, false).op("argmax")?;
        // confusion[pred_i, :] += onehot_i
        let _ = self
            .confusion
            .f_index_add_(0, &predicted, &views.onehot)
            .op("index_add_")?;
        Ok(())
    }

    /// Interprets a metric buffer read back to the host.
    ///
    /// The loss is returned as read (a diverged run gives NaN or an
    /// infinity: the trainer reports that as
    /// [`Error::NonFiniteLoss`]); the confusion diagonal must be a
    /// finite count of at most `samples`.
    ///
    /// # Errors
    /// [`Error::Readback`] for a buffer of the wrong length,
    /// [`Error::InvalidMetric`] for an impossible count of correct
    /// samples.
    pub fn interpret_metrics(
        &self,
        values: &[f32],
        n_steps: usize,
        samples: usize,
    ) -> Result<EpochMetrics> {
        let classes = self.n_classes;
        let expected = classes
            .checked_mul(classes)
            .and_then(|len| len.checked_add(1))
            .unwrap_or(usize::MAX);
        let (Some((&loss_sum, confusion)), true) = (values.split_first(), values.len() == expected)
        else {
            return Err(Error::Readback {
                what: "epoch metrics",
                expected,
                got: values.len(),
            });
        };
        // The diagonal of the row-major [C, C] confusion matrix.
        let correct: f64 = confusion
            .iter()
            .step_by(classes.saturating_add(1))
            .map(|&count| f64::from(count))
            .sum();
        if !(correct.is_finite() && (0.0..=samples as f64 + 0.5).contains(&correct)) {
            return Err(Error::InvalidMetric {
                what: "correct",
                value: correct,
            });
        }
        Ok(EpochMetrics {
            loss: f64::from(loss_sum) / n_steps.max(1) as f64,
            // A finite count in [0, samples + 0.5]: the cast cannot saturate.
            correct: correct.round() as usize,
            samples,
        })
    }

    /// Evaluates `inputs` (`[n, F + 1]`) against `onehot` (`[n, C]`) without
    /// touching the training state; returns device scalars `[mean loss, correct]`.
    pub fn evaluate(&self, inputs: &Tensor, onehot: &Tensor) -> Result<Tensor> {
        let logits = inputs.f_mm(&self.params.f_tr().op("t")?).op("mm")?;
        let log_probs = logits.f_log_softmax(1, None::<Kind>).op("log_softmax")?;
        let n = inputs.size().first().copied().unwrap_or(1).max(1);
        let loss = log_probs
            .f_mul(onehot)
            .op("mul")?
            .f_sum(Kind::Float)
            .op("sum")?
            .f_div_scalar(-(n as f64))
            .op("div")?;
        let correct = logits
            .f_argmax(1, false)
            .op("argmax")?
            .f_eq_tensor(&onehot.f_argmax(1, false).op("argmax")?)
            .op("eq")?
            .f_sum(Kind::Float)
            .op("sum")?;
        Tensor::f_stack(&[loss, correct], 0).op("stack")
    }
}
