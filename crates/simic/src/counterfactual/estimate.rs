//! Estimators over the measured accuracies (reference §4.4 and §4.5), in
//! accuracy points:
//!
//! - [`marginals`]: per player, the mean value of the measured coalitions
//!   with it on minus the mean of those with it off;
//! - [`interactions`]: `I_ij = v({i,j}) − v({i}) − v({j}) + v(∅)` for every
//!   pair, only for games of at most [`MAX_INTERACTION_PLAYERS`] players;
//! - [`RewardInputs`]: the contribution reward's inputs, `c` per player =
//!   `val_acc − acc(that seed off)` and the clean total
//!   `T = val_acc − acc(all off)`, where a missing all-off measurement is
//!   replaced by the lowest solo-off accuracy;
//! - [`CounterfactualReport`]: all of them (and Shapley values when a plan
//!   was measured) from one fused pass over a [`ConfigSet`].

use kasmina::host::SlotId;

use super::coalition::{Coalition, CoalitionValues};
use super::configs::{ConfigLabel, ConfigSet};
use super::shapley::{ShapleyPlan, ShapleyValue};
use crate::{Error, Result};

/// Largest game whose pairwise interactions are computed (reference: 3).
pub const MAX_INTERACTION_PLAYERS: usize = 3;

/// Per player, mean value with the player on minus mean value with it off,
/// over every measured coalition; `None` where either side has no
/// measurement.
pub fn marginals(values: &CoalitionValues) -> Vec<Option<f64>> {
    (0..values.players())
        .map(|player| {
            let (mut on, mut on_count, mut off, mut off_count) = (0.0, 0usize, 0.0, 0usize);
            for (coalition, value) in values.iter() {
                if coalition.contains(player) {
                    on += value;
                    on_count = on_count.saturating_add(1);
                } else {
                    off += value;
                    off_count = off_count.saturating_add(1);
                }
            }
            (on_count > 0 && off_count > 0).then(|| on / on_count as f64 - off / off_count as f64)
        })
        .collect()
}

/// The interaction of two players.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interaction {
    /// The first player (the lower index).
    pub first: usize,
    /// The second player.
    pub second: usize,
    /// `v({i,j}) − v({i}) − v({j}) + v(∅)`.
    pub value: f64,
}

/// Every pair's interaction (pairs in ascending order) when the game has at
/// most [`MAX_INTERACTION_PLAYERS`] players, nothing otherwise; a pair
/// whose four coalitions are not all measured is left out.
pub fn interactions(values: &CoalitionValues) -> Vec<Interaction> {
    let n = values.players();
    if n > MAX_INTERACTION_PLAYERS {
        return Vec::new();
    }
    let mut pairs = Vec::new();
    for first in 0..n {
        for second in first.saturating_add(1)..n {
            let solo_first = Coalition::EMPTY.with(first);
            let solo_second = Coalition::EMPTY.with(second);
            let measured = (
                values.get(solo_first.with(second)),
                values.get(solo_first),
                values.get(solo_second),
                values.get(Coalition::EMPTY),
            );
            if let (Some(both), Some(i), Some(j), Some(none)) = measured {
                pairs.push(Interaction {
                    first,
                    second,
                    value: both - i - j + none,
                });
            }
        }
    }
    pairs
}

/// What the contribution reward reads (reference §4.4), in accuracy points.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardInputs {
    /// The model's validation accuracy (the main configuration).
    pub val_accuracy: f64,
    /// Per player, `val_acc − acc(that seed off)`; `None` where not
    /// measured.
    pub contributions: Vec<Option<f64>>,
    /// `val_acc − acc(all off)`, or `val_acc − min(solo-off accuracies)`
    /// when all-off was not measured; `None` without players or without
    /// either measurement.
    pub total: Option<f64>,
}

