//! The SPARSE and MINIMAL rewards (reference §4.4).
//!
//! - **SPARSE**: 0 on every step but the terminal one, which gets
//!   `scale·clamp(committed_acc/100 − 0.1·fossil_params/500,000, −1, 1)`:
//!   the accuracy of the fossils alone less a parameter cost.
//! - **MINIMAL**: SPARSE plus −0.1 on a PRUNE (carried out) of a seed
//!   younger than 5 epochs, against a degenerate prune-everything policy.
//!
//! Neither pays the auto-prune penalty or any other shaping.

use leyline::LifecycleOp;

use super::breakdown::RewardBreakdown;
use super::config::{RewardConfig, RewardMode};
use super::inputs::RewardInputs;
use crate::{Error, Result};

/// The sparse reward: 0 before the terminal step, the clamped
/// committed-accuracy reward at it (whatever `config.mode`). Validates the
/// config and the inputs; the terminal step needs
/// [`RewardInputs::committed_val_acc`].
pub fn sparse_reward(config: &RewardConfig, inputs: &RewardInputs) -> Result<f64> {
    config.validate()?;
    inputs.validate()?;
    sparse_value(config, inputs)
}

/// [`sparse_reward`] of validated inputs.
fn sparse_value(config: &RewardConfig, inputs: &RewardInputs) -> Result<f64> {
    if !inputs.terminal {
        return Ok(0.0);
    }
    let committed = inputs
        .committed_val_acc
        .ok_or_else(|| Error::InvalidInput {
            field: "RewardInputs.committed_val_acc",
            reason: "the terminal step of a sparse reward needs the committed accuracy".to_owned(),
        })?;
    let param_cost =
        config.param_penalty_weight * inputs.fossil_params as f64 / config.param_budget as f64;
    Ok(config.sparse_reward_scale * (committed / 100.0 - param_cost).clamp(-1.0, 1.0))
}

/// SPARSE or MINIMAL (per `mode`) of validated inputs as a breakdown: the sparse reward in
/// `terminal`, MINIMAL's early-prune penalty in `prune_shaping`.
pub(super) fn sparse_breakdown(
    config: &RewardConfig,
    inputs: &RewardInputs,
    mode: RewardMode,
) -> Result<RewardBreakdown> {
    let mut breakdown = RewardBreakdown::zero(mode);
    breakdown.clean_total = inputs.resolved_clean_total();
    breakdown.terminal = sparse_value(config, inputs)?;
    if mode == RewardMode::Minimal
        && inputs.op == LifecycleOp::Prune
        && inputs.op_succeeded
        && inputs
            .seed
            .is_some_and(|seed| seed.age_epochs < config.early_prune_threshold)
    {
        breakdown.prune_shaping = config.early_prune_penalty;
    }
    breakdown.total = breakdown.component_sum();
    Ok(breakdown)
}
