//! Lifecycle gate levels and the stage each gate guards.

use crate::SeedStage;

contract_enum! {
    /// Quality gate guarding entry into a stage (G4 does not exist).
    pub enum GateLevel {
        /// Germination: seed and blueprint ids present.
        G0 = 0 => "G0",
        /// GERMINATED -> TRAINING.
        G1 = 1 => "G1",
        /// TRAINING -> BLENDING.
        G2 = 2 => "G2",
        /// BLENDING -> HOLDING.
        G3 = 3 => "G3",
        /// HOLDING -> FOSSILIZED.
        G5 = 5 => "G5",
    }
}

impl GateLevel {
    /// The gate a move into `target` must pass, if any.
    pub fn for_target(target: SeedStage) -> Option<GateLevel> {
        match target {
            SeedStage::Germinated => Some(GateLevel::G0),
            SeedStage::Training => Some(GateLevel::G1),
            SeedStage::Blending => Some(GateLevel::G2),
            SeedStage::Holding => Some(GateLevel::G3),
            SeedStage::Fossilized => Some(GateLevel::G5),
            _ => None,
        }
    }
}

/// Lifecycle thresholds from the reference (HEAD) defaults.
pub mod thresholds {
    /// G2 strict: improvement since stage start, percentage points.
    pub const MIN_TRAINING_IMPROVEMENT: f64 = 0.5;
    /// Minimum epochs in TRAINING before G2 (and in BLENDING before strict G3).
    pub const MIN_BLENDING_EPOCHS: u32 = 10;
    /// G2 strict: minimum seed gradient ratio.
    pub const GRADIENT_RATIO_THRESHOLD: f64 = 0.10;
    /// G2 permissive: minimum gradient health.
    pub const MIN_GRADIENT_HEALTH_FOR_BLENDING: f64 = 0.7;
    /// G5 strict: minimum counterfactual contribution, percentage points.
    pub const MIN_FOSSILIZE_CONTRIBUTION: f64 = 1.0;
    /// Tolerance for "alpha reached its target" in G3.
    pub const ALPHA_TOLERANCE: f64 = 1e-6;
    /// Gradient ratio clamp.
    pub const MAX_GRADIENT_RATIO: f64 = 10.0;
    /// EMA weight of the previous gradient ratio.
    pub const GRADIENT_RATIO_EMA_DECAY: f64 = 0.9;
    /// Host gradient norm under which the ratio is defined as 0.
    pub const MIN_HOST_GRAD_NORM: f64 = 1e-8;
    /// Epochs a slot stays EMBARGOED after a prune.
    pub const EMBARGO_EPOCHS_AFTER_PRUNE: u32 = 5;
    /// Minimum seed age (epochs) before PRUNE is allowed.
    pub const MIN_PRUNE_AGE: u32 = 5;
    /// Bounded stage history length per seed.
    pub const STAGE_HISTORY_LEN: usize = 100;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g4_does_not_exist() {
        assert!(GateLevel::from_value(4).is_err());
        assert_eq!(
            GateLevel::for_target(SeedStage::Fossilized),
            Some(GateLevel::G5)
        );
        assert_eq!(GateLevel::for_target(SeedStage::Pruned), None);
    }
}
