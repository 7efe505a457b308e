//! Data sets: Fashion-MNIST, CIFAR-10 binary, seeded synthetic tasks.

/// Why a data set could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Placeholder until the readers land.
    #[error("data sets are not implemented yet")]
    NotImplemented,
}
