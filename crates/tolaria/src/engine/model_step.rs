//! The general step: one batch of any [`MorphogeneticModel`] with libtorch
//! autograd.
//!
//! One [`Step::run`] is, with nothing read back:
//!
//! 1. zero every group's gradients in place;
//! 2. per microbatch: the forward under autocast (bf16/fp16, or none for
//!    fp32; under bf16 the weights' casts in one launch from the layout's
//!    [`torch_ext::nn::Bf16Shadows`]), mean cross-entropy in fp32 weighted by the microbatch's share
//!    of the batch, scaled by the [`GradScaler`], backward; the loss and
//!    hits go into the engine's accumulator;
//! 3. when seeds feed the host's gradient (non-isolated seeds, i.e.
//!    transformer hosts from BLENDING on), the host gradient is split by
//!    gradient taps ([`MorphogeneticModel::forward_tapped`]) into the host's
//!    own part (the teacher) and one part per seed, and recombined by the
//!    [`GradAggregator`] (PCGrad with two or more seeds; the single-seed
//!    fast path only when [`kasmina::attribution::attribute_batch`] on a
//!    probe batch confirms one influential seed). With isolation (CNN hosts)
//!    no seed sends the host a gradient and nothing is aggregated;
//! 4. unscale (fp16), deferred gradient norms every
//!    `gradient_telemetry_stride` batches ([`SeedMetricsAccumulator`]),
//!    gradient clipping on the device (`clip_grad_norm_` with foreach
//!    kernels), the optimizer step of every group skipped on the device
//!    when the scaler found an inf, the scaler's update.
//!
//! Alphas live in device tensors: every active, blending seed's alpha is a
//! `[1, 1, 1, 1]` (CNN) or `[1, 1, 1]` (transformer) tensor given to the
//! forward as an override and refilled at each epoch boundary, so a blend
//! schedule does not change the step's [`StepKey`]; a seed still in the
//! incubator (TRAINING at alpha 0) runs through Kasmina's incubator. The key
//! holds the precision, microbatches, clipping, the aggregation path and
//! each slot's seed, stage class, blend algorithm, isolation and freeze.

mod layout;

use std::fmt::Write as _;

use kasmina::host::SlotId;
use kasmina::model::MorphogeneticModel;
use tch::{Device, Kind, Reduction, Tensor};
use torch_ext::fused;
use torch_ext::loss::{CrossEntropyWeights, FusedCrossEntropy};

use super::{Batch, EpochAccumulator, Step, StepKey};
use crate::amp::{GradScaler, GradScalerConfig, Precision};
use crate::error::{Error, Result, TorchResultExt};
use crate::grad_agg::{AggPath, GradAggMetrics, GradAggregator};
use crate::optim::{GroupOptimizers, OptimizerConfig};
use crate::seed_metrics::{EpochSeedMetrics, SeedMetricsAccumulator};
use layout::Layout;

/// Largest number of microbatches a batch may be split into.
pub const MAX_MICROBATCHES: usize = 1024;

/// What the general step does besides forward and backward.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelStepConfig {
    /// Autocast dtype (`fp32` turns AMP off).
    pub precision: Precision,
    /// The fp16 grad scaler's settings.
    pub scaler: GradScalerConfig,
    /// Microbatches per batch (gradients accumulate over them).
    pub microbatches: usize,
    /// Clip the joint L2 norm of all gradients to this (on the device).
    pub clip_grad_norm: Option<f64>,
    /// Gather gradient norms every this many batches of an epoch
    /// ([`crate::seed_metrics::NEVER`] turns it off).
    pub gradient_telemetry_stride: u64,
    /// Most seeds the aggregator holds rows for.
    pub max_seeds: usize,
    /// The optimizers of the host and of every seed.
    pub optimizer: OptimizerConfig,
    /// Keep every 4-D parameter (and so the CNN's activations) in
    /// channels-last layout, which cuDNN runs without layout conversions.
    /// Only on CUDA; ignored on the CPU.
    pub channels_last: bool,
    /// Let the fused convolutions' weight gradients run on a side stream,
    /// beside the input gradients, in captured steps
    /// (`torch_ext::nn::with_overlapped_weight_grads`, set around this
    /// step's forward passes only). A win where one step has the GPU to
    /// itself (tolaria-fmnist's graph-epoch: 47.9 to 43.1 ms); where several
    /// steps' graphs already run side by side (vectorized environments on
    /// one GPU) the fork and join gain nothing. Only on CUDA.
    pub overlap_weight_grads: bool,
}

