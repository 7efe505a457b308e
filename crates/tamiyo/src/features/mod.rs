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
//! - [`RawObservation`] holds the un-normalised inputs of one environment;
//!   [`RawObservation::encode_into`] writes its normalised row. Every input
//!   is checked (finite, alpha in `[0, 1]`) before anything is written.
//! - [`tracker::ObservationTracker`] builds a [`RawObservation`] from
//!   Tolaria's [`tolaria::controller::EpochObservation`] and the
//!   environment's history (losses, accuracies, last action, contribution
//!   velocity, counterfactual freshness, previous gradient health).
//! - [`batch::FeatureBatch`] encodes many environments into preallocated
//!   `[n_envs, obs_dim]` / `[n_envs, num_slots]` tensors.

pub mod batch;
pub mod tracker;

use leyline::stage::NUM_STAGES;
use leyline::{AlphaAlgorithm, AlphaMode, BlueprintAction, LifecycleOp, SeedStage};

use crate::{Error, Result};

pub use batch::FeatureBatch;
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

/// The base inputs of one observation (un-normalised).
#[derive(Debug, Clone, PartialEq)]
pub struct BaseInputs {
    /// Epochs completed, counted from 1 (the reference's epoch number).
    pub epoch: u32,
    /// The run's episode length (`1..=MAX_EPOCHS`); epoch-like counts are
    /// divided by it.
    pub max_epochs: u32,
    /// Validation loss (finite).
    pub val_loss: f64,
    /// Validation accuracy in percent, `[0, 100]`.
    pub val_accuracy: f64,
    /// The last five validation losses, oldest first; `None` for epochs not
    /// observed yet (the first four epochs of a run).
    pub loss_history: [Option<f64>; HISTORY_LEN],
    /// The last five validation accuracies (percent), oldest first.
    pub accuracy_history: [Option<f64>; HISTORY_LEN],
    /// Whether the last action succeeded (`true` before any action).
    pub last_action_success: bool,
    /// The last op taken (WAIT before any action).
    pub last_op: LifecycleOp,
}

/// The inputs of one slot holding a seed state (un-normalised).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotInputs {
    /// Lifecycle stage.
    pub stage: SeedStage,
    /// The seed's blueprint (fed to the network's embedding).
    pub blueprint: BlueprintAction,
    /// Current alpha, `[0, 1]`.
    pub alpha: f64,
    /// Counterfactual contribution in percentage points (`None` when never
    /// measured).
    pub contribution: Option<f64>,
    /// EMA of the contribution's change (percentage points per measurement).
    pub contribution_velocity: f64,
    /// Blend tempo in epochs (3, 5 or 8).
    pub blend_tempo_epochs: u32,
    /// Alpha target, `[0, 1]`.
    pub alpha_target: f64,
    /// Alpha controller mode.
    pub alpha_mode: AlphaMode,
    /// Alpha schedule length in ticks.
    pub alpha_steps_total: u32,
    /// Alpha schedule ticks done.
    pub alpha_steps_done: u32,
    /// Alpha change per tick (clamped to ±1 when encoded).
    pub alpha_velocity: f64,
    /// Blend algorithm.
    pub alpha_algorithm: AlphaAlgorithm,
    /// Shapley interaction sum (0 when not estimated).
    pub interaction_sum: f64,
    /// Seed gradient norm (`None` when unmeasured).
    pub gradient_norm: Option<f64>,
    /// Gradient health in `[0, 1]` (`None` when unmeasured).
    pub gradient_health: Option<f64>,
    /// Gradients vanish.
    pub gradients_vanishing: bool,
    /// Gradients explode.
    pub gradients_exploding: bool,
    /// The previous epoch's gradient health (`None` when unknown).
    pub previous_gradient_health: Option<f64>,
    /// Epochs in the current stage.
    pub epochs_in_stage: u32,
    /// Epochs since the counterfactual was last measured (`None`: never).
    pub epochs_since_counterfactual: Option<u32>,
    /// Seed age in epochs (`epochs_total`).
    pub epochs_total: u32,
}

