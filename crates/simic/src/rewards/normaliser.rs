//! [`RewardNormaliser`]: scales rewards by their running standard deviation
//! (reference §4.2, the `RewardNormalizer`).
//!
//! Welford's online algorithm keeps the count, mean and `M2` (sum of squared
//! deviations) of every reward seen; the normalised reward is
//! `clamp(r / max(s, epsilon), ±clip)` with `s` the sample standard
//! deviation `sqrt(M2/(n − 1))`. The mean is tracked for the variance only
//! and never subtracted: shifting rewards by a moving mean would hand the
//! critic a moving target, while dividing by the spread keeps the reward's
//! sign and zero. Before two rewards have been seen there is no spread, and
//! the reward is only clipped.
//!
//! [`RewardNormaliserState`] is the serde form for checkpoints. Non-finite
//! rewards are refused and leave the state unchanged.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The normaliser's constants.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardNormaliserConfig {
    /// Normalised rewards are clamped to `±clip` (10).
    pub clip: f64,
    /// Floor of the standard deviation divided by (1e-8).
    pub epsilon: f64,
}

impl Default for RewardNormaliserConfig {
    /// The reference's reward normaliser: clip 10, epsilon 1e-8.
    fn default() -> Self {
        RewardNormaliserConfig {
            clip: 10.0,
            epsilon: 1e-8,
        }
    }
}

impl RewardNormaliserConfig {
    /// Checks the constants: `clip` and `epsilon` finite and > 0.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("RewardNormaliserConfig.clip", self.clip),
            ("RewardNormaliserConfig.epsilon", self.epsilon),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(Error::InvalidConfig {
                    field,
                    reason: format!("{value} is not a finite number > 0"),
                });
            }
        }
        Ok(())
    }
}

/// The normaliser's state (checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardNormaliserState {
    /// The constants.
    pub config: RewardNormaliserConfig,
    /// Rewards seen.
    pub count: u64,
    /// Their running mean.
    pub mean: f64,
    /// Their sum of squared deviations from the mean (Welford's `M2`, ≥ 0).
    pub m2: f64,
}

/// The running reward normaliser (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardNormaliser {
    config: RewardNormaliserConfig,
    count: u64,
    mean: f64,
    m2: f64,
}

fn finite_reward(reward: f64) -> Result<f64> {
    if reward.is_finite() {
        Ok(reward)
    } else {
        Err(Error::InvalidInput {
            field: "RewardNormaliser.reward",
            reason: format!("{reward} is not finite"),
        })
    }
}

impl RewardNormaliser {
    /// A normaliser that has seen nothing.
    pub fn new(config: RewardNormaliserConfig) -> Result<RewardNormaliser> {
        config.validate()?;
        Ok(RewardNormaliser {
            config,
            count: 0,
            mean: 0.0,
            m2: 0.0,
        })
    }

    /// The constants.
    pub fn config(&self) -> RewardNormaliserConfig {
        self.config
    }

    /// Rewards seen.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Running mean of the rewards seen (0 before any).
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// Sample standard deviation of the rewards seen, `None` before two.
    pub fn std(&self) -> Option<f64> {
        if self.count < 2 {
            return None;
        }
        let degrees = self.count.saturating_sub(1) as f64;
        Some((self.m2 / degrees).sqrt())
    }

    /// `reward` normalised with the current statistics, without updating
    /// them (see the module docs).
    pub fn normalise(&self, reward: f64) -> Result<f64> {
        let reward = finite_reward(reward)?;
        let clip = self.config.clip;
        let scaled = match self.std() {
            Some(std) => reward / std.max(self.config.epsilon),
            None => reward,
        };
        Ok(scaled.clamp(-clip, clip))
    }

    /// Adds `reward` to the statistics, then returns it normalised with
    /// them. A non-finite reward, or one so large that the statistics would
    /// overflow, is refused and leaves the state unchanged.
    pub fn update_and_normalise(&mut self, reward: f64) -> Result<f64> {
        let reward = finite_reward(reward)?;
        let count = self
            .count
            .checked_add(1)
            .ok_or_else(|| Error::InvalidInput {
                field: "RewardNormaliser.count",
                reason: "the reward count would overflow".to_owned(),
            })?;
        let delta = reward - self.mean;
        let mean = self.mean + delta / count as f64;
        let m2 = self.m2 + delta * (reward - mean);
        if !(mean.is_finite() && m2.is_finite()) {
            return Err(Error::InvalidInput {
                field: "RewardNormaliser.reward",
                reason: format!("{reward} overflows the running statistics"),
            });
        }
        self.count = count;
        self.mean = mean;
        self.m2 = m2.max(0.0);
        self.normalise(reward)
    }

    /// The state, for a checkpoint.
    pub fn state(&self) -> RewardNormaliserState {
        RewardNormaliserState {
            config: self.config,
            count: self.count,
            mean: self.mean,
            m2: self.m2,
        }
    }

    /// A normaliser restored from a checkpoint's state. Refuses an invalid
    /// config, a non-finite mean or `M2`, a negative `M2`, and statistics
    /// that no reward sequence gives (a non-zero mean or `M2` after no
    /// reward, a non-zero `M2` after one).
    pub fn from_state(state: RewardNormaliserState) -> Result<RewardNormaliser> {
        state.config.validate()?;
        let refuse = |field: &'static str, reason: String| Error::InvalidInput { field, reason };
        if !state.mean.is_finite() {
            return Err(refuse(
                "RewardNormaliserState.mean",
                format!("{} is not finite", state.mean),
            ));
        }
        if !(state.m2.is_finite() && state.m2 >= 0.0) {
            return Err(refuse(
                "RewardNormaliserState.m2",
                format!("{} is not a finite number >= 0", state.m2),
            ));
        }
        if state.count == 0 && (state.mean != 0.0 || state.m2 != 0.0) {
            return Err(refuse(
                "RewardNormaliserState.count",
                "no reward seen, yet the mean or M2 is not 0".to_owned(),
            ));
        }
        if state.count == 1 && state.m2 != 0.0 {
            return Err(refuse(
                "RewardNormaliserState.m2",
                format!("{} after a single reward (must be 0)", state.m2),
            ));
        }
        Ok(RewardNormaliser {
            config: state.config,
            count: state.count,
            mean: state.mean,
            m2: state.m2,
        })
    }
}
