//! The checks of the reward's constants: [`RewardConfig::validate`] and
//! [`StagePotentials::validate`] (every value finite and on the side of zero
//! its rule assumes; the stage potentials rising along the lifecycle).

use super::config::{RewardConfig, RewardMode, StagePotentials};
use crate::{Error, Result};

/// Which side of zero a constant must be on.
#[derive(Clone, Copy)]
enum Sign {
    /// `> 0`.
    Positive,
    /// `>= 0`.
    NonNegative,
    /// `<= 0`.
    NonPositive,
    /// Any finite value.
    Any,
}

fn check(field: &'static str, value: f64, sign: Sign) -> Result<()> {
    let ok = value.is_finite()
        && match sign {
            Sign::Positive => value > 0.0,
            Sign::NonNegative => value >= 0.0,
            Sign::NonPositive => value <= 0.0,
            Sign::Any => true,
        };
    if ok {
        Ok(())
    } else {
        let wanted = match sign {
            Sign::Positive => "a finite number > 0",
            Sign::NonNegative => "a finite number >= 0",
            Sign::NonPositive => "a finite number <= 0",
            Sign::Any => "a finite number",
        };
        Err(Error::InvalidConfig {
            field,
            reason: format!("{value} is not {wanted}"),
        })
    }
}

fn check_positive_count(field: &'static str, value: u64) -> Result<()> {
    if value >= 1 {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            field,
            reason: "must be at least 1".to_owned(),
        })
    }
}

impl StagePotentials {
    /// Checks that the potentials are finite, positive and non-decreasing
    /// along GERMINATED → TRAINING → BLENDING → HOLDING → FOSSILIZED.
    pub fn validate(&self) -> Result<()> {
        let ladder = [
            ("RewardConfig.stage_potentials.germinated", self.germinated),
            ("RewardConfig.stage_potentials.training", self.training),
            ("RewardConfig.stage_potentials.blending", self.blending),
            ("RewardConfig.stage_potentials.holding", self.holding),
            ("RewardConfig.stage_potentials.fossilized", self.fossilized),
        ];
        let mut previous = 0.0;
        for (field, value) in ladder {
            check(field, value, Sign::Positive)?;
            if value < previous {
                return Err(Error::InvalidConfig {
                    field,
                    reason: format!(
                        "{value} is below the previous stage's potential {previous} \
                         (potentials must rise along the lifecycle)"
                    ),
                });
            }
            previous = value;
        }
        Ok(())
    }
}

