//! [`HeuristicController`]: the reference's `HeuristicTamiyo` (reference
//! §3.5), with its `SignalTracker` (plateau and stabilisation).
//!
//! Asked by the general trainer through [`tolaria::controller::DecisionDeadline`]. Every constant below
//! is the reference's value, cited in its doc.
//!
//! Every number of an observation is checked before anything changes
//! ([`HeuristicController::decide_checked`]): a NaN or infinite loss,
//! accuracy or seed contribution is refused with a typed error naming the
//! field and leaves the controller exactly as it was, so a HOLDING seed is
//! never pruned or fossilized on a non-finite contribution (the reference's
//! comparisons would read NaN as "not above the threshold" and prune).
//!
//! Two reading choices, stated because the reference leaves them open:
//! - With several live seeds, they are considered in slot execution order
//!   and the first non-WAIT decision wins (WAIT if none).
//! - The ransomware check needs a seed's total improvement, which Kasmina's
//!   `SeedState` does not carry: it is the seed's validation accuracy minus
//!   the seed's validation accuracy when this controller first saw that
//!   seed id (at its germination when the controller runs every epoch).

use std::collections::BTreeMap;

use leyline::proto::{SeedState, TelemetryPacket};
use leyline::{AlphaMode, BlueprintAction, SeedStage, Telemetry, TelemetryLevel, event};
use serde::{Deserialize, Serialize};

use leyline::codec::MAX_ACCURACY_PERCENT;
use tolaria::Result;
use tolaria::controller::{Controller, Decision, EpochObservation, seed_stage};

use crate::error::{finite, in_range};

/// Epochs after a prune during which no germination happens
/// (`DEFAULT_EMBARGO_EPOCHS_AFTER_PRUNE` = 5, reference §1.4 / §3.5).
pub const EMBARGO_EPOCHS_AFTER_PRUNE: u32 = 5;
/// No germination before this epoch (`min_epochs_before_germinate` = 5).
pub const MIN_EPOCHS_BEFORE_GERMINATE: u32 = 5;
/// Plateau epochs needed to germinate (reference §3.5: `plateau_epochs ≥ 3`).
pub const PLATEAU_EPOCHS_TO_GERMINATE: u32 = 3;
/// Germination confidence is `min(1, plateau / 5)` (reference §3.5).
pub const PLATEAU_CONFIDENCE_EPOCHS: f64 = 5.0;
/// The germination blueprint rotation (reference §3.5).
pub const BLUEPRINT_ROTATION: [BlueprintAction; 5] = [
    BlueprintAction::ConvLight,
    BlueprintAction::ConvHeavy,
    BlueprintAction::Attention,
    BlueprintAction::Norm,
    BlueprintAction::Depthwise,
];
/// The rotation on a transformer host: the reference rotation's blueprints
/// that exist there (the convolutions do not), in its order.
pub const TRANSFORMER_ROTATION: [BlueprintAction; 2] =
    [BlueprintAction::Attention, BlueprintAction::Norm];

/// The rotation on a host of `topology`: [`BLUEPRINT_ROTATION`] on a CNN,
/// [`TRANSFORMER_ROTATION`] on a transformer.
pub fn rotation_for(topology: kasmina::host::Topology) -> &'static [BlueprintAction] {
    match topology {
        kasmina::host::Topology::Cnn => &BLUEPRINT_ROTATION,
        kasmina::host::Topology::Transformer => &TRANSFORMER_ROTATION,
    }
}
/// A blueprint with a penalty at or above this is skipped (3.0).
pub const BLUEPRINT_PENALTY_THRESHOLD: f64 = 3.0;
/// Penalty added to a blueprint each time one of its seeds is pruned (2.0).
pub const PRUNE_PENALTY: f64 = 2.0;
/// Penalties are multiplied by this once per epoch (0.5).
pub const PENALTY_DECAY: f64 = 0.5;
/// Penalties below this are deleted (0.1).
pub const PENALTY_FLOOR: f64 = 0.1;
/// TRAINING/BLENDING seeds are pruned only after this many epochs in the
/// stage (5).
pub const PRUNE_MIN_EPOCHS_IN_STAGE: u32 = 5;
/// ... and when their stage improvement is below this (−2.0 percentage
/// points).
pub const PRUNE_IMPROVEMENT_THRESHOLD: f64 = -2.0;
/// Ransomware check: a HOLDING seed with contribution above this (0.1) and a
/// negative total improvement is pruned.
pub const RANSOMWARE_CONTRIBUTION: f64 = 0.1;
/// A HOLDING seed is fossilized when its contribution exceeds this
/// (`DEFAULT_MIN_IMPROVEMENT_TO_FOSSILIZE` = 0.5), pruned otherwise.
pub const FOSSILIZE_CONTRIBUTION: f64 = 0.5;
/// An epoch whose validation accuracy improved by less than this (0.5
/// percentage points, `plateau_threshold_pct`) is a plateau epoch.
pub const PLATEAU_THRESHOLD_PCT: f64 = 0.5;
/// Consecutive stable epochs that latch stabilisation (3).
pub const STABILIZATION_EPOCHS: u32 = 3;
/// A stable epoch's relative loss improvement lies in
/// (`STABILIZATION_LOWER`, `STABILIZATION_UPPER`) = (−0.05, 0.03).
pub const STABILIZATION_LOWER: f64 = -0.05;
/// See [`STABILIZATION_LOWER`].
pub const STABILIZATION_UPPER: f64 = 0.03;

