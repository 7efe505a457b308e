//! The host side of a round: what the host decided about each step
//! ([`HostStep`]) and the calls that record or rewrite it.

use crate::{Error, Result};

use super::RolloutBuffer;

/// What the host decided about one step of every environment.
#[derive(Debug, Clone, PartialEq)]
pub struct HostStep {
    /// Reward per environment (before normalisation or after: the caller's
    /// choice, kept as given).
    pub rewards: Vec<f32>,
    /// The step ended its episode for good (a true terminal, e.g. the
    /// governor's rollback).
    pub terminated: Vec<bool>,
    /// The step ended its episode by the time limit (bootstrapped).
    pub truncated: Vec<bool>,
    /// The policy had no real choice (only WAIT was allowed).
    pub forced: Vec<bool>,
    /// The row holds a real transition (false: the environment had already
    /// ended its episode, or the step was rolled back).
    pub valid: Vec<bool>,
}

impl RolloutBuffer {
    /// Records the host side of step `step` (one entry per environment).
    /// Checks the step, the lengths and that every reward is finite before
    /// it writes anything.
    pub fn record_host(&mut self, step: usize, host: &HostStep) -> Result<()> {
        let n = self.shape.n_envs;
        if step >= self.shape.max_steps {
            return Err(Error::Buffer(format!(
                "step {step} is past the last column ({} steps per round)",
                self.shape.max_steps
            )));
        }
        for (what, len) in [
            ("rewards", host.rewards.len()),
            ("terminated", host.terminated.len()),
            ("truncated", host.truncated.len()),
            ("forced", host.forced.len()),
            ("valid", host.valid.len()),
        ] {
            if len != n {
                return Err(Error::Buffer(format!(
                    "{what} has {len} entries for {n} environments"
                )));
            }
        }
        if let Some((env, bad)) = host
            .rewards
            .iter()
            .enumerate()
            .find(|(_, reward)| !reward.is_finite())
        {
            return Err(Error::InvalidInput {
                field: "HostStep.rewards",
                reason: format!("{bad} for environment {env} at step {step} is not finite"),
            });
        }
        for env in 0..n {
            let cell = env
                .checked_mul(self.shape.max_steps)
                .and_then(|row| row.checked_add(step))
                .ok_or_else(|| Error::Buffer("cell index overflows".to_owned()))?;
            let set = |list: &mut Vec<bool>, source: &[bool]| {
                if let (Some(slot), Some(value)) = (list.get_mut(cell), source.get(env)) {
                    *slot = *value;
                }
            };
            set(&mut self.terminated, &host.terminated);
            set(&mut self.truncated, &host.truncated);
            set(&mut self.forced, &host.forced);
            set(&mut self.valid, &host.valid);
            if let (Some(slot), Some(value)) = (self.rewards.get_mut(cell), host.rewards.get(env)) {
                *slot = *value;
            }
        }
        Ok(())
    }

    /// The host cell of `env` at `step`, if both are in range.
    fn cell(&self, env: usize, step: usize) -> Option<usize> {
        if step >= self.shape.max_steps || env >= self.shape.n_envs {
            return None;
        }
        env.checked_mul(self.shape.max_steps)?.checked_add(step)
    }

    /// Rewrites the reward of `env` at `step` (the episode-level rules: the
    /// governor's forfeit). A reward that is not finite (as `f32`) or a
    /// cell out of range is refused and nothing changes.
    pub fn set_reward(&mut self, env: usize, step: usize, reward: f32) -> Result<()> {
        if !reward.is_finite() {
            return Err(Error::InvalidInput {
                field: "RolloutBuffer.set_reward",
                reason: format!("{reward} for environment {env} at step {step} is not finite"),
            });
        }
        let slot = self
            .cell(env, step)
            .and_then(|cell| self.rewards.get_mut(cell))
            .ok_or_else(|| Error::Buffer(format!("no cell for environment {env} step {step}")))?;
        *slot = reward;
        Ok(())
    }

    /// Marks `env`'s transition at `step` as a true terminal (the episode
    /// ended there: no bootstrap, the recursion resets).
    pub fn set_terminal(&mut self, env: usize, step: usize) -> Result<()> {
        let cell = self
            .cell(env, step)
            .ok_or_else(|| Error::Buffer(format!("no cell for environment {env} step {step}")))?;
        if let Some(flag) = self.terminated.get_mut(cell) {
            *flag = true;
        }
        if let Some(flag) = self.truncated.get_mut(cell) {
            *flag = false;
        }
        Ok(())
    }

    /// The rewards of one environment's row, in step order.
    pub fn row_rewards(&self, env: usize) -> Option<&[f32]> {
        let start = env.checked_mul(self.shape.max_steps)?;
        let end = start.checked_add(self.shape.max_steps)?;
        self.rewards.get(start..end)
    }
}
