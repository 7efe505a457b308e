//! `export_seed_states`: the leyline `SeedState` message of every seed.
//!
//! One message per enabled slot that holds a state (live seeds and seeds in
//! cooldown), in slot execution order; empty slots export nothing. Each
//! message is validated against the contract (`leyline::codec::Contract`)
//! before it is returned. Reads no tensors: safe to call at any time outside
//! a captured CUDA graph.

use leyline::codec::Contract;
use leyline::proto::{SeedMetricSet, SeedState as SeedStateMessage};

use crate::Result;
use crate::model::MorphogeneticModel;
use crate::slot::SeedSlot;

/// The message of the seed in `slot`, `None` for an empty slot.
pub fn seed_state_message(slot: &SeedSlot) -> Result<Option<SeedStateMessage>> {
    let Some(state) = slot.state() else {
        return Ok(None);
    };
    let metrics = state.metrics();
    let controller = state.alpha_controller();
    let message = SeedStateMessage {
        schema_version: leyline::SCHEMA_VERSION,
        seed_id: state.seed_id().to_owned(),
        slot_id: slot.id().to_string(),
        blueprint_id: state.blueprint().name().to_owned(),
        stage: state.stage().value(),
        previous_stage: state.previous_stage().value(),
        alpha: controller.alpha(),
        alpha_target: controller.alpha_target(),
        alpha_mode: controller.mode().value(),
        alpha_curve: controller.curve().value(),
        alpha_algorithm: state.algorithm().value(),
        isolate_gradients: state.isolate_gradients(),
        is_healthy: state.is_healthy(),
        metrics: Some(SeedMetricSet {
            schema_version: leyline::SCHEMA_VERSION,
            epochs_total: metrics.epochs_total,
            epochs_in_stage: metrics.epochs_in_stage,
            train_accuracy: metrics.train_accuracy,
            val_accuracy: metrics.val_accuracy,
            accuracy_at_stage_start: metrics.accuracy_at_stage_start,
            improvement_since_stage_start: metrics.improvement_since_stage_start(),
            gradient_norm: metrics.gradient_norm,
            gradient_ratio: metrics.gradient_ratio,
            counterfactual_contribution: metrics.counterfactual_contribution,
            param_count: u64::try_from(state.param_count()).unwrap_or(0),
            gradients_vanishing: metrics.gradients_vanishing,
            gradients_exploding: metrics.gradients_exploding,
        }),
    };
    message.validate()?;
    Ok(Some(message))
}

/// The messages of every seed in `model` (see the module docs).
pub fn export_seed_states(model: &MorphogeneticModel) -> Result<Vec<SeedStateMessage>> {
    let mut messages = Vec::new();
    for slot in model.slots() {
        if let Some(message) = seed_state_message(slot)? {
            messages.push(message);
        }
    }
    Ok(messages)
}