/// `index` modulo `count` (0 for a zero count).
fn wrap(index: usize, count: usize) -> usize {
    index.checked_rem(count).unwrap_or(0)
}

/// The reference's `SignalTracker`: plateau count and the stabilisation
/// latch, fed once per epoch with the validation loss and accuracy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignalTracker {
    previous: Option<(f64, f64)>,
    plateau_epochs: u32,
    stable_epochs: u32,
    stabilized: bool,
}

impl SignalTracker {
    /// Feeds one epoch's validation loss and accuracy (percent). A NaN or
    /// infinite loss or accuracy is [`crate::Error::NonFinite`], an accuracy
    /// outside `[0, 100]` [`crate::Error::InvalidInput`]; either leaves the
    /// tracker unchanged.
    pub fn update(&mut self, val_loss: f64, val_accuracy: f64) -> crate::Result<()> {
        finite("tracker.val_loss", val_loss)?;
        in_range(
            "tracker.val_accuracy",
            val_accuracy,
            0.0,
            MAX_ACCURACY_PERCENT,
        )?;
        self.record(val_loss, val_accuracy);
        Ok(())
    }

    /// [`SignalTracker::update`] with values already checked.
    fn record(&mut self, val_loss: f64, val_accuracy: f64) {
        if let Some((previous_loss, previous_accuracy)) = self.previous {
            if val_accuracy - previous_accuracy < PLATEAU_THRESHOLD_PCT {
                self.plateau_epochs = self.plateau_epochs.saturating_add(1);
            } else {
                self.plateau_epochs = 0;
            }
            if !self.stabilized {
                let stable = previous_loss > 0.0 && {
                    let relative = (previous_loss - val_loss) / previous_loss;
                    relative > STABILIZATION_LOWER && relative < STABILIZATION_UPPER
                };
                self.stable_epochs = if stable {
                    self.stable_epochs.saturating_add(1)
                } else {
                    0
                };
                if self.stable_epochs >= STABILIZATION_EPOCHS {
                    self.stabilized = true;
                }
            }
        }
        self.previous = Some((val_loss, val_accuracy));
    }

    /// Consecutive plateau epochs.
    pub fn plateau_epochs(&self) -> u32 {
        self.plateau_epochs
    }

    /// Whether the host has stabilised (a one-way latch).
    pub fn is_stabilized(&self) -> bool {
        self.stabilized
    }
}

/// The reference's heuristic policy (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct HeuristicController {
    tracker: SignalTracker,
    penalties: BTreeMap<BlueprintAction, f64>,
    rotation: usize,
    /// The blueprints rotated over; empty: [`BLUEPRINT_ROTATION`].
    blueprints: Vec<BlueprintAction>,
    last_prune_epoch: Option<u32>,
    last_epoch: Option<u32>,
    baselines: BTreeMap<String, f64>,
    telemetry: Telemetry,
}

impl HeuristicController {
    /// A fresh controller (no history, no penalties).
    pub fn new() -> HeuristicController {
        HeuristicController::default()
    }

    /// The same controller germinating from `blueprints` instead of
    /// [`BLUEPRINT_ROTATION`] ([`TRANSFORMER_ROTATION`] on a transformer
    /// host, where the convolutions do not exist); an empty list keeps the
    /// reference rotation.
    pub fn with_rotation(mut self, blueprints: &[BlueprintAction]) -> HeuristicController {
        self.blueprints = blueprints.to_vec();
        self
    }

    fn rotation_set(&self) -> &[BlueprintAction] {
        if self.blueprints.is_empty() {
            &BLUEPRINT_ROTATION
        } else {
            &self.blueprints
        }
    }

