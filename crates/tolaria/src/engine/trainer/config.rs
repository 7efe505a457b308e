//! [`ModelTrainerConfig`]: everything the general trainer needs to know,
//! and its defaults.

use serde::{Deserialize, Serialize};

use crate::ExecutionMode;
use crate::amp::{Precision, PrecisionConfig};
use crate::engine::DataPlacement;
use crate::optim::OptimizerConfig;

/// Everything the general trainer needs to know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTrainerConfig {
    /// Seed of the shuffle.
    pub seed: u64,
    /// Samples per training batch.
    pub batch_size: usize,
    /// Samples per validation batch.
    pub validation_batch_size: usize,
    /// Drop each epoch's last, smaller batch.
    pub drop_last: bool,
    /// Shuffle the training set every epoch (on the device).
    pub shuffle: bool,
    /// Eager, graph per step, or graph per epoch.
    pub mode: ExecutionMode,
    /// Autocast precision; `None` picks bf16 on GPUs that support it, fp32
    /// on the CPU ([`Precision::auto`]).
    pub precision: Option<Precision>,
    /// Microbatches per batch.
    pub microbatches: usize,
    /// Clip the joint gradient L2 norm (on the device).
    pub clip_grad_norm: Option<f64>,
    /// Gather gradient norms every this many batches.
    pub gradient_telemetry_stride: u64,
    /// Host and seed optimizers.
    pub optimizer: OptimizerConfig,
    /// Eager steps of a shape before its capture.
    pub graph_warmup_steps: usize,
    /// Graph-epoch: training steps per captured graph, the epoch replayed as
    /// a chain of them ([`crate::engine::EngineConfig::epoch_graph_steps`]; 0: the
    /// whole epoch in one graph).
    #[serde(default = "crate::engine::default_epoch_graph_steps")]
    pub epoch_graph_steps: usize,
    /// Most seeds the gradient aggregator holds rows for.
    pub max_seeds: usize,
    /// TF32 and matmul precision.
    pub matmul: PrecisionConfig,
    /// Run the governor (NaN, lobotomy and divergence rollback).
    pub governor: bool,
    /// Governor snapshot interval, epochs.
    pub snapshot_interval_epochs: usize,
    /// Fail an epoch that synchronises the device inside its steps (CUDA
    /// sync debug mode "error"; tests).
    pub forbid_syncs: bool,
    /// Where the training set lives: on the device (default; every mode),
    /// or in pinned host memory with double-buffered staging (eager only).
    pub data_placement: DataPlacement,
    /// Keep 4-D parameters channels-last on CUDA (see
    /// [`crate::engine::model_step::ModelStepConfig::channels_last`]).
    pub channels_last: bool,
    /// Validation samples the counterfactual contribution of each blending
    /// or holding seed is measured on at every boundary (0: not measured;
    /// G5 then refuses to fossilize).
    pub counterfactual_samples: usize,
    /// The graph memory pool lane of this trainer's engine
    /// ([`crate::engine::EngineConfig::pool_lane`]): trainers whose epochs run at the
    /// same time (a vectorized driver's environments) need different lanes.
    #[serde(default)]
    pub graph_pool_lane: usize,
    /// Let cuDNN time its algorithms for every new convolution shape
    /// (process-wide; the last trainer built on CUDA sets it). Faster
    /// kernels for a long-lived shape; a cost at every new shape.
    #[serde(default = "default_true")]
    pub cudnn_benchmark: bool,
    /// The convolutions' weight gradients on a side stream in captured
    /// steps ([`crate::engine::model_step::ModelStepConfig::overlap_weight_grads`]; CUDA only).
    #[serde(default = "default_true")]
    pub overlap_weight_grads: bool,
}

fn default_true() -> bool {
    true
}

impl Default for ModelTrainerConfig {
    fn default() -> Self {
        ModelTrainerConfig {
            seed: 0,
            batch_size: 256,
            validation_batch_size: 1000,
            drop_last: true,
            shuffle: true,
            mode: ExecutionMode::Eager,
            precision: None,
            microbatches: 1,
            clip_grad_norm: None,
            gradient_telemetry_stride: crate::seed_metrics::DEFAULT_GRADIENT_TELEMETRY_STRIDE,
            optimizer: OptimizerConfig::default(),
            graph_warmup_steps: 3,
            epoch_graph_steps: crate::engine::DEFAULT_EPOCH_GRAPH_STEPS,
            max_seeds: 8,
            matmul: PrecisionConfig::default(),
            governor: true,
            snapshot_interval_epochs: 5,
            forbid_syncs: false,
            counterfactual_samples: 1000,
            channels_last: true,
            data_placement: DataPlacement::Device,
            graph_pool_lane: 0,
            cudnn_benchmark: true,
            overlap_weight_grads: true,
        }
    }
}
