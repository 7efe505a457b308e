//! Benchmarks of the general path: `tolaria-fmnist` (DESIGN.md §6) and the
//! `tolaria-reference` workload run through the engine and the general
//! [`ModelStep`](crate::engine::model_step::ModelStep) (a `Linear(16->4)` Kasmina host with no slot).
//!
//! `tolaria-fmnist`: the Fashion-MNIST CNN host (8/16/32 channels) with
//! `conv_light` at r0c1 and `attention` at r0c2, both blending at alpha 0.5
//! (ADD, gradient isolation), batch 256, the whole 60,000-sample training
//! set per epoch (234 batches, the last partial batch dropped), validation
//! on the 10,000 test samples. The seeds are brought to BLENDING by the
//! lifecycle itself (germinate, a few fp32 epochs on a subset with the
//! permissive gates, advance) before anything is measured. Then each
//! variant (precision x execution mode) gets the same model: warm-up epochs
//! (captures happen there), then measured epochs. Per variant: epoch ms
//! (host wall time, readback included) p50/p95, samples/s, device ms per
//! epoch (CUDA events around the epoch's steps), validation ms, capture ms,
//! peak device memory, final loss and accuracies. The first graph variant
//! is followed by a second trainer of the same shape, whose first capture
//! time is the `second_trainer_capture_ms` figure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use kasmina::host::SlotId;
use kasmina::host::cnn::CnnHost;
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::baseline::{Measurements, ResultEntry, percentile};
use leyline::{Collector, SeedStage, Telemetry};
use tch::Device;
use torch_ext::DeviceChoice;

use super::ExecutionMode;
use super::trainer::{ModelTrainer, ModelTrainerConfig};
use crate::amp::Precision;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::optim::OptimizerConfig;

mod drills;
mod reference;
pub use drills::{ROLLBACK_WORKLOAD, TIMEOUT_WORKLOAD, run_rollback_drill, run_timeout_drill};
pub use reference::{ReferenceWorkload, run_reference_general};

/// Workload name of the CNN benchmark.
pub const FMNIST_WORKLOAD: &str = "tolaria-fmnist";

/// Suffix of the `tolaria-fmnist` modes run with libtorch's layers instead
/// of torch-ext's fused ones (`torch_ext::nn::set_fused_kernels(false)`).
pub const LIBTORCH_LAYERS_SUFFIX: &str = "-libtorch-layers";

/// What `tolaria-fmnist` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct FmnistOptions {
    /// Device.
    pub device: DeviceChoice,
    /// Folder of the four Fashion-MNIST files (`None`: the data layer's
    /// default and environment variable).
    pub data_dir: Option<PathBuf>,
    /// Use seeded synthetic images of the real size instead of the files.
    pub synthetic: bool,
    /// Variants: (precision, mode). Empty: fp32 and bf16 x eager, graph-step,
    /// graph-epoch on CUDA, then fp32 and bf16 graph-epoch again with
    /// libtorch's layers (modes ending in [`LIBTORCH_LAYERS_SUFFIX`]); fp32
    /// eager on the CPU.
    pub variants: Vec<(Precision, ExecutionMode)>,
    /// Unmeasured epochs per variant.
    pub warmup_epochs: usize,
    /// Measured epochs per variant.
    pub measured_epochs: usize,
    /// Training samples per epoch (`None`: all).
    pub train_samples: Option<usize>,
}

impl FmnistOptions {
    /// Full settings (2 warm-up, 5 measured epochs) or a smoke run.
    pub fn new(device: DeviceChoice, quick: bool) -> FmnistOptions {
        FmnistOptions {
            device,
            data_dir: None,
            synthetic: false,
            variants: Vec::new(),
            warmup_epochs: 2,
            measured_epochs: if quick { 2 } else { 5 },
            train_samples: quick.then_some(8192),
        }
    }
}

/// What [`run_fmnist`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRun {
    /// The record's figures.
    pub measurements: Measurements,
    /// The device.
    pub device: Device,
}

fn put(metrics: &mut BTreeMap<String, f64>, key: &str, value: Option<f64>) {
    if let Some(value) = value.filter(|value| value.is_finite()) {
        metrics.insert(key.to_owned(), value);
    }
}

fn fmnist_data(options: &FmnistOptions) -> Result<(Dataset, Dataset, &'static str)> {
    if !options.synthetic {
        let data = crate::task::load(
            crate::task::Task::Fmnist,
            &crate::task::TaskOptions {
                data_dir: options.data_dir.clone(),
                ..crate::task::TaskOptions::default()
            },
        )?;
        return Ok((data.train, data.validation, "fashion-mnist"));
    }
    let train = crate::data::synthetic::image_task(
        &crate::data::synthetic::ImageTaskOptions::fashion_like(60_000, 1),
    )?;
    let test = crate::data::synthetic::image_task(
        &crate::data::synthetic::ImageTaskOptions::fashion_like(10_000, 2),
    )?;
    Ok((train, test, "synthetic (fashion-like, real size)"))
}

