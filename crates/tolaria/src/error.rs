//! Tolaria's error type: one enum for the whole crate.

/// Why a trainer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libtorch operation failed.
    #[error("tensor operation `{op}` failed: {source}")]
    Torch {
        /// The operation that failed.
        op: &'static str,
        /// libtorch's message.
        source: tch::TchError,
    },
    /// A torch-ext (streams, events, graphs, precision) call failed.
    #[error("torch-ext: {0}")]
    TorchExt(#[from] torch_ext::Error),
    /// The configuration asks for something that needs CUDA, and the trainer
    /// runs on the CPU (graph modes, a CUDA device that is not there).
    #[error("{what} needs a CUDA device: {reason}")]
    CudaRequired {
        /// The feature that needs CUDA.
        what: &'static str,
        /// Why it is not available.
        reason: String,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid trainer configuration `{field}`: {reason}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The AMP grad scaler was given a bad saved state, tensors it cannot
    /// use, or calls out of order (see [`crate::amp::GradScaler`]).
    #[error("grad scaler `{field}`: {reason}")]
    GradScaler {
        /// The offending field or call, e.g. `scale` or `unscale_`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// Gradient aggregation was given gradients that do not match the
    /// parameter layout (count, shape, dtype, device), more seeds than it
    /// holds rows for, or inconsistent arguments (see
    /// [`crate::grad_agg::GradAggregator`]).
    #[error("gradient aggregation `{field}`: {reason}")]
    GradAgg {
        /// The offending argument, e.g. `seeds` or `out`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// Deferred seed metrics were given gradients that do not match the
    /// parameter layout (count, shape, device), an inconsistent group event,
    /// or reduced to a value the contract refuses (non-finite, out of range)
    /// at the epoch's end (see [`crate::seed_metrics::SeedMetricsAccumulator`]).
    #[error("seed metrics `{field}`: {reason}")]
    SeedMetrics {
        /// The offending argument or metric, e.g. `grads` or `gradient_norm`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// The governor was given a bad configuration value or loss, asked to
    /// roll back without a snapshot, or found a snapshot that no longer
    /// matches the model (see [`crate::governor::Governor`]).
    #[error("governor `{field}`: {reason}")]
    Governor {
        /// The offending field or argument, e.g. `snapshot` or `host`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// A training or validation set is inconsistent (lengths, sizes).
    #[error("invalid data set `{field}`: {reason}")]
    InvalidData {
        /// The offending field, e.g. `inputs`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// A data set could not be read, built or used (see
    /// [`crate::data::DataError`]: files, formats, sizes, labels, finiteness).
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// The loss read back at the end of an epoch (training) or of a
    /// validation pass is NaN or infinite: the run diverged. The epoch's
    /// updates have been applied (the parameters are likely non-finite too);
    /// the caller decides what to do (roll back, stop).
    #[error("{phase} loss of epoch {epoch} is {value}, not finite: the run diverged")]
    NonFiniteLoss {
        /// `training` or `validation`.
        phase: &'static str,
        /// Zero-based epoch index (for validation: epochs trained before it).
        epoch: usize,
        /// The loss read back.
        value: f64,
    },
    /// A metric read back at the end of an epoch is impossible (non-finite or
    /// out of range), so it cannot be reported.
    #[error("metric `{what}` read back as {value}, which is impossible")]
    InvalidMetric {
        /// The metric, e.g. `correct`.
        what: &'static str,
        /// The value read back.
        value: f64,
    },
    /// A controller, its observation, its decision or the decision deadline
    /// is invalid (see [`crate::controller`]).
    #[error("controller `{field}`: {reason}")]
    Controller {
        /// The offending field or argument, e.g. `deadline` or `decision.slot`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// Kasmina refused a lifecycle operation a decision asked for (illegal
    /// transition, occupied slot, failed gate check...; see
    /// [`crate::controller::apply`]).
    #[error("lifecycle operation `{op}` refused: {source}")]
    Lifecycle {
        /// The operation, e.g. `germinate`.
        op: &'static str,
        /// Kasmina's typed error.
        source: kasmina::Error,
    },
    /// A checkpoint directory that could not be written, or that does not
    /// check on reading (missing, cut short, checksum mismatch).
    #[error("checkpoint directory: {0}")]
    Durable(#[from] durable::Error),
    /// A trainer state given to
    /// [`crate::engine::trainer::ModelTrainer::restore`] does not fit the
    /// model, the configuration or itself (a tensor missing or of another
    /// shape, other slots, a governor the configuration lacks...); nothing
    /// was built.
    #[error("trainer state `{field}`: {reason}")]
    Checkpoint {
        /// The part at fault, e.g. `tensors`, `slots`, `optimizers`.
        field: &'static str,
        /// What is wrong with it, with the values.
        reason: String,
    },
    /// A value read back from the device does not have the expected shape.
    #[error("readback of `{what}` returned {got} values, expected {expected}")]
    Readback {
        /// What was read.
        what: &'static str,
        /// Values expected.
        expected: usize,
        /// Values received.
        got: usize,
    },
}

/// Tolaria's result type.
pub type Result<T> = std::result::Result<T, Error>;

// `TorchResultExt` (`.op(name)` on a tch result), defined once in torch-ext.
torch_ext::torch_result_ext!();
