//! Simic's error type: one enum for the whole crate. Errors of the crates
//! below are boxed, so a `Result` stays small.

/// Why a Simic operation failed.
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
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration `{field}`: {reason}")]
    InvalidConfig {
        /// The offending field, e.g. `PpoConfig.clip`.
        field: &'static str,
        /// What is wrong with it, with the value.
        reason: String,
    },
    /// An input value is impossible (non-finite, out of its range).
    #[error("invalid input `{field}`: {reason}")]
    InvalidInput {
        /// The offending field, e.g. `reward.contribution`.
        field: &'static str,
        /// What is wrong with it, with the value.
        reason: String,
    },
    /// A tensor does not have the shape, dtype or device the call needs
    /// (checked before libtorch sees it).
    #[error("shape mismatch in `{what}`: expected {expected}, got {got}")]
    ShapeMismatch {
        /// The argument, e.g. `PpoBatch.advantages`.
        what: &'static str,
        /// What was expected.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A value read back from the device does not have the expected size or
    /// is not finite where it must be.
    #[error("readback of `{what}` failed: {reason}")]
    Readback {
        /// What was read.
        what: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The rollout buffer is full, or a step was written out of order.
    #[error("rollout buffer: {0}")]
    Buffer(String),
    /// A training loss or statistic became NaN or infinite.
    #[error("non-finite `{what}` ({value})")]
    NonFinite {
        /// What was non-finite, e.g. `ppo.loss`.
        what: &'static str,
        /// The value as read.
        value: f64,
    },
    /// Data-parallel ranks no longer hold identical policy parameters
    /// (checked after every update, [`crate::distributed`]).
    #[error(
        "data-parallel rank {rank}: {differing} of {total} policy parameters differ between ranks"
    )]
    Diverged {
        /// The rank that found it (every rank finds it).
        rank: usize,
        /// Elements whose maximum and minimum over the ranks differ.
        differing: u64,
        /// Elements compared.
        total: u64,
    },
    /// A leyline contract value was refused.
    #[error("contract value refused: {0}")]
    Contract(Box<leyline::Error>),
    /// Kasmina refused an operation on an environment's model.
    #[error("kasmina: {0}")]
    Kasmina(Box<kasmina::Error>),
    /// Tolaria failed while training an environment.
    #[error("tolaria: {0}")]
    Tolaria(Box<tolaria::Error>),
    /// A data set could not be read (missing files say how to get them).
    #[error("data: {0}")]
    Data(Box<tolaria::data::DataError>),
    /// Tamiyo (features, masks, policy) refused an input.
    #[error("tamiyo: {0}")]
    Tamiyo(Box<tamiyo::Error>),
    /// torch-ext failed (fused kernels, streams, graphs).
    #[error("torch-ext: {0}")]
    TorchExt(Box<torch_ext::Error>),
    /// A checkpoint directory that could not be written, or that does not
    /// check on reading (missing, cut short, checksum mismatch).
    #[error("checkpoint directory: {0}")]
    Durable(Box<durable::Error>),
    /// A checkpoint that checked but is not a PPO checkpoint this build
    /// reads (another format or version, a body that does not parse).
    #[error("PPO checkpoint `{field}`: {reason}")]
    Checkpoint {
        /// The part at fault.
        field: &'static str,
        /// What is wrong, with the values.
        reason: String,
    },
}

impl From<leyline::Error> for Error {
    fn from(error: leyline::Error) -> Self {
        Error::Contract(Box::new(error))
    }
}

impl From<kasmina::Error> for Error {
    fn from(error: kasmina::Error) -> Self {
        Error::Kasmina(Box::new(error))
    }
}

impl From<tolaria::Error> for Error {
    fn from(error: tolaria::Error) -> Self {
        Error::Tolaria(Box::new(error))
    }
}

impl From<tolaria::data::DataError> for Error {
    fn from(error: tolaria::data::DataError) -> Self {
        Error::Data(Box::new(error))
    }
}

impl From<tamiyo::Error> for Error {
    fn from(error: tamiyo::Error) -> Self {
        Error::Tamiyo(Box::new(error))
    }
}

impl From<torch_ext::Error> for Error {
    fn from(error: torch_ext::Error) -> Self {
        Error::TorchExt(Box::new(error))
    }
}

impl From<durable::Error> for Error {
    fn from(error: durable::Error) -> Self {
        Error::Durable(Box::new(error))
    }
}

/// `Result` with Simic's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

// `TorchResultExt` (`.op(name)` on a tch result), defined once in torch-ext.
torch_ext::torch_result_ext!();