impl Default for ModelStepConfig {
    fn default() -> Self {
        ModelStepConfig {
            precision: Precision::Fp32,
            scaler: GradScalerConfig::default(),
            microbatches: 1,
            clip_grad_norm: None,
            gradient_telemetry_stride: crate::seed_metrics::DEFAULT_GRADIENT_TELEMETRY_STRIDE,
            max_seeds: 8,
            optimizer: OptimizerConfig::default(),
            channels_last: true,
            overlap_weight_grads: true,
        }
    }
}

impl ModelStepConfig {
    /// Checks ranges: microbatches in `1..=MAX_MICROBATCHES`, a positive
    /// finite clip norm, a stride of at least 1, the optimizer settings.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_MICROBATCHES).contains(&self.microbatches) {
            return Err(Error::InvalidConfig {
                field: "microbatches",
                reason: format!("{} is outside 1..={MAX_MICROBATCHES}", self.microbatches),
            });
        }
        if let Some(norm) = self.clip_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(Error::InvalidConfig {
                field: "clip_grad_norm",
                reason: format!("{norm} must be finite and > 0"),
            });
        }
        if self.gradient_telemetry_stride == 0 {
            return Err(Error::InvalidConfig {
                field: "gradient_telemetry_stride",
                reason: "0; must be at least 1".to_owned(),
            });
        }
        self.scaler.validate()?;
        self.optimizer.validate()
    }
}

/// The general autograd step over a Kasmina model (see the module docs).
pub struct ModelStep {
    model: MorphogeneticModel,
    optimizers: GroupOptimizers,
    scaler: GradScaler,
    seed_metrics: SeedMetricsAccumulator,
    aggregator: GradAggregator,
    config: ModelStepConfig,
    device: Device,
    layout: Layout,
    /// Samples `attribute_batch` runs on to confirm a single seed.
    probe: Option<Tensor>,
    /// The last aggregation path taken (host-side record).
    last_path: Option<AggPath>,
    /// Bumped whenever parameter groups change.
    generation: u64,
    /// The key the layout was built for, and the key reported.
    key: Option<String>,
    full_key: Option<StepKey>,
    /// 4-D parameters and inputs kept channels-last (CUDA only).
    channels_last: bool,
    /// The fused cross-entropy (CUDA), or why the libtorch loss runs.
    fused_loss: std::result::Result<FusedCrossEntropy, String>,
}

impl std::fmt::Debug for ModelStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStep")
            .field("model", &self.model)
            .field("config", &self.config)
            .finish()
    }
}

