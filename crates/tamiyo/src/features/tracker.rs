//! [`ObservationTracker`]: one environment's history, turning Tolaria's
//! [`EpochObservation`] into a [`RawObservation`] once per epoch.
//!
//! The observation needs more than one epoch's figures: the last five
//! validation losses and accuracies, the last action and whether it
//! succeeded, and per seed the contribution velocity (EMA
//! `v = 0.7 v + 0.3 Δcontribution` over measurements), the counterfactual
//! freshness (epochs since the last measurement) and the previous epoch's
//! gradient health. The tracker keeps these per slot, keyed by seed id (a new
//! seed in a slot starts a fresh record).
//!
//! Leyline's `SeedState` does not carry every per-slot input; the rest come
//! from [`SlotExtras`], which [`slot_extras`] reads from Kasmina's slots
//! (blend tempo, alpha schedule, gradient health) and a PPO trainer extends
//! (Shapley interaction sum, whether a counterfactual was measured this
//! epoch). Without extras (a controller sees only the `EpochObservation`):
//! the blend tempo is Kasmina's default, the alpha schedule counts are 0,
//! the alpha velocity is the change of alpha since the previous epoch while
//! the controller is not holding, the gradient health is unmeasured (0, and
//! the previous one unknown), the interaction sum is 0, and a counterfactual
//! counts as measured this epoch when its value is new for the seed.
//!
//! `EpochObservation::epoch` is zero-based (the epoch just finished); the
//! observation's epoch feature counts from 1 as the reference does.

use std::collections::VecDeque;

use kasmina::host::SlotId;
use kasmina::lifecycle::DEFAULT_TEMPO_EPOCHS;
use kasmina::model::MorphogeneticModel;
use leyline::proto::SeedState;
use leyline::{AlphaAlgorithm, AlphaMode, BlueprintAction, LifecycleOp, SeedStage};
use tolaria::controller::EpochObservation;

use super::{
    BaseInputs, CONTRIBUTION_VELOCITY_DECAY, HISTORY_LEN, MAX_EPOCHS, MAX_SLOTS, RawObservation,
    SlotInputs,
};
use crate::error::{finite, in_range};
use crate::{Error, Result};

/// Per-slot inputs the `SeedState` message lacks (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotExtras {
    /// Blend tempo chosen at germination, in epochs.
    pub blend_tempo_epochs: u32,
    /// Alpha at the start of the current schedule.
    pub alpha_start: f64,
    /// Alpha schedule length in ticks.
    pub alpha_steps_total: u32,
    /// Alpha schedule ticks done.
    pub alpha_steps_done: u32,
    /// Gradient health in `[0, 1]` (`None` when unmeasured).
    pub gradient_health: Option<f64>,
    /// Shapley interaction sum (0 when not estimated).
    pub interaction_sum: f64,
    /// Whether the counterfactual contribution was measured this epoch
    /// (`None`: infer it from a changed value).
    pub counterfactual_measured: Option<bool>,
}

impl SlotExtras {
    /// Checks the numbers: alpha start in `[0, 1]`, gradient health in
    /// `[0, 1]`, the interaction sum finite ([`Error::NonFinite`] or
    /// [`Error::InvalidInput`] naming the field).
    pub fn validate(&self) -> Result<()> {
        in_range("extras.alpha_start", self.alpha_start, 0.0, 1.0)?;
        if let Some(health) = self.gradient_health {
            in_range("extras.gradient_health", health, 0.0, 1.0)?;
        }
        finite("extras.interaction_sum", self.interaction_sum)?;
        Ok(())
    }

    /// The extras of a Kasmina seed state (interaction sum 0, measurement
    /// inferred).
    pub fn from_state(state: &kasmina::lifecycle::SeedState) -> SlotExtras {
        let controller = state.alpha_controller();
        SlotExtras {
            blend_tempo_epochs: state.tempo_epochs(),
            alpha_start: controller.alpha_start(),
            alpha_steps_total: controller.steps_total(),
            alpha_steps_done: controller.steps_done(),
            gradient_health: state.metrics().gradient_health,
            interaction_sum: 0.0,
            counterfactual_measured: None,
        }
    }
}

