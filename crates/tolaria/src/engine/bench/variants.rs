//! The measuring loop the general-path benchmarks share: every variant
//! (precision x execution mode, torch-ext's fused layers or libtorch's) of
//! one model trains warm-up epochs, then measured epochs, then one profiled
//! epoch; the figures of each become one record entry (`implementation`
//! "rust"), a failing variant an entry with its error. The model passes
//! from one variant's trainer to the next, so every variant continues the
//! same training.

use std::collections::{BTreeMap, BTreeSet};

use kasmina::model::MorphogeneticModel;
use leyline::baseline::{ResultEntry, percentile};
use leyline::{Collector, Telemetry};

use super::{LIBTORCH_LAYERS_SUFFIX, variant_name};
use crate::amp::Precision;
use crate::data::Dataset;
use crate::engine::ExecutionMode;
use crate::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use crate::error::Result;

/// Warm-up and measured epochs of every variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EpochCounts {
    /// Unmeasured epochs (captures happen there).
    pub(super) warmup: usize,
    /// Measured epochs.
    pub(super) measured: usize,
}

/// One variant: precision, execution mode, and whether torch-ext's fused
/// layers are on (`false`: libtorch's, the mode name gets
/// [`LIBTORCH_LAYERS_SUFFIX`]).
pub(super) type Variant = (Precision, ExecutionMode, bool);

/// What [`run_variants`] measures.
pub(super) struct Plan<'a> {
    /// The variants, in order.
    pub(super) variants: Vec<Variant>,
    /// Training set.
    pub(super) train: &'a Dataset,
    /// Validation set.
    pub(super) test: &'a Dataset,
    /// The trainer configuration of a precision and mode.
    pub(super) config: &'a dyn Fn(Precision, ExecutionMode) -> ModelTrainerConfig,
    /// Epochs per variant.
    pub(super) epochs: EpochCounts,
}

/// What [`run_variants`] returns: the entries and the telemetry names seen.
pub(super) struct Measured {
    pub(super) results: Vec<ResultEntry>,
    pub(super) names: BTreeSet<String>,
}

pub(super) fn put(metrics: &mut BTreeMap<String, f64>, key: &str, value: Option<f64>) {
    if let Some(value) = value.filter(|value| value.is_finite()) {
        metrics.insert(key.to_owned(), value);
    }
}