impl ModelStep {
    /// The step for `model` (its parameter groups get optimizers now).
    pub fn new(mut model: MorphogeneticModel, config: ModelStepConfig) -> Result<ModelStep> {
        config.validate()?;
        let device = model.device();
        if config.precision != Precision::Fp32 && !matches!(device, Device::Cuda(_)) {
            return Err(Error::InvalidConfig {
                field: "precision",
                reason: format!(
                    "{} autocast needs a CUDA device; use fp32 on {device:?}",
                    config.precision
                ),
            });
        }
        let channels_last = config.channels_last && matches!(device, Device::Cuda(_));
        if channels_last {
            to_channels_last(&model)?;
        }
        // State for every group the model has now, whatever events an
        // earlier owner already drained (a model handed from one trainer to
        // the next has none pending).
        let _ = model.drain_group_events();
        let mut optimizers = GroupOptimizers::new(config.optimizer, device)?;
        for group in model.parameter_groups() {
            optimizers.apply(kasmina::groups::GroupEvent::Added(group.key), &model)?;
        }
        let seed_metrics = SeedMetricsAccumulator::new(
            config.gradient_telemetry_stride,
            &model.parameter_groups(),
            device,
        )?;
        let aggregator = GradAggregator::new(config.max_seeds.max(1), device)?;
        let scaler = GradScaler::for_precision(config.precision, config.scaler, device)?;
        let fused_loss = match device {
            Device::Cuda(index) => FusedCrossEntropy::new(index).map_err(|error| error.to_string()),
            other => Err(format!("the fused loss runs on CUDA, not {other:?}")),
        };
        Ok(ModelStep {
            fused_loss,
            model,
            optimizers,
            scaler,
            seed_metrics,
            aggregator,
            config,
            device,
            layout: Layout::default(),
            probe: None,
            last_path: None,
            generation: 0,
            key: None,
            full_key: None,
            channels_last,
        })
    }

    /// The model.
    pub fn model(&self) -> &MorphogeneticModel {
        &self.model
    }

    /// Whether the step runs channels-last: asked for
    /// ([`ModelStepConfig::channels_last`]) and on a CUDA device.
    pub fn channels_last(&self) -> bool {
        self.channels_last
    }

    /// Hands the model back (optimizer state dropped).
    pub fn into_model(self) -> MorphogeneticModel {
        self.model
    }

    /// The model, for lifecycle calls at epoch boundaries; the next
    /// [`Step::prepare`] adopts whatever changed.
    pub fn model_mut(&mut self) -> &mut MorphogeneticModel {
        &mut self.model
    }

    /// The model and the optimizers together (a governor rollback needs
    /// both).
    pub fn model_and_optimizers(&mut self) -> (&mut MorphogeneticModel, &mut GroupOptimizers) {
        (&mut self.model, &mut self.optimizers)
    }

    /// The optimizers.
    pub fn optimizers(&self) -> &GroupOptimizers {
        &self.optimizers
    }

    /// Why the step's loss is libtorch's `cross_entropy` rather than the
    /// fused loss kernels ([`torch_ext::loss`]); `None` when fused. The
    /// fused loss serves the plain backward; the gradient-tap path (seeds
    /// feeding the host gradient) always uses libtorch's.
    pub fn fused_loss_fallback(&self) -> Option<&str> {
        self.fused_loss.as_ref().err().map(String::as_str)
    }

    /// Turns the fused loss off (libtorch's `cross_entropy` and metric
    /// kernels) or back on where it was built; takes effect at the next
    /// step (a captured graph keeps what it captured: change it between
    /// trainers, not mid-run).
    pub fn set_fused_loss(&mut self, on: bool) -> Result<()> {
        self.fused_loss = match (on, self.device) {
            (true, Device::Cuda(index)) => {
                FusedCrossEntropy::new(index).map_err(|error| error.to_string())
            }
            (true, other) => Err(format!("the fused loss runs on CUDA, not {other:?}")),
            (false, _) => Err("turned off".to_owned()),
        };
        Ok(())
    }

    /// The grad scaler.
    pub fn scaler(&self) -> &GradScaler {
        &self.scaler
    }

    /// The configuration.
    pub fn config(&self) -> &ModelStepConfig {
        &self.config
    }

    /// The aggregation path of the last batch that had seeds feeding the
    /// host gradient.
    pub fn last_aggregation_path(&self) -> Option<AggPath> {
        self.last_path
    }

    /// Samples for the single-seed attribution check (a few dozen suffice).
    pub fn set_probe(&mut self, inputs: Tensor) {
        self.probe = Some(inputs);
    }

    /// The epoch's deferred gradient metrics (one readback; zeroes them).
    pub fn take_seed_metrics(&mut self) -> Result<EpochSeedMetrics> {
        self.seed_metrics.finish_epoch()
    }

