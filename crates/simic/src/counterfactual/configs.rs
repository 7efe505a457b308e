//! Alpha configurations: which seeds are switched on or off in one block of
//! the fused validation pass (reference §4.5).
//!
//! A [`SlotAlphas`] is a per-slot alpha override in the model's slot order:
//! `None` leaves the slot's own alpha, `Some(0.0)` switches the seed off,
//! `Some(a)` runs it at `a`. The *players* ([`Players`]) are the active
//! seeds: on the forward path with alpha > 0, fossils excluded unless asked
//! for (the reference includes them only with the "drip" reward). A player is
//! "on" at its current alpha ([`OnAlpha::Current`], the default) or at 1
//! ([`OnAlpha::Full`]).
//!
//! [`ConfigSet::counterfactual`] builds the per-epoch set:
//! - the main configuration (every alpha as it is);
//! - one solo-off per player (that seed off, every other alpha as it is:
//!   the reward's `c`);
//! - one solo-on per player;
//! - all-off, when 2–4 players are active;
//! - every pair, when 3–4 are active;
//! - "committed": only the fossils on (with fossils excluded from the
//!   players this is the all-off coalition).
//!
//! [`ConfigSet::add_shapley`] adds the Shapley configurations (see
//! [`super::shapley`]). Configurations are deduplicated by their effect: an
//! override equal to the slot's current alpha, or on a slot off the forward
//! path, is the same as no override, and each distinct configuration is
//! measured once however many labels point at it.

use kasmina::host::SlotId;
use kasmina::model::MorphogeneticModel;
use leyline::SeedStage;

use super::coalition::{Coalition, CoalitionValues, MAX_PLAYERS};
use super::shapley::{ShapleyConfig, ShapleyPlan};
use crate::{Error, Result};

/// Player counts for which the all-off configuration is added (2–4).
pub const ALL_OFF_PLAYERS: std::ops::RangeInclusive<usize> = 2..=4;

/// Player counts for which every pair is added (3–4).
pub const PAIR_PLAYERS: std::ops::RangeInclusive<usize> = 3..=4;

/// What the configurations need to know of one enabled slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotSnapshot {
    /// The slot.
    pub id: SlotId,
    /// Its seed's current alpha (0 for an empty slot).
    pub alpha: f64,
    /// Whether the seed is on the forward path (TRAINING to FOSSILIZED).
    pub on_path: bool,
    /// Whether the seed is FOSSILIZED.
    pub fossilized: bool,
}

impl SlotSnapshot {
    /// The snapshot of every enabled slot of `model`, execution order.
    pub fn of_model(model: &MorphogeneticModel) -> Vec<SlotSnapshot> {
        model
            .slots()
            .iter()
            .map(|slot| SlotSnapshot {
                id: slot.id(),
                alpha: slot.alpha(),
                on_path: slot.is_active(),
                fossilized: slot.stage() == Some(SeedStage::Fossilized),
            })
            .collect()
    }
}

/// The alpha a player's seed runs at when it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnAlpha {
    /// Its current alpha (the main configuration is then "all on").
    #[default]
    Current,
    /// Alpha 1.
    Full,
}

/// Who plays and how "on" is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlayerOptions {
    /// Count fossilized seeds as players (the reference does with drip).
    pub include_fossils: bool,
    /// The alpha of a seed that is on.
    pub on_alpha: OnAlpha,
}

/// The players of the attribution game: the active seeds, in slot order.
#[derive(Debug, Clone, PartialEq)]
pub struct Players {
    slots: Vec<SlotSnapshot>,
    /// Index into `slots` of each player.
    players: Vec<usize>,
    on_alpha: OnAlpha,
}