/// The un-normalised inputs of one environment's observation.
#[derive(Debug, Clone, PartialEq)]
pub struct RawObservation {
    /// Base inputs.
    pub base: BaseInputs,
    /// One entry per slot in slot order; `None` for an empty slot.
    pub slots: Vec<Option<SlotInputs>>,
}

fn finite(field: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::InvalidInput {
            field,
            reason: format!("{value} is not finite"),
        })
    }
}

fn in_range(field: &'static str, value: f64, low: f64, high: f64) -> Result<f64> {
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(Error::InvalidInput {
            field,
            reason: format!("{value} is outside [{low}, {high}]"),
        })
    }
}

/// `count / max_epochs`, capped at 1.
fn epoch_fraction(count: u32, max_epochs: u32) -> f32 {
    let max = f64::from(max_epochs.max(1));
    (f64::from(count).min(max) / max) as f32
}

fn clamp_unit(value: f64) -> f32 {
    value.clamp(-1.0, 1.0) as f32
}

fn symlog_scaled(value: f64) -> f32 {
    (symlog(value) / SYMLOG_SCALE) as f32
}

fn one_hot(row: &mut [f32], index: usize) {
    for (position, value) in row.iter_mut().enumerate() {
        *value = if position == index { 1.0 } else { 0.0 };
    }
}

/// Writes `value` at `offset` of `row` (fixed-size rows: offsets are the
/// layout's constants, so a miss is a bug caught by the layout test).
fn put(row: &mut [f32], offset: usize, value: f32) {
    if let Some(slot) = row.get_mut(offset) {
        *slot = value;
    }
}

fn sub(row: &mut [f32], offset: usize, width: usize) -> &mut [f32] {
    let end = offset.saturating_add(width).min(row.len());
    row.get_mut(offset.min(end)..end).unwrap_or_default()
}

/// `AlphaMode` value / its largest value (2).
fn alpha_mode_fraction(mode: AlphaMode) -> f32 {
    let max = AlphaMode::ALL
        .iter()
        .map(|mode| mode.value())
        .max()
        .unwrap_or(1)
        .max(1);
    (f64::from(mode.value()) / f64::from(max)) as f32
}

/// `(algorithm − smallest) / (largest − smallest)`: `(v − 1) / 2`.
fn alpha_algorithm_fraction(algorithm: AlphaAlgorithm) -> f32 {
    let values = AlphaAlgorithm::ALL.iter().map(|a| a.value());
    let low = values.clone().min().unwrap_or(0);
    let high = values.max().unwrap_or(1);
    let range = high.saturating_sub(low).max(1);
    (f64::from(algorithm.value().saturating_sub(low)) / f64::from(range)) as f32
}

impl BaseInputs {
    /// Checks every value (finite losses, accuracies in `[0, 100]`,
    /// `max_epochs` in `1..=MAX_EPOCHS`).
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_EPOCHS).contains(&self.max_epochs) {
            return Err(Error::InvalidInput {
                field: "observation.max_epochs",
                reason: format!("{} is outside [1, {MAX_EPOCHS}]", self.max_epochs),
            });
        }
        finite("observation.val_loss", self.val_loss)?;
        in_range("observation.val_accuracy", self.val_accuracy, 0.0, 100.0)?;
        for loss in self.loss_history.iter().flatten() {
            finite("observation.loss_history", *loss)?;
        }
        for accuracy in self.accuracy_history.iter().flatten() {
            in_range("observation.accuracy_history", *accuracy, 0.0, 100.0)?;
        }
        Ok(())
    }
}

impl SlotInputs {
    /// Checks every value: finite, alpha and alpha target in `[0, 1]`,
    /// gradient norm ≥ 0, gradient healths in `[0, 1]`.
    pub fn validate(&self) -> Result<()> {
        in_range("slot.alpha", self.alpha, 0.0, 1.0)?;
        in_range("slot.alpha_target", self.alpha_target, 0.0, 1.0)?;
        if let Some(contribution) = self.contribution {
            finite("slot.contribution", contribution)?;
        }
        finite("slot.contribution_velocity", self.contribution_velocity)?;
        finite("slot.alpha_velocity", self.alpha_velocity)?;
        finite("slot.interaction_sum", self.interaction_sum)?;
        if let Some(norm) = self.gradient_norm {
            in_range("slot.gradient_norm", norm, 0.0, f64::MAX)?;
        }
        if let Some(health) = self.gradient_health {
            in_range("slot.gradient_health", health, 0.0, 1.0)?;
        }
        if let Some(health) = self.previous_gradient_health {
            in_range("slot.previous_gradient_health", health, 0.0, 1.0)?;
        }
        Ok(())
    }