impl RewardInputs {
    /// The inputs from the validation accuracy and the measured coalitions
    /// of a game whose main configuration is the all-on coalition (solo-off
    /// of player `i` = every player but `i`).
    pub fn new(val_accuracy: f64, values: &CoalitionValues) -> Result<RewardInputs> {
        let full = Coalition::full(values.players());
        let solo_off = (0..values.players())
            .map(|player| values.get(full.without(player)))
            .collect();
        RewardInputs::from_accuracies(val_accuracy, solo_off, values.get(Coalition::EMPTY))
    }

    /// The inputs from the validation accuracy, each player's solo-off
    /// accuracy (`None` where not measured) and the all-off accuracy; every
    /// accuracy must be finite and in `[0, 100]` percent.
    pub fn from_accuracies(
        val_accuracy: f64,
        solo_off: Vec<Option<f64>>,
        all_off: Option<f64>,
    ) -> Result<RewardInputs> {
        let measured = std::iter::once(Some(val_accuracy))
            .chain(solo_off.iter().copied())
            .chain(std::iter::once(all_off));
        if let Some(bad) = measured
            .flatten()
            .find(|value| !super::coalition::accuracy_in_range(*value))
        {
            return Err(Error::InvalidInput {
                field: "RewardInputs",
                reason: format!("accuracy {bad} is not a finite accuracy in [0, 100]"),
            });
        }
        let contributions = solo_off
            .iter()
            .map(|off| off.map(|accuracy| val_accuracy - accuracy))
            .collect();
        let baseline = all_off.or_else(|| solo_off.iter().flatten().copied().reduce(f64::min));
        let total = if solo_off.is_empty() {
            None
        } else {
            baseline.map(|accuracy| val_accuracy - accuracy)
        };
        Ok(RewardInputs {
            val_accuracy,
            contributions,
            total,
        })
    }
}

/// Everything the counterfactual pass measured, per player.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterfactualReport {
    /// The players' slots (player `i` is `slots[i]`).
    pub slots: Vec<SlotId>,
    /// The reward's inputs.
    pub reward: RewardInputs,
    /// [`marginals`] over every measured coalition.
    pub marginals: Vec<Option<f64>>,
    /// [`interactions`] (at most [`MAX_INTERACTION_PLAYERS`] players).
    pub interactions: Vec<Interaction>,
    /// Shapley values, when a plan was measured.
    pub shapley: Option<Vec<ShapleyValue>>,
}

impl CounterfactualReport {
    /// The report from one accuracy per configuration of `set` (the fused
    /// pass's order); `set` must hold [`ConfigLabel::Main`], and `shapley`
    /// must be a plan added to `set`.
    pub fn new(
        set: &ConfigSet,
        accuracies: &[f64],
        shapley: Option<&ShapleyPlan>,
    ) -> Result<CounterfactualReport> {
        set.check_accuracies(accuracies)?;
        let main = set
            .index_of(ConfigLabel::Main)
            .and_then(|index| accuracies.get(index).copied())
            .ok_or_else(|| Error::InvalidInput {
                field: "CounterfactualReport.set",
                reason: "the configuration set has no main configuration".to_owned(),
            })?;
        let values = set.coalition_values(accuracies)?;
        let solo_off = set
            .players()
            .slot_ids()
            .into_iter()
            .map(|slot| {
                set.index_of(ConfigLabel::SoloOff(slot))
                    .and_then(|index| accuracies.get(index).copied())
            })
            .collect();
        let shapley = shapley.map(|plan| plan.estimate(&values)).transpose()?;
        Ok(CounterfactualReport {
            slots: set.players().slot_ids(),
            reward: RewardInputs::from_accuracies(main, solo_off, values.get(Coalition::EMPTY))?,
            marginals: marginals(&values),
            interactions: interactions(&values),
            shapley,
        })
    }

    /// The contribution `c` of the seed in `slot`, if it plays and was
    /// measured.
    pub fn contribution(&self, slot: SlotId) -> Option<f64> {
        self.slots
            .iter()
            .position(|candidate| *candidate == slot)
            .and_then(|player| self.reward.contributions.get(player).copied().flatten())
    }
}
