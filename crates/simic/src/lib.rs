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
//! - [`vectorized`]: the vectorized PPO rounds ([`vectorized::Simic`]):
//!   environments driven through Tolaria's epoch phases, the fused
//!   counterfactual pass, one batched policy forward and one readback per
//!   step, rewards, the rollout buffer, GAE and the update.
//! - [`buffer`]: the rollout buffer on the device, `[n_envs, steps]`.
//! - [`agent`]: Tamiyo's policy as PPO sees it (the
//!   re-evaluation of stored rows as sequences).
//! - [`gae`]: generalised advantage estimation over `[E, T]` rollouts on the
//!   device (terminal, truncation with bootstrap, row ends).
//! - [`ppo`]: the PPO update on rows of `[R, T, ...]` batches (config and
//!   schedules, the per-head clipped loss, the value normaliser, the KL early
//!   stop) with Tolaria's AdamW.
//! - [`distributed`]: data-parallel PPO across processes over a c10d group
//!   (gradients averaged, statistics pooled, parameters checked identical).
//! - [`checkpoint`]: a PPO run's checkpoint directory (policy, optimizer,
//!   generators, normalisers) written and read through `durable`'s one
//!   checkpoint-directory writer ([`vectorized::Simic::save_checkpoint`],
//!   [`checkpoint::read_checkpoint`]).
//! - [`cartpole`]: CartPole-v1 (gymnasium's rules, vectorised, auto-reset),
//!   CleanRL's MLP actor-critic and `train_cartpole`, the PPO core's proof.
//!
//! - [`counterfactual`]: counterfactual and Shapley attribution of the
//!   seeds: alpha configurations, the fused validation pass over them, and
//!   the contribution, interaction and Shapley estimates.
//!
//! - [`rewards`]: the reward of one environment step (SHAPED, SPARSE,
//!   MINIMAL, by component, with PBRS), the episode rules (governor
//!   rollback, auto-prune) and the running reward normaliser.
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

pub mod agent;
pub mod bench;
pub mod buffer;
pub mod cartpole;
pub mod checkpoint;
pub mod counterfactual;
pub mod distributed;
pub mod error;
mod finite;
pub mod gae;
pub mod ppo;
pub mod rewards;
pub mod vectorized;

/// The unit tests that seed libtorch's global generator and build or train
/// models hold this lock: the tests of one binary run in parallel threads,
/// and another test's draws from the same generator between a seeding and
/// its draws would change the weights a test compares bit for bit.
#[cfg(test)]
pub(crate) fn global_rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use error::{Error, Result};
