//! The un-normalised inputs of one observation ([`RawObservation`]: base
//! inputs and one optional [`SlotInputs`] per slot), their checks, and
//! their encoding into the normalised Obs V3 row (see [`super`] for the
//! layout and the normalisations).

use leyline::codec::MAX_ABS_PERCENTAGE_POINTS;
use leyline::stage::NUM_STAGES;
use leyline::{AlphaAlgorithm, AlphaMode, BlueprintAction, LifecycleOp, SeedStage};

use super::{
    BASE_FEATURES, BLEND_TEMPO_SCALE, CONTRIBUTION_SCALE, EMPTY_BLUEPRINT, FRESHNESS_GAMMA,
    HISTORY_LEN, INTERACTION_SCALE, MAX_EPOCHS, MAX_SLOTS, NUM_OPS, SLOT_FEATURES, SYMLOG_SCALE,
    UNKNOWN, base, layout, slot, symlog,
};
use crate::error::{finite, in_range};
use crate::{Error, Result};

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
    /// `max_epochs` in `1..=MAX_EPOCHS`): [`Error::NonFinite`] for a NaN or
    /// an infinity, [`Error::InvalidInput`] for a value out of range.
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
    /// Checks every value: finite ([`Error::NonFinite`] naming the field
    /// otherwise), alpha and alpha target in `[0, 1]`, the contribution
    /// within leyline's ±100 percentage points, gradient norm ≥ 0, gradient
    /// healths in `[0, 1]`.
    pub fn validate(&self) -> Result<()> {
        in_range("slot.alpha", self.alpha, 0.0, 1.0)?;
        in_range("slot.alpha_target", self.alpha_target, 0.0, 1.0)?;
        if let Some(contribution) = self.contribution {
            in_range(
                "slot.contribution",
                contribution,
                -MAX_ABS_PERCENTAGE_POINTS,
                MAX_ABS_PERCENTAGE_POINTS,
            )?;
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
