//! [`PpoConfig`]: every PPO hyperparameter, its reference value (§4.2) and
//! the per-update schedules derived from it (learning-rate anneal, entropy
//! anneal, value-coefficient warm-up, entropy-floor penalty schedule).
//!
//! Per-head settings (entropy multipliers, entropy floors, floor-penalty
//! coefficients) are `Vec<f64>` of length `H`, the number of action heads of
//! the policy being trained: 1 for a plain categorical policy
//! ([`PpoConfig::default`]), 8 in `leyline::HEAD_NAMES` order for Tamiyo
//! ([`PpoConfig::tamiyo_reference`]).

use serde::{Deserialize, Serialize};
use tolaria::optim::MAX_LEARNING_RATE;

use crate::{Error, Result};

/// Most passes over the batch one update may make ([`PpoConfig::epochs`]).
pub const MAX_EPOCHS: usize = 1_000;

/// Most minibatches per epoch ([`PpoConfig::minibatches`]).
pub const MAX_MINIBATCHES: usize = 1 << 20;

/// Linear entropy-coefficient anneal: from [`PpoConfig::entropy_coef`] at
/// update 0 to `final_coef` at update `updates`, constant afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyAnneal {
    /// The coefficient at the end of the anneal (the reference's floor is
    /// 0.01).
    pub final_coef: f64,
    /// Updates the anneal takes (≥ 1).
    pub updates: u64,
}

/// PPO hyperparameters (see the module docs and the field docs for the
/// reference values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PpoConfig {
    /// Adam learning rate (3e-4).
    pub learning_rate: f64,
    /// Adam epsilon (1e-5).
    pub adam_eps: f64,
    /// Ratio clip range ε (0.2): each head's ratio is clipped to `[1−ε, 1+ε]`.
    pub clip: f64,
    /// Discount γ (0.995), for the caller's GAE.
    pub gamma: f64,
    /// GAE λ (0.98), for the caller's GAE.
    pub gae_lambda: f64,
    /// Target KL (0.015): an epoch is skipped, and the update stops, when the
    /// approximate KL measured before its first step exceeds
    /// `kl_stop_factor · target_kl`. `None` disables the check (and its
    /// readback).
    pub target_kl: Option<f64>,
    /// Multiple of `target_kl` that stops the update (1.5).
    pub kl_stop_factor: f64,
    /// Entropy bonus coefficient (0.05).
    pub entropy_coef: f64,
    /// Optional linear anneal of `entropy_coef` (off).
    pub entropy_anneal: Option<EntropyAnneal>,
    /// Per head, multiplier of that head's entropy in the bonus (length `H`).
    pub head_entropy_multipliers: Vec<f64>,
    /// Per head, the entropy below which the quadratic floor penalty starts
    /// (length `H`; 0 disables a head's penalty).
    pub entropy_floors: Vec<f64>,
    /// Per head, the floor penalty's coefficient (length `H`).
    pub entropy_floor_coefs: Vec<f64>,
    /// Scale the floor penalty with the reference's schedule (×1.5 for the
    /// first 25% of `total_updates`, ×1.0 to 75%, then linearly down to
    /// ×0.5); without `total_updates` the scale stays 1.
    pub floor_penalty_schedule: bool,
    /// Value-loss coefficient (0.5).
    pub value_coef: f64,
    /// Updates of the value-coefficient warm-up (10; 0 disables it): the
    /// coefficient rises linearly from `value_warmup_start · value_coef` at
    /// update 0 to `value_coef` at this update.
    pub value_warmup_updates: u64,
    /// Fraction of `value_coef` the warm-up starts from (0.1).
    pub value_warmup_start: f64,
    /// Optional value clipping around the rollout's values (off): the loss
    /// of a sample is the larger of the unclipped and the clipped error.
    pub value_clip: Option<f64>,
    /// Gradient clipping to this global L2 norm (5.0).
    pub max_grad_norm: f64,
    /// Passes over the batch per update (1).
    pub epochs: usize,
    /// Minibatches per epoch (1); rows are shuffled per epoch when > 1.
    pub minibatches: usize,
    /// Seed of the row shuffle.
    pub shuffle_seed: u64,
    /// Normalise advantages over the batch (on).
    pub normalize_advantages: bool,
    /// Floor of the advantages' standard deviation in the normalisation (0.1).
    pub advantage_std_floor: f64,
    /// CleanRL-style linear learning-rate anneal to 0 over `total_updates`
    /// (off; needs `total_updates`).
    pub anneal_learning_rate: bool,
    /// Planned number of updates, for the schedules that need it.
    pub total_updates: Option<u64>,
    /// Coefficient of the contribution predictor's loss (0.05; used only
    /// by policies with auxiliary heads).
    pub contribution_aux_coef: f64,
    /// Transitions over which that coefficient ramps up linearly from 0
    /// (1000; 0: no warm-up).
    pub contribution_aux_warmup: u64,
}