    /// The epoch's aggregation counters (one readback; zeroes them).
    pub fn take_grad_agg_metrics(&mut self) -> Result<GradAggMetrics> {
        self.aggregator.take_epoch_metrics()
    }

    fn grads(&self) -> Result<Vec<Tensor>> {
        let mut grads = Vec::new();
        for group in &self.layout.groups {
            for tensor in &group.tensors {
                if tensor.requires_grad() {
                    let grad = tensor.f_grad().op("grad")?;
                    if grad.defined() {
                        grads.push(grad);
                    }
                }
            }
        }
        Ok(grads)
    }

    fn forward_loss(&self, inputs: &Tensor, labels: &Tensor, taps: bool) -> Result<ForwardLoss> {
        let (logits, labels, taps) = self.forward_logits(inputs, labels, taps)?;
        let loss = logits
            .f_cross_entropy_loss::<Tensor>(&labels, None, Reduction::Mean, -100, 0.0)
            .op("cross_entropy")?;
        Ok((logits, loss, labels, taps))
    }

    /// One microbatch's forward: `[N, classes]` f32 logits (token models
    /// flattened), the `[N]` labels they are scored against, and the taps.
    fn forward_logits(
        &self,
        inputs: &Tensor,
        labels: &Tensor,
        taps: bool,
    ) -> Result<ForwardLogits> {
        let overrides: Vec<Option<&Tensor>> =
            self.layout.overrides.iter().map(Option::as_ref).collect();
        // No weight-cast cache: cached casts made in one replay would be
        // stale in the next, and PyTorch requires it off under capture.
        let autocast = self.config.precision.autocast(self.device, false)?;
        // The weights' bf16 casts in one launch (torch_ext::nn::Bf16Shadows).
        let shadows = (self.config.precision == Precision::Bf16)
            .then(|| self.layout.shadows.enter())
            .transpose()?;
        // The step reads no gradient inside its backward passes, so the
        // convolutions' weight gradients may run on a side stream, beside
        // the input gradients (joined before backward returns).
        let overlap = self.config.overlap_weight_grads && matches!(self.device, Device::Cuda(_));
        let (logits, taps) = torch_ext::nn::with_overlapped_weight_grads(overlap, || {
            if taps {
                self.model.forward_tapped(inputs, &overrides, true)
            } else {
                self.model
                    .forward_with_alpha(inputs, &overrides, true)
                    .map(|logits| (logits, Vec::new()))
            }
        })
        .map_err(|source| Error::Lifecycle {
            op: "forward",
            source,
        })?;
        drop(shadows);
        drop(autocast);
        let mut logits = logits.f_to_kind(Kind::Float).op("logits to f32")?;
        let mut labels = labels.shallow_clone();
        if logits.dim() == 3 {
            // Token models: `[B, T, V]` logits against `[B, T]` labels, one
            // prediction per token.
            let classes = logits.size().last().copied().unwrap_or(1);
            logits = logits.f_reshape([-1, classes]).op("flatten tokens")?;
            labels = labels.f_reshape([-1]).op("flatten labels")?;
        }
        Ok((logits, labels, taps))
    }

