//! Tamiyo: the controller that decides, once per host epoch, what happens to
//! the seeds (reference §3).
//!
//! - [`features`]: the HEAD "Obs V3" observation (schema version
//!   [`features::SCHEMA_VERSION`]): the exact layout, widths and
//!   normalisations of reference §3.3 ([`features::layout`] names every
//!   field's offset and width), the per-environment history it needs
//!   ([`features::ObservationTracker`]), and [`features::FeatureBatch`], which
//!   writes `[n_envs, obs_dim]` observations and `[n_envs, num_slots]`
//!   blueprint indices for many environments into preallocated tensors.
//! - [`normaliser`]: the running observation normaliser (the reference's
//!   `RunningMeanStd`: EMA or Welford moments, epsilon, clip), state on the
//!   device, a serde form for checkpoints.
//! - [`heads`]: the action heads as the policy uses them (positions in
//!   [`leyline::HEAD_NAMES`], sizes, causal relevance per op, canonical
//!   actions) and [`heads::FactoredAction`].
//! - [`masks`]: the action masks per head (reference §3.2), including the
//!   op-conditioned slot masks and the HEAD "D3" germination block, from the
//!   observation and Kasmina's [`kasmina::model::OpAvailability`].
//! - [`policy`]: the recurrent actor-critic (reference §3.4): blueprint
//!   embedding, feature net, residual LSTM, one head per
//!   [`leyline::HEAD_NAMES`] entry and the critic, on a tch `VarStore`, with
//!   one batched forward for every environment; masked sampling with a
//!   seeded device-side generator, per-head log-probs and entropies in fp32,
//!   the causal relevance of each head for the chosen op
//!   ([`policy::sampling`]).
//! - [`controller`]: [`controller::PolicyController`], the policy network
//!   behind Tolaria's [`tolaria::controller::Controller`] trait for one
//!   environment.
//! - [`heuristic`]: [`heuristic::HeuristicController`], the reference's
//!   `HeuristicTamiyo` (reference §3.5) with its signal tracker, behind the
//!   same trait.
//! - [`growth`]: [`growth::MaxGrowthController`], a scripted controller that
//!   grows as fast as the masks allow and never prunes: the ceiling on
//!   active seeds per epoch that the Simic benches report beside the
//!   policy's.
//! - [`policy::graphed`]: the batched policy step replayed from a CUDA graph.
//!
//! The network's auxiliary heads (the reference's `q_head` and contribution
//! predictor, [`policy::PolicyNetwork::auxiliary`]) run in the PPO update
//! only. The PPO trainer that trains the policy is Simic. The heuristic
//! reports the host's stabilisation (`tamiyo.initiated`,
//! [`heuristic::HeuristicController::with_telemetry`]); the rest of the
//! reference's Tamiyo telemetry (decision analytics) is not built.
//!
//! **Bad input.** Every public entry point that takes numbers from outside
//! checks them before anything changes, and a refused call leaves the state
//! exactly as it was:
//! - a NaN or an infinity is [`Error::NonFinite`] naming the field (and,
//!   for a tensor, the position of the first bad value); a finite value out
//!   of its range is [`Error::InvalidInput`]: observations and their seed
//!   states ([`features::check_observation`], the tracker, the encoders),
//!   the normaliser's update and saved state, the heuristic's tracker and
//!   saved state, every controller's observation;
//! - a mask row that allows nothing is [`Error::EmptyMask`], refused where
//!   masks are built on the host ([`masks::MaskTensors::from_masks`]) or
//!   checked once ([`masks::MaskTensors::from_tensors`]), so a forbidden
//!   action is never sampled;
//! - device tensors are read back only outside the per-step path (the
//!   normaliser's update reads one flag); on the per-step policy path, inputs
//!   on the CPU are checked (host memory) and inputs on CUDA are built from
//!   values already checked on the host.
//!
//! On a CPU whose oneDNN has no bf16 LSTM (no AVX-512), bf16 policy forwards
//! run their LSTM layers in full precision
//! ([`policy::cpu_bf16_lstm_supported`]).
//!
//! `examples/policy_controller.rs` runs the whole loop on a small Kasmina
//! model: observe, mask, act, and Tolaria's `apply`. (Like the other
//! libtorch crates, Tamiyo has no doctests: a doctest binary is linked
//! outside `target/` and would not find libtorch.)

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

pub mod controller;
pub mod error;
pub mod features;
mod finite;
pub mod growth;
pub mod heads;
pub mod heuristic;
pub mod masks;
pub mod normaliser;
pub mod policy;

pub use error::{Error, Result};