    /// The same controller reporting through `telemetry`: a
    /// `tamiyo.initiated` event when its tracker sees the host stabilise
    /// (once; a controller restored already stabilised does not repeat
    /// it).
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> HeuristicController {
        self.telemetry = telemetry;
        self
    }

    /// The signal tracker.
    pub fn tracker(&self) -> &SignalTracker {
        &self.tracker
    }

    /// The current penalty of `blueprint` (0 when none).
    pub fn penalty(&self, blueprint: BlueprintAction) -> f64 {
        self.penalties.get(&blueprint).copied().unwrap_or(0.0)
    }

    /// The next blueprint of the rotation: round-robin over
    /// [`BLUEPRINT_ROTATION`] skipping penalties ≥
    /// [`BLUEPRINT_PENALTY_THRESHOLD`]; when all are penalised, the rotation
    /// runs over them sorted by penalty (lowest first).
    pub fn next_blueprint(&mut self) -> BlueprintAction {
        let rotation = self.rotation_set().to_vec();
        let count = rotation.len();
        for offset in 0..count {
            let index = wrap(self.rotation.wrapping_add(offset), count);
            let Some(&candidate) = rotation.get(index) else {
                continue;
            };
            if self.penalty(candidate) < BLUEPRINT_PENALTY_THRESHOLD {
                self.rotation = wrap(index.wrapping_add(1), count);
                return candidate;
            }
        }
        let mut sorted = rotation;
        sorted.sort_by(|a, b| self.penalty(*a).total_cmp(&self.penalty(*b)));
        let index = wrap(self.rotation, count);
        self.rotation = wrap(index.wrapping_add(1), count);
        sorted.get(index).copied().unwrap_or(BlueprintAction::Norm)
    }

    fn decay_penalties(&mut self) {
        for penalty in self.penalties.values_mut() {
            *penalty *= PENALTY_DECAY;
        }
        self.penalties
            .retain(|_, penalty| *penalty >= PENALTY_FLOOR);
    }

    fn record_prune(&mut self, seed: &SeedState, epoch: u32) {
        self.last_prune_epoch = Some(epoch);
        if let Ok(blueprint) = BlueprintAction::from_name(&seed.blueprint_id.to_uppercase()) {
            let penalty = self.penalties.entry(blueprint).or_insert(0.0);
            *penalty += PRUNE_PENALTY;
        }
    }

    fn decide_seed(
        &self,
        seed: &SeedState,
        stage: SeedStage,
        slot: kasmina::host::SlotId,
    ) -> Decision {
        let Some(metrics) = seed.metrics.as_ref() else {
            return Decision::wait().because("no_metrics", 1.0);
        };
        let failing = metrics.epochs_in_stage >= PRUNE_MIN_EPOCHS_IN_STAGE
            && metrics.improvement_since_stage_start < PRUNE_IMPROVEMENT_THRESHOLD;
        match stage {
            SeedStage::Germinated => Decision::advance(slot).because("germinated", 1.0),
            SeedStage::Training if failing => {
                Decision::prune(slot).because("failing_training", 1.0)
            }
            SeedStage::Training => Decision::advance(slot).because("training", 1.0),
            SeedStage::Blending if failing => {
                Decision::prune(slot).because("failing_blending", 1.0)
            }
            SeedStage::Blending => {
                let held = seed.alpha_target >= 1.0
                    && seed.alpha_mode == AlphaMode::Hold.value()
                    && seed.alpha == seed.alpha_target;
                if held {
                    Decision::advance(slot).because("blend_complete", 1.0)
                } else {
                    Decision::wait().because("blending", 1.0)
                }
            }
            SeedStage::Holding => {
                let total_improvement = self
                    .baselines
                    .get(&seed.seed_id)
                    .map_or(0.0, |baseline| metrics.val_accuracy - baseline);
                match metrics.counterfactual_contribution {
                    Some(contribution)
                        if contribution > RANSOMWARE_CONTRIBUTION && total_improvement < 0.0 =>
                    {
                        Decision::prune(slot).because("ransomware", 1.0)
                    }
                    None => Decision::wait().because("no_counterfactual", 1.0),
                    Some(contribution) if contribution > FOSSILIZE_CONTRIBUTION => {
                        Decision::fossilize(slot).because("contributes", 1.0)
                    }
                    Some(_) => Decision::prune(slot).because("no_contribution", 1.0),
                }
            }
            _ => Decision::wait(),
        }
    }