/// The extras of every enabled slot of `model`, in execution order (`None`
/// for an empty slot): the order of `EpochObservation::slots`.
pub fn slot_extras(model: &MorphogeneticModel) -> Vec<Option<SlotExtras>> {
    model
        .slots()
        .iter()
        .map(|slot| slot.state().map(SlotExtras::from_state))
        .collect()
}

/// What the tracker remembers about the seed in one slot.
#[derive(Debug, Clone, PartialEq)]
struct SlotMemory {
    seed_id: String,
    /// Contribution at the last measurement.
    last_contribution: Option<f64>,
    velocity: f64,
    epochs_since_counterfactual: Option<u32>,
    last_gradient_health: Option<f64>,
    last_alpha: f64,
}

impl SlotMemory {
    fn fresh(seed_id: &str, alpha: f64) -> SlotMemory {
        SlotMemory {
            seed_id: seed_id.to_owned(),
            last_contribution: None,
            velocity: 0.0,
            epochs_since_counterfactual: None,
            last_gradient_health: None,
            last_alpha: alpha,
        }
    }
}

/// One environment's observation history (see the module docs).
#[derive(Debug, Clone)]
pub struct ObservationTracker {
    slots: Vec<SlotId>,
    slot_names: Vec<String>,
    max_epochs: u32,
    losses: VecDeque<f64>,
    accuracies: VecDeque<f64>,
    last_op: LifecycleOp,
    last_success: bool,
    memory: Vec<Option<SlotMemory>>,
}

fn slot_list(slots: &[String]) -> String {
    slots.join(", ")
}

fn blueprint_of(seed: &SeedState) -> Result<BlueprintAction> {
    BlueprintAction::ALL
        .iter()
        .copied()
        .find(|blueprint| blueprint.blueprint_id() == seed.blueprint_id)
        .ok_or_else(|| Error::InvalidInput {
            field: "seed.blueprint_id",
            reason: format!("`{}` is not a leyline blueprint", seed.blueprint_id),
        })
}

fn padded_history(values: &VecDeque<f64>) -> [Option<f64>; HISTORY_LEN] {
    let mut out = [None; HISTORY_LEN];
    let skip = HISTORY_LEN.saturating_sub(values.len());
    let recent = values.iter().skip(values.len().saturating_sub(HISTORY_LEN));
    for (slot, value) in out.iter_mut().skip(skip).zip(recent) {
        *slot = Some(*value);
    }
    out
}

impl ObservationTracker {
    /// A tracker for an environment with `slots` (the enabled slots in
    /// execution order, as its observations list them) and episodes of
    /// `max_epochs` epochs.
    pub fn new(slots: &[SlotId], max_epochs: u32) -> Result<ObservationTracker> {
        if !(1..=MAX_SLOTS).contains(&slots.len()) {
            return Err(Error::InvalidConfig {
                field: "ObservationTracker.slots",
                reason: format!("{} slots is outside [1, {MAX_SLOTS}]", slots.len()),
            });
        }
        let slot_names: Vec<String> = slots.iter().map(SlotId::to_string).collect();
        for (index, name) in slot_names.iter().enumerate() {
            if slot_names.iter().take(index).any(|other| other == name) {
                return Err(Error::InvalidConfig {
                    field: "ObservationTracker.slots",
                    reason: format!("slot {name} is listed twice"),
                });
            }
        }
        if !(1..=MAX_EPOCHS).contains(&max_epochs) {
            return Err(Error::InvalidConfig {
                field: "ObservationTracker.max_epochs",
                reason: format!("{max_epochs} is outside [1, {MAX_EPOCHS}]"),
            });
        }
        Ok(ObservationTracker {
            slots: slots.to_vec(),
            slot_names,
            max_epochs,
            losses: VecDeque::with_capacity(HISTORY_LEN),
            accuracies: VecDeque::with_capacity(HISTORY_LEN),
            last_op: LifecycleOp::Wait,
            last_success: true,
            memory: vec![None; slots.len()],
        })
    }

