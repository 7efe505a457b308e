//! A vectorized PPO run's state between rounds, for checkpoints: what
//! [`Simic::export_state`] returns and [`Simic::import_state`] puts back, so
//! that a run stopped after round `r` and resumed continues exactly as the
//! run that was never stopped (on the CPU: bitwise).
//!
//! A round depends on nothing else: its environments are built fresh from
//! `(seed, round)` (Kasmina models seeded, Tolaria trainers seeded), and
//! libtorch's global generator is reseeded as each environment is built.

use serde::{Deserialize, Serialize};
use tamiyo::normaliser::NormaliserState;
use tamiyo::policy::PolicyRng;
use tch::Tensor;

use super::Simic;
use crate::error::TorchResultExt;
use crate::ppo::ValueNormaliserState;
use crate::rewards::RewardNormaliserState;
use crate::{Error, Result};

/// The host-side part of the state (a checkpoint's manifest holds it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimicState {
    /// Rounds run.
    pub rounds: u64,
    /// Environment-epochs run.
    pub env_epochs: u64,
    /// PPO updates applied (the schedules' clock).
    pub ppo_updates: u64,
    /// The rollouts' sampling generator.
    pub sampler_rng: PolicyRng,
    /// The PPO minibatches' row-order generator.
    pub ppo_rng: PolicyRng,
    /// The observation normaliser, when observations are normalised.
    pub obs_normaliser: Option<NormaliserState>,
    /// The critic targets' normaliser.
    pub value_normaliser: ValueNormaliserState,
    /// The rewards' normaliser.
    pub reward_normaliser: RewardNormaliserState,
    /// Every rank's generators after the last round, in rank order, when
    /// the run was data-parallel ([`Simic::join`]); empty for one process.
    /// Rank 0's checkpoint alone lets every rank of a group of the same
    /// size continue: each takes its own entry ([`Simic::import_state`],
    /// then [`Simic::join`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_rngs: Vec<RankRngs>,
}

/// One rank's generators (see [`SimicState::rank_rngs`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankRngs {
    /// The rollouts' sampling generator.
    pub sampler: PolicyRng,
    /// The PPO minibatches' row-order generator.
    pub ppo: PolicyRng,
}

impl RankRngs {
    /// As four words: sampler seed and draws, PPO seed and draws.
    pub(super) fn words(&self) -> [u64; 4] {
        [
            self.sampler.seed(),
            self.sampler.draws(),
            self.ppo.seed(),
            self.ppo.draws(),
        ]
    }

    /// From [`RankRngs::words`].
    pub(super) fn from_words(words: &[u64]) -> Option<RankRngs> {
        match words {
            [sampler_seed, sampler_draws, ppo_seed, ppo_draws] => Some(RankRngs {
                sampler: PolicyRng::from_parts(*sampler_seed, *sampler_draws),
                ppo: PolicyRng::from_parts(*ppo_seed, *ppo_draws),
            }),
            _ => None,
        }
    }
}

/// Prefix of the policy's parameters among the state tensors.
const POLICY: &str = "policy/";

impl Simic {
    /// The state between rounds: host values, and the tensors (the policy's
    /// parameters as `policy/<name>`, the optimizer's state as
    /// `optimizer/<index>`, its step count as `optimizer/step_count`), as
    /// handles (copy them before the next round changes them).
    pub fn export_state(&self) -> Result<(SimicState, Vec<(String, Tensor)>)> {
        let learner = self.learner.state()?;
        let state = SimicState {
            rounds: self.progress.rounds,
            env_epochs: self.progress.env_epochs,
            ppo_updates: learner.ppo_updates,
            sampler_rng: self.actor.rng().clone(),
            ppo_rng: learner.ppo_rng,
            obs_normaliser: learner.obs_normaliser,
            value_normaliser: learner.value_normaliser,
            reward_normaliser: learner.reward_normaliser,
            rank_rngs: self.rank_rngs.clone(),
        };
        let mut tensors = self.policy_tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        tensors.extend(self.learner.optimizer_tensors());
        Ok((state, tensors))
    }

    /// The policy's variables as a checkpoint names them
    /// (`policy/<name>`), as handles.
    fn policy_tensors(&self) -> Vec<(String, Tensor)> {
        self.actor
            .policy()
            .var_store()
            .variables()
            .into_iter()
            .map(|(name, tensor)| (format!("{POLICY}{name}"), tensor))
            .collect()
    }