impl Players {
    /// The players among `slots` (every enabled slot, execution order): on
    /// the forward path with alpha > 0, fossils only with
    /// `options.include_fossils`. Alphas must be finite and in `[0, 1]`;
    /// at most [`MAX_PLAYERS`] players.
    pub fn new(slots: Vec<SlotSnapshot>, options: PlayerOptions) -> Result<Players> {
        for slot in &slots {
            if !(0.0..=1.0).contains(&slot.alpha) {
                return Err(Error::InvalidInput {
                    field: "SlotSnapshot.alpha",
                    reason: format!("{} for slot {} is outside [0, 1]", slot.alpha, slot.id),
                });
            }
        }
        let players: Vec<usize> = slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| {
                slot.on_path && slot.alpha > 0.0 && (options.include_fossils || !slot.fossilized)
            })
            .map(|(index, _)| index)
            .collect();
        if players.len() > MAX_PLAYERS {
            return Err(Error::InvalidInput {
                field: "Players.slots",
                reason: format!("{} active seeds; at most {MAX_PLAYERS}", players.len()),
            });
        }
        Ok(Players {
            slots,
            players,
            on_alpha: options.on_alpha,
        })
    }

    /// The players of `model` as it is now.
    pub fn from_model(model: &MorphogeneticModel, options: PlayerOptions) -> Result<Players> {
        Players::new(SlotSnapshot::of_model(model), options)
    }

    /// Number of players.
    pub fn len(&self) -> usize {
        self.players.len()
    }

    /// Whether there is no player.
    pub fn is_empty(&self) -> bool {
        self.players.is_empty()
    }

    /// Every enabled slot, execution order.
    pub fn slots(&self) -> &[SlotSnapshot] {
        &self.slots
    }

    /// The slot of each player.
    pub fn slot_ids(&self) -> Vec<SlotId> {
        self.player_slots().map(|slot| slot.id).collect()
    }

    /// The slot index (into [`Players::slots`]) of each player.
    pub fn slot_indices(&self) -> &[usize] {
        &self.players
    }

    /// The player in `slot`, if that slot's seed plays.
    pub fn player_of(&self, slot: SlotId) -> Option<usize> {
        self.player_slots().position(|snapshot| snapshot.id == slot)
    }

    fn player_slots(&self) -> impl Iterator<Item = &SlotSnapshot> + '_ {
        self.players
            .iter()
            .filter_map(|&index| self.slots.get(index))
    }

    /// Every player.
    pub fn full(&self) -> Coalition {
        Coalition::full(self.len())
    }

    /// The players that are fossilized seeds (empty unless fossils play).
    pub fn fossils(&self) -> Coalition {
        let members: Vec<usize> = self
            .player_slots()
            .enumerate()
            .filter(|(_, slot)| slot.fossilized)
            .map(|(player, _)| player)
            .collect();
        Coalition::of(&members)
    }

    /// The alphas with exactly `coalition`'s players on (members must be
    /// players).
    pub fn alphas_for(&self, coalition: Coalition) -> Result<SlotAlphas> {
        if !coalition.fits(self.len()) {
            return Err(Error::InvalidInput {
                field: "Players.coalition",
                reason: format!("{coalition} has members outside 0..{}", self.len()),
            });
        }
        let mut alphas = vec![None; self.slots.len()];
        for (player, slot) in self.player_slots().enumerate() {
            let on = match self.on_alpha {
                OnAlpha::Current => slot.alpha,
                OnAlpha::Full => 1.0,
            };
            let index = self.players.get(player).copied();
            if let Some(entry) = index.and_then(|index| alphas.get_mut(index)) {
                *entry = Some(if coalition.contains(player) { on } else { 0.0 });
            }
        }
        SlotAlphas::new(alphas)
    }

    /// `alphas` with every override that changes nothing removed: one on a
    /// slot off the forward path, or equal to the slot's current alpha.
    fn normalise(&self, alphas: &SlotAlphas) -> Result<SlotAlphas> {
        if alphas.len() != self.slots.len() {
            return Err(Error::InvalidInput {
                field: "SlotAlphas",
                reason: format!(
                    "{} entries for {} enabled slots",
                    alphas.len(),
                    self.slots.len()
                ),
            });
        }
        let values = alphas
            .as_slice()
            .iter()
            .zip(&self.slots)
            .map(|(value, slot)| match value {
                Some(alpha) if slot.on_path && *alpha != slot.alpha => Some(*alpha),
                _ => None,
            })
            .collect();
        SlotAlphas::new(values)
    }
}

/// A per-slot alpha override, in the model's slot order (see the module
/// docs). Values are finite and in `[0, 1]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlotAlphas(Vec<Option<f64>>);

