//! [`MaxGrowthController`]: a scripted controller that grows as fast as the
//! reference's action masks allow and never prunes. It is not a policy
//! anyone should train with; it measures a ceiling: how many seeds a
//! controller can keep active per epoch under the masks (HEAD's D3
//! germination block included) and Kasmina's gates, for a given episode
//! length and slot count. The Simic benches report it beside the learned
//! policy's count.
//!
//! Each epoch it takes the first of these that the masks allow:
//! 1. GERMINATE its blueprint (conv_light unless told otherwise) in the
//!    first slot the masks offer;
//! 2. ADVANCE a seed, earliest stage first (GERMINATED, then TRAINING, then
//!    BLENDING), so each moves on the first epoch its gate passes;
//! 3. FOSSILIZE a HOLDING seed;
//! 4. WAIT.
//!
//! A failed gate costs nothing but the epoch's decision: the seed stays
//! where it was and the next epoch asks again. An observation with a NaN or
//! an infinity anywhere is refused with a typed error
//! ([`MaxGrowthController::decide_checked`]); the controller holds no state
//! that a refused call could change.

use leyline::{BlueprintAction, LifecycleOp, SeedStage};
use tolaria::controller::{Controller, Decision, EpochObservation, seed_stage};

use crate::heads::BLUEPRINT;
use crate::masks::{MaskConfig, observation_masks};

/// The scripted ceiling controller (see the module docs).
#[derive(Debug, Clone)]
pub struct MaxGrowthController {
    masks: MaskConfig,
    blueprint: BlueprintAction,
}

impl MaxGrowthController {
    /// Grows under `masks` (set `max_seeds` to the environment's limit),
    /// germinating conv_light seeds.
    pub fn new(masks: MaskConfig) -> MaxGrowthController {
        MaxGrowthController {
            masks,
            blueprint: BlueprintAction::ConvLight,
        }
    }

    /// The same controller germinating `blueprint` instead.
    pub fn with_blueprint(mut self, blueprint: BlueprintAction) -> MaxGrowthController {
        self.blueprint = blueprint;
        self
    }

    /// The decision for `observation` (see the module docs), with Tamiyo's
    /// error. The observation's numbers are checked first
    /// ([`crate::features::check_observation`]): the rules read only stages
    /// and ages, but a NaN or infinite loss, accuracy or seed figure means
    /// the observation is broken, and it is refused
    /// ([`crate::Error::NonFinite`] naming the field) rather than acted on.
    pub fn decide_checked(&self, observation: &EpochObservation) -> crate::Result<Decision> {
        crate::features::check_observation(observation)?;
        let masks = observation_masks(observation, &self.masks)?;
        let blueprint_allowed = usize::try_from(self.blueprint.value())
            .ok()
            .and_then(|index| masks.head(BLUEPRINT).get(index).copied())
            .unwrap_or(false);
        if masks.allows(LifecycleOp::Germinate) && blueprint_allowed {
            let slot = first_allowed(observation, masks.slots_for(LifecycleOp::Germinate));
            if let Some(slot) = slot {
                return Ok(Decision::germinate(slot, self.blueprint).because("max_growth", 1.0));
            }
        }
        if masks.allows(LifecycleOp::Advance) {
            let allowed = masks.slots_for(LifecycleOp::Advance);
            for stage in [
                SeedStage::Germinated,
                SeedStage::Training,
                SeedStage::Blending,
            ] {
                if let Some(slot) = slot_in_stage(observation, allowed, stage) {
                    return Ok(Decision::advance(slot).because("max_growth", 1.0));
                }
            }
        }
        if masks.allows(LifecycleOp::Fossilize) {
            let allowed = masks.slots_for(LifecycleOp::Fossilize);
            if let Some(slot) = slot_in_stage(observation, allowed, SeedStage::Holding) {
                return Ok(Decision::fossilize(slot).because("max_growth", 1.0));
            }
        }
        Ok(Decision::wait())
    }
}

/// The first enabled slot `allowed` marks.
fn first_allowed(
    observation: &EpochObservation,
    allowed: &[bool],
) -> Option<kasmina::host::SlotId> {
    observation
        .slots
        .iter()
        .zip(allowed)
        .find_map(|(slot, &ok)| ok.then_some(*slot))
}

/// The first slot `allowed` marks whose seed is in `stage`.
fn slot_in_stage(
    observation: &EpochObservation,
    allowed: &[bool],
    stage: SeedStage,
) -> Option<kasmina::host::SlotId> {
    observation
        .slots
        .iter()
        .zip(allowed)
        .filter(|&(_, &ok)| ok)
        .map(|(slot, _)| *slot)
        .find(|slot| {
            let name = slot.to_string();
            observation
                .seeds
                .iter()
                .any(|seed| seed.slot_id == name && seed_stage(seed) == Some(stage))
        })
}

impl Controller for MaxGrowthController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.decide_checked(observation)
            .map_err(|error| tolaria::Error::Controller {
                field: error.field().unwrap_or("tamiyo.max_growth"),
                reason: error.to_string(),
            })
    }
}