    /// The slot's features (normalised), for a run of `max_epochs` epochs.
    pub fn encode(&self, max_epochs: u32) -> Result<[f32; SLOT_FEATURES]> {
        self.validate()?;
        let mut row = [0.0_f32; SLOT_FEATURES];
        put(&mut row, slot::OCCUPIED, 1.0);
        one_hot(
            sub(&mut row, slot::STAGE, NUM_STAGES),
            self.stage.one_hot_index(),
        );
        put(&mut row, slot::ALPHA, self.alpha as f32);
        put(
            &mut row,
            slot::CONTRIBUTION,
            clamp_unit(self.contribution.unwrap_or(0.0) / CONTRIBUTION_SCALE),
        );
        put(
            &mut row,
            slot::CONTRIBUTION_VELOCITY,
            clamp_unit(self.contribution_velocity / CONTRIBUTION_SCALE),
        );
        put(
            &mut row,
            slot::BLEND_TEMPO,
            (f64::from(self.blend_tempo_epochs) / BLEND_TEMPO_SCALE) as f32,
        );
        put(&mut row, slot::ALPHA_TARGET, self.alpha_target as f32);
        put(
            &mut row,
            slot::ALPHA_MODE,
            alpha_mode_fraction(self.alpha_mode),
        );
        put(
            &mut row,
            slot::ALPHA_STEPS_TOTAL,
            epoch_fraction(self.alpha_steps_total, max_epochs),
        );
        put(
            &mut row,
            slot::ALPHA_STEPS_DONE,
            epoch_fraction(self.alpha_steps_done, max_epochs),
        );
        put(
            &mut row,
            slot::TIME_TO_TARGET,
            epoch_fraction(
                self.alpha_steps_total.saturating_sub(self.alpha_steps_done),
                max_epochs,
            ),
        );
        put(
            &mut row,
            slot::ALPHA_VELOCITY,
            clamp_unit(self.alpha_velocity),
        );
        put(
            &mut row,
            slot::ALPHA_ALGORITHM,
            alpha_algorithm_fraction(self.alpha_algorithm),
        );
        put(
            &mut row,
            slot::INTERACTION_SUM,
            clamp_unit(self.interaction_sum / INTERACTION_SCALE),
        );
        put(
            &mut row,
            slot::GRADIENT_NORM,
            self.gradient_norm.map_or(0.0, symlog_scaled),
        );
        put(
            &mut row,
            slot::GRADIENT_HEALTH,
            self.gradient_health.map_or(0.0, |health| health as f32),
        );
        put(
            &mut row,
            slot::HAS_VANISHING,
            f32::from(u8::from(self.gradients_vanishing)),
        );
        put(
            &mut row,
            slot::HAS_EXPLODING,
            f32::from(u8::from(self.gradients_exploding)),
        );
        put(
            &mut row,
            slot::PREVIOUS_GRADIENT_HEALTH,
            self.previous_gradient_health
                .map_or(UNKNOWN, |health| health as f32),
        );
        put(
            &mut row,
            slot::EPOCHS_IN_STAGE,
            epoch_fraction(self.epochs_in_stage, max_epochs),
        );
        put(
            &mut row,
            slot::COUNTERFACTUAL_FRESHNESS,
            self.epochs_since_counterfactual.map_or(UNKNOWN, |epochs| {
                FRESHNESS_GAMMA.powi(i32::try_from(epochs).unwrap_or(i32::MAX)) as f32
            }),
        );
        put(
            &mut row,
            slot::SEED_AGE,
            epoch_fraction(self.epochs_total, max_epochs),
        );
        Ok(row)
    }
}

