//! A deterministic SGD with momentum over an ordered parameter list.
//!
//! Same update as `torch.optim.SGD(lr, momentum)` without dampening, weight
//! decay or Nesterov: `buf = grad` on the first step, then
//! `buf = momentum buf + grad`; `p -= lr buf`. Each seed slot owns one (the
//! reference's per-seed optimizer: lr 0.01, momentum 0.9), created lazily and
//! dropped with the seed. Parameters without a gradient are skipped (their
//! momentum is left untouched), as in PyTorch.
//!
//! The learning rate must be finite and in `(0, MAX_LEARNING_RATE]`, the
//! momentum finite and in `[0, 1]` ([`Sgd::new`] refuses anything else: a
//! NaN learning rate would turn every parameter non-finite on the first
//! step).

use tch::Tensor;

use crate::Result;
use crate::validate::{MAX_LEARNING_RATE, in_range, positive_at_most};

/// Seed learning rate of the reference.
pub const SEED_LR: f64 = 0.01;
/// Seed momentum of the reference.
pub const SEED_MOMENTUM: f64 = 0.9;

/// SGD with momentum.
#[derive(Debug)]
pub struct Sgd {
    learning_rate: f64,
    momentum: f64,
    parameters: Vec<Tensor>,
    buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// An optimizer over `parameters` (shallow handles to the variables);
    /// see the module docs for the accepted learning rate and momentum.
    pub fn new(parameters: Vec<Tensor>, learning_rate: f64, momentum: f64) -> Result<Sgd> {
        let learning_rate =
            positive_at_most("Sgd.learning_rate", learning_rate, MAX_LEARNING_RATE)?;
        let momentum = in_range("Sgd.momentum", momentum, 0.0, 1.0)?;
        let buffers = parameters.iter().map(|_| None).collect();
        Ok(Sgd {
            learning_rate,
            momentum,
            parameters,
            buffers,
        })
    }

    /// Learning rate.
    pub fn learning_rate(&self) -> f64 {
        self.learning_rate
    }

    /// Number of parameter tensors.
    pub fn len(&self) -> usize {
        self.parameters.len()
    }

    /// Whether the optimizer holds no parameters.
    pub fn is_empty(&self) -> bool {
        self.parameters.is_empty()
    }

    /// Applies one update from the current gradients.
    pub fn step(&mut self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (parameter, buffer) in self.parameters.iter_mut().zip(self.buffers.iter_mut()) {
            let grad = parameter.f_grad()?;
            if !grad.defined() {
                continue;
            }
            let direction = if self.momentum != 0.0 {
                let next = match buffer.take() {
                    // A real copy: the gradient is zeroed in place later.
                    None => grad.f_detach()?.f_mul_scalar(1.0)?,
                    Some(previous) => previous.f_mul_scalar(self.momentum)?.f_add(&grad)?,
                };
                let direction = next.shallow_clone();
                *buffer = Some(next);
                direction
            } else {
                grad
            };
            let _updated = parameter.f_sub_(&direction.f_mul_scalar(self.learning_rate)?)?;
        }
        Ok(())
    }

    /// Zeroes every parameter's gradient (where one exists).
    pub fn zero_grad(&mut self) -> Result<()> {
        zero_grads(&self.parameters)
    }

    /// Forgets the momentum buffers (after a rollback).
    pub fn reset_state(&mut self) {
        self.buffers.iter_mut().for_each(|buffer| *buffer = None);
    }
}

/// Zeroes the gradients of `parameters` in place (those that have one).
pub fn zero_grads(parameters: &[Tensor]) -> Result<()> {
    for parameter in parameters {
        let mut grad = parameter.f_grad()?;
        if grad.defined() {
            let _guard = tch::no_grad_guard();
            let _detached = grad.f_detach_()?;
            let _zeroed = grad.f_zero_()?;
        }
    }
    Ok(())
}
