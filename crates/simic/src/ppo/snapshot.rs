//! The trainer's snapshot: the device copy of everything an update changes,
//! and how a refused update puts it back.

use tch::Tensor;

use tamiyo::policy::PolicyRng;

use crate::error::TorchResultExt;
use crate::{Error, Result};

use super::PpoTrainer;

/// The trainer's state before an update, on the device (see the module
/// docs): what a refused update puts back.
#[derive(Debug)]
pub(crate) struct TrainerSnapshot {
    parameters: Vec<Tensor>,
    optimizer_state: Vec<Tensor>,
    step_count: Tensor,
    learning_rate: f64,
    updates: u64,
    rng: PolicyRng,
}

/// A device copy of `tensor`, without gradient.
fn device_copy(tensor: &Tensor) -> Result<Tensor> {
    let mut copy = tensor.f_empty_like().op("ppo snapshot")?;
    copy.f_copy_(&tensor.f_detach().op("ppo snapshot")?)
        .op("ppo snapshot")?;
    Ok(copy)
}

/// Copies `sources` into `targets` in place (same order and shapes).
fn copy_back(targets: &[Tensor], sources: &[Tensor]) -> Result<()> {
    if targets.len() != sources.len() {
        return Err(Error::Buffer(format!(
            "PPO snapshot of {} tensors for {} targets",
            sources.len(),
            targets.len()
        )));
    }
    for (target, source) in targets.iter().zip(sources) {
        let mut target = target.shallow_clone();
        target.f_copy_(source).op("ppo restore")?;
    }
    Ok(())
}

impl PpoTrainer {
    /// A device copy of everything an update changes (see the module docs).
    pub(crate) fn snapshot(&self) -> Result<TrainerSnapshot> {
        let _guard = tch::no_grad_guard();
        Ok(TrainerSnapshot {
            parameters: self
                .parameters
                .iter()
                .map(device_copy)
                .collect::<Result<_>>()?,
            optimizer_state: self
                .optimizer
                .state_tensors()
                .iter()
                .map(device_copy)
                .collect::<Result<_>>()?,
            step_count: device_copy(self.optimizer.step_count_tensor())?,
            learning_rate: self.optimizer.config().learning_rate(),
            updates: self.updates,
            rng: self.rng.clone(),
        })
    }

    /// Puts back what [`PpoTrainer::snapshot`] copied, in place (the
    /// tensors the policy and the optimizer hold stay the same), and clears
    /// the gradients.
    pub(crate) fn restore(&mut self, snapshot: &TrainerSnapshot) -> Result<()> {
        {
            let _guard = tch::no_grad_guard();
            copy_back(&self.parameters, &snapshot.parameters)?;
            copy_back(&self.optimizer.state_tensors(), &snapshot.optimizer_state)?;
            copy_back(
                &[self.optimizer.step_count_tensor().shallow_clone()],
                std::slice::from_ref(&snapshot.step_count),
            )?;
        }
        self.optimizer.set_learning_rate(snapshot.learning_rate)?;
        self.optimizer.zero_grad()?;
        self.updates = snapshot.updates;
        self.rng = snapshot.rng.clone();
        Ok(())
    }
}
