//! [`ValueNormaliser`]: running statistics of the critic's targets
//! (reference §4.2: the critic is trained on normalised returns, and its
//! outputs are denormalised before GAE).
//!
//! A scalar mean and variance of the returns, held as 0-dim `f32` tensors on
//! the device and updated with a whole batch at a time by an EMA with
//! momentum `m` (0.99), the law of total variance for the two weighted parts:
//! `mean' = m·mean + (1−m)·μ_b`, `var' = m·var + (1−m)·σ²_b + m(1−m)(mean − μ_b)²`
//! (`μ_b`, `σ²_b` the batch's weighted mean and population variance). The
//! first update takes the batch's moments as they are instead: starting the
//! EMA from mean 0 and variance 1 would hand the critic targets hundreds of
//! standard deviations wide for its first hundred updates.
//!
//! `normalise(x) = (x − mean) / sqrt(var + ε)` and `denormalise` its
//! inverse. A batch whose weights are all zero leaves the state unchanged
//! (decided on the device). [`ValueNormaliser::update`] reads back once, a
//! few integers, before it changes anything: returns that are NaN or
//! infinite, weights that are not finite and >= 0, and a batch whose moments
//! overflow `f32` are refused and leave the state as it was. Nothing else is
//! read back except by [`ValueNormaliser::state`], the serde form for
//! checkpoints.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::shape_error;
use crate::error::TorchResultExt;
use crate::{Error, Result};

/// The normaliser's constants.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueNormaliserConfig {
    /// EMA momentum in `(0, 1)` (0.99).
    pub momentum: f64,
    /// Added to the variance under the square root (1e-8).
    pub epsilon: f64,
}

impl Default for ValueNormaliserConfig {
    /// Momentum 0.99 (the reference), epsilon 1e-8.
    fn default() -> Self {
        ValueNormaliserConfig {
            momentum: 0.99,
            epsilon: 1e-8,
        }
    }
}

impl ValueNormaliserConfig {
    /// Checks the constants: momentum in `(0, 1)`, epsilon finite and > 0.
    pub fn validate(&self) -> Result<()> {
        if !(self.momentum > 0.0 && self.momentum < 1.0) {
            return Err(Error::InvalidConfig {
                field: "ValueNormaliserConfig.momentum",
                reason: format!("{} is outside (0, 1)", self.momentum),
            });
        }
        if !(self.epsilon.is_finite() && self.epsilon > 0.0) {
            return Err(Error::InvalidConfig {
                field: "ValueNormaliserConfig.epsilon",
                reason: format!("{} is not finite and > 0", self.epsilon),
            });
        }
        Ok(())
    }
}

/// The normaliser's state on the host (checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueNormaliserState {
    /// The constants.
    pub config: ValueNormaliserConfig,
    /// Running mean of the returns.
    pub mean: f64,
    /// Running variance of the returns (≥ 0).
    pub var: f64,
    /// Updates applied.
    pub updates: u64,
}

/// Running return statistics (see the module docs).
#[derive(Debug)]
pub struct ValueNormaliser {
    config: ValueNormaliserConfig,
    mean: Tensor,
    var: Tensor,
    updates: u64,
}

fn scalar(value: f64, device: Device) -> Result<Tensor> {
    Tensor::f_full([] as [i64; 0], value, (Kind::Float, device)).op("value normaliser state")
}

impl ValueNormaliser {
    /// Mean 0, variance 1 on `device`, no update yet.
    pub fn new(config: ValueNormaliserConfig, device: Device) -> Result<ValueNormaliser> {
        config.validate()?;
        Ok(ValueNormaliser {
            config,
            mean: scalar(0.0, device)?,
            var: scalar(1.0, device)?,
            updates: 0,
        })
    }

