//! Anomalies of a PPO update, read from its [`PpoStats`] on the host (no
//! readback of its own): the reference's `RATIO_EXPLOSION_DETECTED`,
//! `RATIO_COLLAPSE_DETECTED`, `VALUE_COLLAPSE_DETECTED` and
//! `NUMERICAL_INSTABILITY_DETECTED` (§6.2).
//!
//! The reference names these events without giving their thresholds; the
//! defaults here are ours ([`AnomalyThresholds::default`]): a joint ratio
//! above 5 or below 0.2 is far outside PPO's clip range of [0.8, 1.2], and
//! a critic whose values vary by less than 1e-4 (on the normalised scale,
//! where returns have unit variance) predicts one value for every state.

use super::PpoStats;

/// Where each anomaly starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnomalyThresholds {
    /// A joint ratio above this is an explosion (5.0).
    pub ratio_explosion: f64,
    /// A joint ratio below this is a collapse (0.2).
    pub ratio_collapse: f64,
    /// Values varying by less than this standard deviation are a collapsed
    /// critic (1e-4).
    pub value_collapse_std: f64,
}

impl Default for AnomalyThresholds {
    fn default() -> Self {
        AnomalyThresholds {
            ratio_explosion: 5.0,
            ratio_collapse: 0.2,
            value_collapse_std: 1e-4,
        }
    }
}

impl AnomalyThresholds {
    /// Checks the thresholds: both ratios finite and > 0, the value
    /// standard deviation finite and >= 0; the error names the field, e.g.
    /// `AnomalyThresholds.ratio_explosion`. (A NaN threshold would compare
    /// false against everything and silence its anomaly.)
    pub fn validate(&self) -> crate::Result<()> {
        let checks = [
            (
                "AnomalyThresholds.ratio_explosion",
                self.ratio_explosion,
                false,
            ),
            (
                "AnomalyThresholds.ratio_collapse",
                self.ratio_collapse,
                false,
            ),
            (
                "AnomalyThresholds.value_collapse_std",
                self.value_collapse_std,
                true,
            ),
        ];
        for (field, value, zero_allowed) in checks {
            let ok = value.is_finite() && (value > 0.0 || (zero_allowed && value == 0.0));
            if !ok {
                return Err(crate::Error::InvalidConfig {
                    field,
                    reason: format!(
                        "{value} is not a finite number {}",
                        if zero_allowed { ">= 0" } else { "> 0" }
                    ),
                });
            }
        }
        Ok(())
    }
}

/// One anomaly of an update.
#[derive(Debug, Clone, PartialEq)]
pub enum PpoAnomaly {
    /// The policy moved far from the one that acted: the largest joint
    /// ratio.
    RatioExplosion {
        /// The largest joint ratio.
        ratio_max: f64,
    },
    /// The policy made some acted action far less likely: the smallest
    /// joint ratio.
    RatioCollapse {
        /// The smallest joint ratio.
        ratio_min: f64,
    },
    /// The critic predicts one value for every state.
    ValueCollapse {
        /// The standard deviation of its values.
        value_std: f64,
    },
    /// A statistic of the update is not finite.
    NumericalInstability {
        /// Which one.
        what: &'static str,
        /// Its value.
        value: f64,
    },
}

impl PpoAnomaly {
    /// The anomalies of `stats` under `thresholds`, in the order of the
    /// enum's variants. A NaN ratio (no sample trained the actor) is none.
    pub fn detect(stats: &PpoStats, thresholds: &AnomalyThresholds) -> Vec<PpoAnomaly> {
        let mut found = Vec::new();
        if stats.ratio_max > thresholds.ratio_explosion {
            found.push(PpoAnomaly::RatioExplosion {
                ratio_max: stats.ratio_max,
            });
        }
        if stats.ratio_min < thresholds.ratio_collapse {
            found.push(PpoAnomaly::RatioCollapse {
                ratio_min: stats.ratio_min,
            });
        }
        if stats.value_std < thresholds.value_collapse_std {
            found.push(PpoAnomaly::ValueCollapse {
                value_std: stats.value_std,
            });
        }
        for (what, value) in [
            ("policy_loss", stats.policy_loss),
            ("value_loss", stats.value_loss),
            ("entropy_bonus", stats.entropy_bonus),
            ("floor_penalty", stats.floor_penalty),
            ("total_loss", stats.total_loss),
            ("approx_kl", stats.approx_kl),
            ("grad_norm", stats.grad_norm),
            ("q_loss", stats.q_loss),
            ("contribution_loss", stats.contribution_loss),
            ("value_std", stats.value_std),
        ] {
            if !value.is_finite() {
                found.push(PpoAnomaly::NumericalInstability { what, value });
            }
        }
        found
    }

