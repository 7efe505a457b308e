//! The optimizer state of one parameter group and its step.
//!
//! A [`GroupOptimizer`] holds the group's parameters (shallow handles), its
//! state tensors (SGD momentum buffers, or AdamW moments and per-parameter
//! step counts), its learning rate as a 0-dim `f32` tensor on the device and
//! a 0-dim `f32` count of the steps applied. [`GroupOptimizer::step`] is one
//! torch-ext fused kernel (`_fused_sgd_` / `_fused_adamw_`) over the
//! parameters that have a gradient, reading the learning rate from device
//! memory, plus one in-place add to the step count: no value is read back,
//! nothing is allocated on the device, so the step can be captured in a CUDA
//! graph, and a new learning rate written with
//! [`GroupOptimizer::set_learning_rate`] reaches the next replay without a
//! re-capture. [`GroupOptimizer::reset`] zeroes the state in place (the
//! tensors a captured graph points at stay the same).
//!
//! SGD momentum buffers start at zero and every step runs with
//! `is_first_step = false`: with dampening 0 the first update is then
//! `buf = 0 * momentum + grad = grad`, exactly PyTorch's first step, and the
//! same kernel serves warm-up, capture and replay. Parameters without a
//! gradient are skipped, as in PyTorch (their state is left as it is).

use tch::{Device, Kind, Tensor};
use torch_ext::fused::{self, AdamWOptions, LearningRate, SgdGroup, SgdOptions};

use kasmina::groups::GroupKey;

use super::config::{GroupOptimizerConfig, learning_rate};
use crate::error::{Result, TorchResultExt};

/// The per-parameter state of one group.
#[derive(Debug)]
enum GroupState {
    /// SGD: one momentum buffer per parameter (none without momentum).
    Sgd { momentum: f64, buffers: Vec<Tensor> },
    /// AdamW: first and second moments and a device step count per
    /// parameter.
    AdamW {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        exp_avgs: Vec<Tensor>,
        exp_avg_sqs: Vec<Tensor>,
        steps: Vec<Tensor>,
    },
}

/// Kernel argument lists, rebuilt by every step from the current gradients
/// (handles only; their capacity is kept between steps).
#[derive(Debug, Default)]
struct Scratch {
    parameters: Vec<Tensor>,
    grads: Vec<Tensor>,
    first: Vec<Tensor>,
    second: Vec<Tensor>,
    third: Vec<Tensor>,
}

impl Scratch {
    fn clear(&mut self) {
        self.parameters.clear();
        self.grads.clear();
        self.first.clear();
        self.second.clear();
        self.third.clear();
    }
}

/// Optimizer state of one parameter group (see the module docs).
#[derive(Debug)]
pub struct GroupOptimizer {
    key: GroupKey,
    config: GroupOptimizerConfig,
    parameters: Vec<Tensor>,
    learning_rate: Tensor,
    step_count: Tensor,
    state: GroupState,
    scratch: Scratch,
}

/// A 0-dim `f32` tensor holding `value` on `device`.
fn device_scalar(value: f64, device: Device) -> Result<Tensor> {
    Tensor::f_full([] as [i64; 0], value, (Kind::Float, device)).op("full")
}

fn zeros_like_all(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    tensors
        .iter()
        .map(|tensor| tensor.f_zeros_like().op("zeros_like"))
        .collect()
}

impl GroupOptimizer {
    /// Fresh state for `parameters` of group `key` on `device` (the
    /// parameters' device): zero momentum / moments / step counts, the
    /// configured learning rate on the device. The configuration must have
    /// been validated ([`super::OptimizerConfig::validate`]).
    pub fn new(
        key: GroupKey,
        config: GroupOptimizerConfig,
        parameters: Vec<Tensor>,
        device: Device,
    ) -> Result<GroupOptimizer> {
        let state = match config {
            GroupOptimizerConfig::Sgd(sgd) => GroupState::Sgd {
                momentum: sgd.momentum,
                buffers: if sgd.momentum == 0.0 {
                    Vec::new()
                } else {
                    zeros_like_all(&parameters)?
                },
            },
            GroupOptimizerConfig::AdamW(adamw) => GroupState::AdamW {
                beta1: adamw.beta1,
                beta2: adamw.beta2,
                eps: adamw.eps,
                weight_decay: adamw.weight_decay,
                exp_avgs: zeros_like_all(&parameters)?,
                exp_avg_sqs: zeros_like_all(&parameters)?,
                steps: parameters
                    .iter()
                    .map(|_| device_scalar(0.0, device))
                    .collect::<Result<_>>()?,
            },
        };
        Ok(GroupOptimizer {
            key,
            config,
            learning_rate: device_scalar(config.learning_rate(), device)?,
            step_count: device_scalar(0.0, device)?,
            parameters,
            state,
            scratch: Scratch::default(),
        })
    }