    /// Restores a checkpointed state on `device` (checked: finite mean, and
    /// a variance finite and ≥ 0, both also as `f32`).
    pub fn from_state(state: &ValueNormaliserState, device: Device) -> Result<ValueNormaliser> {
        state.config.validate()?;
        let finite32 = |value: f64| value.is_finite() && (value as f32).is_finite();
        if !finite32(state.mean) {
            return Err(Error::InvalidInput {
                field: "ValueNormaliserState.mean",
                reason: format!("{} is not a finite f32", state.mean),
            });
        }
        if !(finite32(state.var) && state.var >= 0.0) {
            return Err(Error::InvalidInput {
                field: "ValueNormaliserState.var",
                reason: format!("{} is not a finite f32 >= 0", state.var),
            });
        }
        Ok(ValueNormaliser {
            config: state.config,
            mean: scalar(state.mean, device)?,
            var: scalar(state.var, device)?,
            updates: state.updates,
        })
    }

    /// Another handle on the same state: [`ValueNormaliser::update`]
    /// replaces the mean and variance tensors rather than writing into
    /// them, so the copy keeps the state of now (a checkpoint to put back).
    pub(crate) fn shallow_copy(&self) -> ValueNormaliser {
        ValueNormaliser {
            config: self.config,
            mean: self.mean.shallow_clone(),
            var: self.var.shallow_clone(),
            updates: self.updates,
        }
    }

    /// The constants.
    pub fn config(&self) -> ValueNormaliserConfig {
        self.config
    }

    /// The running mean, a 0-dim `f32` device tensor.
    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    /// The running variance, a 0-dim `f32` device tensor.
    pub fn var(&self) -> &Tensor {
        &self.var
    }