    /// The tap path of one microbatch: the host gradient split into the
    /// teacher and one part per seed, aggregated and added to the host
    /// gradients; seed gradients added to the seeds'.
    fn tapped_backward(&mut self, scaled: &Tensor, taps: &[(SlotId, Tensor)]) -> Result<()> {
        let host = &self.layout.host;
        let seeds = &self.layout.seeds;
        let tap_tensors: Vec<Tensor> = taps.iter().map(|(_, tap)| tap.shallow_clone()).collect();
        let mut inputs: Vec<&Tensor> = host.iter().collect();
        inputs.extend(seeds.iter());
        inputs.extend(tap_tensors.iter());
        let grads = Tensor::f_run_backward(&[scaled], &inputs, true, false).op("backward")?;
        let (host_total, rest) = grads.split_at(host.len());
        let (seed_grads, tap_grads) = rest.split_at(seeds.len());
        let mut per_seed = Vec::with_capacity(taps.len());
        for (tap, tap_grad) in tap_tensors.iter().zip(tap_grads) {
            let root = tap
                .f_mul(&tap_grad.f_detach().op("detach")?)
                .op("tap root")?
                .f_sum(Kind::Float)
                .op("tap root sum")?;
            // Undefined where the seed sends the parameter nothing (above
            // its slot): the aggregator zeroes those rows itself.
            per_seed.push(Tensor::f_run_backward(&[root], host, true, false).op("tap backward")?);
        }
        // The teacher is the total less every seed's part, taken in the
        // aggregator's pooled rows.
        let total = dense(host_total, host)?;
        let path = self.aggregator.aggregate_total(
            &total,
            &per_seed,
            self.layout.confirmed_single,
            &self.layout.scratch,
        )?;
        self.last_path = Some(path);
        let host_grads = host
            .iter()
            .map(|tensor| tensor.f_grad().op("grad"))
            .collect::<Result<Vec<_>>>()?;
        fused::foreach_add_(&host_grads, &self.layout.scratch, 1.0)?;
        let mut seed_dst = Vec::new();
        let mut seed_src = Vec::new();
        for (tensor, grad) in seeds.iter().zip(seed_grads) {
            if grad.defined() {
                seed_dst.push(tensor.f_grad().op("grad")?);
                seed_src.push(grad.shallow_clone());
            }
        }
        if !seed_dst.is_empty() {
            fused::foreach_add_(&seed_dst, &seed_src, 1.0)?;
        }
        Ok(())
    }
}

/// One microbatch's forward without the loss: `[N, classes]` f32 logits,
/// the `[N]` labels and the gradient taps.
type ForwardLogits = (Tensor, Tensor, Vec<(SlotId, Tensor)>);

/// One microbatch's forward: `[N, classes]` logits (f32), the mean loss,
/// the `[N]` labels they were scored against, and the gradient taps.
type ForwardLoss = (Tensor, Tensor, Tensor, Vec<(SlotId, Tensor)>);

/// Converts every 4-D parameter of `model` to channels-last in place.
fn to_channels_last(model: &MorphogeneticModel) -> Result<()> {
    for parameter in model.parameters() {
        let _ = torch_ext::memory::set_channels_last_(&parameter.tensor)?;
    }
    Ok(())
}

/// Gradients with undefined entries replaced by zeros shaped like `like`.
fn dense(grads: &[Tensor], like: &[Tensor]) -> Result<Vec<Tensor>> {
    grads
        .iter()
        .zip(like)
        .map(|(grad, like)| {
            if grad.defined() {
                Ok(grad.shallow_clone())
            } else {
                like.f_zeros_like().op("zeros_like")
            }
        })
        .collect()
}

impl Step for ModelStep {
    fn prepare(&mut self) -> Result<StepKey> {
        if self.channels_last {
            // New seeds arrive contiguous: convert them before their
            // optimizer state is built, so the state follows the layout.
            to_channels_last(&self.model)?;
        }
        let events = self.optimizers.sync(&mut self.model)?;
        if !events.is_empty() {
            self.generation = self.generation.wrapping_add(1);
        }
        for event in events {
            let group = self.model.parameter_group(event.key());
            self.seed_metrics.on_group_event(event, group.as_ref())?;
        }
        let (mut key, alphas, tap_seeds) = self.describe();
        if self.key.as_ref() == Some(&key) {
            self.refill_alphas(&alphas)?;
        } else {
            let single = self.rebuild_layout(&alphas, tap_seeds)?;
            if tap_seeds > 0 {
                self.materialise_grads()?;
            }
            self.key = Some(key.clone());
            let _ = write!(key, "|single{single}");
            self.full_key = Some(StepKey(key));
        }
        self.full_key.clone().ok_or_else(|| Error::InvalidConfig {
            field: "step key",
            reason: "no layout was built".to_owned(),
        })
    }

