//! `tolaria-lm`: the language-model task's transformer through the general
//! trainer, beside its PyTorch peer (`bench/python/tolaria_lm.py`).
//!
//! The model is the `lm-fortunes` host ([`Task::lm_host_config`]: byte
//! tokens, width 128, 4 heads, 3 layers, context 64, a slot after each
//! layer) with `mlp_small` at r0c0 and the causal `attention` seed at r0c1,
//! both blending at alpha 0.5 (ADD; transformer seeds in BLENDING see the
//! live host features, so the host takes gradient through them). AdamW
//! (PyTorch's defaults: lr 0.001, weight decay 0.01) for the host and each
//! seed, batch 128 windows (8,192 tokens), the last partial batch dropped,
//! validation on the held-out documents' windows in batches of 1,024. The
//! seeds are brought to BLENDING by the lifecycle itself (germinate, a few
//! epochs on a subset, advance) before anything is measured; then each
//! variant (precision x execution mode) trains the same model (warm-up
//! epochs, then measured ones; see `variants`). Per variant, besides the
//! figures of `tolaria-fmnist`: `tokens_per_s` and `val_perplexity`.

use std::path::PathBuf;

use kasmina::host::SlotId;
use kasmina::host::transformer::TransformerHost;
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use leyline::baseline::Measurements;
use tch::Device;
use torch_ext::DeviceChoice;

use super::variants::{self, EpochCounts, Plan, put};
use super::{BenchRun, bring_to_blending, default_variants};
use crate::amp::Precision;
use crate::data::Dataset;
use crate::engine::ExecutionMode;
use crate::engine::trainer::ModelTrainerConfig;
use crate::error::{Error, Result};
use crate::optim::OptimizerConfig;
use crate::task::{LM_BATCH, LM_CONTEXT, LM_LEARNING_RATE, Task, TaskOptions};

/// Workload name of the language-model benchmark.
pub const LM_WORKLOAD: &str = "tolaria-lm";

/// Validation batch, in windows.
const VALIDATION_BATCH: usize = 1024;
/// Windows of the subset that brings the seeds to BLENDING.
const BLENDING_SUBSET: usize = 2048;
/// Seed of the document split and of the model's initial weights.
const SEED: u64 = 20_261_128;

/// What `tolaria-lm` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct LmOptions {
    /// Device.
    pub device: DeviceChoice,
    /// Folder of the corpus (`None`: the data layer's default and
    /// environment variable).
    pub data_dir: Option<PathBuf>,
    /// Use the seeded synthetic text instead of the corpus.
    pub synthetic: bool,
    /// Variants: (precision, mode). Empty: fp32 and bf16 x eager,
    /// graph-step, graph-epoch on CUDA; fp32 eager on the CPU.
    pub variants: Vec<(Precision, ExecutionMode)>,
    /// Unmeasured epochs per variant.
    pub warmup_epochs: usize,
    /// Measured epochs per variant.
    pub measured_epochs: usize,
    /// Training windows per epoch (`None`: all).
    pub train_windows: Option<usize>,
    /// Graph-epoch's steps per captured graph
    /// ([`crate::engine::EngineConfig::epoch_graph_steps`]; 0: one graph).
    pub epoch_graph_steps: usize,
}

impl LmOptions {
    /// Full settings (2 warm-up, 5 measured epochs over every training
    /// window) or a smoke run (1 warm-up, 2 measured, 8,192 windows).
    pub fn new(device: DeviceChoice, quick: bool) -> LmOptions {
        LmOptions {
            device,
            data_dir: None,
            synthetic: false,
            variants: Vec::new(),
            warmup_epochs: if quick { 1 } else { 2 },
            measured_epochs: if quick { 2 } else { 5 },
            train_windows: quick.then_some(8192),
            epoch_graph_steps: crate::engine::DEFAULT_EPOCH_GRAPH_STEPS,
        }
    }
}

