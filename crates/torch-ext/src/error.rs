//! The crate's error type.

/// Everything that can go wrong in torch-ext.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA-only operation was asked for on a machine without a CUDA device
    /// (or without a driver). Callers fall back to the CPU / eager path.
    #[error("CUDA not available")]
    CudaUnavailable,
    /// A device index at or beyond the number of CUDA devices.
    #[error("CUDA device {device} does not exist ({count} devices)")]
    InvalidDevice {
        /// The index asked for.
        device: usize,
        /// How many CUDA devices there are.
        count: usize,
    },
    /// A device name that is none of `auto`, `cpu`, `cuda`, `cuda:N` (see
    /// [`crate::device::DeviceChoice`]).
    #[error("unknown device {text:?} (expected auto, cpu, cuda or cuda:N)")]
    UnknownDevice {
        /// The refused text.
        text: String,
    },
    /// The C++ side threw (a `c10::Error`, a CUDA error, ...); `message` is
    /// its text without the C++ backtrace.
    #[error("{op}: {message}")]
    Cpp {
        /// The torch-ext operation that failed.
        op: &'static str,
        /// The C++ exception message.
        message: String,
    },
    /// An argument the shim would reject, caught on the Rust side first.
    #[error("{op}: {message}")]
    InvalidArgument {
        /// The torch-ext operation.
        op: &'static str,
        /// What is wrong with the argument.
        message: String,
    },
    /// A closure run by torch-ext (the body of a graph capture) panicked. The
    /// panic was caught; it never unwound through C++.
    #[error("panic in captured body: {message}")]
    Panic {
        /// The panic payload, when it was a string.
        message: String,
    },
    /// A closure run by torch-ext (the body of a graph capture) returned an
    /// error.
    #[error("captured body failed during {phase}: {message}")]
    Body {
        /// `"warm-up"` or `"capture"`.
        phase: &'static str,
        /// The error the body returned.
        message: String,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Defines the calling crate's `TorchResultExt`: the one way a crate above
/// torch-ext attaches the operation name to a tch error while keeping its
/// own typed error.
///
/// Invoke it once, in the module that defines the crate's `Error` (which
/// must have a variant `Torch { op: &'static str, source: tch::TchError }`)
/// and `Result<T>`. It expands to a `pub(crate) trait TorchResultExt<T>`
/// with one method, `op(self, op) -> Result<T>`, implemented for
/// `Result<T, tch::TchError>`, so `tensor.f_add(&other).op("add")?` gives
/// `Error::Torch { op: "add", .. }`. The calling crate depends on tch.
///
/// A macro rather than a generic trait: a generic `op` would leave the
/// error type to inference, which `?` cannot settle.
#[macro_export]
macro_rules! torch_result_ext {
    () => {
        /// Attaches the operation name to a tch error.
        pub(crate) trait TorchResultExt<T> {
            /// Maps a tch error into [`Error::Torch`] naming `op`.
            fn op(self, op: &'static str) -> Result<T>;
        }

        impl<T> TorchResultExt<T> for ::std::result::Result<T, ::tch::TchError> {
            fn op(self, op: &'static str) -> Result<T> {
                self.map_err(|source| Error::Torch { op, source })
            }
        }
    };
}
