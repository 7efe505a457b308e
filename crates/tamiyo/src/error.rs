//! Tamiyo's error type: one enum for the whole crate.

/// Why a Tamiyo operation failed.
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
    /// A torch-ext device facility (autocast, streams, kernels) failed.
    #[error("device operation `{op}` failed: {source}")]
    Device {
        /// The operation that failed.
        op: &'static str,
        /// torch-ext's error.
        source: torch_ext::Error,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration `{field}`: {reason}")]
    InvalidConfig {
        /// The offending field, e.g. `PolicyConfig.hidden_dim`.
        field: &'static str,
        /// What is wrong with it, with the value.
        reason: String,
    },
    /// An input value is impossible (non-finite, out of its range, outside a
    /// contract enum).
    #[error("invalid input `{field}`: {reason}")]
    InvalidInput {
        /// The offending field, e.g. `observation.val_loss`.
        field: &'static str,
        /// What is wrong with it, with the value.
        reason: String,
    },
    /// A tensor or buffer does not have the shape, dtype or device the call
    /// needs (checked before libtorch sees it).
    #[error("shape mismatch in `{what}`: expected {expected}, got {got}")]
    ShapeMismatch {
        /// The argument, e.g. `forward.obs`.
        what: &'static str,
        /// What was expected.
        expected: String,
        /// What was given.
        got: String,
    },
    /// An observation's slots do not match the slots the tracker, mask or
    /// policy was built for.
    #[error("slot mismatch: expected slots [{expected}], observation has [{got}]")]
    SlotMismatch {
        /// The configured slots, in order.
        expected: String,
        /// The observation's slots, in order.
        got: String,
    },
    /// A leyline contract value was refused (an unknown stage, op or enum
    /// value).
    #[error("contract value refused: {0}")]
    Contract(#[from] leyline::Error),
    /// A value read back from the device does not have the expected size.
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

/// Tamiyo's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Attaches the operation name to a tch error.
pub(crate) trait TorchResultExt<T> {
    /// Maps a tch error into [`Error::Torch`] naming `op`.
    fn op(self, op: &'static str) -> Result<T>;
}

impl<T> TorchResultExt<T> for std::result::Result<T, tch::TchError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Torch { op, source })
    }
}

/// A shape error for `what`.
pub(crate) fn shape_mismatch(
    what: &'static str,
    expected: impl std::fmt::Display,
    got: impl std::fmt::Debug,
) -> Error {
    Error::ShapeMismatch {
        what,
        expected: expected.to_string(),
        got: format!("{got:?}"),
    }
}