impl RawObservation {
    /// Number of slots.
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The base features (normalised).
    pub fn encode_base(&self) -> Result<[f32; BASE_FEATURES]> {
        let base = &self.base;
        base.validate()?;
        let num_slots = self.slots.len();
        if !(1..=MAX_SLOTS).contains(&num_slots) {
            return Err(Error::InvalidInput {
                field: "observation.slots",
                reason: format!("{num_slots} slots is outside [1, {MAX_SLOTS}]"),
            });
        }
        let mut row = [0.0_f32; BASE_FEATURES];
        put(
            &mut row,
            base::EPOCH,
            epoch_fraction(base.epoch, base.max_epochs),
        );
        put(&mut row, base::VAL_LOSS, symlog_scaled(base.val_loss));
        put(
            &mut row,
            base::VAL_ACCURACY,
            (base.val_accuracy / 100.0) as f32,
        );
        let history = sub(&mut row, base::LOSS_HISTORY, HISTORY_LEN);
        for (out, loss) in history.iter_mut().zip(&base.loss_history) {
            *out = loss.map_or(UNKNOWN, symlog_scaled);
        }
        let history = sub(&mut row, base::ACCURACY_HISTORY, HISTORY_LEN);
        for (out, accuracy) in history.iter_mut().zip(&base.accuracy_history) {
            *out = accuracy.map_or(UNKNOWN, |accuracy| (accuracy / 100.0) as f32);
        }
        let count = |wanted: &[SeedStage]| {
            self.slots
                .iter()
                .flatten()
                .filter(|inputs| wanted.contains(&inputs.stage))
                .count()
        };
        let fraction = |n: usize| (n as f64 / num_slots as f64) as f32;
        put(
            &mut row,
            base::TRAINING_FRACTION,
            fraction(count(&[SeedStage::Training])),
        );
        put(
            &mut row,
            base::BLENDING_FRACTION,
            fraction(count(&[SeedStage::Blending])),
        );
        put(
            &mut row,
            base::HOLDING_FRACTION,
            fraction(count(&[SeedStage::Holding, SeedStage::Fossilized])),
        );
        put(
            &mut row,
            base::LAST_ACTION_SUCCESS,
            f32::from(u8::from(base.last_action_success)),
        );
        let op_index = LifecycleOp::ALL
            .iter()
            .position(|op| *op == base.last_op)
            .unwrap_or(0);
        one_hot(sub(&mut row, base::LAST_OP, NUM_OPS), op_index);
        Ok(row)
    }

    /// Writes the normalised observation into `row` (`obs_dim` floats) and
    /// the blueprint indices into `blueprints` (`num_slots` values,
    /// [`EMPTY_BLUEPRINT`] for an empty slot). Every input is checked first;
    /// on an error nothing is written.
    pub fn encode_into(&self, row: &mut [f32], blueprints: &mut [i64]) -> Result<()> {
        let layout = layout(self.slots.len())?;
        if row.len() != layout.obs_dim() {
            return Err(crate::error::shape_mismatch(
                "encode_into.row",
                layout.obs_dim(),
                row.len(),
            ));
        }
        if blueprints.len() != self.slots.len() {
            return Err(crate::error::shape_mismatch(
                "encode_into.blueprints",
                self.slots.len(),
                blueprints.len(),
            ));
        }
        let base = self.encode_base()?;
        let slots = self
            .slots
            .iter()
            .map(|inputs| {
                inputs
                    .as_ref()
                    .map(|inputs| inputs.encode(self.base.max_epochs))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let (base_out, slot_out) = row.split_at_mut(BASE_FEATURES.min(row.len()));
        base_out.copy_from_slice(&base);
        for (out, encoded) in slot_out.chunks_exact_mut(SLOT_FEATURES).zip(&slots) {
            match encoded {
                Some(encoded) => out.copy_from_slice(encoded),
                None => out.fill(0.0),
            }
        }
        for (out, inputs) in blueprints.iter_mut().zip(&self.slots) {
            *out = inputs.as_ref().map_or(EMPTY_BLUEPRINT, |inputs| {
                i64::from(inputs.blueprint.value())
            });
        }
        Ok(())
    }
}
