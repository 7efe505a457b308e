//! Kasmina: where the network grows.
//!
//! A *host* network ([`host`]) exposes seed slots at canonical boundaries
//! (`r{row}c{col}`). A [`model::MorphogeneticModel`] routes the forward pass
//! through the enabled slots in execution order; each [`slot::SeedSlot`]
//! holds at most one seed module built from a [`blueprint`], blends it in
//! with one of the [`blend`] algorithms and isolates its gradients from the
//! host, while its [`lifecycle`] (a state machine without tensors, on
//! leyline's transition table, the [`gate`]s and the [`alpha`] schedule)
//! decides every stage move. Around the model sit [`attribution`] (which seeds
//! influenced which samples), [`export`] (leyline `SeedState` messages),
//! [`masks`] (which flattened parameter ranges belong to whom), [`prefetch`]
//! (building seed modules off the training thread) and [`telemetry`]
//! (lifecycle events).
//!
//! Kasmina is the model side. It holds no data sets, splits, shuffling or
//! staging (those are `tolaria::data`, the trainer side) and picks no device
//! (`torch_ext::device::select` does; callers pass the device in). It owns
//! no optimizer either: it exposes parameter [`groups`] (the host, one per
//! live seed) and records when a group appears or goes; the trainer
//! (`tolaria::optim`) builds, steps and drops the optimizer state.
//!
//! - [`layers`]: the small fallible tch layers the rest is made of.
//! - [`error`]: the crate's error type; [`validate`]: the checks and size
//!   bounds applied where values enter the crate.
//! - [`bench`](mod@bench): the `kasmina-prefetch` benchmark's measuring code
//!   (figures only; `esper bench kasmina-prefetch` writes the record).

#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing
    )
)]

pub mod alpha;
pub mod attribution;
pub mod bench;
pub mod blend;
pub mod blueprint;
pub mod error;
pub mod export;
pub mod gate;
pub mod groups;
pub mod host;
pub mod layers;
pub mod lifecycle;
pub mod masks;
pub mod model;
pub mod prefetch;
pub mod slot;
mod slot_checks;
pub mod telemetry;
pub mod validate;

pub use error::{Error, Result};