impl Default for PpoConfig {
    /// The reference's values for a one-head policy: no per-head floors,
    /// multiplier 1.
    fn default() -> Self {
        PpoConfig {
            learning_rate: 3e-4,
            adam_eps: 1e-5,
            clip: 0.2,
            gamma: 0.995,
            gae_lambda: 0.98,
            target_kl: Some(0.015),
            kl_stop_factor: 1.5,
            entropy_coef: 0.05,
            entropy_anneal: None,
            head_entropy_multipliers: vec![1.0],
            entropy_floors: vec![0.0],
            entropy_floor_coefs: vec![0.0],
            floor_penalty_schedule: false,
            value_coef: 0.5,
            value_warmup_updates: 10,
            value_warmup_start: 0.1,
            value_clip: None,
            max_grad_norm: 5.0,
            epochs: 1,
            minibatches: 1,
            shuffle_seed: 0,
            normalize_advantages: true,
            advantage_std_floor: 0.1,
            anneal_learning_rate: false,
            total_updates: None,
            contribution_aux_coef: 0.05,
            contribution_aux_warmup: 1000,
        }
    }
}

/// The reference's per-head settings (§4.2) for one of Tamiyo's heads:
/// (entropy multiplier, entropy floor, floor-penalty coefficient).
fn tamiyo_head(name: &str) -> (f64, f64, f64) {
    match name {
        "op" => (1.0, 0.30, 0.3),
        "slot" => (1.0, 0.15, 0.1),
        "blueprint" => (1.3, 0.20, 0.3),
        "style" => (1.2, 0.15, 0.1),
        "tempo" => (1.3, 0.20, 0.3),
        // alpha_target, alpha_speed, alpha_curve.
        _ => (1.2, 0.10, 0.1),
    }
}

fn invalid(field: &'static str, value: impl std::fmt::Display, allowed: &str) -> Error {
    Error::InvalidConfig {
        field,
        reason: format!("{value} must be {allowed}"),
    }
}

/// Finite as an `f32`: the PPO arithmetic runs in f32 tensors, and libtorch
/// refuses (or turns into an infinity) a scalar beyond f32's range.
pub(crate) fn finite_f32(value: f64) -> bool {
    value.is_finite() && value.abs() <= f64::from(f32::MAX)
}

fn positive(field: &'static str, value: f64) -> Result<()> {
    if finite_f32(value) && value > 0.0 {
        Ok(())
    } else {
        Err(invalid(field, value, "finite (as an f32) and > 0"))
    }
}

fn non_negative(field: &'static str, value: f64) -> Result<()> {
    if finite_f32(value) && value >= 0.0 {
        Ok(())
    } else {
        Err(invalid(field, value, "finite (as an f32) and >= 0"))
    }
}

fn unit(field: &'static str, value: f64) -> Result<()> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value, "in [0, 1]"))
    }
}

/// `numerator / denominator` as a fraction in `[0, 1]`.
fn progress(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        1.0
    } else {
        (numerator.min(denominator) as f64) / (denominator as f64)
    }
}

impl PpoConfig {
    /// The reference's configuration for Tamiyo's eight heads, in
    /// `leyline::HEAD_NAMES` order: entropy multipliers op 1.0, slot 1.0,
    /// blueprint 1.3, style 1.2, tempo 1.3, alpha_* 1.2; floors op .30, slot
    /// .15, blueprint .20, style .15, tempo .20, alpha_* .10; floor-penalty
    /// coefficients op, blueprint, tempo .3, others .1 with the schedule on.
    pub fn tamiyo_reference() -> PpoConfig {
        let heads: Vec<(f64, f64, f64)> = leyline::HEAD_NAMES
            .iter()
            .map(|name| tamiyo_head(name))
            .collect();
        PpoConfig {
            head_entropy_multipliers: heads.iter().map(|head| head.0).collect(),
            entropy_floors: heads.iter().map(|head| head.1).collect(),
            entropy_floor_coefs: heads.iter().map(|head| head.2).collect(),
            floor_penalty_schedule: true,
            ..PpoConfig::default()
        }
    }

