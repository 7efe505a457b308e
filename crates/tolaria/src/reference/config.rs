//! The special reference path's configuration (`tolaria-reference`, the
//! hand-derived fused step): one explicit serde struct, serialized next to
//! benchmark results so a record says exactly what ran.
//!
//! Its execution mode, data placement and precision are the engine's and
//! amp's types ([`ExecutionMode`], [`DataPlacement`], [`PrecisionConfig`]);
//! [`DataPlacement`] and the packed buffer's bound [`MAX_PACKED_VALUES`]
//! (the data layer's) are re-exported here.

use serde::{Deserialize, Serialize};
use torch_ext::DeviceChoice;

pub use crate::data::limits::MAX_PACKED_VALUES;
pub use crate::engine::DataPlacement;

use crate::amp::PrecisionConfig;
use crate::data::ReferenceTask;
use crate::engine::ExecutionMode;
use crate::error::{Error, Result};

/// Largest number of training (or validation) samples, and largest batch size,
/// of the trainer (the data layer's own bounds are in [`crate::data::limits`]).
pub const MAX_TRAINER_SAMPLES: usize = 1 << 24;
/// Largest number of input features of the linear host.
pub const MAX_TRAINER_FEATURES: usize = 1 << 16;
/// Largest number of classes (the confusion matrix holds `n_classes^2` `f32`s).
pub const MAX_TRAINER_CLASSES: usize = 1024;

/// How the gradient of a step is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// Hand-derived backward for linear + softmax cross-entropy: the loss
    /// gradient is one `_log_softmax_backward_data`, the weight gradient one
    /// matrix product, and the optimizer update is fused. Fewest kernels.
    Fused,
    /// libtorch autograd (`torch::autograd::grad`) and a device-resident SGD
    /// update: the general path, kept as the reference the fused step is
    /// checked against.
    Autograd,
}

/// Everything a [`super::Trainer`] needs to know: the `tolaria-reference`
/// workload (DESIGN.md §6) by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    /// Seed of the synthetic data and of the parameter initialisation.
    pub seed: u64,
    /// Training samples.
    pub n_samples: usize,
    /// Validation samples (0: no validation set).
    pub n_validation_samples: usize,
    /// Input features of the linear host.
    pub n_features: usize,
    /// Output classes.
    pub n_classes: usize,
    /// Microbatch size; the last microbatch is smaller when `n_samples` is not
    /// a multiple of it.
    pub batch_size: usize,
    /// SGD learning rate.
    pub learning_rate: f64,
    /// SGD momentum (dampening 0, no Nesterov, no weight decay).
    pub momentum: f64,
    /// Device to train on.
    pub device: DeviceChoice,
    /// Step execution mode.
    pub mode: ExecutionMode,
    /// Where the training set lives.
    pub data_placement: DataPlacement,
    /// Gradient computation.
    pub step: StepKind,
    /// Fused step only: update with torch-ext's fused SGD kernel
    /// (`at::_fused_sgd_`, one kernel) instead of `mul_` + `addmm_` + `addcmul_`.
    pub fused_sgd: bool,
    /// Eager steps run on the capture stream before the first capture.
    pub graph_warmup_steps: usize,
    /// TF32 / matmul precision, set once at start-up.
    pub precision: PrecisionConfig,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig::reference()
    }
}

impl TrainerConfig {
    /// The `tolaria-reference` workload: Linear(16->4), 16 samples, batch 4
    /// (4 steps per epoch), SGD lr 0.01 momentum 0.9, eager on the best device.
    pub fn reference() -> TrainerConfig {
        TrainerConfig {
            seed: 20_251_001,
            n_samples: 16,
            n_validation_samples: 16,
            n_features: 16,
            n_classes: 4,
            batch_size: 4,
            learning_rate: 0.01,
            momentum: 0.9,
            device: DeviceChoice::Auto,
            mode: ExecutionMode::Eager,
            data_placement: DataPlacement::PinnedHost,
            step: StepKind::Fused,
            fused_sgd: true,
            graph_warmup_steps: 3,
            precision: PrecisionConfig::default(),
        }
    }

    /// The data set this configuration trains on: its seed and sizes.
    pub fn task(&self) -> ReferenceTask {
        ReferenceTask {
            seed: self.seed,
            n_samples: self.n_samples,
            n_validation_samples: self.n_validation_samples,
            n_features: self.n_features,
            n_classes: self.n_classes,
        }
    }

    /// Microbatches per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        self.n_samples.div_ceil(self.batch_size.max(1))
    }

    /// Checks ranges and combinations that cannot work, with checked
    /// arithmetic on every size before anything is allocated:
    ///
    /// - `n_samples` in `1..=`[`MAX_TRAINER_SAMPLES`], `n_validation_samples` at most
    ///   [`MAX_TRAINER_SAMPLES`], `batch_size` in `1..=`[`MAX_TRAINER_SAMPLES`];
    /// - `n_features` in `1..=`[`MAX_TRAINER_FEATURES`], `n_classes` in
    ///   `2..=`[`MAX_TRAINER_CLASSES`];
    /// - the packed training and validation buffers
    ///   (`samples x (2 x n_classes + n_features + 1)` `f32`s) at most
    ///   [`MAX_PACKED_VALUES`];
    /// - `learning_rate` finite, positive and a positive finite `f32`
    ///   (the device keeps it in `f32`); `momentum` in `[0, 1)`;
    /// - graph-epoch mode only with device-resident data.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        let invalid =
            |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        let in_range = |field: &'static str, value: usize, low: usize, high: usize| {
            if (low..=high).contains(&value) {
                Ok(())
            } else {
                invalid(field, format!("{value} is outside {low}..={high}"))
            }
        };
        in_range("n_samples", self.n_samples, 1, MAX_TRAINER_SAMPLES)?;
        in_range(
            "n_validation_samples",
            self.n_validation_samples,
            0,
            MAX_TRAINER_SAMPLES,
        )?;
        in_range("batch_size", self.batch_size, 1, MAX_TRAINER_SAMPLES)?;
        in_range("n_features", self.n_features, 1, MAX_TRAINER_FEATURES)?;
        in_range("n_classes", self.n_classes, 2, MAX_TRAINER_CLASSES)?;
        // The packed-buffer bounds of the training and validation sets are
        // the reference task's own check.
        self.task().validate()?;
        let lr = self.learning_rate;
        let lr_f32 = lr as f32;
        if !(lr.is_finite() && lr > 0.0 && lr_f32.is_finite() && lr_f32 > 0.0) {
            return invalid(
                "learning_rate",
                format!("{lr} is not a finite positive number representable as a positive f32"),
            );
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return invalid("momentum", format!("{} is outside [0, 1)", self.momentum));
        }
        if self.mode == ExecutionMode::GraphEpoch && self.data_placement != DataPlacement::Device {
            return invalid(
                "data_placement",
                "graph-epoch replays the whole epoch from device memory: use `device`".to_owned(),
            );
        }
        Ok(())
    }
}
