//! The optimizers: the trainer owns the optimizer state of every parameter
//! group of a morphogenetic model.
//!
//! Kasmina exposes parameter groups (the host's, one per live seed, keyed
//! by [`GroupKey`]) and queues a [`GroupEvent`] whenever a group appears or
//! goes (`kasmina::groups`). [`GroupOptimizers`] follows those events:
//! [`GroupOptimizers::sync`] drains the model's queue and, in order, builds
//! fresh state for an `Added` group (with [`OptimizerConfig::host`] or
//! [`OptimizerConfig::seed`]) and drops the state of a `Removed` one. A
//! FOSSILIZED seed keeps its group, so it keeps its state and keeps training
//! (reference: seeds train through FOSSILIZED).
//!
//! Every step runs on torch-ext's fused multi-tensor kernels with the
//! learning rate and the step count held on the device ([`GroupOptimizer`]),
//! so [`GroupOptimizers::step`] and [`GroupOptimizers::zero_grad`] can be
//! captured in a CUDA graph. [`GroupOptimizers::sync`] changes which tensors
//! exist: call it outside any captured region, before the step (a group
//! change means a re-capture).
//!
//! Resetting state happens in one place, [`GroupOptimizers::reset`]: a
//! pruned seed's state is dropped ([`StateReset::Drop`], what a `Removed`
//! event does), and a rollback zeroes every group's state in place
//! ([`GroupOptimizers::rollback`], [`StateReset::Zero`]; captured graphs stay
//! valid).
//!
//! The special `tolaria-reference` fused step does not use these types: it
//! (`tolaria::reference::step::LinearCeState`) keeps its own hand-fused SGD
//! state, the reference fast path whose figures and kernel count are the
//! benchmark.

use std::collections::BTreeMap;

use kasmina::groups::{GroupEvent, GroupKey};
use kasmina::model::MorphogeneticModel;
use tch::{Device, Tensor};

use crate::error::{Error, Result};

mod config;
mod group;

pub use config::{
    AdamWConfig, GroupOptimizerConfig, MAX_LEARNING_RATE, OptimizerConfig, SEED_LEARNING_RATE,
    SEED_MOMENTUM, SgdConfig,
};
pub use group::GroupOptimizer;

/// What [`GroupOptimizers::reset`] does to a group's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateReset {
    /// Forget the state (the group's parameters are gone: a prune).
    Drop,
    /// Zero the state in place (a rollback: the parameters were restored).
    Zero,
}

/// The optimizer state of every parameter group of one model.
#[derive(Debug)]
pub struct GroupOptimizers {
    config: OptimizerConfig,
    device: Device,
    groups: BTreeMap<GroupKey, GroupOptimizer>,
}

impl GroupOptimizers {
    /// No state yet, for groups on `device`; `config` must pass
    /// [`OptimizerConfig::validate`].
    pub fn new(config: OptimizerConfig, device: Device) -> Result<GroupOptimizers> {
        config.validate()?;
        Ok(GroupOptimizers {
            config,
            device,
            groups: BTreeMap::new(),
        })
    }

    /// State for every group `model` has announced so far (drains its
    /// events: at least `Added(Host)` on a fresh model).
    pub fn for_model(
        config: OptimizerConfig,
        model: &mut MorphogeneticModel,
    ) -> Result<GroupOptimizers> {
        let mut optimizers = GroupOptimizers::new(config, model.device())?;
        optimizers.sync(model)?;
        Ok(optimizers)
    }

    /// The configuration.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Drains `model`'s group events and applies them in order; returns
    /// them. Call it before a step, outside any captured region.
    pub fn sync(&mut self, model: &mut MorphogeneticModel) -> Result<Vec<GroupEvent>> {
        let events = model.drain_group_events();
        for event in &events {
            self.apply(*event, model)?;
        }
        Ok(events)
    }

