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
        let normalisers = self.learner.normalisers_of(state)?;
        // Everything is checked: write.
        {
            let _guard = tch::no_grad_guard();
            for (target, source) in &staged {
                let mut target = target.shallow_clone();
                target.f_copy_(source).op("checkpoint copy")?;
            }
        }
        self.learner.resume(normalisers, state);
        self.actor.resume(state.sampler_rng.clone());
        self.progress.rounds = state.rounds;
        self.progress.env_epochs = state.env_epochs;
        Ok(())
    }
}
