//! Benchmarks of the general path: `tolaria-fmnist` (DESIGN.md §6),
//! `tolaria-lm` (the language-model transformer, [`run_lm`]) and the
//! `tolaria-reference` workload run through the engine and the general
//! [`ModelStep`](crate::engine::model_step::ModelStep) (a `Linear(16->4)` Kasmina host with no slot).
//! The first two share one measuring loop (`variants`).
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

use std::path::PathBuf;

use kasmina::host::SlotId;
use kasmina::host::cnn::CnnHost;
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::baseline::Measurements;
use leyline::{SeedStage, Telemetry};
use tch::Device;
use torch_ext::DeviceChoice;

use super::ExecutionMode;
use super::trainer::{ModelTrainer, ModelTrainerConfig};
use crate::amp::Precision;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::optim::OptimizerConfig;

mod drills;
mod lm;
mod reference;
mod variants;
pub use drills::{ROLLBACK_WORKLOAD, TIMEOUT_WORKLOAD, run_rollback_drill, run_timeout_drill};
pub use lm::{LM_WORKLOAD, LmOptions, lm_model, run_lm};
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
    /// Graph-epoch's steps per captured graph
    /// ([`crate::engine::EngineConfig::epoch_graph_steps`]; 0: one graph).
    pub epoch_graph_steps: usize,
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
            epoch_graph_steps: crate::engine::DEFAULT_EPOCH_GRAPH_STEPS,
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
        default_variants(cuda)
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
    let model = bring_to_blending(fmnist_model(device, Telemetry::disabled())?, &subset, 40)?;
    let measured = variants::run_variants(
        model,
        &variants::Plan {
            variants: runs,
            train: &train,
            test: &test,
            config: &|precision, mode| ModelTrainerConfig {
                epoch_graph_steps: options.epoch_graph_steps,
                ..fmnist_config(precision, mode)
            },
            epochs: variants::EpochCounts {
                warmup: options.warmup_epochs,
                measured: options.measured_epochs,
            },
        },
        progress,
    )?;
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
        "epoch_graph_steps": options.epoch_graph_steps,
        "measured_epochs": options.measured_epochs,
        "epoch_ms": "host wall time of the epoch's steps and its one readback (validation excluded)",
        "samples_per_s": "training samples per second of epoch_ms p50",
        "device_epoch_ms": "CUDA-event time from before the first step to after the last",
        "gpu_busy_ms_per_epoch": "one more epoch under libtorch's Kineto profiler: the summed device time of every kernel and copy, the epoch's validation included (profiled_kernels_per_step counts its kernels the same way)",
    });
    Ok(BenchRun {
        measurements: Measurements {
            params,
            results: measured.results,
            telemetry_names: measured.names.into_iter().collect(),
        },
        device,
    })
}

/// The variants a run measures when none are asked for: fp32 and bf16 x
/// eager, graph-step, graph-epoch on CUDA; fp32 eager on the CPU.
fn default_variants(cuda: bool) -> Vec<(Precision, ExecutionMode)> {
    if !cuda {
        return vec![(Precision::Fp32, ExecutionMode::Eager)];
    }
    let modes = [
        ExecutionMode::Eager,
        ExecutionMode::GraphStep,
        ExecutionMode::GraphEpoch,
    ];
    modes
        .into_iter()
        .flat_map(|mode| [(Precision::Fp32, mode), (Precision::Bf16, mode)])
        .collect()
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
