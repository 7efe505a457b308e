//! A vectorized PPO run's state between rounds, for checkpoints: what
//! [`Simic::export_state`] returns and [`Simic::import_state`] puts back, so
//! that a run stopped after round `r` and resumed continues exactly as the
//! run that was never stopped (on the CPU: bitwise).
//!
//! A round depends on nothing else: its environments are built fresh from
//! `(seed, round)` (Kasmina models seeded, Tolaria trainers seeded), and
//! libtorch's global generator is reseeded as each environment is built.

use serde::{Deserialize, Serialize};
use tamiyo::normaliser::{NormaliserState, RunningMeanStd};
use tamiyo::policy::PolicyRng;
use tch::Tensor;

use super::Simic;
use crate::error::TorchResultExt;
use crate::ppo::{ValueNormaliser, ValueNormaliserState};
use crate::rewards::{RewardNormaliser, RewardNormaliserState};
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
/// Prefix of the PPO optimizer's state among the state tensors.
const OPTIMIZER: &str = "optimizer/";

impl Simic {
    /// The state between rounds: host values, and the tensors (the policy's
    /// parameters as `policy/<name>`, the optimizer's state as
    /// `optimizer/<index>`, its step count as `optimizer/step_count`), as
    /// handles (copy them before the next round changes them).
    pub fn export_state(&self) -> Result<(SimicState, Vec<(String, Tensor)>)> {
        let state = SimicState {
            rounds: self.rounds,
            env_epochs: self.env_epochs,
            ppo_updates: self.ppo.updates(),
            sampler_rng: self.sampler.rng().clone(),
            ppo_rng: self.ppo.rng().clone(),
            obs_normaliser: match &self.obs_normaliser {
                Some(normaliser) => Some(normaliser.state()?),
                None => None,
            },
            value_normaliser: self.value_normaliser.state()?,
            reward_normaliser: self.reward_normaliser.state(),
        };
        let mut tensors: Vec<(String, Tensor)> = self
            .policy
            .var_store()
            .variables()
            .into_iter()
            .map(|(name, tensor)| (format!("{POLICY}{name}"), tensor))
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let optimizer = self.ppo.optimizer();
        for (index, tensor) in optimizer.state_tensors().into_iter().enumerate() {
            tensors.push((format!("{OPTIMIZER}{index}"), tensor));
        }
        tensors.push((
            format!("{OPTIMIZER}step_count"),
            optimizer.step_count_tensor().shallow_clone(),
        ));
        Ok((state, tensors))
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
        let mut targets: Vec<(String, Tensor)> = self
            .policy
            .var_store()
            .variables()
            .into_iter()
            .map(|(name, tensor)| (format!("{POLICY}{name}"), tensor))
            .collect();
        let optimizer = self.ppo.optimizer();
        for (index, tensor) in optimizer.state_tensors().into_iter().enumerate() {
            targets.push((format!("{OPTIMIZER}{index}"), tensor));
        }
        targets.push((
            format!("{OPTIMIZER}step_count"),
            optimizer.step_count_tensor().shallow_clone(),
        ));
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
        let obs_normaliser = match (&state.obs_normaliser, self.config.normalise_observations) {
            (Some(saved), true) => Some(RunningMeanStd::from_state(saved, self.device)?),
            (None, false) => None,
            _ => {
                return Err(Error::InvalidInput {
                    field: "SimicState.obs_normaliser",
                    reason: "the checkpoint and the configuration disagree on observation \
                             normalisation"
                        .to_owned(),
                });
            }
        };
        let value_normaliser = ValueNormaliser::from_state(&state.value_normaliser, self.device)?;
        let reward_normaliser = RewardNormaliser::from_state(state.reward_normaliser)?;
        // Everything is checked: write.
        {
            let _guard = tch::no_grad_guard();
            for (target, source) in &staged {
                let mut target = target.shallow_clone();
                target.f_copy_(source).op("checkpoint copy")?;
            }
        }
        self.obs_normaliser = obs_normaliser;
        self.value_normaliser = value_normaliser;
        self.reward_normaliser = reward_normaliser;
        self.sampler.set_rng(state.sampler_rng.clone());
        self.ppo.resume_at(state.ppo_updates, state.ppo_rng.clone());
        self.rounds = state.rounds;
        self.env_epochs = state.env_epochs;
        self.graphed = None;
        Ok(())
    }
}
