//! Simic: the vectorized PPO trainer that teaches Tamiyo's policy
//! (reference §4).
//!
//! Simic has no training loop of its own for the host networks: every
//! environment is a Kasmina model trained by Tolaria's engine, one epoch per
//! environment step, and Simic only decides what happens between epochs and
//! learns from it.
//!
//! Modules (each says what it owns):
//!
//! Like the other libtorch crates, Simic has no doctests: a doctest binary is
//! linked outside `target/` and would not find libtorch.

// No panics on caller- or file-supplied values: the panic lints are on for
// library code, and every integer operation is checked, saturating or bounded
// where it is written (sizes are validated where they enter).
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

pub mod error;

pub use error::{Error, Result};