    /// Updates applied so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    fn check(&self, what: &'static str, x: &Tensor) -> Result<()> {
        if !x.is_floating_point() {
            return Err(shape_error(
                what,
                "a floating-point tensor".to_owned(),
                x.kind(),
            ));
        }
        if x.device() != self.mean.device() {
            return Err(shape_error(
                what,
                format!("a tensor on {:?}", self.mean.device()),
                x.device(),
            ));
        }
        Ok(())
    }

    fn std(&self) -> Result<Tensor> {
        self.var
            .f_add_scalar(self.config.epsilon)
            .op("value normaliser std")?
            .f_sqrt()
            .op("value normaliser std")
    }

    /// `(x − mean) / sqrt(var + ε)`, any shape, in `f32`.
    pub fn normalise(&self, x: &Tensor) -> Result<Tensor> {
        self.check("ValueNormaliser.normalise", x)?;
        x.f_to_kind(Kind::Float)
            .op("normalise")?
            .f_sub(&self.mean)
            .op("normalise")?
            .f_div(&self.std()?)
            .op("normalise")
    }

    /// `x·sqrt(var + ε) + mean`, any shape, in `f32`.
    pub fn denormalise(&self, x: &Tensor) -> Result<Tensor> {
        self.check("ValueNormaliser.denormalise", x)?;
        x.f_to_kind(Kind::Float)
            .op("denormalise")?
            .f_mul(&self.std()?)
            .op("denormalise")?
            .f_add(&self.mean)
            .op("denormalise")
    }

    /// Updates the statistics with `returns` (any shape, at least one
    /// element), each weighted by `weights` (same shape, e.g. 0 for padding)
    /// or all by 1. One readback of a few integers (the finiteness check).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for a kind, device or shape that does not
    /// fit; [`Error::InvalidInput`] for a NaN or infinite return
    /// (`ValueNormaliser.update returns`) or a weight that is not a finite
    /// number `>= 0` (`ValueNormaliser.update weights`);
    /// [`Error::NonFinite`] when the new mean or variance would overflow. A
    /// refused update changes nothing.
    pub fn update(&mut self, returns: &Tensor, weights: Option<&Tensor>) -> Result<()> {
        self.check("ValueNormaliser.update", returns)?;
        if returns.numel() == 0 {
            return Err(shape_error(
                "ValueNormaliser.update",
                "at least one element".to_owned(),
                returns.size(),
            ));
        }
        let x = returns
            .f_detach()
            .op("value normaliser update")?
            .f_to_kind(Kind::Float)
            .op("value normaliser update")?;
        let w = match weights {
            Some(weights) => {
                self.check("ValueNormaliser.update weights", weights)?;
                if weights.size() != returns.size() {
                    return Err(shape_error(
                        "ValueNormaliser.update weights",
                        format!("{:?}", returns.size()),
                        weights.size(),
                    ));
                }
                weights
                    .f_to_kind(Kind::Float)
                    .op("value normaliser weights")?
            }
            None => x.f_ones_like().op("value normaliser weights")?,
        };
        let total = w.f_sum(Kind::Float).op("value normaliser update")?;
        let any = total.f_gt(0.0).op("value normaliser update")?;
        let denominator = total.f_clamp_min(1e-12).op("value normaliser update")?;
        let batch_mean = x
            .f_mul(&w)
            .op("value normaliser mean")?
            .f_sum(Kind::Float)
            .op("value normaliser mean")?
            .f_div(&denominator)
            .op("value normaliser mean")?;
        let batch_var = x
            .f_sub(&batch_mean)
            .op("value normaliser var")?
            .f_square()
            .op("value normaliser var")?
            .f_mul(&w)
            .op("value normaliser var")?
            .f_sum(Kind::Float)
            .op("value normaliser var")?
            .f_div(&denominator)
            .op("value normaliser var")?;
        let (mean, var) = if self.updates == 0 {
            (batch_mean, batch_var)
        } else {
            let m = self.config.momentum;
            let rest = 1.0 - m;
            let delta_sq = self
                .mean
                .f_sub(&batch_mean)
                .op("value normaliser ema")?
                .f_square()
                .op("value normaliser ema")?;
            let mean = self
                .mean
                .f_mul_scalar(m)
                .op("value normaliser ema")?
                .f_add(&batch_mean.f_mul_scalar(rest).op("value normaliser ema")?)
                .op("value normaliser ema")?;
            let var = self
                .var
                .f_mul_scalar(m)
                .op("value normaliser ema")?
                .f_add(&batch_var.f_mul_scalar(rest).op("value normaliser ema")?)
                .op("value normaliser ema")?
                .f_add(&delta_sq.f_mul_scalar(m * rest).op("value normaliser ema")?)
                .op("value normaliser ema")?;
            (mean, var)
        };
        let mean = mean
            .f_where_self(&any, &self.mean)
            .op("value normaliser keep")?;
        let var = var
            .f_where_self(&any, &self.var)
            .op("value normaliser keep")?;
        {
            use crate::finite::Rule::{Finite, NonNegative};
            let checks = [
                ("ValueNormaliser.update returns", &x, Finite),
                ("ValueNormaliser.update weights", &w, NonNegative),
                ("ValueNormaliser.mean", &mean, Finite),
                ("ValueNormaliser.var", &var, NonNegative),
            ];
            let counts = crate::finite::bad_counts(&checks)?;
            for (index, ((field, tensor, rule), count)) in checks.iter().zip(counts).enumerate() {
                if count == 0 {
                    continue;
                }
                if index < 2 {
                    return Err(crate::finite::invalid(field, tensor, *rule, count));
                }
                return Err(Error::NonFinite {
                    what: field,
                    value: crate::finite::first_non_finite(tensor),
                });
            }
        }
        self.mean = mean;
        self.var = var;
        self.updates = self.updates.saturating_add(1);
        Ok(())
    }

    /// The state on the host (two scalars read back).
    pub fn state(&self) -> Result<ValueNormaliserState> {
        let read = |tensor: &Tensor, what: &'static str| -> Result<f64> {
            tensor
                .f_double_value(&[])
                .map_err(|source| Error::Readback {
                    what,
                    reason: source.to_string(),
                })
        };
        Ok(ValueNormaliserState {
            config: self.config,
            mean: read(&self.mean, "ValueNormaliser.mean")?,
            var: read(&self.var, "ValueNormaliser.var")?,
            updates: self.updates,
        })
    }
}
