//! Tolaria's error type: one enum for the whole crate.

/// Why a trainer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TolariaError {
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
pub type Result<T> = std::result::Result<T, TolariaError>;

/// Attaches the operation name to a tch error.
pub(crate) trait TorchResultExt<T> {
    /// Maps a tch error into [`TolariaError::Torch`] naming `op`.
    fn op(self, op: &'static str) -> Result<T>;
}

impl<T> TorchResultExt<T> for std::result::Result<T, tch::TchError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|source| TolariaError::Torch { op, source })
    }
}
