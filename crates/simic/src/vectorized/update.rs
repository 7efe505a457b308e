//! The round's end: a governor rollback's death penalty on an
//! environment's row, and the update (GAE on the device, the critic's
//! targets, one PPO update, the Q head's estimate per op).

use tch::Kind;

use super::Simic;
use super::env::Env;
use crate::Result;
use crate::agent;
use crate::buffer::RolloutBuffer;
use crate::error::TorchResultExt;
use crate::gae::compute_gae;
use crate::rewards::apply_governor_rollback;

impl Simic {
    /// Ends `env`'s episode after a governor rollback: the death penalty on
    /// its last transition (a true terminal), earlier rewards forfeited.
    pub(super) fn end_by_rollback(
        &mut self,
        env: &mut Env,
        index: usize,
        buffer: &mut RolloutBuffer,
    ) -> Result<()> {
        env.done = true;
        let Some(last) = env.last_step else {
            return Ok(());
        };
        let mut rewards: Vec<f64> = buffer
            .row_rewards(index)
            .map(|row| {
                row.iter()
                    .take(last.saturating_add(1))
                    .map(|&r| f64::from(r))
                    .collect()
            })
            .unwrap_or_default();
        apply_governor_rollback(
            &self.config.reward,
            &self.config.reward_normaliser,
            &mut rewards,
        )?;
        for (step, value) in rewards.iter().enumerate() {
            buffer.set_reward(index, step, *value as f32)?;
        }
        buffer.set_terminal(index, last)
    }

    /// GAE on the device and one PPO update of the policy on `buffer`.
    /// Returns the update's statistics and the Q head's estimate per op
    /// after it (`None` without auxiliary heads). On an error the policy,
    /// its optimizer state and the value normaliser are as they were
    /// before (the other statistics are [`Simic::run_round`]'s to put
    /// back).
    pub(super) fn update(
        &mut self,
        buffer: &RolloutBuffer,
    ) -> Result<(crate::ppo::PpoStats, Option<Vec<f64>>)> {
        let value_normaliser = self.value_normaliser.shallow_copy();
        let snapshot = self.ppo.snapshot()?;
        let result = self.update_unguarded(buffer);
        if result.is_err() {
            self.value_normaliser = value_normaliser;
            self.ppo.restore(&snapshot)?;
        }
        result
    }

    /// [`Simic::update`] without the checkpoint.
    fn update_unguarded(
        &mut self,
        buffer: &RolloutBuffer,
    ) -> Result<(crate::ppo::PpoStats, Option<Vec<f64>>)> {
        self.pool_rollout_statistics()?;
        let rollout = buffer.finish()?;
        let values = self.value_normaliser.denormalise(&rollout.values)?;
        let bootstrap = self.value_normaliser.denormalise(&rollout.bootstrap)?;
        let (advantages, returns) = compute_gae(
            &rollout.rewards,
            &values,
            &rollout.terminated,
            &rollout.truncated,
            &bootstrap,
            self.config.ppo.gamma,
            self.config.ppo.gae_lambda,
        )?;
        let valid = rollout.valid.f_to_kind(Kind::Float).op("valid")?;
        self.value_normaliser.update(&returns, Some(&valid))?;
        self.pool_value_statistics()?;
        let targets = self.value_normaliser.normalise(&returns)?;
        let batch = rollout.ppo_batch(&advantages, &targets)?;
        let policy = &self.policy;
        let sampler = &self.sampler;
        let stats = self.ppo.update_unguarded(
            &batch,
            |rows| agent::evaluate_rows(policy, sampler, &rollout, rows),
            self.data_parallel.as_mut(),
        )?;
        let q_per_op = agent::q_per_op(&self.policy, &rollout)?;
        Ok((stats, q_per_op))
    }
}
