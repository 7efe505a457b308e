//! The HEAD "Obs V3" observation (reference §3.3), schema version
//! [`SCHEMA_VERSION`].
//!
//! One observation is `23 + 31 · num_slots` floats (116 for three slots):
//! [`BASE_FEATURES`] base features, then [`SLOT_FEATURES`] per slot in the
//! slot order the tracker was built with (the enabled slots in execution
//! order, as Tolaria's `EpochObservation` lists them). Beside it, one
//! blueprint index per slot (`i64`, [`EMPTY_BLUEPRINT`] for a slot holding
//! no seed) feeds the network's learned blueprint embedding, which adds
//! [`BLUEPRINT_EMBED_DIM`] inputs per slot inside the network (128 for three
//! slots). [`layout`] names every field with its offset and width; the
//! offsets are the `base` and `slot` constants below.
//!
//! Normalisations (reference §3.3): `symlog(x) = sign(x) ln(1 + |x|)`,
//! divided by [`SYMLOG_SCALE`]; epoch-like counts divided by the run's
//! `max_epochs` and capped at 1; the sentinel [`UNKNOWN`] (−1) for a value
//! not observed yet (history entries before the run's fifth epoch, the
//! previous gradient health and the counterfactual freshness of a seed never
//! measured). An empty slot is all zeros.
//!
//! - [`encode`]: [`RawObservation`] holds the un-normalised inputs of one
//!   environment; [`RawObservation::encode_into`] writes its normalised
//!   row. Every input is checked (finite, alpha in `[0, 1]`) before anything
//!   is written.
//! - [`tracker::ObservationTracker`] builds a [`RawObservation`] from
//!   Tolaria's [`tolaria::controller::EpochObservation`] and the
//!   environment's history (losses, accuracies, last action, contribution
//!   velocity, counterfactual freshness, previous gradient health).
//! - [`batch::FeatureBatch`] encodes many environments into preallocated
//!   `[n_envs, obs_dim]` / `[n_envs, num_slots]` tensors.
//! - [`check::check_observation`] checks every number of an
//!   `EpochObservation` (losses, accuracies, each seed's alpha, accuracies,
//!   improvement, gradient figures, contribution) before the tracker or any
//!   controller reads it: a NaN or an infinity is [`crate::Error::NonFinite`]
//!   naming the field, and nothing changes.

pub mod batch;
pub mod check;
pub mod encode;
pub mod tracker;

use leyline::stage::NUM_STAGES;
use leyline::{BlueprintAction, LifecycleOp};

use crate::{Error, Result};

pub use batch::FeatureBatch;
pub use check::{check_observation, check_seed};
pub use encode::{BaseInputs, RawObservation, SlotInputs};
pub use tracker::{ObservationTracker, SlotExtras, slot_extras};

/// Version of the observation layout (HEAD Obs V3, schema version 1).
pub const SCHEMA_VERSION: u32 = 1;
/// Base features per observation.
pub const BASE_FEATURES: usize = 23;
/// Features per slot.
pub const SLOT_FEATURES: usize = 31;
/// Validation losses and accuracies kept in the history features.
pub const HISTORY_LEN: usize = 5;
/// The "not observed yet" sentinel.
pub const UNKNOWN: f32 = -1.0;
/// `symlog` values are divided by this (`symlog(1000) ≈ 6.9`).
pub const SYMLOG_SCALE: f64 = 7.0;
/// Contributions and their velocity (percentage points) are divided by this
/// and clamped to `±1`.
pub const CONTRIBUTION_SCALE: f64 = 10.0;
/// The Shapley interaction sum is divided by this and clamped to `±1`.
pub const INTERACTION_SCALE: f64 = 10.0;
/// The blend tempo (epochs) is divided by this.
pub const BLEND_TEMPO_SCALE: f64 = 12.0;
/// Counterfactual freshness is `FRESHNESS_GAMMA^(epochs since measured)`
/// (the PPO discount, `DEFAULT_GAMMA`).
pub const FRESHNESS_GAMMA: f64 = 0.995;
/// Contribution velocity is the EMA `v = 0.7 v + 0.3 Δcontribution`.
pub const CONTRIBUTION_VELOCITY_DECAY: f64 = 0.7;
/// Width of the learned blueprint embedding per slot (inside the network).
pub const BLUEPRINT_EMBED_DIM: usize = 4;
/// Number of blueprints (the blueprint head's size).
pub const NUM_BLUEPRINTS: usize = BlueprintAction::ALL.len();
/// Blueprint index of a slot holding no seed.
pub const EMPTY_BLUEPRINT: i64 = -1;
/// Number of lifecycle ops (the op head's size).
pub const NUM_OPS: usize = LifecycleOp::ALL.len();
/// Most slots an observation describes.
pub const MAX_SLOTS: usize = 64;
/// Longest run (`max_epochs`) an observation normalises by.
pub const MAX_EPOCHS: u32 = 1 << 20;

