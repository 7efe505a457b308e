//! Episode-level reward rules (reference §4.4): the governor rollback rule
//! over one episode's rewards, and the auto-prune penalty.

use super::config::RewardConfig;
use super::normaliser::RewardNormaliserConfig;
use crate::Result;

/// What [`apply_governor_rollback`] did to an episode's rewards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RollbackOutcome {
    /// Whether there was a transition to punish (false for an episode
    /// rolled back before its first transition).
    pub penalised: bool,
    /// The reward placed on the last transition.
    pub penalty: f64,
    /// How many earlier rewards were forfeited (set to 0).
    pub forfeited: usize,
}

/// The governor rollback rule over one episode's **normalised** rewards, in
/// step order: the last executed transition's reward becomes the death
/// penalty ([`RewardConfig::rollback_death_penalty`], −10, clipped to the
/// normaliser's `±clip`) and every earlier reward of the episode is
/// forfeited to 0. The rolled-back step itself adds no transition, and the
/// caller marks the last one terminal (done, not truncated).
///
/// Refuses an invalid configuration.
pub fn apply_governor_rollback(
    config: &RewardConfig,
    normaliser: &RewardNormaliserConfig,
    episode_rewards: &mut [f64],
) -> Result<RollbackOutcome> {
    config.validate()?;
    normaliser.validate()?;
    let penalty = config
        .rollback_death_penalty
        .clamp(-normaliser.clip, normaliser.clip);
    let Some((last, earlier)) = episode_rewards.split_last_mut() else {
        return Ok(RollbackOutcome {
            penalised: false,
            penalty,
            forfeited: 0,
        });
    };
    *last = penalty;
    earlier.fill(0.0);
    Ok(RollbackOutcome {
        penalised: true,
        penalty,
        forfeited: earlier.len(),
    })
}

/// The penalty for `count` seeds the environment pruned on its own (the
/// governor, or any prune the policy did not choose):
/// `count·auto_prune_penalty` (−0.2 each). SHAPED adds it through
/// [`crate::rewards::RewardInputs::auto_prunes`].
pub fn auto_prune_penalty(config: &RewardConfig, count: u32) -> f64 {
    config.auto_prune_penalty * f64::from(count)
}