    /// The contribution predictor's coefficient at update `update` (0-based)
    /// of batches of `transitions` transitions each: `contribution_aux_coef`
    /// times the fraction of the warm-up the earlier updates covered.
    pub fn contribution_coef_at(&self, update: u64, transitions: u64) -> f64 {
        if self.contribution_aux_warmup == 0 {
            return self.contribution_aux_coef;
        }
        let seen = update.saturating_mul(transitions) as f64;
        self.contribution_aux_coef * (seen / self.contribution_aux_warmup as f64).min(1.0)
    }

    /// Number of action heads `H` the configuration is for.
    pub fn heads(&self) -> usize {
        self.head_entropy_multipliers.len()
    }

    /// Checks every value; the error names the field, e.g.
    /// `PpoConfig.clip`: every float finite and on its side of zero (the
    /// learning rate also a positive `f32`, the discounts and fractions in
    /// `[0, 1]`), one per-head value per head, `epochs` in
    /// `[1, MAX_EPOCHS]`, `minibatches` in `[1, MAX_MINIBATCHES]`, and
    /// `total_updates` set (and >= 1) when a schedule needs it.
    pub fn validate(&self) -> Result<()> {
        let as_f32 = self.learning_rate as f32;
        if !(self.learning_rate.is_finite()
            && self.learning_rate > 0.0
            && self.learning_rate <= MAX_LEARNING_RATE
            && as_f32.is_finite()
            && as_f32 > 0.0)
        {
            return Err(invalid(
                "PpoConfig.learning_rate",
                self.learning_rate,
                &format!("finite, in (0, {MAX_LEARNING_RATE}] and a positive f32"),
            ));
        }
        positive("PpoConfig.adam_eps", self.adam_eps)?;
        positive("PpoConfig.clip", self.clip)?;
        unit("PpoConfig.gamma", self.gamma)?;
        unit("PpoConfig.gae_lambda", self.gae_lambda)?;
        if let Some(target) = self.target_kl {
            positive("PpoConfig.target_kl", target)?;
        }
        positive("PpoConfig.kl_stop_factor", self.kl_stop_factor)?;
        non_negative("PpoConfig.entropy_coef", self.entropy_coef)?;
        non_negative(
            "PpoConfig.contribution_aux_coef",
            self.contribution_aux_coef,
        )?;
        if let Some(anneal) = self.entropy_anneal {
            non_negative("PpoConfig.entropy_anneal.final_coef", anneal.final_coef)?;
            if anneal.updates == 0 {
                return Err(invalid("PpoConfig.entropy_anneal.updates", 0, ">= 1"));
            }
        }
        let heads = self.heads();
        if heads == 0 {
            return Err(invalid(
                "PpoConfig.head_entropy_multipliers",
                "an empty list",
                "one value per head (at least one)",
            ));
        }
        for (field, list) in [
            (
                "PpoConfig.head_entropy_multipliers",
                &self.head_entropy_multipliers,
            ),
            ("PpoConfig.entropy_floors", &self.entropy_floors),
            ("PpoConfig.entropy_floor_coefs", &self.entropy_floor_coefs),
        ] {
            if list.len() != heads {
                return Err(invalid(
                    field,
                    format!("{} values", list.len()),
                    &format!("{heads} values (one per head)"),
                ));
            }
            for value in list {
                non_negative(field, *value)?;
            }
        }
        non_negative("PpoConfig.value_coef", self.value_coef)?;
        unit("PpoConfig.value_warmup_start", self.value_warmup_start)?;
        if let Some(clip) = self.value_clip {
            positive("PpoConfig.value_clip", clip)?;
        }
        positive("PpoConfig.max_grad_norm", self.max_grad_norm)?;
        if !(1..=MAX_EPOCHS).contains(&self.epochs) {
            return Err(invalid(
                "PpoConfig.epochs",
                self.epochs,
                &format!("in [1, {MAX_EPOCHS}]"),
            ));
        }
        if !(1..=MAX_MINIBATCHES).contains(&self.minibatches) {
            return Err(invalid(
                "PpoConfig.minibatches",
                self.minibatches,
                &format!("in [1, {MAX_MINIBATCHES}]"),
            ));
        }
        positive("PpoConfig.advantage_std_floor", self.advantage_std_floor)?;
        if self.total_updates == Some(0) {
            return Err(invalid("PpoConfig.total_updates", 0, ">= 1 when set"));
        }
        if self.anneal_learning_rate && self.total_updates.is_none() {
            return Err(invalid(
                "PpoConfig.total_updates",
                "None",
                "set when anneal_learning_rate is on",
            ));
        }
        Ok(())
    }

