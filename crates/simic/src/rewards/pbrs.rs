//! Potential-based reward shaping over the seed lifecycle (reference §4.4;
//! Ng, Harada & Russell 1999).
//!
//! The potential of a slot is `φ(stage, e) = base(stage) + min(bonus·e, cap)`
//! with `e` the epochs spent in the stage, for the stages that carry a base
//! potential (GERMINATED 1.0, TRAINING 2.0, BLENDING 3.5, HOLDING 5.5,
//! FOSSILIZED 6.0 by default); UNKNOWN, DORMANT, the failure stages
//! (PRUNED, EMBARGOED, RESETTING) and an empty slot have potential exactly 0,
//! whatever their epoch count. The shaping term of one step is
//! `w·(γ·φ(after) − φ(before))`.
//!
//! Over a trajectory `s_0 … s_n` in which each step's `after` is the next
//! step's `before`, the discounted sum `Σ_t γ^t·w·(γφ(s_{t+1}) − φ(s_t))`
//! telescopes to `w·(γ^n·φ(s_n) − φ(s_0))`: the shaping changes returns by
//! an amount that depends only on the end points, so it cannot change which
//! policy is optimal. That holds only if `before` and `after` are taken the
//! same way every step; [`crate::rewards::RewardInputs`] says how.

use leyline::SeedStage;

use super::config::{RewardConfig, StagePotentials};

/// A slot's lifecycle position as the potential sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePoint {
    /// The seed's stage.
    pub stage: SeedStage,
    /// Epochs the seed has spent in that stage.
    pub epochs_in_stage: u32,
}

/// The base potential of `stage` (0 for UNKNOWN, DORMANT and the failure
/// stages).
pub fn base_potential(potentials: &StagePotentials, stage: SeedStage) -> f64 {
    match stage {
        SeedStage::Germinated => potentials.germinated,
        SeedStage::Training => potentials.training,
        SeedStage::Blending => potentials.blending,
        SeedStage::Holding => potentials.holding,
        SeedStage::Fossilized => potentials.fossilized,
        SeedStage::Unknown
        | SeedStage::Dormant
        | SeedStage::Pruned
        | SeedStage::Embargoed
        | SeedStage::Resetting => 0.0,
    }
}

/// `φ(stage, epochs_in_stage)`: the base potential plus
/// `min(epoch_progress_bonus·epochs, max_progress_bonus)`, or exactly 0 for
/// a stage without a base potential.
pub fn potential(config: &RewardConfig, stage: SeedStage, epochs_in_stage: u32) -> f64 {
    let base = base_potential(&config.stage_potentials, stage);
    if base == 0.0 {
        return 0.0;
    }
    let progress =
        (config.epoch_progress_bonus * f64::from(epochs_in_stage)).min(config.max_progress_bonus);
    base + progress
}

/// The potential of a slot: [`potential`] of its seed, 0 when it is empty
/// (`None`).
pub fn slot_potential(config: &RewardConfig, point: Option<StagePoint>) -> f64 {
    point.map_or(0.0, |point| {
        potential(config, point.stage, point.epochs_in_stage)
    })
}

/// The shaping term of one step, `pbrs_weight·(γ·φ(after) − φ(before))`,
/// with `None` an empty slot.
pub fn pbrs_term(
    config: &RewardConfig,
    before: Option<StagePoint>,
    after: Option<StagePoint>,
) -> f64 {
    config.pbrs_weight
        * (config.gamma * slot_potential(config, after) - slot_potential(config, before))
}
