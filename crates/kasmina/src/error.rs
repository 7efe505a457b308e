//! The crate's error type.

/// Errors from Kasmina.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A data set could not be read or is malformed.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// A libtorch operation failed.
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Result alias of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