impl SlotAlphas {
    /// The override `values`; each `Some` must be finite and in `[0, 1]`.
    pub fn new(values: Vec<Option<f64>>) -> Result<SlotAlphas> {
        if let Some(bad) = values
            .iter()
            .flatten()
            .find(|alpha| !(0.0..=1.0).contains(*alpha))
        {
            return Err(Error::InvalidInput {
                field: "SlotAlphas",
                reason: format!("alpha {bad} is not a finite value in [0, 1]"),
            });
        }
        Ok(SlotAlphas(values))
    }

    /// No override on any of `slots` slots (the main configuration).
    pub fn unchanged(slots: usize) -> SlotAlphas {
        SlotAlphas(vec![None; slots])
    }

    /// The overrides, slot order.
    pub fn as_slice(&self) -> &[Option<f64>] {
        &self.0
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no slot.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why a configuration is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigLabel {
    /// Every alpha as it is (the model's validation accuracy).
    Main,
    /// This seed's alpha forced to 0, every other alpha as it is (the
    /// reward's `c`).
    SoloOff(SlotId),
    /// This player on, every other player off.
    SoloOn(SlotId),
    /// Every player off.
    AllOff,
    /// These two players on, the others off.
    Pair(SlotId, SlotId),
    /// Only the fossils on.
    Committed,
    /// Every player on (a Shapley ablation).
    AllOn,
    /// A coalition of a Shapley plan (factorial or permutation prefix).
    Coalition(Coalition),
}

/// One distinct configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    /// The overrides (normalised: no override that changes nothing).
    pub alphas: SlotAlphas,
    /// The coalition of players it measures, if it is one.
    pub coalition: Option<Coalition>,
}

/// Distinct configurations with the labels that ask for them.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSet {
    players: Players,
    entries: Vec<ConfigEntry>,
    labels: Vec<(ConfigLabel, usize)>,
}