    /// The group this state belongs to.
    pub fn key(&self) -> GroupKey {
        self.key
    }

    /// The group's configuration (with the current learning rate).
    pub fn config(&self) -> GroupOptimizerConfig {
        self.config
    }

    /// The parameters this state updates.
    pub fn parameters(&self) -> &[Tensor] {
        &self.parameters
    }

    /// The learning rate: a 0-dim `f32` tensor on the device, read by every
    /// step when its kernel runs.
    pub fn learning_rate_tensor(&self) -> &Tensor {
        &self.learning_rate
    }

    /// Steps applied since the state was built or reset: a 0-dim `f32`
    /// tensor on the device (reading it is a device-to-host copy).
    pub fn step_count_tensor(&self) -> &Tensor {
        &self.step_count
    }

    /// Every state tensor (momentum buffers; or moments and per-parameter
    /// step counts), as handles.
    pub fn state_tensors(&self) -> Vec<Tensor> {
        match &self.state {
            GroupState::Sgd { buffers, .. } => buffers.iter().map(Tensor::shallow_clone).collect(),
            GroupState::AdamW {
                exp_avgs,
                exp_avg_sqs,
                steps,
                ..
            } => exp_avgs
                .iter()
                .chain(exp_avg_sqs)
                .chain(steps)
                .map(Tensor::shallow_clone)
                .collect(),
        }
    }

    /// Writes a new learning rate into the device tensor (checked like the
    /// configuration: finite, in `(0, MAX_LEARNING_RATE]`, a positive
    /// `f32`). A captured step reads it on its next replay.
    pub fn set_learning_rate(&mut self, value: f64) -> Result<()> {
        let value = learning_rate("learning_rate", value)?;
        let _ = self.learning_rate.f_fill_(value).op("fill_")?;
        match &mut self.config {
            GroupOptimizerConfig::Sgd(sgd) => sgd.learning_rate = value,
            GroupOptimizerConfig::AdamW(adamw) => adamw.learning_rate = value,
        }
        Ok(())
    }

    /// One update from the current gradients (see the module docs).
    /// Launches device work only; reads nothing back.
    pub fn step(&mut self) -> Result<()> {
        self.step_with(None)
    }

    /// [`GroupOptimizer::step`] that is skipped on the device when
    /// `found_inf` (a 0-dim `f32` tensor, the grad scaler's flag) is
    /// non-zero: AMP's skipped step, without a readback. Parameters that do
    /// not require gradients (a seed frozen for a blend-out) are left alone.
    pub fn step_with(&mut self, found_inf: Option<&Tensor>) -> Result<()> {
        if self.update(found_inf)? {
            let _ = self.step_count.f_add_scalar_(1.0).op("add_")?;
        }
        Ok(())
    }

    /// [`GroupOptimizer::step_with`]'s update without the step count's
    /// increment (the caller counts); whether the group stepped (`false`:
    /// no parameter had a gradient, nothing was launched).
    pub(super) fn update(&mut self, found_inf: Option<&Tensor>) -> Result<bool> {
        if !self.prepare()? {
            return Ok(false);
        }
        if let Some(group) = self.sgd_group(found_inf) {
            fused::sgd_step_with(
                group.params,
                group.grads,
                group.momentum_buffers,
                &group.options,
            )?;
        } else {
            self.adamw_update(found_inf)?;
        }
        Ok(true)
    }

