//! Simic as one rank of a data-parallel group ([`crate::distributed`]):
//! joining (parameters from rank 0, per-rank sampling and environment
//! seeds) and pooling the running statistics after each round.

use tamiyo::normaliser::RunningMeanStd;
use tamiyo::policy::Sampler;
use torch_ext::dist::ProcessGroup;

use super::Simic;
use crate::distributed::DataParallel;
use crate::ppo::ValueNormaliser;
use crate::rewards::RewardNormaliser;
use crate::{Error, Result};

/// Spreads the ranks' sampling streams apart (the 64-bit golden ratio).
const RANK_SEED_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

impl Simic {
    /// Makes this trainer one rank of `group` before its first round: the
    /// policy's parameters become rank 0's (checked identical, with the
    /// group's collectives warmed up), the sampler is reseeded for
    /// this rank, and environment seeds are drawn as if the group's
    /// environments were one vector of `world_size · n_envs`
    /// (`seed + ((round·world + rank)·n_envs + env)·env_seed_stride`).
    /// From then on every update averages gradients over the ranks and
    /// checks the parameters identical, and the normalisers are pooled. A
    /// join that fails leaves the trainer as it was (its own parameters,
    /// sampler and no group).
    pub fn join(&mut self, group: ProcessGroup) -> Result<()> {
        if self.rounds > 0 {
            return Err(Error::InvalidInput {
                field: "Simic.join",
                reason: format!("{} rounds already ran; join before the first", self.rounds),
            });
        }
        if group.device() != self.device {
            return Err(Error::ShapeMismatch {
                what: "Simic.join",
                expected: format!("a group on the policy's device {:?}", self.device),
                got: format!("{:?}", group.device()),
            });
        }
        let mut group = DataParallel::new(group);
        let rank = group.rank() as u64;
        let seed = self
            .config
            .seed
            .wrapping_add(rank.wrapping_mul(RANK_SEED_STRIDE));
        let sampler = Sampler::new(self.config.sampling, seed, self.device)?;
        // The broadcast writes rank 0's parameters into this rank's: a
        // failed join puts this rank's back.
        let snapshot = self.ppo.snapshot()?;
        let joined = group
            .broadcast_parameters(self.ppo.parameters())
            .and_then(|()| group.warm_up(self.ppo.parameters()));
        if let Err(error) = joined {
            self.ppo.restore(&snapshot)?;
            return Err(error);
        }
        self.sampler = sampler;
        self.graphed = None;
        self.data_parallel = Some(group);
        Ok(())
    }

    /// Waits for every rank (no-op when not data-parallel).
    pub fn barrier(&self) -> Result<()> {
        match self.data_parallel.as_ref() {
            Some(group) => group.barrier(),
            None => Ok(()),
        }
    }

    /// Whether `flag` is set on any rank (a decision every rank must take
    /// alike, e.g. stopping between rounds); `flag` itself when not
    /// data-parallel.
    pub fn any_rank(&self, flag: bool) -> Result<bool> {
        match self.data_parallel.as_ref() {
            Some(group) => Ok(group.mean_scalar(f64::from(u8::from(flag)))? > 0.0),
            None => Ok(flag),
        }
    }

    /// The rank and group size (`(0, 1)` when not data-parallel).
    pub fn rank_and_world(&self) -> (usize, usize) {
        self.data_parallel
            .as_ref()
            .map_or((0, 1), |group| (group.rank(), group.world_size()))
    }

    /// The global index of this round's first environment, in units of
    /// environments: `(round·world + rank)·n_envs`.
    pub(crate) fn env_index_base(&self) -> Option<u64> {
        let (rank, world) = self.rank_and_world();
        self.rounds
            .checked_mul(world as u64)
            .and_then(|k| k.checked_add(rank as u64))
            .and_then(|k| k.checked_mul(self.config.n_envs as u64))
    }

    /// Pools the observation and reward normalisers over the ranks (no-op
    /// when not data-parallel).
    pub(crate) fn pool_rollout_statistics(&mut self) -> Result<()> {
        let Some(group) = self.data_parallel.as_ref() else {
            return Ok(());
        };
        if let Some(normaliser) = self.obs_normaliser.as_ref() {
            let mut state = normaliser.state()?;
            let (mean, var) = group.pool_moments(&state.mean, &state.var)?;
            state.mean = mean;
            state.var = var;
            self.obs_normaliser = Some(RunningMeanStd::from_state(&state, self.device)?);
        }
        let mut state = self.reward_normaliser.state();
        if state.count > 0 {
            let var = state.m2 / state.count as f64;
            let (mean, var) = group.pool_moments(&[state.mean], &[var])?;
            state.mean = mean.first().copied().unwrap_or(state.mean);
            state.m2 = var.first().copied().unwrap_or(0.0) * state.count as f64;
            if state.count == 1 {
                state.m2 = 0.0;
            }
            self.reward_normaliser = RewardNormaliser::from_state(state)?;
        }
        Ok(())
    }

    /// Pools the value normaliser over the ranks (no-op when not
    /// data-parallel).
    pub(crate) fn pool_value_statistics(&mut self) -> Result<()> {
        let Some(group) = self.data_parallel.as_ref() else {
            return Ok(());
        };
        let mut state = self.value_normaliser.state()?;
        let (mean, var) = group.pool_moments(&[state.mean], &[state.var])?;
        state.mean = mean.first().copied().unwrap_or(state.mean);
        state.var = var.first().copied().unwrap_or(state.var);
        self.value_normaliser = ValueNormaliser::from_state(&state, self.device)?;
        Ok(())
    }
}