    /// Puts back a state [`Simic::export_state`] returned (before any round
    /// of this trainer, which must have been built with the same
    /// configuration). Every tensor must be present with its shape, and
    /// every value finite (one readback over all of them); the host state's
    /// normalisers are checked as their `from_state` checks them.
    ///
    /// All or nothing: everything is checked, and every tensor moved to the
    /// policy's device, before the first value is written; a refused import
    /// leaves the trainer as it was.
    pub fn import_state(&mut self, state: &SimicState, tensors: &[(String, Tensor)]) -> Result<()> {
        let find = |name: &str| -> Result<&Tensor> {
            tensors
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, tensor)| tensor)
                .ok_or_else(|| Error::InvalidInput {
                    field: "Simic.import_state",
                    reason: format!("no tensor `{name}` in the checkpoint"),
                })
        };
        // Every (target, source) pair, checked and staged on the target's
        // device before anything is written.
        let mut targets = self.policy_tensors();
        targets.extend(self.learner.optimizer_tensors());
        let mut staged: Vec<(Tensor, Tensor)> = Vec::with_capacity(targets.len());
        for (name, target) in &targets {
            let source = find(name)?;
            if source.size() != target.size() {
                return Err(Error::ShapeMismatch {
                    what: "Simic.import_state",
                    expected: format!("`{name}` of shape {:?}", target.size()),
                    got: format!("{:?}", source.size()),
                });
            }
            if target.is_floating_point() && !source.is_floating_point() {
                return Err(Error::ShapeMismatch {
                    what: "Simic.import_state",
                    expected: format!("`{name}` of a floating-point kind"),
                    got: format!("{:?}", source.kind()),
                });
            }
            let on_device = source
                .f_to_device(target.device())
                .op("checkpoint to device")?
                .f_to_kind(target.kind())
                .op("checkpoint to kind")?;
            staged.push((target.shallow_clone(), on_device));
        }
        let checks: Vec<(&'static str, &Tensor, crate::finite::Rule)> = staged
            .iter()
            .map(|(_, source)| ("Simic.import_state", source, crate::finite::Rule::Finite))
            .collect();
        let counts = crate::finite::bad_counts(&checks)?;
        if let Some(((name, _), count)) = targets.iter().zip(&counts).find(|(_, count)| **count > 0)
        {
            return Err(Error::InvalidInput {
                field: "Simic.import_state",
                reason: format!("`{name}` holds {count} NaN or infinite values"),
            });
        }
        // A data-parallel run's checkpoint continues only as a group of its
        // size, each rank with its own generators; one process's only as
        // one process.
        let mut effective = state.clone();
        let mut pending = None;
        match (self.learner.group(), state.rank_rngs.is_empty()) {
            (None, true) => {}
            (None, false) => pending = Some(state.rank_rngs.clone()),
            (Some(_), true) => {
                return Err(Error::InvalidInput {
                    field: "Simic.import_state",
                    reason: "the checkpoint is of one process; this trainer is one rank of a \
                             group: resume it as one process"
                        .to_owned(),
                });
            }
            (Some(group), false) => {
                let entry = rank_entry(&state.rank_rngs, group.rank(), group.world_size())?;
                effective.sampler_rng = entry.sampler;
                effective.ppo_rng = entry.ppo;
            }
        }
        let normalisers = self.learner.normalisers_of(state)?;
        // Everything is checked: write.
        {
            let _guard = tch::no_grad_guard();
            for (target, source) in &staged {
                let mut target = target.shallow_clone();
                target.f_copy_(source).op("checkpoint copy")?;
            }
        }
        self.learner.resume(normalisers, &effective);
        self.actor.resume(effective.sampler_rng.clone());
        self.progress.rounds = state.rounds;
        self.progress.env_epochs = state.env_epochs;
        self.rank_rngs = state.rank_rngs.clone();
        self.restored_rank_rngs = pending;
        Ok(())
    }

    /// Every rank's generators after a round that learned, gathered over
    /// the group (one small all-reduce; nothing when not data-parallel).
    pub(super) fn gather_rank_rngs(&mut self) -> Result<()> {
        let Some(group) = self.learner.group() else {
            return Ok(());
        };
        let mine = RankRngs {
            sampler: self.actor.rng().clone(),
            ppo: self.learner.ppo_rng(),
        };
        let rows = group.gather_words(&mine.words())?;
        self.rank_rngs = rows
            .iter()
            .map(|row| {
                RankRngs::from_words(row).ok_or_else(|| Error::InvalidInput {
                    field: "Simic.gather_rank_rngs",
                    reason: format!("{} words where 4 belong", row.len()),
                })
            })
            .collect::<Result<_>>()?;
        Ok(())
    }
}

/// Rank `rank`'s entry of a group of `world` ranks' generators, refused when
/// the checkpoint's group was of another size.
pub(super) fn rank_entry(rngs: &[RankRngs], rank: usize, world: usize) -> Result<RankRngs> {
    if rngs.len() != world {
        return Err(Error::InvalidInput {
            field: "Simic.import_state",
            reason: format!(
                "the checkpoint was written by a group of {} ranks; this group has {world}: \
                 resume it with {} ranks",
                rngs.len(),
                rngs.len()
            ),
        });
    }
    rngs.get(rank).cloned().ok_or_else(|| Error::InvalidInput {
        field: "Simic.import_state",
        reason: format!("no generators for rank {rank}"),
    })
}