    fn variant(&self, index: usize) -> u8 {
        u8::from(self.seed_metrics.observes(index as u64))
    }

    fn run(&mut self, batch: &Batch<'_>, accumulator: &EpochAccumulator) -> Result<()> {
        let size = batch.inputs.size().first().copied().unwrap_or(0);
        if size == 0 || batch.labels.size().first().copied() != Some(size) {
            return Err(Error::InvalidData {
                field: "batch",
                reason: format!(
                    "inputs {:?} and labels {:?} do not hold the same non-zero number of samples",
                    batch.inputs.size(),
                    batch.labels.size()
                ),
            });
        }
        let taps = self.layout.tap_seeds > 0;
        if taps {
            // The tap path adds into existing gradients.
            self.optimizers.zero_grad()?;
        } else {
            // set_to_none: backward writes fresh gradients (no zeroing and
            // no accumulation kernels); under capture they live in the
            // graph's pool and are rewritten by every replay.
            torch_ext::memory::set_grads_to_none(&self.layout.trainable)?;
        }
        let micro = i64::try_from(self.config.microbatches)
            .unwrap_or(1)
            .clamp(1, size);
        let inputs = if self.channels_last && batch.inputs.dim() == 4 {
            torch_ext::memory::contiguous_channels_last(batch.inputs)?
        } else {
            batch.inputs.shallow_clone()
        };
        let inputs = inputs.f_chunk(micro, 0).op("chunk")?;
        let labels = batch.labels.f_chunk(micro, 0).op("chunk")?;
        if taps {
            fused::foreach_zero_(&self.layout.scratch)?;
        }
        for (x, y) in inputs.iter().zip(&labels) {
            let part = x.size().first().copied().unwrap_or(0);
            if !taps && let Ok(fused) = &self.fused_loss {
                // Loss, its logits gradient and the metrics in two kernels,
                // then backward from the logits.
                let (logits, flat_labels, _) = self.forward_logits(x, y, false)?;
                let predictions = logits.size().first().copied().unwrap_or(1).max(1);
                let scale = self.scaler.is_enabled().then(|| self.scaler.scale());
                let grad = fused.run(
                    &logits.f_detach().op("detach")?,
                    &flat_labels,
                    scale,
                    accumulator.values(),
                    CrossEntropyWeights {
                        weight: part as f64 / size as f64,
                        loss_weight: part as f64,
                        hits_weight: part as f64 / predictions as f64,
                    },
                )?;
                torch_ext::loss::backward_with(&logits, &grad)?;
                continue;
            }
            let (logits, loss, flat_labels, tapped) = self.forward_loss(x, y, taps)?;
            accumulator.add(&loss, &logits, &flat_labels, part)?;
            let weighted = if part == size {
                loss
            } else {
                loss.f_mul_scalar(part as f64 / size as f64).op("weight")?
            };
            let scaled = self.scaler.scale_loss(&weighted)?;
            if tapped.is_empty() {
                scaled.f_backward().op("backward")?;
            } else {
                self.tapped_backward(&scaled, &tapped)?;
            }
        }
        let grads = self.grads()?;
        self.scaler.unscale_(&grads)?;
        let _ = self
            .seed_metrics
            .observe_params(batch.index as u64, &self.layout.groups)?;
        if let Some(max_norm) = self.config.clip_grad_norm
            && !grads.is_empty()
        {
            let _ = fused::clip_grad_norm_(&grads, max_norm, 2.0)?;
        }
        self.optimizers
            .step_with(self.scaler.optimizer_found_inf())?;
        // Shadows for the weights this step's layers cast themselves (none
        // while a graph captures: it allocates).
        let _ = self.layout.shadows.adopt_misses()?;
        self.scaler.update()
    }

    fn abandon(&mut self) {
        self.scaler.abandon_step();
    }
}