/// Runs every variant of `plan` on `model` (see the module docs). The first
/// graph variant is followed by a second trainer of the same shape, whose
/// first capture is the `second_trainer_capture_ms` figure. torch-ext's
/// fused layers are on again afterwards.
pub(super) fn run_variants(
    model: MorphogeneticModel,
    plan: &Plan<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<Measured> {
    let mut model = model;
    let mut results = Vec::new();
    let mut names = BTreeSet::new();
    let mut second_capture_done = false;
    for &(precision, mode, fused) in &plan.variants {
        torch_ext::nn::set_fused_kernels(fused);
        let mut name = variant_name(precision, mode);
        if !fused {
            name.push_str(LIBTORCH_LAYERS_SUFFIX);
        }
        progress(&format!(
            "[rust {name}] {} warm-up + {} measured epochs",
            plan.epochs.warmup, plan.epochs.measured
        ));
        let config = (plan.config)(precision, mode);
        let sink = Collector::new();
        let trainer = ModelTrainer::new(
            model,
            plan.train,
            Some(plan.test),
            config.clone(),
            Telemetry::new(sink.clone()),
        );
        let mut trainer = match trainer {
            Ok(trainer) => trainer,
            Err(error) => {
                torch_ext::nn::set_fused_kernels(true);
                return Err(error);
            }
        };
        let outcome = measure(&mut trainer, plan.epochs, &name, progress);
        names.extend(sink.names());
        let error = match outcome {
            Ok(mut metrics) => {
                if mode.uses_graphs() && !second_capture_done {
                    second_capture_done = true;
                    let (restored, second) =
                        second_trainer_capture(trainer.into_model(), plan, &config)?;
                    put(&mut metrics, "second_trainer_capture_ms", second);
                    model = restored;
                } else {
                    model = trainer.into_model();
                }
                progress(&format!(
                    "[rust {name}] epoch p50 {:.1} ms, {:.0} samples/s",
                    metrics.get("epoch_ms_p50").copied().unwrap_or(f64::NAN),
                    metrics.get("samples_per_s").copied().unwrap_or(f64::NAN)
                ));
                results.push(ResultEntry {
                    amp: None,
                    implementation: "rust".to_owned(),
                    mode: name,
                    metrics,
                    error: None,
                });
                continue;
            }
            Err(error) => error,
        };
        progress(&format!("[rust {name}] failed: {error}"));
        results.push(ResultEntry {
            amp: None,
            implementation: "rust".to_owned(),
            mode: name,
            metrics: BTreeMap::new(),
            error: Some(error.to_string()),
        });
        model = trainer.into_model();
    }
    torch_ext::nn::set_fused_kernels(true);
    Ok(Measured { results, names })
}

fn measure(
    trainer: &mut ModelTrainer,
    epochs: EpochCounts,
    name: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<BTreeMap<String, f64>> {
    let mut metrics = BTreeMap::new();
    let cuda_index = trainer.engine().cuda_index();
    for index in 0..epochs.warmup {
        let report = trainer.train_epoch()?;
        if index == 0 {
            put(&mut metrics, "first_epoch_ms", Some(report.train.epoch_ms));
        }
        if report.train.capture_ms.is_some() {
            put(&mut metrics, "capture_ms", report.train.capture_ms);
        }
        for event in &report.train.events {
            if event.name == leyline::telemetry::TOLARIA_GRAPH_FALLBACK {
                progress(&format!(
                    "[rust {name}] graph fallback: {:?}",
                    event.attributes
                ));
            }
        }
    }
    if let Some(index) = cuda_index {
        torch_ext::cuda::synchronize(index)?;
        torch_ext::cuda::reset_peak_memory_stats(index)?;
    }
    let mut epoch_ms = Vec::new();
    let mut device_ms = Vec::new();
    let mut validation_ms = Vec::new();
    let mut replayed = 0_usize;
    let mut steps = 0_usize;
    let mut last = None;
    for index in 0..epochs.measured {
        let report = trainer.train_epoch()?;
        epoch_ms.push(report.train.epoch_ms);
        if let Some(ms) = report.train.device_ms {
            device_ms.push(ms);
        }
        if let Some(validation) = report.validation {
            validation_ms.push(validation.elapsed_ms);
        }
        replayed = replayed.saturating_add(report.train.replayed_steps);
        steps = steps.saturating_add(report.train.steps);
        progress(&format!(
            "[rust {name}] epoch {}/{}: {:.1} ms, loss {:.4}",
            index.saturating_add(1),
            epochs.measured,
            report.train.epoch_ms,
            report.train.loss
        ));
        last = Some(report);
    }
    let p50 = percentile(&epoch_ms, 50.0);
    put(&mut metrics, "epoch_ms_p50", p50);
    put(&mut metrics, "epoch_ms_p95", percentile(&epoch_ms, 95.0));
    put(
        &mut metrics,
        "device_epoch_ms_p50",
        percentile(&device_ms, 50.0),
    );
    put(
        &mut metrics,
        "validation_ms_p50",
        percentile(&validation_ms, 50.0),
    );
    put(
        &mut metrics,
        "replayed_steps_fraction",
        (steps > 0).then(|| replayed as f64 / steps as f64),
    );
    if let Some(report) = &last {
        put(
            &mut metrics,
            "samples_per_s",
            p50.map(|ms| report.train.samples as f64 / (ms / 1000.0)),
        );
        put(
            &mut metrics,
            "steps_per_epoch",
            Some(report.train.steps as f64),
        );
        put(&mut metrics, "final_train_loss", Some(report.train.loss));
        put(
            &mut metrics,
            "final_train_accuracy",
            Some(report.train.accuracy),
        );
        put(
            &mut metrics,
            "val_accuracy",
            report.validation.map(|validation| validation.accuracy),
        );
        put(
            &mut metrics,
            "val_loss",
            report.validation.map(|validation| validation.loss),
        );
        put(
            &mut metrics,
            "active_seeds",
            Some(report.active_seeds as f64),
        );
        put(
            &mut metrics,
            "graph_fallback_events",
            Some(
                report
                    .train
                    .events
                    .iter()
                    .filter(|event| event.name == leyline::telemetry::TOLARIA_GRAPH_FALLBACK)
                    .count() as f64,
            ),
        );
    }
    if let Some(report) = &last {
        put(
            &mut metrics,
            "kernels_per_step",
            trainer.engine().kernels_per_step(report.train.steps)?,
        );
    }
    if cuda_index.is_some() {
        profile_epoch(trainer, name, &mut metrics, progress)?;
    }
    if let Some(index) = cuda_index {
        put(
            &mut metrics,
            "peak_device_memory_bytes",
            Some(torch_ext::cuda::max_memory_allocated(index)? as f64),
        );
    }
    Ok(metrics)
}

/// One more epoch under the kernel profiler: GPU-busy time per epoch and
/// kernels per step (the epoch's validation included), and the largest
/// kernels by device time, printed.
fn profile_epoch(
    trainer: &mut ModelTrainer,
    name: &str,
    metrics: &mut BTreeMap<String, f64>,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let profiler = torch_ext::profile::KernelProfiler::start()?;
    let report = trainer.train_epoch();
    let profile = profiler.stop()?;
    let steps = report?.train.steps.max(1) as f64;
    put(
        metrics,
        "gpu_busy_ms_per_epoch",
        Some(profile.busy_us() / 1000.0),
    );
    put(
        metrics,
        "profiled_kernels_per_step",
        Some(profile.kernel_launches() as f64 / steps),
    );
    progress(&format!(
        "[rust {name}] profiled epoch: {:.1} ms GPU-busy, {:.1} kernels a step; largest (us a step, launches a step, name):",
        profile.busy_us() / 1000.0,
        profile.kernel_launches() as f64 / steps
    ));
    if name == "graph-epoch" || name == "graph-epoch-bf16" {
        progress(&format!(
            "[rust {name}] {} consecutive launches from the profiled epoch's middle (us, name):",
            profile.sample.len()
        ));
        for kernel in &profile.sample {
            let short: String = kernel.name.chars().take(100).collect();
            progress(&format!(
                "[rust {name}]   seq {:7.2}  {short}",
                kernel.total_us
            ));
        }
    }
    for kernel in profile.largest(PROFILE_TOP) {
        let short: String = kernel.name.chars().take(120).collect();
        progress(&format!(
            "[rust {name}]   {:7.2} {:5.2}  {short}",
            kernel.total_us / steps,
            kernel.count as f64 / steps
        ));
    }
    Ok(())
}

/// Kernels the profiled epoch prints.
const PROFILE_TOP: usize = 30;

/// A second trainer of the same shape on the same device: the time of its
/// first capture (the shared pool's promise). Returns the model back.
fn second_trainer_capture(
    model: MorphogeneticModel,
    plan: &Plan<'_>,
    config: &ModelTrainerConfig,
) -> Result<(MorphogeneticModel, Option<f64>)> {
    let mut trainer = ModelTrainer::new(
        model,
        plan.train,
        Some(plan.test),
        config.clone(),
        Telemetry::disabled(),
    )?;
    let _ = trainer.train_epoch()?;
    let first = trainer.engine().first_capture_ms();
    Ok((trainer.into_model(), first))
}