    /// Whether the group's state is SGD's.
    pub(super) fn is_sgd(&self) -> bool {
        matches!(self.state, GroupState::Sgd { .. })
    }

    /// The SGD step's lists and options as [`GroupOptimizer::prepare`] left
    /// them, for one launch over several groups
    /// (`fused::sgd_step_groups`); `None` for AdamW state or when no
    /// parameter had a gradient.
    pub(super) fn sgd_group<'a>(&'a self, found_inf: Option<&'a Tensor>) -> Option<SgdGroup<'a>> {
        let GroupState::Sgd { momentum, .. } = &self.state else {
            return None;
        };
        if self.scratch.parameters.is_empty() {
            return None;
        }
        Some(SgdGroup {
            params: &self.scratch.parameters,
            grads: &self.scratch.grads,
            momentum_buffers: &self.scratch.first,
            options: SgdOptions {
                lr: LearningRate::Tensor(&self.learning_rate),
                momentum: *momentum,
                is_first_step: false,
                found_inf,
                ..SgdOptions::default()
            },
        })
    }

    /// Gathers the parameters that have a gradient, their gradients and
    /// state into the kernels' argument lists; whether there was any.
    pub(super) fn prepare(&mut self) -> Result<bool> {
        let scratch = &mut self.scratch;
        scratch.clear();
        for (index, parameter) in self.parameters.iter().enumerate() {
            if !parameter.requires_grad() {
                continue;
            }
            let grad = parameter.f_grad().op("grad")?;
            if !grad.defined() {
                continue;
            }
            scratch.parameters.push(parameter.shallow_clone());
            scratch.grads.push(grad);
            match &self.state {
                GroupState::Sgd { buffers, .. } => {
                    if let Some(buffer) = buffers.get(index) {
                        scratch.first.push(buffer.shallow_clone());
                    }
                }
                GroupState::AdamW {
                    exp_avgs,
                    exp_avg_sqs,
                    steps,
                    ..
                } => {
                    for (list, out) in [
                        (exp_avgs, &mut scratch.first),
                        (exp_avg_sqs, &mut scratch.second),
                        (steps, &mut scratch.third),
                    ] {
                        if let Some(tensor) = list.get(index) {
                            out.push(tensor.shallow_clone());
                        }
                    }
                }
            }
        }
        Ok(!scratch.parameters.is_empty())
    }

    /// The AdamW update over the lists [`GroupOptimizer::prepare`] left
    /// (nothing for SGD state).
    fn adamw_update(&self, found_inf: Option<&Tensor>) -> Result<()> {
        let scratch = &self.scratch;
        let lr = LearningRate::Tensor(&self.learning_rate);
        match &self.state {
            GroupState::Sgd { .. } => {}
            GroupState::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => fused::adamw_step(
                &scratch.parameters,
                &scratch.grads,
                &scratch.first,
                &scratch.second,
                &scratch.third,
                &AdamWOptions {
                    lr,
                    beta1: *beta1,
                    beta2: *beta2,
                    eps: *eps,
                    weight_decay: *weight_decay,
                    found_inf,
                    ..AdamWOptions::default()
                },
            )?,
        }
        Ok(())
    }

    /// Zeroes the gradients of the group's parameters in place (one
    /// multi-tensor kernel; parameters without a gradient are left alone).
    pub fn zero_grad(&self) -> Result<()> {
        fused::foreach_zero_(&self.defined_grads()?)?;
        Ok(())
    }

    /// The gradients the group's parameters have (handles).
    pub(super) fn defined_grads(&self) -> Result<Vec<Tensor>> {
        let mut grads = Vec::with_capacity(self.parameters.len());
        for parameter in &self.parameters {
            let grad = parameter.f_grad().op("grad")?;
            if grad.defined() {
                grads.push(grad);
            }
        }
        Ok(grads)
    }

    /// Zeroes every state tensor and the step count in place: the next
    /// step starts like the first (the learning rate is kept).
    pub(super) fn reset(&mut self) -> Result<()> {
        fused::foreach_zero_(&self.state_tensors())?;
        let _ = self.step_count.f_zero_().op("zero_")?;
        Ok(())
    }
}
