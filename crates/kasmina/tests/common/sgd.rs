//! A test-local SGD with momentum over a model's parameter groups.
//!
//! Kasmina owns no optimizer (the trainer does: `tolaria::optim`, which
//! kasmina must not depend on). Tests that train seeds use this small stand-in:
//! it follows the model's group events (fresh zero momentum for an added
//! group, dropped state for a removed one) and steps every group with
//! torch-ext's fused SGD kernel. Momentum buffers start at zero, so the
//! first step equals PyTorch's `buf = grad` (dampening 0); parameters without
//! a gradient are skipped, as in PyTorch.

use std::collections::BTreeMap;

use kasmina::groups::{GroupEvent, GroupKey};
use kasmina::model::MorphogeneticModel;
use tch::Tensor;

/// SGD state per parameter group: `(parameter, momentum buffer)` pairs.
#[derive(Debug, Default)]
pub struct GroupSgd {
    learning_rate: f64,
    momentum: f64,
    groups: BTreeMap<GroupKey, Vec<(Tensor, Tensor)>>,
    events: Vec<GroupEvent>,
}

impl GroupSgd {
    /// SGD with `learning_rate` and `momentum` for every group.
    pub fn new(learning_rate: f64, momentum: f64) -> GroupSgd {
        GroupSgd {
            learning_rate,
            momentum,
            ..GroupSgd::default()
        }
    }

    /// Drains the model's group events and builds or drops state to match.
    pub fn sync(&mut self, model: &mut MorphogeneticModel) {
        for event in model.drain_group_events() {
            self.events.push(event);
            match event {
                GroupEvent::Added(key) => {
                    let Some(group) = model.parameter_group(key) else {
                        continue;
                    };
                    let state = group
                        .tensors
                        .into_iter()
                        .map(|parameter| {
                            let buffer = parameter.zeros_like();
                            (parameter, buffer)
                        })
                        .collect();
                    self.groups.insert(key, state);
                }
                GroupEvent::Removed(key) => {
                    self.groups.remove(&key);
                }
            }
        }
    }

    /// Every event applied so far, in order.
    pub fn events(&self) -> &[GroupEvent] {
        &self.events
    }

    /// Whether `key` has optimizer state.
    pub fn has_group(&self, key: GroupKey) -> bool {
        self.groups.contains_key(&key)
    }

    /// Syncs with the model, then applies one step to every group.
    pub fn step(&mut self, model: &mut MorphogeneticModel) {
        self.sync(model);
        for state in self.groups.values() {
            let (mut parameters, mut grads, mut buffers) = (Vec::new(), Vec::new(), Vec::new());
            for (parameter, buffer) in state {
                let grad = parameter.grad();
                if grad.defined() {
                    parameters.push(parameter.shallow_clone());
                    grads.push(grad);
                    buffers.push(buffer.shallow_clone());
                }
            }
            torch_ext::fused::sgd_step(
                &parameters,
                &grads,
                &buffers,
                self.learning_rate,
                self.momentum,
                0.0,
                0.0,
                false,
                false,
            )
            .expect("fused sgd step");
        }
    }

    /// Zeroes the gradients of every parameter of the model that has one.
    pub fn zero_grad(&mut self, model: &mut MorphogeneticModel) {
        self.sync(model);
        let grads: Vec<Tensor> = self
            .groups
            .values()
            .flatten()
            .map(|(parameter, _)| parameter.grad())
            .filter(Tensor::defined)
            .collect();
        torch_ext::fused::foreach_zero_(&grads).expect("zero grads");
    }
}
