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
    /// A number is NaN or infinite (or too large to be represented where it
    /// is stored) where only finite values are allowed. The call that
    /// returns it changed nothing.
    #[error("`{field}` is not finite: {value}{}", position(.index))]
    NonFinite {
        /// The offending field or tensor, e.g. `observation.val_loss` or
        /// `RunningMeanStd.update.batch`.
        field: &'static str,
        /// The first offending value.
        value: f64,
        /// Its position in the tensor (row, column, ...); empty for a
        /// scalar.
        index: Vec<usize>,
    },
    /// A mask leaves a head without any allowed action in some row (an
    /// all-false row): sampling under it would have to return an action the
    /// mask forbids. The call that returns it changed nothing.
    #[error("mask of head `{head}`{} allows no action in row {row}", op_suffix(.op))]
    EmptyMask {
        /// The head ([`leyline::HEAD_NAMES`] entry).
        head: &'static str,
        /// For the slot head's `slot_by_op` row: the op it belongs to.
        op: Option<leyline::LifecycleOp>,
        /// The row (environment) at fault.
        row: usize,
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

impl Error {
    /// The field, tensor or argument the error names, where it names one
    /// (`None` for libtorch and device failures, slot mismatches and
    /// contract errors).
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::InvalidConfig { field, .. }
            | Error::InvalidInput { field, .. }
            | Error::NonFinite { field, .. } => Some(field),
            Error::EmptyMask { head, .. } => Some(head),
            Error::ShapeMismatch { what, .. } | Error::Readback { what, .. } => Some(what),
            Error::Torch { .. }
            | Error::Device { .. }
            | Error::SlotMismatch { .. }
            | Error::Contract(_) => None,
        }
    }
}

/// ` at [i, j]` for a tensor position, nothing for a scalar.
fn position(index: &[usize]) -> String {
    if index.is_empty() {
        String::new()
    } else {
        format!(" at {index:?}")
    }
}

/// ` (op X)` for a `slot_by_op` row.
fn op_suffix(op: &Option<leyline::LifecycleOp>) -> String {
    op.map(|op| format!(" for op {}", op.name()))
        .unwrap_or_default()
}

/// `value` if it is finite, else [`Error::NonFinite`] naming `field`.
pub(crate) fn finite(field: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::NonFinite {
            field,
            value,
            index: Vec::new(),
        })
    }
}

/// `value` if it is finite and in `[low, high]`: [`Error::NonFinite`] or
/// [`Error::InvalidInput`] naming `field` otherwise.
pub(crate) fn in_range(field: &'static str, value: f64, low: f64, high: f64) -> Result<f64> {
    finite(field, value)?;
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(Error::InvalidInput {
            field,
            reason: format!("{value} is outside [{low}, {high}]"),
        })
    }
}

// `TorchResultExt` (`.op(name)` on a tch result), defined once in torch-ext.
torch_ext::torch_result_ext!();

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