/// Offsets of the base features.
pub mod base {
    /// `epoch / max_epochs`, capped at 1.
    pub const EPOCH: usize = 0;
    /// `symlog(val_loss) / 7`.
    pub const VAL_LOSS: usize = 1;
    /// `val_accuracy / 100`.
    pub const VAL_ACCURACY: usize = 2;
    /// Last five validation losses (`symlog / 7`), oldest first, left-padded
    /// with −1.
    pub const LOSS_HISTORY: usize = 3;
    /// Last five validation accuracies (`/ 100`), oldest first, left-padded
    /// with −1.
    pub const ACCURACY_HISTORY: usize = 8;
    /// `#TRAINING / num_slots`.
    pub const TRAINING_FRACTION: usize = 13;
    /// `#BLENDING / num_slots`.
    pub const BLENDING_FRACTION: usize = 14;
    /// `#(HOLDING + FOSSILIZED) / num_slots`.
    pub const HOLDING_FRACTION: usize = 15;
    /// Whether the last action succeeded (1 before any action).
    pub const LAST_ACTION_SUCCESS: usize = 16;
    /// One-hot of the last op (WAIT before any action), six wide.
    pub const LAST_OP: usize = 17;
}

/// Offsets within one slot's features.
pub mod slot {
    /// 1 when the slot holds a seed state (also PRUNED, EMBARGOED, RESETTING).
    pub const OCCUPIED: usize = 0;
    /// Stage one-hot, ten wide (`SeedStage::one_hot_index`).
    pub const STAGE: usize = 1;
    /// Current alpha.
    pub const ALPHA: usize = 11;
    /// Counterfactual contribution / 10, clamped to ±1 (0 if none).
    pub const CONTRIBUTION: usize = 12;
    /// Contribution velocity / 10, clamped to ±1.
    pub const CONTRIBUTION_VELOCITY: usize = 13;
    /// Blend tempo (epochs) / 12.
    pub const BLEND_TEMPO: usize = 14;
    /// Alpha target.
    pub const ALPHA_TARGET: usize = 15;
    /// Alpha mode / 2.
    pub const ALPHA_MODE: usize = 16;
    /// Alpha schedule length / max_epochs.
    pub const ALPHA_STEPS_TOTAL: usize = 17;
    /// Alpha schedule steps done / max_epochs.
    pub const ALPHA_STEPS_DONE: usize = 18;
    /// Steps left to the target / max_epochs.
    pub const TIME_TO_TARGET: usize = 19;
    /// Alpha velocity, clamped to ±1.
    pub const ALPHA_VELOCITY: usize = 20;
    /// `(alpha_algorithm − 1) / 2`.
    pub const ALPHA_ALGORITHM: usize = 21;
    /// Shapley interaction sum / 10, clamped to ±1.
    pub const INTERACTION_SUM: usize = 22;
    /// `symlog(gradient_norm) / 7` (0 when unmeasured).
    pub const GRADIENT_NORM: usize = 23;
    /// Gradient health in `[0, 1]` (0 when unmeasured).
    pub const GRADIENT_HEALTH: usize = 24;
    /// 1 when gradients vanish.
    pub const HAS_VANISHING: usize = 25;
    /// 1 when gradients explode.
    pub const HAS_EXPLODING: usize = 26;
    /// The previous epoch's gradient health (−1 if unknown).
    pub const PREVIOUS_GRADIENT_HEALTH: usize = 27;
    /// Epochs in the current stage / max_epochs.
    pub const EPOCHS_IN_STAGE: usize = 28;
    /// `0.995^(epochs since the last counterfactual)` (−1 if never measured).
    pub const COUNTERFACTUAL_FRESHNESS: usize = 29;
    /// Seed age (epochs_total) / max_epochs.
    pub const SEED_AGE: usize = 30;
}

/// One named field of the observation: where it starts and how wide it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    /// Field name (snake case).
    pub name: &'static str,
    /// Offset within the base block or within one slot's block.
    pub offset: usize,
    /// Number of floats.
    pub width: usize,
}

const fn field(name: &'static str, offset: usize, width: usize) -> FieldSpec {
    FieldSpec {
        name,
        offset,
        width,
    }
}

/// The base fields in order.
pub const BASE_FIELDS: [FieldSpec; 10] = [
    field("epoch", base::EPOCH, 1),
    field("val_loss", base::VAL_LOSS, 1),
    field("val_accuracy", base::VAL_ACCURACY, 1),
    field("loss_history", base::LOSS_HISTORY, HISTORY_LEN),
    field("accuracy_history", base::ACCURACY_HISTORY, HISTORY_LEN),
    field("training_fraction", base::TRAINING_FRACTION, 1),
    field("blending_fraction", base::BLENDING_FRACTION, 1),
    field("holding_fraction", base::HOLDING_FRACTION, 1),
    field("last_action_success", base::LAST_ACTION_SUCCESS, 1),
    field("last_op", base::LAST_OP, NUM_OPS),
];