    /// The learning rate of update `update` (0-based): with the anneal,
    /// `learning_rate · (1 − update / total_updates)` (CleanRL's schedule;
    /// updates past the plan keep the last rate), otherwise `learning_rate`.
    pub fn learning_rate_at(&self, update: u64) -> f64 {
        match (self.anneal_learning_rate, self.total_updates) {
            (true, Some(total)) if total > 0 => {
                let done = update.min(total.saturating_sub(1));
                self.learning_rate * (1.0 - progress(done, total))
            }
            _ => self.learning_rate,
        }
    }

    /// The entropy coefficient of update `update` (see [`EntropyAnneal`]).
    pub fn entropy_coef_at(&self, update: u64) -> f64 {
        match self.entropy_anneal {
            Some(anneal) => {
                let fraction = progress(update, anneal.updates);
                self.entropy_coef + (anneal.final_coef - self.entropy_coef) * fraction
            }
            None => self.entropy_coef,
        }
    }

    /// The value coefficient of update `update`, after the warm-up.
    pub fn value_coef_at(&self, update: u64) -> f64 {
        if self.value_warmup_updates == 0 {
            return self.value_coef;
        }
        let fraction = progress(update, self.value_warmup_updates);
        self.value_coef * (self.value_warmup_start + (1.0 - self.value_warmup_start) * fraction)
    }

    /// The floor-penalty scale of update `update` (see
    /// [`PpoConfig::floor_penalty_schedule`]).
    pub fn floor_penalty_scale_at(&self, update: u64) -> f64 {
        match (self.floor_penalty_schedule, self.total_updates) {
            (true, Some(total)) => {
                let done = progress(update, total);
                if done < 0.25 {
                    1.5
                } else if done < 0.75 {
                    1.0
                } else {
                    1.0 - 0.5 * (done - 0.75) / 0.25
                }
            }
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_name_bad_fields() {
        PpoConfig::default().validate().unwrap();
        PpoConfig::tamiyo_reference().validate().unwrap();
        let bad = PpoConfig {
            clip: 0.0,
            ..PpoConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(Error::InvalidConfig {
                field: "PpoConfig.clip",
                ..
            })
        ));
        let bad = PpoConfig {
            entropy_floors: vec![0.1, 0.2],
            ..PpoConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(Error::InvalidConfig {
                field: "PpoConfig.entropy_floors",
                ..
            })
        ));
        let bad = PpoConfig {
            anneal_learning_rate: true,
            ..PpoConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(Error::InvalidConfig {
                field: "PpoConfig.total_updates",
                ..
            })
        ));
    }

    #[test]
    fn tamiyo_reference_follows_head_names() {
        let config = PpoConfig::tamiyo_reference();
        assert_eq!(config.heads(), leyline::NUM_ACTION_HEADS);
        let op = leyline::action::head_index("op").unwrap();
        let blueprint = leyline::action::head_index("blueprint").unwrap();
        let curve = leyline::action::head_index("alpha_curve").unwrap();
        assert_eq!(config.entropy_floors[op], 0.30);
        assert_eq!(config.head_entropy_multipliers[blueprint], 1.3);
        assert_eq!(config.entropy_floor_coefs[blueprint], 0.3);
        assert_eq!(config.entropy_floors[curve], 0.10);
        assert_eq!(config.entropy_floor_coefs[curve], 0.1);
    }

    #[test]
    fn schedules() {
        let config = PpoConfig {
            anneal_learning_rate: true,
            total_updates: Some(4),
            entropy_anneal: Some(EntropyAnneal {
                final_coef: 0.01,
                updates: 4,
            }),
            floor_penalty_schedule: true,
            ..PpoConfig::default()
        };
        assert_eq!(config.learning_rate_at(0), 3e-4);
        assert!((config.learning_rate_at(2) - 1.5e-4).abs() < 1e-12);
        assert!((config.learning_rate_at(9) - 0.75e-4).abs() < 1e-12);
        assert!((config.entropy_coef_at(2) - 0.03).abs() < 1e-12);
        assert!((config.entropy_coef_at(40) - 0.01).abs() < 1e-12);
        assert!((config.value_coef_at(0) - 0.05).abs() < 1e-12);
        assert!((config.value_coef_at(5) - 0.275).abs() < 1e-12);
        assert!((config.value_coef_at(10) - 0.5).abs() < 1e-12);
        assert_eq!(config.floor_penalty_scale_at(0), 1.5);
        assert_eq!(config.floor_penalty_scale_at(2), 1.0);
        assert_eq!(config.floor_penalty_scale_at(4), 0.5);
    }
}