/// The `tolaria-fmnist` model: the CNN host with `conv_light` at r0c1 and
/// `attention` at r0c2 germinated (blend target 0.5, one-epoch tempo).
pub fn fmnist_model(device: Device, telemetry: Telemetry) -> Result<MorphogeneticModel> {
    let lifecycle = |op: &'static str| move |source| Error::Lifecycle { op, source };
    let host = CnnHost::new(crate::task::Task::Fmnist.host_config()?, device)
        .map_err(lifecycle("host"))?;
    let mut model = MorphogeneticModel::with_slot_names(
        host,
        &["r0c1", "r0c2"],
        SlotConfig::default(),
        telemetry,
    )
    .map_err(lifecycle("model"))?;
    for (slot, blueprint, id) in [
        (SlotId::new(0, 1), "conv_light", "bench-conv-light"),
        (SlotId::new(0, 2), "attention", "bench-attention"),
    ] {
        let mut options = GerminationOptions::new(id);
        options.alpha_target = 0.5;
        options.tempo_epochs = 1;
        model
            .germinate(slot, blueprint, options)
            .map_err(lifecycle("germinate"))?;
    }
    Ok(model)
}

/// Brings every germinated seed of `model` to BLENDING at its target alpha
/// by training `data` (fp32, eager) and advancing through the gates; at
/// most `max_epochs` epochs.
pub fn bring_to_blending(
    model: MorphogeneticModel,
    train: &Dataset,
    max_epochs: usize,
) -> Result<MorphogeneticModel> {
    let config = ModelTrainerConfig {
        precision: Some(Precision::Fp32),
        batch_size: 256.min(train.len()),
        gradient_telemetry_stride: 1,
        counterfactual_samples: 0,
        governor: false,
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(model, train, None, config, Telemetry::disabled())?;
    for _ in 0..max_epochs {
        let done = trainer.model().slots().iter().all(|slot| {
            slot.state().is_none_or(|state| {
                state.stage() == SeedStage::Blending && state.alpha_controller().is_settled()
            })
        });
        if done {
            return Ok(trainer.into_model());
        }
        let slots: Vec<SlotId> = trainer
            .model()
            .slots()
            .iter()
            .filter(|slot| {
                slot.stage().is_some_and(|stage| {
                    matches!(stage, SeedStage::Germinated | SeedStage::Training)
                })
            })
            .map(|slot| slot.id())
            .collect();
        for slot in slots {
            let _ = trainer
                .model_mut()
                .advance_stage(slot, None)
                .map_err(|source| Error::Lifecycle {
                    op: "advance_stage",
                    source,
                })?;
        }
        let _ = trainer.train_epoch()?;
    }
    Err(Error::InvalidConfig {
        field: "bring_to_blending",
        reason: format!("the seeds did not reach BLENDING within {max_epochs} epochs"),
    })
}

/// Runs `tolaria-fmnist`; `progress` receives one line per stage.
pub fn run_fmnist(options: &FmnistOptions, progress: &mut dyn FnMut(&str)) -> Result<BenchRun> {
    let device = torch_ext::device::select(options.device)?;
    let cuda = device.is_cuda();
    let variants = if options.variants.is_empty() {
        if cuda {
            vec![
                (Precision::Fp32, ExecutionMode::Eager),
                (Precision::Bf16, ExecutionMode::Eager),
                (Precision::Fp32, ExecutionMode::GraphStep),
                (Precision::Bf16, ExecutionMode::GraphStep),
                (Precision::Fp32, ExecutionMode::GraphEpoch),
                (Precision::Bf16, ExecutionMode::GraphEpoch),
            ]
        } else {
            vec![(Precision::Fp32, ExecutionMode::Eager)]
        }
    } else {
        options.variants.clone()
    };
    // Each variant with torch-ext's fused layers; on CUDA by default the
    // graph-epoch variants again with libtorch's layers, so one run shows
    // what the fused kernels change.
    let mut runs: Vec<(Precision, ExecutionMode, bool)> = variants
        .iter()
        .map(|&(precision, mode)| (precision, mode, true))
        .collect();
    if cuda && options.variants.is_empty() {
        runs.push((Precision::Fp32, ExecutionMode::GraphEpoch, false));
        runs.push((Precision::Bf16, ExecutionMode::GraphEpoch, false));
    }
    let (train, test, source) = fmnist_data(options)?;
    let train = match options.train_samples {
        Some(len) => train.slice(0, len.min(train.len()))?,
        None => train,
    };
    progress(&format!(
        "[rust tolaria-fmnist] {} train / {} test samples ({source}); bringing the seeds to BLENDING",
        train.len(),
        test.len()
    ));
    tch::manual_seed(20_251_123);
    let subset = train.slice(0, 4096.min(train.len()))?;
    let mut model = bring_to_blending(fmnist_model(device, Telemetry::disabled())?, &subset, 40)?;
    let mut results = Vec::new();
    let mut names = BTreeSet::new();
    let mut second_capture_done = false;
    for (precision, mode, fused) in runs {
        torch_ext::nn::set_fused_kernels(fused);
        let mut name = variant_name(precision, mode);
        if !fused {
            name.push_str(LIBTORCH_LAYERS_SUFFIX);
        }
        progress(&format!(
            "[rust {name}] {} warm-up + {} measured epochs",
            options.warmup_epochs, options.measured_epochs
        ));
        let config = fmnist_config(precision, mode);
        let sink = Collector::new();
        let trainer = ModelTrainer::new(
            model,
            &train,
            Some(&test),
            config.clone(),
            Telemetry::new(sink.clone()),
        );
        let mut trainer = trainer?;
        let outcome = measure(&mut trainer, options, &name, progress);
        names.extend(sink.names());
        let metrics = match outcome {
            Ok(mut metrics) => {
                if mode.uses_graphs() && !second_capture_done {
                    second_capture_done = true;
                    let (restored, second) =
                        second_trainer_capture(trainer.into_model(), &train, &test, &config)?;
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
        progress(&format!("[rust {name}] failed: {metrics}"));
        results.push(ResultEntry {
            amp: None,
            implementation: "rust".to_owned(),
            mode: name,
            metrics: BTreeMap::new(),
            error: Some(metrics.to_string()),
        });
        model = trainer.into_model();
    }
    torch_ext::nn::set_fused_kernels(true);
    let params = serde_json::json!({
        "layers": format!("torch-ext kernels (torch_ext::nn): 3x3 convolutions (forward, input and weight gradients), batch norm + ReLU, group norm + ReLU, max-pool; modes ending in {LIBTORCH_LAYERS_SUFFIX} use libtorch's conv2d (cuDNN), batch_norm, group_norm, relu and max_pool2d"),
        "model": "CnnHost fashion_mnist (8/16/32) + conv_light@r0c1 + attention@r0c2, ADD blend at alpha 0.5, isolated",
        "data": source,
        "train_samples": train.len(),
        "test_samples": test.len(),
        "batch_size": 256,
        "drop_last": true,
        "steps_per_epoch": train.len() / 256,
        "optimizer": serde_json::to_value(OptimizerConfig::default()).unwrap_or_default(),
        "warmup_epochs": options.warmup_epochs,
        "measured_epochs": options.measured_epochs,
        "epoch_ms": "host wall time of the epoch's steps and its one readback (validation excluded)",
        "samples_per_s": "training samples per second of epoch_ms p50",
        "device_epoch_ms": "CUDA-event time from before the first step to after the last",
        "gpu_busy_ms_per_epoch": "one more epoch under libtorch's Kineto profiler: the summed device time of every kernel and copy, the epoch's validation included (profiled_kernels_per_step counts its kernels the same way)",
    });
    Ok(BenchRun {
        measurements: Measurements {
            params,
            results,
            telemetry_names: names.into_iter().collect(),
        },
        device,
    })
}

/// The record's mode name: `eager`, `graph-step`, ... with `-bf16` or
/// `-fp16` appended for autocast.
pub fn variant_name(precision: Precision, mode: ExecutionMode) -> String {
    match precision {
        Precision::Fp32 => mode.name().to_owned(),
        other => format!("{}-{}", mode.name(), other.name()),
    }
}

fn fmnist_config(precision: Precision, mode: ExecutionMode) -> ModelTrainerConfig {
    ModelTrainerConfig {
        precision: Some(precision),
        mode,
        batch_size: 256,
        validation_batch_size: 2000,
        counterfactual_samples: 0,
        ..ModelTrainerConfig::default()
    }
}

fn measure(
    trainer: &mut ModelTrainer,
    options: &FmnistOptions,
    name: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<BTreeMap<String, f64>> {
    let mut metrics = BTreeMap::new();
    let cuda_index = trainer.engine().cuda_index();
    for index in 0..options.warmup_epochs {
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
    for index in 0..options.measured_epochs {
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
            options.measured_epochs,
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
    train: &Dataset,
    test: &Dataset,
    config: &ModelTrainerConfig,
) -> Result<(MorphogeneticModel, Option<f64>)> {
    let mut trainer = ModelTrainer::new(
        model,
        train,
        Some(test),
        config.clone(),
        Telemetry::disabled(),
    )?;
    let _ = trainer.train_epoch()?;
    let first = trainer.engine().first_capture_ms();
    Ok((trainer.into_model(), first))
}