    /// Applies one event: `Added` builds fresh state for the group as the
    /// model has it now (nothing when the group is already gone again: its
    /// `Removed` follows); `Removed` drops the state.
    pub fn apply(&mut self, event: GroupEvent, model: &MorphogeneticModel) -> Result<()> {
        match event {
            GroupEvent::Added(key) => {
                self.reset(key, StateReset::Drop)?;
                if let Some(group) = model.parameter_group(key) {
                    let config = match key {
                        GroupKey::Host => self.config.host,
                        GroupKey::Seed(_) => self.config.seed,
                    };
                    let state = GroupOptimizer::new(key, config, group.tensors, self.device)?;
                    self.groups.insert(key, state);
                }
                Ok(())
            }
            GroupEvent::Removed(key) => self.reset(key, StateReset::Drop),
        }
    }

    /// The one place optimizer state is reset: `Drop` forgets the group's
    /// state, `Zero` zeroes it in place. A group without state is left
    /// alone.
    pub fn reset(&mut self, key: GroupKey, reset: StateReset) -> Result<()> {
        match reset {
            StateReset::Drop => {
                self.groups.remove(&key);
                Ok(())
            }
            StateReset::Zero => match self.groups.get_mut(&key) {
                Some(group) => group.reset(),
                None => Ok(()),
            },
        }
    }

    /// After a rollback: zeroes every group's state (momentum, moments, step
    /// counts) in place.
    pub fn rollback(&mut self) -> Result<()> {
        let keys: Vec<GroupKey> = self.groups.keys().copied().collect();
        for key in keys {
            self.reset(key, StateReset::Zero)?;
        }
        Ok(())
    }

    /// One step of every group (host first, then seeds in slot order).
    pub fn step(&mut self) -> Result<()> {
        self.step_with(None)
    }

    /// [`GroupOptimizers::step`] skipped on the device when `found_inf` is
    /// non-zero (see [`GroupOptimizer::step_with`]). AdamW groups launch
    /// their own update; the SGD groups' updates and every stepped group's
    /// step count go up together in `torch_ext::fused::sgd_step_groups`
    /// (one launch on CUDA).
    pub fn step_with(&mut self, found_inf: Option<&Tensor>) -> Result<()> {
        let mut counts = Vec::with_capacity(self.groups.len());
        for group in self.groups.values_mut() {
            let stepped = if group.is_sgd() {
                group.prepare()?
            } else {
                group.update(found_inf)?
            };
            if stepped {
                counts.push(group.step_count_tensor().shallow_clone());
            }
        }
        let sgd: Vec<_> = self
            .groups
            .values()
            .filter_map(|group| group.sgd_group(found_inf))
            .collect();
        torch_ext::fused::sgd_step_groups(&sgd, &counts)?;
        Ok(())
    }

    /// Zeroes the gradients of every group's parameters in place, every
    /// group's in one multi-tensor launch.
    pub fn zero_grad(&self) -> Result<()> {
        let mut grads = Vec::new();
        for group in self.groups.values() {
            grads.extend(group.defined_grads()?);
        }
        torch_ext::fused::foreach_zero_(&grads)?;
        Ok(())
    }

    /// The state of group `key`, if it has any.
    pub fn group(&self, key: GroupKey) -> Option<&GroupOptimizer> {
        self.groups.get(&key)
    }

    /// The groups with state, in order (host, then seeds by slot).
    pub fn keys(&self) -> Vec<GroupKey> {
        self.groups.keys().copied().collect()
    }

    /// Writes a new learning rate for group `key` into its device tensor
    /// (see [`GroupOptimizer::set_learning_rate`]).
    pub fn set_learning_rate(&mut self, key: GroupKey, value: f64) -> Result<()> {
        match self.groups.get_mut(&key) {
            Some(group) => group.set_learning_rate(value),
            None => Err(Error::InvalidConfig {
                field: "GroupOptimizers.group",
                reason: format!("{key} has no optimizer state"),
            }),
        }
    }
}