impl RewardConfig {
    /// Checks every constant: finite, on the side of zero its rule assumes
    /// (costs and penalties `<= 0`, bonuses, weights, scales and caps
    /// `>= 0`), `gamma` in `(0, 1]`, the discount floor in `[0, 1]`, the
    /// divisors (`hacking_ratio_threshold`, `fossilize_quality_ceiling`,
    /// `min_holding_epochs`, `rent_host_params_floor`, `param_budget`) > 0,
    /// and the stage potentials rising along the lifecycle. Under ESCROW
    /// also a stable window of at least 1 and no `attribute_all_seeds`
    /// (SHAPED's).
    pub fn validate(&self) -> Result<()> {
        use Sign::{Any, NonNegative, NonPositive, Positive};
        if !(self.gamma.is_finite() && self.gamma > 0.0 && self.gamma <= 1.0) {
            return Err(Error::InvalidConfig {
                field: "RewardConfig.gamma",
                reason: format!("{} is outside (0, 1]", self.gamma),
            });
        }
        self.stage_potentials.validate()?;
        if self.mode == RewardMode::Escrow {
            if self.attribute_all_seeds {
                return Err(Error::InvalidConfig {
                    field: "RewardConfig.attribute_all_seeds",
                    reason: "is SHAPED's: ESCROW pays the change of the targeted seed's credit"
                        .to_owned(),
                });
            }
            check_positive_count(
                "RewardConfig.escrow_stable_window",
                u64::from(self.escrow_stable_window),
            )?;
        }
        if !(0.0..=1.0).contains(&self.germination_discount_floor) {
            return Err(Error::InvalidConfig {
                field: "RewardConfig.germination_discount_floor",
                reason: format!("{} is outside [0, 1]", self.germination_discount_floor),
            });
        }
        let checks: &[(&'static str, f64, Sign)] = &[
            ("RewardConfig.pbrs_weight", self.pbrs_weight, NonNegative),
            (
                "RewardConfig.epoch_progress_bonus",
                self.epoch_progress_bonus,
                NonNegative,
            ),
            (
                "RewardConfig.max_progress_bonus",
                self.max_progress_bonus,
                NonNegative,
            ),
            (
                "RewardConfig.contribution_weight",
                self.contribution_weight,
                NonNegative,
            ),
            ("RewardConfig.proxy_weight", self.proxy_weight, NonNegative),
            (
                "RewardConfig.escrow_delta_clip",
                self.escrow_delta_clip,
                NonNegative,
            ),
            (
                "RewardConfig.attribution_sigmoid_steepness",
                self.attribution_sigmoid_steepness,
                NonNegative,
            ),
            (
                "RewardConfig.ratio_penalty_min_contribution",
                self.ratio_penalty_min_contribution,
                Any,
            ),
            (
                "RewardConfig.improvement_safe_threshold",
                self.improvement_safe_threshold,
                Any,
            ),
            (
                "RewardConfig.hacking_ratio_threshold",
                self.hacking_ratio_threshold,
                Positive,
            ),
            (
                "RewardConfig.ratio_penalty_slope",
                self.ratio_penalty_slope,
                NonNegative,
            ),
            (
                "RewardConfig.ratio_penalty_cap",
                self.ratio_penalty_cap,
                NonNegative,
            ),
            (
                "RewardConfig.suspicious_contribution_scale",
                self.suspicious_contribution_scale,
                Positive,
            ),
            (
                "RewardConfig.blending_warning_base",
                self.blending_warning_base,
                NonPositive,
            ),
            (
                "RewardConfig.blending_warning_per_epoch",
                self.blending_warning_per_epoch,
                NonPositive,
            ),
            (
                "RewardConfig.blending_warning_escalation_cap",
                self.blending_warning_escalation_cap,
                NonNegative,
            ),
            (
                "RewardConfig.holding_warning_base",
                self.holding_warning_base,
                NonPositive,
            ),
            (
                "RewardConfig.holding_warning_per_epoch",
                self.holding_warning_per_epoch,
                NonPositive,
            ),
            (
                "RewardConfig.holding_warning_cap",
                self.holding_warning_cap,
                NonNegative,
            ),
            (
                "RewardConfig.synergy_weight",
                self.synergy_weight,
                NonNegative,
            ),
            (
                "RewardConfig.synergy_scale",
                self.synergy_scale,
                NonNegative,
            ),
            ("RewardConfig.rent_weight", self.rent_weight, NonNegative),
            ("RewardConfig.max_rent", self.max_rent, NonNegative),
            (
                "RewardConfig.base_slot_rent_ratio",
                self.base_slot_rent_ratio,
                NonNegative,
            ),
            (
                "RewardConfig.alpha_shock_coef",
                self.alpha_shock_coef,
                NonNegative,
            ),
            (
                "RewardConfig.alpha_shock_cap",
                self.alpha_shock_cap,
                NonNegative,
            ),
            (
                "RewardConfig.seed_occupancy_cost",
                self.seed_occupancy_cost,
                NonPositive,
            ),
            (
                "RewardConfig.fossilized_maintenance_cost",
                self.fossilized_maintenance_cost,
                NonPositive,
            ),
            (
                "RewardConfig.germination_delay_cost",
                self.germination_delay_cost,
                NonPositive,
            ),
            (
                "RewardConfig.accuracy_delta_weight",
                self.accuracy_delta_weight,
                NonNegative,
            ),
            (
                "RewardConfig.twin_delta_weight",
                self.twin_delta_weight,
                NonNegative,
            ),
            (
                "RewardConfig.germinate_cost",
                self.germinate_cost,
                NonPositive,
            ),
            (
                "RewardConfig.germinate_occupied_penalty",
                self.germinate_occupied_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.fossilize_cost",
                self.fossilize_cost,
                NonPositive,
            ),
            ("RewardConfig.prune_cost", self.prune_cost, NonPositive),
            (
                "RewardConfig.set_alpha_target_cost",
                self.set_alpha_target_cost,
                NonPositive,
            ),
            (
                "RewardConfig.advance_from_training_penalty",
                self.advance_from_training_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.invalid_fossilize_penalty",
                self.invalid_fossilize_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.fossilize_regression_base",
                self.fossilize_regression_base,
                NonPositive,
            ),
            (
                "RewardConfig.fossilize_damage_scale",
                self.fossilize_damage_scale,
                NonNegative,
            ),
            (
                "RewardConfig.fossilize_damage_cap",
                self.fossilize_damage_cap,
                NonNegative,
            ),
            (
                "RewardConfig.ransomware_penalty",
                self.ransomware_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.ransomware_min_contribution",
                self.ransomware_min_contribution,
                Any,
            ),
            (
                "RewardConfig.ransomware_max_total",
                self.ransomware_max_total,
                Any,
            ),
            (
                "RewardConfig.min_fossilize_contribution",
                self.min_fossilize_contribution,
                Any,
            ),
            (
                "RewardConfig.fossilize_base_bonus",
                self.fossilize_base_bonus,
                NonNegative,
            ),
            (
                "RewardConfig.fossilize_contribution_scale",
                self.fossilize_contribution_scale,
                NonNegative,
            ),
            (
                "RewardConfig.fossilize_noncontributing_penalty",
                self.fossilize_noncontributing_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.fossilize_bonus_scale",
                self.fossilize_bonus_scale,
                NonNegative,
            ),
            (
                "RewardConfig.fossilize_quality_ceiling",
                self.fossilize_quality_ceiling,
                Positive,
            ),
            (
                "RewardConfig.prune_young_penalty_per_epoch",
                self.prune_young_penalty_per_epoch,
                NonPositive,
            ),
            (
                "RewardConfig.prune_hurting_threshold",
                self.prune_hurting_threshold,
                NonPositive,
            ),
            (
                "RewardConfig.prune_hurting_bonus",
                self.prune_hurting_bonus,
                NonNegative,
            ),
            (
                "RewardConfig.prune_young_hurting_penalty",
                self.prune_young_hurting_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.prune_acceptable_bonus",
                self.prune_acceptable_bonus,
                NonNegative,
            ),
            (
                "RewardConfig.prune_good_seed_penalty",
                self.prune_good_seed_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.prune_contribution_scale",
                self.prune_contribution_scale,
                NonPositive,
            ),
            (
                "RewardConfig.prune_good_seed_floor",
                self.prune_good_seed_floor,
                NonPositive,
            ),
            (
                "RewardConfig.prune_invalid_penalty",
                self.prune_invalid_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.prune_no_seed_penalty",
                self.prune_no_seed_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.terminal_acc_weight",
                self.terminal_acc_weight,
                NonNegative,
            ),
            (
                "RewardConfig.auto_prune_penalty",
                self.auto_prune_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.rollback_death_penalty",
                self.rollback_death_penalty,
                NonPositive,
            ),
            (
                "RewardConfig.param_penalty_weight",
                self.param_penalty_weight,
                NonNegative,
            ),
            (
                "RewardConfig.sparse_reward_scale",
                self.sparse_reward_scale,
                NonNegative,
            ),
            (
                "RewardConfig.early_prune_penalty",
                self.early_prune_penalty,
                NonPositive,
            ),
        ];
        for &(field, value, sign) in checks {
            check(field, value, sign)?;
        }
        if self.prune_good_seed_floor > self.prune_good_seed_penalty {
            return Err(Error::InvalidConfig {
                field: "RewardConfig.prune_good_seed_floor",
                reason: format!(
                    "{} is above prune_good_seed_penalty {} (the floor must not be the \
                     milder value)",
                    self.prune_good_seed_floor, self.prune_good_seed_penalty
                ),
            });
        }
        check_positive_count(
            "RewardConfig.rent_host_params_floor",
            self.rent_host_params_floor,
        )?;
        check_positive_count("RewardConfig.param_budget", self.param_budget)?;
        check_positive_count(
            "RewardConfig.min_holding_epochs",
            u64::from(self.min_holding_epochs),
        )?;
        Ok(())
    }
}