/// The `tolaria-lm` model: the language-model host with `mlp_small` at
/// r0c0 and `attention` at r0c1 germinated (blend target 0.5, one-epoch
/// tempo), r0c2 empty.
pub fn lm_model(device: Device, telemetry: Telemetry) -> Result<MorphogeneticModel> {
    let lifecycle = |op: &'static str| move |source| Error::Lifecycle { op, source };
    let host = TransformerHost::new(Task::lm_host_config(), device).map_err(lifecycle("host"))?;
    let mut model = MorphogeneticModel::with_slot_names(
        host,
        &["r0c0", "r0c1", "r0c2"],
        SlotConfig::default(),
        telemetry,
    )
    .map_err(lifecycle("model"))?;
    for (slot, blueprint, id) in [
        (SlotId::new(0, 0), "mlp_small", "bench-mlp-small"),
        (SlotId::new(0, 1), "attention", "bench-attention"),
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

/// The optimizer of every group: the task's, AdamW with PyTorch's defaults.
fn adamw() -> OptimizerConfig {
    Task::LmFortunes.optimizer(LM_LEARNING_RATE, 0.0)
}

fn lm_config(precision: Precision, mode: ExecutionMode) -> ModelTrainerConfig {
    ModelTrainerConfig {
        precision: Some(precision),
        mode,
        batch_size: LM_BATCH,
        validation_batch_size: VALIDATION_BATCH,
        counterfactual_samples: 0,
        optimizer: adamw(),
        seed: SEED,
        ..ModelTrainerConfig::default()
    }
}

fn lm_data(options: &LmOptions) -> Result<(Dataset, Dataset, &'static str)> {
    let task = if options.synthetic {
        Task::LmSynthetic
    } else {
        Task::LmFortunes
    };
    let data = crate::task::load(
        task,
        &TaskOptions {
            data_dir: options.data_dir.clone(),
            seed: SEED,
            ..TaskOptions::default()
        },
    )?;
    let source = if options.synthetic {
        "synthetic text (seeded)"
    } else {
        "Debian's fortunes corpus, byte tokens"
    };
    Ok((data.train, data.validation, source))
}

/// Runs `tolaria-lm`; `progress` receives one line per stage.
pub fn run_lm(options: &LmOptions, progress: &mut dyn FnMut(&str)) -> Result<BenchRun> {
    let device = torch_ext::device::select(options.device)?;
    let cuda = device.is_cuda();
    let variants = if options.variants.is_empty() {
        default_variants(cuda)
    } else {
        options.variants.clone()
    };
    let (train, test, source) = lm_data(options)?;
    let train = match options.train_windows {
        Some(len) => train.slice(0, len.min(train.len()))?,
        None => train,
    };
    let steps = train.len() / LM_BATCH;
    progress(&format!(
        "[rust {LM_WORKLOAD}] {} train / {} validation windows of {LM_CONTEXT} tokens ({source}); bringing the seeds to BLENDING",
        train.len(),
        test.len()
    ));
    tch::manual_seed(SEED as i64);
    let subset = train.slice(0, BLENDING_SUBSET.min(train.len()))?;
    let model = bring_to_blending(lm_model(device, Telemetry::disabled())?, &subset, 40)?;
    let mut measured = variants::run_variants(
        model,
        &Plan {
            variants: variants
                .iter()
                .map(|&(precision, mode)| (precision, mode, true))
                .collect(),
            train: &train,
            test: &test,
            config: &|precision, mode| ModelTrainerConfig {
                epoch_graph_steps: options.epoch_graph_steps,
                ..lm_config(precision, mode)
            },
            epochs: EpochCounts {
                warmup: options.warmup_epochs,
                measured: options.measured_epochs,
            },
        },
        progress,
    )?;
    for entry in &mut measured.results {
        let windows = entry.metrics.get("samples_per_s").copied();
        put(
            &mut entry.metrics,
            "tokens_per_s",
            windows.map(|windows| windows * LM_CONTEXT as f64),
        );
        let loss = entry.metrics.get("val_loss").copied();
        put(&mut entry.metrics, "val_perplexity", loss.map(f64::exp));
    }
    let host = Task::lm_host_config();
    let params = serde_json::json!({
        "model": "TransformerHost (lm-fortunes) + mlp_small@r0c0 + attention@r0c1, ADD blend at alpha 0.5, not isolated (BLENDING), r0c2 empty",
        "host": serde_json::to_value(&host).unwrap_or_default(),
        "host_parameters": host.param_count().ok(),
        "attention": "torch_ext::nn::causal_attention: its own kernel each way under bf16 (T <= 64, heads of 16 or 32), libtorch's causal scaled_dot_product_attention in f32",
        "data": source,
        "context_tokens": LM_CONTEXT,
        "train_windows": train.len(),
        "validation_windows": test.len(),
        "batch_size": LM_BATCH,
        "tokens_per_step": LM_BATCH * LM_CONTEXT,
        "drop_last": true,
        "steps_per_epoch": steps,
        "validation_batch": VALIDATION_BATCH,
        "optimizer": serde_json::to_value(adamw()).unwrap_or_default(),
        "loss": "softmax cross-entropy over the 256 byte tokens, mean over every position",
        "warmup_epochs": options.warmup_epochs,
        "epoch_graph_steps": options.epoch_graph_steps,
        "measured_epochs": options.measured_epochs,
        "epoch_ms": "host wall time of the epoch's steps and its one readback (validation excluded)",
        "samples_per_s": "training windows per second of epoch_ms p50 (tokens_per_s: times the context)",
        "gpu_busy_ms_per_epoch": "one more epoch under libtorch's Kineto profiler: the summed device time of every kernel and copy, the epoch's validation included",
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
