//! The reward of one environment step (reference §4.4) and the reward
//! normaliser (§4.2): pure host code on `f64`, run once per environment step
//! at the epoch boundary.
//!
//! Each submodule owns one part; the main items are re-exported here.
//!
//! - [`RewardConfig`] holds every constant with the reference's defaults and
//!   the [`RewardMode`] (SHAPED, ESCROW, SPARSE, MINIMAL); [`RewardInputs`] is what
//!   one step reads (the op, the targeted seed's [`SeedFacts`], every slot's
//!   [`SlotFacts`], accuracies, counts); [`compute_reward`] validates both
//!   and returns a [`RewardBreakdown`] with every component and the total.
//! - The stage potential [`potential`] and the shaping term [`pbrs_term`]
//!   (`0.3·(γφ′ − φ)`), which telescopes over a trajectory.
//! - The SHAPED components are listed in [`shaped`]'s docs
//!   (attribution with its discounts and anti-gaming ratio penalty, the
//!   BLENDING and HOLDING warnings, PBRS, synergy, rent, alpha shock,
//!   occupancy, the germination delay cost (not the reference's, off by
//!   default), per-op costs, fossilize and prune shaping, terminal bonus,
//!   auto-prune penalty); [`sparse_reward`] is SPARSE's terminal reward.
//! - Episode rules: [`apply_governor_rollback`] (death penalty on the last
//!   transition, earlier rewards forfeited) and [`auto_prune_penalty`].
//! - [`RewardNormaliser`]: divides by the running standard deviation
//!   (Welford, no mean shift) and clips to ±10, with a serde state.
//!
//! - ESCROW ([`RewardMode::Escrow`]) is SHAPED with the attribution paid as
//!   the change of a per-slot credit ([`EscrowInputs`]; the environment
//!   keeps the credits), forfeited at the last step unless fossilized.
//!
//! Not built: the reference's other modes (BASIC, SIMPLIFIED, and
//! BASIC_PLUS with its post-fossilisation "drip" and the drip's asymmetric
//! clipping), the LOSS family, and the scaffold hindsight credit.

pub mod breakdown;
pub mod config;
mod config_checks;
pub mod episode;
pub mod inputs;
pub mod normaliser;
pub mod pbrs;
pub mod shaped;
pub mod sparse;

pub use breakdown::RewardBreakdown;
pub use config::{DEFAULT_GAMMA, RewardConfig, RewardMode, StagePotentials};
pub use episode::{RollbackOutcome, apply_governor_rollback, auto_prune_penalty};
pub use inputs::{EscrowInputs, RewardInputs, SeedFacts, SlotFacts};
pub use normaliser::{RewardNormaliser, RewardNormaliserConfig, RewardNormaliserState};
pub use pbrs::{StagePoint, base_potential, pbrs_term, potential, slot_potential};
pub use shaped::{attribution_discount, timing_discount};
pub use sparse::sparse_reward;

use crate::Result;

/// The reward of one step under `config`'s mode, by component. Validates
/// the config ([`Error::InvalidConfig`](crate::Error::InvalidConfig)) and
/// the inputs ([`Error::InvalidInput`](crate::Error::InvalidInput) for a
/// non-finite or out-of-range value, naming the field). Constants that are
/// finite but so large that the total overflows are refused as
/// [`Error::NonFinite`](crate::Error::NonFinite) (`reward.total`): no
/// non-finite reward leaves this function.
pub fn compute_reward(config: &RewardConfig, inputs: &RewardInputs) -> Result<RewardBreakdown> {
    config.validate()?;
    inputs.validate()?;
    let breakdown = match config.mode {
        RewardMode::Shaped => shaped::shaped_reward(config, inputs),
        RewardMode::Escrow => {
            if inputs.escrow.is_none() {
                return Err(crate::Error::InvalidInput {
                    field: "RewardInputs.escrow",
                    reason: "ESCROW needs the slot's credit and the stable accuracy".to_owned(),
                });
            }
            shaped::shaped_reward(config, inputs)
        }
        RewardMode::Sparse | RewardMode::Minimal => {
            sparse::sparse_breakdown(config, inputs, config.mode)?
        }
    };
    if !breakdown.total.is_finite() {
        return Err(crate::Error::NonFinite {
            what: "reward.total",
            value: breakdown.total,
        });
    }
    Ok(breakdown)
}