    fn decide_germination(&mut self, observation: &EpochObservation) -> Decision {
        let epoch = observation.epoch;
        if let Some(pruned) = self.last_prune_epoch
            && epoch.saturating_sub(pruned) < EMBARGO_EPOCHS_AFTER_PRUNE
        {
            return Decision::wait().because("embargo", 1.0);
        }
        if !self.tracker.is_stabilized() {
            return Decision::wait().because("not_stabilized", 1.0);
        }
        if epoch < MIN_EPOCHS_BEFORE_GERMINATE {
            return Decision::wait().because("too_early", 1.0);
        }
        let Some(&slot) = observation.available_slots().first() else {
            return Decision::wait().because("no_slot", 1.0);
        };
        let plateau = self.tracker.plateau_epochs();
        if plateau < PLATEAU_EPOCHS_TO_GERMINATE {
            return Decision::wait().because("no_plateau", 1.0);
        }
        let confidence = (f64::from(plateau) / PLATEAU_CONFIDENCE_EPOCHS).min(1.0);
        let blueprint = self.next_blueprint();
        Decision::germinate(slot, blueprint).because("plateau", confidence)
    }
}

/// Everything a [`HeuristicController`] remembers between epochs, in plain
/// values for a checkpoint (serde): the signal tracker, the blueprint
/// penalties (by leyline's blueprint name), the rotation position, the last
/// prune (the germination embargo), the last epoch seen and the seeds'
/// baseline accuracies. [`HeuristicController::from_state`] of
/// [`HeuristicController::export_state`] decides exactly as the original.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeuristicState {
    /// The tracker's previous (validation loss, validation accuracy).
    pub previous: Option<(f64, f64)>,
    /// Consecutive plateau epochs.
    pub plateau_epochs: u32,
    /// Consecutive stable epochs.
    pub stable_epochs: u32,
    /// The stabilisation latch.
    pub stabilized: bool,
    /// Blueprint penalties, keyed by leyline's blueprint name.
    pub penalties: BTreeMap<String, f64>,
    /// Position in [`BLUEPRINT_ROTATION`].
    pub rotation: usize,
    /// Epoch of the last prune (the embargo).
    pub last_prune_epoch: Option<u32>,
    /// The last epoch whose observation updated the tracker.
    pub last_epoch: Option<u32>,
    /// Validation accuracy of each seed id when first seen.
    pub baselines: BTreeMap<String, f64>,
}

impl HeuristicController {
    /// The controller's state (see [`HeuristicState`]).
    pub fn export_state(&self) -> HeuristicState {
        HeuristicState {
            previous: self.tracker.previous,
            plateau_epochs: self.tracker.plateau_epochs,
            stable_epochs: self.tracker.stable_epochs,
            stabilized: self.tracker.stabilized,
            penalties: self
                .penalties
                .iter()
                .map(|(blueprint, penalty)| (blueprint.name().to_owned(), *penalty))
                .collect(),
            rotation: self.rotation,
            last_prune_epoch: self.last_prune_epoch,
            last_epoch: self.last_epoch,
            baselines: self.baselines.clone(),
        }
    }

    /// A controller in `state`. An unknown blueprint name, a negative
    /// penalty, a tracked accuracy or baseline outside `[0, 100]`, or a
    /// rotation position outside [`BLUEPRINT_ROTATION`] is
    /// [`crate::Error::InvalidInput`] naming the field; a NaN or infinite
    /// penalty, tracked figure or baseline is [`crate::Error::NonFinite`].
    pub fn from_state(state: &HeuristicState) -> crate::Result<HeuristicController> {
        let invalid =
            |field: &'static str, reason: String| crate::Error::InvalidInput { field, reason };
        if let Some((loss, accuracy)) = state.previous {
            finite("heuristic_state.previous", loss)?;
            in_range(
                "heuristic_state.previous",
                accuracy,
                0.0,
                MAX_ACCURACY_PERCENT,
            )?;
        }
        if state.rotation >= BLUEPRINT_ROTATION.len() {
            return Err(invalid(
                "heuristic_state.rotation",
                format!(
                    "{} is outside 0..{}",
                    state.rotation,
                    BLUEPRINT_ROTATION.len()
                ),
            ));
        }
        let mut penalties = BTreeMap::new();
        for (name, penalty) in &state.penalties {
            let blueprint = BlueprintAction::from_name(name).map_err(|error| {
                invalid("heuristic_state.penalties", format!("{name:?}: {error}"))
            })?;
            in_range("heuristic_state.penalties", *penalty, 0.0, f64::MAX)?;
            penalties.insert(blueprint, *penalty);
        }
        for baseline in state.baselines.values() {
            in_range(
                "heuristic_state.baselines",
                *baseline,
                0.0,
                MAX_ACCURACY_PERCENT,
            )?;
        }
        Ok(HeuristicController {
            tracker: SignalTracker {
                previous: state.previous,
                plateau_epochs: state.plateau_epochs,
                stable_epochs: state.stable_epochs,
                stabilized: state.stabilized,
            },
            penalties,
            rotation: state.rotation,
            // Follows the host, not the history: set it with `with_rotation`.
            blueprints: Vec::new(),
            last_prune_epoch: state.last_prune_epoch,
            last_epoch: state.last_epoch,
            baselines: state.baselines.clone(),
            // Not part of the state: attach it with `with_telemetry`.
            telemetry: Telemetry::disabled(),
        })
    }
}

