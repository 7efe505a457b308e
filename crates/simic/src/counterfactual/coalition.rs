//! [`Coalition`]: a set of players (active seeds), and [`CoalitionValues`]:
//! the measured value (validation accuracy, percent) of some coalitions.
//!
//! Players are numbered `0..n` in the order of
//! [`Players`](super::configs::Players) (the model's slot execution order);
//! a coalition is a bit set over them, so a game has at most
//! [`MAX_PLAYERS`] players. A coalition's value is the accuracy of the
//! model with exactly its members' seeds on and every other player's seed
//! off (alpha 0).

use std::collections::BTreeMap;

use leyline::codec::MAX_ACCURACY_PERCENT;

use crate::{Error, Result};

/// Most players a game can have (one bit each in a [`Coalition`]).
pub const MAX_PLAYERS: usize = 64;

/// A set of players, as a bit set (bit `i` = player `i` is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Coalition(u64);

impl Coalition {
    /// The empty coalition (every seed off).
    pub const EMPTY: Coalition = Coalition(0);

    /// The coalition of the bits of `bits`.
    pub fn from_bits(bits: u64) -> Coalition {
        Coalition(bits)
    }

    /// The bits (bit `i` = player `i`).
    pub fn bits(self) -> u64 {
        self.0
    }

    /// Every one of `players` players (`players` is capped at
    /// [`MAX_PLAYERS`]).
    pub fn full(players: usize) -> Coalition {
        // `checked_shl` is `None` from 64 players on: every bit.
        let bits = u32::try_from(players)
            .ok()
            .and_then(|shift| 1u64.checked_shl(shift))
            .map_or(u64::MAX, |bit| bit.wrapping_sub(1));
        Coalition(bits)
    }

    /// The coalition of `members` (indices at or above [`MAX_PLAYERS`] are
    /// ignored).
    pub fn of(members: &[usize]) -> Coalition {
        members.iter().fold(Coalition::EMPTY, |coalition, &player| {
            coalition.with(player)
        })
    }

    /// The bit of player `player`, 0 when out of range.
    fn bit(player: usize) -> u64 {
        u32::try_from(player)
            .ok()
            .and_then(|shift| 1u64.checked_shl(shift))
            .unwrap_or(0)
    }

    /// Whether `player` is a member.
    pub fn contains(self, player: usize) -> bool {
        self.0 & Coalition::bit(player) != 0
    }

    /// This coalition plus `player`.
    pub fn with(self, player: usize) -> Coalition {
        Coalition(self.0 | Coalition::bit(player))
    }

    /// This coalition without `player`.
    pub fn without(self, player: usize) -> Coalition {
        Coalition(self.0 & !Coalition::bit(player))
    }

    /// Number of members.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the coalition has no member.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The members in ascending order.
    pub fn members(self) -> Vec<usize> {
        (0..MAX_PLAYERS)
            .filter(|&player| self.contains(player))
            .collect()
    }

    /// Whether every member is below `players`.
    pub fn fits(self, players: usize) -> bool {
        self.0 & !Coalition::full(players).0 == 0
    }
}

impl std::fmt::Display for Coalition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let members: Vec<String> = self.members().iter().map(usize::to_string).collect();
        write!(f, "{{{}}}", members.join(","))
    }
}

/// Whether `value` is an accuracy in percent: finite, in `[0, 100]`.
pub(crate) fn accuracy_in_range(value: f64) -> bool {
    value.is_finite() && (0.0..=MAX_ACCURACY_PERCENT).contains(&value)
}

/// The measured values of some coalitions of an `n`-player game.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CoalitionValues {
    players: usize,
    values: BTreeMap<Coalition, f64>,
}

impl CoalitionValues {
    /// No value yet, for a game of `players` players (at most
    /// [`MAX_PLAYERS`]).
    pub fn new(players: usize) -> Result<CoalitionValues> {
        if players > MAX_PLAYERS {
            return Err(Error::InvalidInput {
                field: "CoalitionValues.players",
                reason: format!("{players} players; at most {MAX_PLAYERS}"),
            });
        }
        Ok(CoalitionValues {
            players,
            values: BTreeMap::new(),
        })
    }

    /// The values `value(c)` of every coalition in `coalitions`.
    pub fn from_fn(
        players: usize,
        coalitions: impl IntoIterator<Item = Coalition>,
        mut value: impl FnMut(Coalition) -> f64,
    ) -> Result<CoalitionValues> {
        let mut values = CoalitionValues::new(players)?;
        for coalition in coalitions {
            values.insert(coalition, value(coalition))?;
        }
        Ok(values)
    }

    /// Records `value` for `coalition` (whose members must be players of
    /// this game), replacing an earlier one. A value is an accuracy in
    /// percent: finite and in `[0, 100]` (leyline's
    /// `MAX_ACCURACY_PERCENT`), which also keeps every difference the
    /// estimators take finite. A refused value changes nothing.
    pub fn insert(&mut self, coalition: Coalition, value: f64) -> Result<()> {
        if !coalition.fits(self.players) {
            return Err(Error::InvalidInput {
                field: "CoalitionValues.coalition",
                reason: format!("{coalition} has members outside 0..{}", self.players),
            });
        }
        if !accuracy_in_range(value) {
            return Err(Error::InvalidInput {
                field: "CoalitionValues.value",
                reason: format!(
                    "{value} for {coalition} is not a finite accuracy in [0, {MAX_ACCURACY_PERCENT}]"
                ),
            });
        }
        self.values.insert(coalition, value);
        Ok(())
    }

    /// Number of players.
    pub fn players(&self) -> usize {
        self.players
    }

    /// The value of `coalition`, if measured.
    pub fn get(&self, coalition: Coalition) -> Option<f64> {
        self.values.get(&coalition).copied()
    }

    /// Every measured `(coalition, value)`, coalitions in ascending bit
    /// order.
    pub fn iter(&self) -> impl Iterator<Item = (Coalition, f64)> + '_ {
        self.values
            .iter()
            .map(|(coalition, value)| (*coalition, *value))
    }

    /// Number of measured coalitions.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no coalition is measured.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}
