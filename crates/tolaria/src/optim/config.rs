//! What each parameter group is trained with: SGD with momentum or AdamW,
//! one setting for the host's group and one for every seed's.
//!
//! [`OptimizerConfig::validate`] checks every value where the configuration
//! enters (building [`super::GroupOptimizers`]), naming the field: a learning
//! rate must be finite, in `(0, MAX_LEARNING_RATE]` and a positive finite
//! `f32` (the device holds it in `f32`; a NaN rate would turn every
//! parameter non-finite on the first step); momentum and the AdamW betas
//! finite in `[0, 1)`; `eps` finite and `> 0`; weight decay finite and
//! `>= 0`. These are the checks `SlotConfig` applied to the seed learning
//! rate before the optimizers moved here from Kasmina.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Largest learning rate any group accepts.
pub const MAX_LEARNING_RATE: f64 = 100.0;
/// Seed learning rate of the reference (`seed_lr`).
pub const SEED_LEARNING_RATE: f64 = 0.01;
/// Seed SGD momentum of the reference.
pub const SEED_MOMENTUM: f64 = 0.9;

/// SGD with momentum (dampening 0, no Nesterov, no weight decay): the
/// arithmetic of `torch.optim.SGD(lr, momentum)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgdConfig {
    /// Learning rate (held on the device).
    pub learning_rate: f64,
    /// Momentum factor in `[0, 1)` (0: plain SGD).
    pub momentum: f64,
}

/// AdamW (decoupled weight decay, no amsgrad): the arithmetic of
/// `torch.optim.AdamW(fused=True)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// Learning rate (held on the device).
    pub learning_rate: f64,
    /// First-moment decay in `[0, 1)`.
    pub beta1: f64,
    /// Second-moment decay in `[0, 1)`.
    pub beta2: f64,
    /// Denominator epsilon, `> 0`.
    pub eps: f64,
    /// Decoupled weight decay, `>= 0`.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
    /// decay 1e-2.
    fn default() -> Self {
        AdamWConfig {
            learning_rate: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// The optimizer of one kind of group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum GroupOptimizerConfig {
    /// SGD with momentum.
    Sgd(SgdConfig),
    /// AdamW.
    AdamW(AdamWConfig),
}

impl GroupOptimizerConfig {
    /// SGD with `learning_rate` and `momentum`.
    pub fn sgd(learning_rate: f64, momentum: f64) -> GroupOptimizerConfig {
        GroupOptimizerConfig::Sgd(SgdConfig {
            learning_rate,
            momentum,
        })
    }

    /// The configured learning rate.
    pub fn learning_rate(&self) -> f64 {
        match self {
            GroupOptimizerConfig::Sgd(sgd) => sgd.learning_rate,
            GroupOptimizerConfig::AdamW(adamw) => adamw.learning_rate,
        }
    }

    fn validate(&self, fields: &Fields) -> Result<()> {
        match self {
            GroupOptimizerConfig::Sgd(sgd) => {
                learning_rate(fields.learning_rate, sgd.learning_rate)?;
                decay(fields.momentum, sgd.momentum)
            }
            GroupOptimizerConfig::AdamW(adamw) => {
                learning_rate(fields.learning_rate, adamw.learning_rate)?;
                decay(fields.beta1, adamw.beta1)?;
                decay(fields.beta2, adamw.beta2)?;
                if !(adamw.eps.is_finite() && adamw.eps > 0.0) {
                    return Err(invalid(fields.eps, adamw.eps, "finite and > 0"));
                }
                if !(adamw.weight_decay.is_finite() && adamw.weight_decay >= 0.0) {
                    return Err(invalid(
                        fields.weight_decay,
                        adamw.weight_decay,
                        "finite and >= 0",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The optimizers of a morphogenetic model: one setting for the host's
/// group, one for every seed's group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// The host's group.
    pub host: GroupOptimizerConfig,
    /// Every seed's group (each seed has its own state).
    pub seed: GroupOptimizerConfig,
}

impl Default for OptimizerConfig {
    /// The reference: SGD lr 0.01, momentum 0.9 for the host and for every
    /// seed.
    fn default() -> Self {
        OptimizerConfig {
            host: GroupOptimizerConfig::sgd(0.01, 0.9),
            seed: GroupOptimizerConfig::sgd(SEED_LEARNING_RATE, SEED_MOMENTUM),
        }
    }
}

impl OptimizerConfig {
    /// Checks both settings (see the module docs); the error names the
    /// field, e.g. `OptimizerConfig.seed.learning_rate`.
    pub fn validate(&self) -> Result<()> {
        self.host.validate(&HOST_FIELDS)?;
        self.seed.validate(&SEED_FIELDS)
    }
}

/// Field names of one setting, for the errors.
struct Fields {
    learning_rate: &'static str,
    momentum: &'static str,
    beta1: &'static str,
    beta2: &'static str,
    eps: &'static str,
    weight_decay: &'static str,
}

const HOST_FIELDS: Fields = Fields {
    learning_rate: "OptimizerConfig.host.learning_rate",
    momentum: "OptimizerConfig.host.momentum",
    beta1: "OptimizerConfig.host.beta1",
    beta2: "OptimizerConfig.host.beta2",
    eps: "OptimizerConfig.host.eps",
    weight_decay: "OptimizerConfig.host.weight_decay",
};

const SEED_FIELDS: Fields = Fields {
    learning_rate: "OptimizerConfig.seed.learning_rate",
    momentum: "OptimizerConfig.seed.momentum",
    beta1: "OptimizerConfig.seed.beta1",
    beta2: "OptimizerConfig.seed.beta2",
    eps: "OptimizerConfig.seed.eps",
    weight_decay: "OptimizerConfig.seed.weight_decay",
};

fn invalid(field: &'static str, value: f64, allowed: &str) -> Error {
    Error::InvalidConfig {
        field,
        reason: format!("{value} must be {allowed}"),
    }
}

/// A learning rate: finite, in `(0, MAX_LEARNING_RATE]`, and a positive
/// finite `f32`.
pub(super) fn learning_rate(field: &'static str, value: f64) -> Result<f64> {
    let as_f32 = value as f32;
    if value.is_finite()
        && value > 0.0
        && value <= MAX_LEARNING_RATE
        && as_f32.is_finite()
        && as_f32 > 0.0
    {
        Ok(value)
    } else {
        Err(invalid(
            field,
            value,
            &format!("finite, in (0, {MAX_LEARNING_RATE}] and a positive f32"),
        ))
    }
}

/// A decay factor (momentum, beta): finite and in `[0, 1)`.
fn decay(field: &'static str, value: f64) -> Result<()> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value, "finite and in [0, 1)"))
    }
}
