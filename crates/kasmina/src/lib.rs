//! Kasmina: where the network grows.
//!
//! - [`data`]: data sets (Fashion-MNIST IDX, CIFAR-10 binary, seeded synthetic
//!   tasks) with shuffle, split, batching and per-data-set normalisation.
//! - [`error`]: the crate's error type.

pub mod data;
pub mod error;

pub use error::{Error, Result};
