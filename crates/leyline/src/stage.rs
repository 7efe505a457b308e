//! Seed lifecycle stages and the legal transition table.
//!
//! [`VALID_TRANSITIONS`] is the single source of truth for which lifecycle
//! moves exist; every crate asks [`SeedStage::can_transition_to`] or
//! [`validate_transition`] rather than keeping its own list.

use crate::{Error, Result};

contract_enum! {
    /// Lifecycle stage of a seed. The integer values are part of the contract;
    /// value 5 (formerly SHADOWING) is reserved and rejected everywhere.
    pub enum SeedStage {
        /// Not yet known.
        Unknown = 0 => "UNKNOWN",
        /// Slot holds no live seed module.
        Dormant = 1 => "DORMANT",
        /// Seed module built and validated (G0 passed).
        Germinated = 2 => "GERMINATED",
        /// Seed trains in isolation (incubator at alpha 0).
        Training = 3 => "TRAINING",
        /// Seed output is blended in by the alpha schedule.
        Blending = 4 => "BLENDING",
        /// Seed held at full amplitude, awaiting a fossilize decision.
        Holding = 6 => "HOLDING",
        /// Seed permanently part of the host (terminal).
        Fossilized = 7 => "FOSSILIZED",
        /// Seed removed; slot in cooldown.
        Pruned = 8 => "PRUNED",
        /// Slot embargoed after a prune.
        Embargoed = 9 => "EMBARGOED",
        /// Slot being cleared for reuse.
        Resetting = 10 => "RESETTING",
    }
}

/// The reserved stage value (formerly SHADOWING); never valid.
pub const RESERVED_STAGE_VALUE: i32 = 5;

/// Version of the stage encoding (values and one-hot layout).
pub const STAGE_SCHEMA_VERSION: u32 = 1;

/// Number of entries in the stage one-hot (10 contiguous indices).
pub const NUM_STAGES: usize = 10;

/// Legal transitions: for each stage, the stages it may move to, in order of
/// preference (an "advance" without explicit target takes the first).
pub const VALID_TRANSITIONS: &[(SeedStage, &[SeedStage])] = &[
    (SeedStage::Unknown, &[SeedStage::Dormant]),
    (SeedStage::Dormant, &[SeedStage::Germinated]),
    (
        SeedStage::Germinated,
        &[SeedStage::Training, SeedStage::Pruned],
    ),
    (
        SeedStage::Training,
        &[SeedStage::Blending, SeedStage::Pruned],
    ),
    (
        SeedStage::Blending,
        &[SeedStage::Holding, SeedStage::Pruned],
    ),
    (
        SeedStage::Holding,
        &[
            SeedStage::Fossilized,
            SeedStage::Blending,
            SeedStage::Pruned,
        ],
    ),
    (SeedStage::Fossilized, &[]),
    (SeedStage::Pruned, &[SeedStage::Embargoed]),
    (SeedStage::Embargoed, &[SeedStage::Resetting]),
    (SeedStage::Resetting, &[SeedStage::Dormant]),
];

impl SeedStage {
    /// The stages this one may move to, in order of preference.
    pub fn successors(self) -> &'static [SeedStage] {
        VALID_TRANSITIONS
            .iter()
            .find(|(from, _)| *from == self)
            .map(|(_, to)| *to)
            .unwrap_or(&[])
    }

    /// Whether the table allows `self -> to`.
    pub fn can_transition_to(self, to: SeedStage) -> bool {
        self.successors().contains(&to)
    }

    /// The default "advance" target (first listed successor that is not a
    /// failure stage), if any.
    pub fn advance_target(self) -> Option<SeedStage> {
        self.successors()
            .iter()
            .copied()
            .find(|stage| !stage.is_failure())
    }

    /// On the forward path: TRAINING, BLENDING, HOLDING, FOSSILIZED.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            SeedStage::Training | SeedStage::Blending | SeedStage::Holding | SeedStage::Fossilized
        )
    }

    /// FOSSILIZED only.
    pub fn is_terminal(self) -> bool {
        self == SeedStage::Fossilized
    }

    /// PRUNED, EMBARGOED, RESETTING.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            SeedStage::Pruned | SeedStage::Embargoed | SeedStage::Resetting
        )
    }

    /// Index into the 10-wide stage one-hot (values above 5 shift down by one).
    pub fn one_hot_index(self) -> usize {
        match self {
            SeedStage::Unknown => 0,
            SeedStage::Dormant => 1,
            SeedStage::Germinated => 2,
            SeedStage::Training => 3,
            SeedStage::Blending => 4,
            SeedStage::Holding => 5,
            SeedStage::Fossilized => 6,
            SeedStage::Pruned => 7,
            SeedStage::Embargoed => 8,
            SeedStage::Resetting => 9,
        }
    }
}

/// Checks a lifecycle move against [`VALID_TRANSITIONS`].
pub fn validate_transition(from: SeedStage, to: SeedStage) -> Result<()> {
    if from.can_transition_to(to) {
        Ok(())
    } else {
        Err(Error::IllegalTransition { from, to })
    }
}

/// Checks a lifecycle move given as raw contract integers (rejects value 5 and
/// unknown values before consulting the table).
pub fn validate_transition_values(from: i32, to: i32) -> Result<(SeedStage, SeedStage)> {
    let from = SeedStage::from_value(from)?;
    let to = SeedStage::from_value(to)?;
    validate_transition(from, to)?;
    Ok((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_value_is_rejected() {
        assert!(SeedStage::from_value(RESERVED_STAGE_VALUE).is_err());
        assert!(SeedStage::from_name("SHADOWING").is_err());
    }

    #[test]
    fn holding_advances_to_fossilized_first() {
        assert_eq!(
            SeedStage::Holding.advance_target(),
            Some(SeedStage::Fossilized)
        );
        assert_eq!(SeedStage::Fossilized.advance_target(), None);
    }

    #[test]
    fn named_illegal_moves_are_refused() {
        assert!(!SeedStage::Training.can_transition_to(SeedStage::Fossilized));
        assert!(!SeedStage::Germinated.can_transition_to(SeedStage::Blending));
        for &to in SeedStage::ALL {
            assert!(validate_transition(SeedStage::Fossilized, to).is_err());
        }
    }

    #[test]
    fn one_hot_is_contiguous() {
        let indices: Vec<usize> = SeedStage::ALL.iter().map(|s| s.one_hot_index()).collect();
        assert_eq!(indices, (0..NUM_STAGES).collect::<Vec<_>>());
    }
}