impl ConfigSet {
    /// An empty set over `players`.
    pub fn new(players: Players) -> ConfigSet {
        ConfigSet {
            players,
            entries: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// The per-epoch counterfactual set (see the module docs).
    pub fn counterfactual(players: Players) -> Result<ConfigSet> {
        let mut set = ConfigSet::new(players);
        let n = set.players.len();
        let full = set.players.full();
        let slots = set.players.slot_ids();
        // The main configuration is the all-on coalition when every player
        // is "on" at its current alpha.
        let unchanged = SlotAlphas::unchanged(set.players.slots().len());
        let full_alphas = set.players.normalise(&set.players.alphas_for(full)?)?;
        let main_is_full = full_alphas == unchanged;
        set.insert(ConfigLabel::Main, &unchanged, main_is_full.then_some(full))?;
        for (player, slot) in slots.iter().enumerate() {
            // Only this seed off; a coalition when "on" is the current alpha.
            let mut alphas = vec![None; set.players.slots().len()];
            let index = set.players.slot_indices().get(player).copied();
            if let Some(entry) = index.and_then(|index| alphas.get_mut(index)) {
                *entry = Some(0.0);
            }
            let coalition = main_is_full.then_some(full.without(player));
            set.insert(
                ConfigLabel::SoloOff(*slot),
                &SlotAlphas::new(alphas)?,
                coalition,
            )?;
        }
        for (player, slot) in slots.iter().enumerate() {
            set.insert_coalition(ConfigLabel::SoloOn(*slot), Coalition::EMPTY.with(player))?;
        }
        if ALL_OFF_PLAYERS.contains(&n) {
            set.insert_coalition(ConfigLabel::AllOff, Coalition::EMPTY)?;
        }
        if PAIR_PLAYERS.contains(&n) {
            for (i, first) in slots.iter().enumerate() {
                for (j, second) in slots.iter().enumerate().skip(i.saturating_add(1)) {
                    let pair = Coalition::EMPTY.with(i).with(j);
                    set.insert_coalition(ConfigLabel::Pair(*first, *second), pair)?;
                }
            }
        }
        let fossils = set.players.fossils();
        set.insert_coalition(ConfigLabel::Committed, fossils)?;
        Ok(set)
    }

    /// Adds the configurations of a Shapley plan for these players (see
    /// [`super::shapley`]) and returns the plan. All or nothing: the
    /// configurations are added to a copy that replaces the set only when
    /// every one was accepted.
    pub fn add_shapley(&mut self, config: &ShapleyConfig) -> Result<ShapleyPlan> {
        let plan = ShapleyPlan::new(self.players.len(), config)?;
        let mut next = self.clone();
        let full = next.players.full();
        next.insert_coalition(ConfigLabel::AllOn, full)?;
        for player in 0..next.players.len() {
            let each_off = full.without(player);
            next.insert_coalition(ConfigLabel::Coalition(each_off), each_off)?;
        }
        next.insert_coalition(ConfigLabel::AllOff, Coalition::EMPTY)?;
        for coalition in plan.coalitions() {
            next.insert_coalition(ConfigLabel::Coalition(coalition), coalition)?;
        }
        *self = next;
        Ok(plan)
    }

    /// Adds the configuration of `coalition` under `label`; returns its
    /// index.
    pub fn insert_coalition(&mut self, label: ConfigLabel, coalition: Coalition) -> Result<usize> {
        let alphas = self.players.alphas_for(coalition)?;
        self.insert(label, &alphas, Some(coalition))
    }

    /// Adds `alphas` (one entry per enabled slot) under `label`, measuring
    /// `coalition` if given; an identical configuration already in the set
    /// is reused. Returns the configuration's index.
    pub fn insert(
        &mut self,
        label: ConfigLabel,
        alphas: &SlotAlphas,
        coalition: Option<Coalition>,
    ) -> Result<usize> {
        let alphas = self.players.normalise(alphas)?;
        let index = match self.entries.iter().position(|entry| entry.alphas == alphas) {
            Some(index) => {
                if let Some(entry) = self.entries.get_mut(index)
                    && entry.coalition.is_none()
                {
                    entry.coalition = coalition;
                }
                index
            }
            None => {
                self.entries.push(ConfigEntry { alphas, coalition });
                self.entries.len().saturating_sub(1)
            }
        };
        if !self.labels.contains(&(label, index)) {
            self.labels.push((label, index));
        }
        Ok(index)
    }

    /// The players.
    pub fn players(&self) -> &Players {
        &self.players
    }

    /// The distinct configurations, in insertion order.
    pub fn entries(&self) -> &[ConfigEntry] {
        &self.entries
    }

    /// The overrides of every distinct configuration, in insertion order
    /// (what the fused pass takes).
    pub fn alphas(&self) -> Vec<SlotAlphas> {
        self.entries
            .iter()
            .map(|entry| entry.alphas.clone())
            .collect()
    }

    /// Number of distinct configurations.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no configuration.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every `(label, configuration index)`, in insertion order.
    pub fn labels(&self) -> &[(ConfigLabel, usize)] {
        &self.labels
    }

    /// The configuration asked for by `label`.
    pub fn index_of(&self, label: ConfigLabel) -> Option<usize> {
        self.labels
            .iter()
            .find(|(candidate, _)| *candidate == label)
            .map(|(_, index)| *index)
    }

    /// The value of every measured coalition, from one accuracy per
    /// configuration (as returned by the fused pass, same order).
    pub fn coalition_values(&self, accuracies: &[f64]) -> Result<CoalitionValues> {
        self.check_accuracies(accuracies)?;
        let mut values = CoalitionValues::new(self.players.len())?;
        for (entry, accuracy) in self.entries.iter().zip(accuracies) {
            if let Some(coalition) = entry.coalition {
                values.insert(coalition, *accuracy)?;
            }
        }
        Ok(values)
    }

    /// `accuracies` has one finite accuracy in `[0, 100]` per
    /// configuration.
    pub(crate) fn check_accuracies(&self, accuracies: &[f64]) -> Result<()> {
        if accuracies.len() != self.entries.len() {
            return Err(Error::InvalidInput {
                field: "ConfigSet.accuracies",
                reason: format!(
                    "{} accuracies for {} configurations",
                    accuracies.len(),
                    self.entries.len()
                ),
            });
        }
        if let Some(bad) = accuracies
            .iter()
            .find(|value| !super::coalition::accuracy_in_range(**value))
        {
            return Err(Error::InvalidInput {
                field: "ConfigSet.accuracies",
                reason: format!("{bad} is not a finite accuracy in [0, 100]"),
            });
        }
        Ok(())
    }
}