impl HeuristicController {
    /// [`Controller::decide`] with Tamiyo's error: the observation is
    /// checked first ([`crate::features::check_observation`]: losses,
    /// accuracies, every seed's alpha, improvement, gradient figures and
    /// contribution), and a NaN, an infinity or a value out of range is
    /// [`crate::Error::NonFinite`] or [`crate::Error::InvalidInput`]
    /// naming the field, with the controller unchanged (tracker, penalties,
    /// rotation, baselines). No decision is ever taken on a non-finite
    /// number.
    pub fn decide_checked(&mut self, observation: &EpochObservation) -> crate::Result<Decision> {
        crate::features::check_observation(observation)?;
        Ok(self.decide_valid(observation))
    }

    /// Updates the tracker and the penalties (once per new epoch), then
    /// applies reference §3.5's rules to a checked observation.
    fn decide_valid(&mut self, observation: &EpochObservation) -> Decision {
        let epoch = observation.epoch;
        if self.last_epoch.is_none_or(|last| epoch > last) {
            self.decay_penalties();
            let was_stabilized = self.tracker.is_stabilized();
            self.tracker.record(
                observation.metrics.val_loss,
                observation.metrics.val_accuracy,
            );
            self.last_epoch = Some(epoch);
            if !was_stabilized && self.tracker.is_stabilized() {
                self.telemetry.emit_packet(
                    TelemetryPacket::new(leyline::telemetry::sources::TAMIYO, TelemetryLevel::Info)
                        .with_event(event(
                            leyline::telemetry::TAMIYO_INITIATED,
                            "The host stabilised: Tamiyo initiated",
                            [
                                ("epoch", epoch.to_string()),
                                ("val_loss", observation.metrics.val_loss.to_string()),
                                ("val_accuracy", observation.metrics.val_accuracy.to_string()),
                            ],
                        )),
                );
            }
        }
        let mut live = Vec::new();
        for seed in &observation.seeds {
            let Some(stage) = seed_stage(seed) else {
                continue;
            };
            if stage.is_terminal() || stage.is_failure() {
                continue;
            }
            let seen_at = seed
                .metrics
                .as_ref()
                .map_or(observation.metrics.val_accuracy, |metrics| {
                    metrics.val_accuracy
                });
            self.baselines
                .entry(seed.seed_id.clone())
                .or_insert(seen_at);
            let Some(slot) = observation
                .slots
                .iter()
                .copied()
                .find(|slot| slot.to_string() == seed.slot_id)
            else {
                continue;
            };
            live.push((seed, stage, slot));
        }
        if live.is_empty() {
            return self.decide_germination(observation);
        }
        // The first seed's WAIT (with its reason) unless a later seed acts.
        let mut first_wait = None;
        for (seed, stage, slot) in live {
            let decision = self.decide_seed(seed, stage, slot);
            if !decision.is_wait() {
                if decision.op == leyline::LifecycleOp::Prune {
                    self.record_prune(seed, epoch);
                }
                return decision;
            }
            first_wait.get_or_insert(decision);
        }
        first_wait.unwrap_or_else(Decision::wait)
    }
}

impl Controller for HeuristicController {
    /// [`HeuristicController::decide_checked`], its error as Tolaria's
    /// [`tolaria::Error::Controller`] naming the field at fault (the
    /// deadline turns it into WAIT).
    fn decide(&mut self, observation: &EpochObservation) -> Result<Decision> {
        self.decide_checked(observation)
            .map_err(|error| tolaria::Error::Controller {
                field: error.field().unwrap_or("tamiyo.heuristic"),
                reason: error.to_string(),
            })
    }
}