    /// The slots, in observation order.
    pub fn slots(&self) -> &[SlotId] {
        &self.slots
    }

    /// The episode length observations are normalised by.
    pub fn max_epochs(&self) -> u32 {
        self.max_epochs
    }

    /// Forgets the history (a new episode): no losses, last op WAIT with
    /// success, no seed records.
    pub fn reset(&mut self) {
        self.losses.clear();
        self.accuracies.clear();
        self.last_op = LifecycleOp::Wait;
        self.last_success = true;
        self.memory.iter_mut().for_each(|memory| *memory = None);
    }

    /// Records the op taken after the last observation and whether it
    /// succeeded; the next observation shows it.
    pub fn record_action(&mut self, op: LifecycleOp, success: bool) {
        self.last_op = op;
        self.last_success = success;
    }

    /// The raw observation of `observation`, with `extras` per slot (empty
    /// for none, otherwise one entry per slot in observation order). Checks
    /// the observation's slots against the tracker's, every seed's slot,
    /// stage and blueprint, and every value (the observation's through
    /// [`super::check_observation`], the extras' and the derived inputs'
    /// through [`SlotInputs::validate`]); on an error the history is
    /// unchanged.
    pub fn observe(
        &mut self,
        observation: &EpochObservation,
        extras: &[Option<SlotExtras>],
    ) -> Result<RawObservation> {
        super::check_observation(observation)?;
        if observation.slots != self.slots {
            return Err(Error::SlotMismatch {
                expected: slot_list(&self.slot_names),
                got: observation
                    .slots
                    .iter()
                    .map(SlotId::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if !extras.is_empty() && extras.len() != self.slots.len() {
            return Err(crate::error::shape_mismatch(
                "observe.extras",
                format!("0 or {} entries", self.slots.len()),
                extras.len(),
            ));
        }
        extras.iter().flatten().try_for_each(SlotExtras::validate)?;
        let mut seeds: Vec<Option<&SeedState>> = vec![None; self.slots.len()];
        for seed in &observation.seeds {
            let index = self
                .slot_names
                .iter()
                .position(|name| *name == seed.slot_id)
                .ok_or_else(|| Error::InvalidInput {
                    field: "seed.slot_id",
                    reason: format!(
                        "seed {} is in slot `{}`, not one of [{}]",
                        seed.seed_id,
                        seed.slot_id,
                        slot_list(&self.slot_names)
                    ),
                })?;
            match seeds.get_mut(index) {
                Some(entry @ None) => *entry = Some(seed),
                _ => {
                    return Err(Error::InvalidInput {
                        field: "seed.slot_id",
                        reason: format!("slot `{}` holds two seed states", seed.slot_id),
                    });
                }
            }
        }

        let metrics = &observation.metrics;
        let mut losses = self.losses.clone();
        let mut accuracies = self.accuracies.clone();
        for (history, value) in [
            (&mut losses, metrics.val_loss),
            (&mut accuracies, metrics.val_accuracy),
        ] {
            if history.len() >= HISTORY_LEN {
                history.pop_front();
            }
            history.push_back(value);
        }
        let base = BaseInputs {
            epoch: observation.epoch.saturating_add(1),
            max_epochs: self.max_epochs,
            val_loss: metrics.val_loss,
            val_accuracy: metrics.val_accuracy,
            loss_history: padded_history(&losses),
            accuracy_history: padded_history(&accuracies),
            last_action_success: self.last_success,
            last_op: self.last_op,
        };
        base.validate()?;

        let mut memory = Vec::with_capacity(self.slots.len());
        let mut slots = Vec::with_capacity(self.slots.len());
        for (index, seed) in seeds.iter().enumerate() {
            let Some(seed) = seed else {
                memory.push(None);
                slots.push(None);
                continue;
            };
            let previous = self.memory.get(index).cloned().flatten();
            let extra = extras.get(index).and_then(Option::as_ref);
            let (inputs, remembered) = observe_slot(seed, previous, extra)?;
            inputs.validate()?;
            memory.push(Some(remembered));
            slots.push(Some(inputs));
        }

        self.losses = losses;
        self.accuracies = accuracies;
        self.memory = memory;
        Ok(RawObservation { base, slots })
    }
}

/// The inputs of one occupied slot and what to remember about it.
fn observe_slot(
    seed: &SeedState,
    previous: Option<SlotMemory>,
    extra: Option<&SlotExtras>,
) -> Result<(SlotInputs, SlotMemory)> {
    let stage = SeedStage::from_value(seed.stage)?;
    let alpha_mode = AlphaMode::from_value(seed.alpha_mode)?;
    let alpha_algorithm = AlphaAlgorithm::from_value(seed.alpha_algorithm)?;
    let blueprint = blueprint_of(seed)?;
    let mut memory = previous
        .filter(|memory| memory.seed_id == seed.seed_id)
        .unwrap_or_else(|| SlotMemory::fresh(&seed.seed_id, seed.alpha));
    let metrics = seed.metrics.unwrap_or_default();
    let contribution = metrics.counterfactual_contribution;

    let measured = match (contribution, extra.and_then(|e| e.counterfactual_measured)) {
        (None, _) => false,
        (Some(_), Some(flag)) => flag,
        (Some(value), None) => memory.last_contribution != Some(value),
    };
    if let (true, Some(value)) = (measured, contribution) {
        if let Some(last) = memory.last_contribution {
            memory.velocity = CONTRIBUTION_VELOCITY_DECAY * memory.velocity
                + (1.0 - CONTRIBUTION_VELOCITY_DECAY) * (value - last);
        }
        memory.last_contribution = Some(value);
        memory.epochs_since_counterfactual = Some(0);
    } else {
        memory.epochs_since_counterfactual = memory
            .epochs_since_counterfactual
            .map(|epochs| epochs.saturating_add(1));
    }

    let holding = alpha_mode == AlphaMode::Hold;
    let alpha_velocity = match extra {
        Some(extra) if !holding && extra.alpha_steps_total > 0 => {
            (seed.alpha_target - extra.alpha_start) / f64::from(extra.alpha_steps_total)
        }
        Some(_) => 0.0,
        None if holding => 0.0,
        None => seed.alpha - memory.last_alpha,
    };
    let gradient_health = extra.and_then(|extra| extra.gradient_health);
    let inputs = SlotInputs {
        stage,
        blueprint,
        alpha: seed.alpha,
        contribution,
        contribution_velocity: memory.velocity,
        blend_tempo_epochs: extra.map_or(DEFAULT_TEMPO_EPOCHS, |e| e.blend_tempo_epochs),
        alpha_target: seed.alpha_target,
        alpha_mode,
        alpha_steps_total: extra.map_or(0, |e| e.alpha_steps_total),
        alpha_steps_done: extra.map_or(0, |e| e.alpha_steps_done),
        alpha_velocity,
        alpha_algorithm,
        interaction_sum: extra.map_or(0.0, |e| e.interaction_sum),
        gradient_norm: seed.metrics.map(|m| m.gradient_norm),
        gradient_health,
        gradients_vanishing: metrics.gradients_vanishing,
        gradients_exploding: metrics.gradients_exploding,
        previous_gradient_health: memory.last_gradient_health,
        epochs_in_stage: metrics.epochs_in_stage,
        epochs_since_counterfactual: memory.epochs_since_counterfactual,
        epochs_total: metrics.epochs_total,
    };
    if gradient_health.is_some() {
        memory.last_gradient_health = gradient_health;
    }
    memory.last_alpha = seed.alpha;
    Ok((inputs, memory))
}