    /// The leyline event name of this anomaly.
    pub fn event_name(&self) -> &'static str {
        use leyline::telemetry as names;
        match self {
            PpoAnomaly::RatioExplosion { .. } => names::SIMIC_PPO_RATIO_EXPLOSION,
            PpoAnomaly::RatioCollapse { .. } => names::SIMIC_PPO_RATIO_COLLAPSE,
            PpoAnomaly::ValueCollapse { .. } => names::SIMIC_PPO_VALUE_COLLAPSE,
            PpoAnomaly::NumericalInstability { .. } => names::SIMIC_PPO_NUMERICAL_INSTABILITY,
        }
    }

    /// The event's attributes (besides the round).
    pub fn attributes(&self, thresholds: &AnomalyThresholds) -> Vec<(String, String)> {
        match self {
            PpoAnomaly::RatioExplosion { ratio_max } => vec![
                ("ratio_max".to_owned(), ratio_max.to_string()),
                (
                    "threshold".to_owned(),
                    thresholds.ratio_explosion.to_string(),
                ),
            ],
            PpoAnomaly::RatioCollapse { ratio_min } => vec![
                ("ratio_min".to_owned(), ratio_min.to_string()),
                (
                    "threshold".to_owned(),
                    thresholds.ratio_collapse.to_string(),
                ),
            ],
            PpoAnomaly::ValueCollapse { value_std } => vec![
                ("value_std".to_owned(), value_std.to_string()),
                (
                    "threshold".to_owned(),
                    thresholds.value_collapse_std.to_string(),
                ),
            ],
            PpoAnomaly::NumericalInstability { what, value } => vec![
                ("what".to_owned(), (*what).to_owned()),
                ("value".to_owned(), value.to_string()),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> PpoStats {
        PpoStats {
            policy_loss: 0.1,
            value_loss: 0.5,
            entropy_bonus: 3.0,
            floor_penalty: 0.0,
            total_loss: 0.2,
            head_entropies: vec![1.0],
            approx_kl: 0.01,
            clip_fraction: 0.1,
            grad_norm: 1.0,
            epochs_run: 1,
            steps: 1,
            early_stopped: false,
            learning_rate: 3e-4,
            entropy_coef: 0.05,
            value_coef: 0.5,
            q_loss: 0.0,
            contribution_loss: 0.0,
            contribution_coef: 0.0,
            explained_variance: 0.3,
            value_std: 0.8,
            ratio_max: 1.3,
            ratio_min: 0.7,
            anchor_loss: 0.0,
            anchor_coef: 0.0,
        }
    }

    #[test]
    fn a_healthy_update_has_no_anomaly() {
        assert!(PpoAnomaly::detect(&healthy(), &AnomalyThresholds::default()).is_empty());
        // No sample trained the actor: NaN ratios are not anomalies.
        let idle = PpoStats {
            ratio_max: f64::NAN,
            ratio_min: f64::NAN,
            ..healthy()
        };
        assert!(PpoAnomaly::detect(&idle, &AnomalyThresholds::default()).is_empty());
    }

    #[test]
    fn each_threshold_is_crossed_on_its_own_side() {
        let thresholds = AnomalyThresholds::default();
        let stats = PpoStats {
            ratio_max: 7.5,
            ratio_min: 0.05,
            value_std: 1e-6,
            grad_norm: f64::INFINITY,
            ..healthy()
        };
        let found = PpoAnomaly::detect(&stats, &thresholds);
        assert_eq!(
            found,
            vec![
                PpoAnomaly::RatioExplosion { ratio_max: 7.5 },
                PpoAnomaly::RatioCollapse { ratio_min: 0.05 },
                PpoAnomaly::ValueCollapse { value_std: 1e-6 },
                PpoAnomaly::NumericalInstability {
                    what: "grad_norm",
                    value: f64::INFINITY
                },
            ]
        );
        assert_eq!(
            found[0].event_name(),
            leyline::telemetry::SIMIC_PPO_RATIO_EXPLOSION
        );
        let attributes = found[0].attributes(&thresholds);
        assert_eq!(attributes[0], ("ratio_max".to_owned(), "7.5".to_owned()));
        // At the thresholds themselves: none.
        let edge = PpoStats {
            ratio_max: 5.0,
            ratio_min: 0.2,
            value_std: 1e-4,
            ..healthy()
        };
        assert!(PpoAnomaly::detect(&edge, &thresholds).is_empty());
    }
}