/// The fields of one slot in order.
pub const SLOT_FIELDS: [FieldSpec; 22] = [
    field("occupied", slot::OCCUPIED, 1),
    field("stage", slot::STAGE, NUM_STAGES),
    field("alpha", slot::ALPHA, 1),
    field("contribution", slot::CONTRIBUTION, 1),
    field("contribution_velocity", slot::CONTRIBUTION_VELOCITY, 1),
    field("blend_tempo", slot::BLEND_TEMPO, 1),
    field("alpha_target", slot::ALPHA_TARGET, 1),
    field("alpha_mode", slot::ALPHA_MODE, 1),
    field("alpha_steps_total", slot::ALPHA_STEPS_TOTAL, 1),
    field("alpha_steps_done", slot::ALPHA_STEPS_DONE, 1),
    field("time_to_target", slot::TIME_TO_TARGET, 1),
    field("alpha_velocity", slot::ALPHA_VELOCITY, 1),
    field("alpha_algorithm", slot::ALPHA_ALGORITHM, 1),
    field("interaction_sum", slot::INTERACTION_SUM, 1),
    field("gradient_norm", slot::GRADIENT_NORM, 1),
    field("gradient_health", slot::GRADIENT_HEALTH, 1),
    field("has_vanishing", slot::HAS_VANISHING, 1),
    field("has_exploding", slot::HAS_EXPLODING, 1),
    field(
        "previous_gradient_health",
        slot::PREVIOUS_GRADIENT_HEALTH,
        1,
    ),
    field("epochs_in_stage", slot::EPOCHS_IN_STAGE, 1),
    field(
        "counterfactual_freshness",
        slot::COUNTERFACTUAL_FRESHNESS,
        1,
    ),
    field("seed_age", slot::SEED_AGE, 1),
];

/// One field of a whole observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Field name.
    pub name: &'static str,
    /// The slot (position in the slot order) for per-slot fields.
    pub slot: Option<usize>,
    /// Offset in the observation vector.
    pub offset: usize,
    /// Number of floats.
    pub width: usize,
}

/// The observation layout for a number of slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObsLayout {
    num_slots: usize,
}

/// The Obs V3 layout for `num_slots` slots (`1..=MAX_SLOTS`).
pub fn layout(num_slots: usize) -> Result<ObsLayout> {
    if !(1..=MAX_SLOTS).contains(&num_slots) {
        return Err(Error::InvalidConfig {
            field: "num_slots",
            reason: format!("{num_slots} is outside [1, {MAX_SLOTS}]"),
        });
    }
    Ok(ObsLayout { num_slots })
}

impl ObsLayout {
    /// Number of slots.
    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Floats per observation: `23 + 31 · num_slots`.
    pub fn obs_dim(&self) -> usize {
        // num_slots ≤ MAX_SLOTS: no overflow.
        SLOT_FEATURES
            .saturating_mul(self.num_slots)
            .saturating_add(BASE_FEATURES)
    }

    /// The network's input width: the observation plus
    /// `BLUEPRINT_EMBED_DIM · num_slots` embedding dims.
    pub fn network_input_dim(&self) -> usize {
        BLUEPRINT_EMBED_DIM
            .saturating_mul(self.num_slots)
            .saturating_add(self.obs_dim())
    }

    /// Offset of slot `slot`'s block (`None` past the last slot).
    pub fn slot_offset(&self, slot: usize) -> Option<usize> {
        (slot < self.num_slots).then(|| {
            SLOT_FEATURES
                .saturating_mul(slot)
                .saturating_add(BASE_FEATURES)
        })
    }

    /// Every field in order: the base fields, then each slot's.
    pub fn fields(&self) -> Vec<Field> {
        let base = BASE_FIELDS.iter().map(|spec| Field {
            name: spec.name,
            slot: None,
            offset: spec.offset,
            width: spec.width,
        });
        let slots = (0..self.num_slots).flat_map(move |slot| {
            let start = self.slot_offset(slot).unwrap_or(0);
            SLOT_FIELDS.iter().map(move |spec| Field {
                name: spec.name,
                slot: Some(slot),
                offset: start.saturating_add(spec.offset),
                width: spec.width,
            })
        });
        base.chain(slots).collect()
    }
}

/// `sign(x) ln(1 + |x|)`.
pub fn symlog(x: f64) -> f64 {
    if x >= 0.0 { x.ln_1p() } else { -(-x).ln_1p() }
}
