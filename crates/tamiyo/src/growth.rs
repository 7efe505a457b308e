//! The scripted controllers the learned policy is measured against, each
//! behind Tolaria's [`Controller`] trait (so `esper train --controller` and
//! the Simic benches drive them as they drive the policy):
//!
//! - [`NoGrowthController`]: WAIT every epoch, the host alone.
//! - [`GerminateOnceController`]: germinates one seed as soon as the masks
//!   allow, moves it on at every gate, fossilizes it, and then holds: it
//!   never germinates again and never prunes.
//! - [`MaxGrowthController`]: grows as fast as the reference's action masks
//!   allow and never prunes. It is not a policy anyone should train with;
//!   it measures a ceiling: how many seeds a controller can keep active per
//!   epoch under the masks (HEAD's D3 germination block included) and
//!   Kasmina's gates, for a given episode length and slot count.
//!
//! Max growth, each epoch, takes the first of these that the masks allow
//! (germinate-once takes the same steps, germinating only while it has not
//! yet seen a seed):
//! Each epoch it takes the first of these that the masks allow:
//! 1. GERMINATE its blueprint ([`scripted_blueprint`] of the masks'
//!    topology unless told otherwise) in the first slot the masks offer;
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

use kasmina::host::Topology;
use leyline::{BlueprintAction, LifecycleOp, SeedStage};
use tolaria::controller::{Controller, Decision, EpochObservation, seed_stage};

use crate::heads::BLUEPRINT;
use crate::masks::{MaskConfig, observation_masks};

/// The blueprint the scripted controllers grow on a host of `topology`:
/// conv_light on a CNN, mlp_small on a transformer (where the reference
/// rotation's convolutions do not exist).
pub fn scripted_blueprint(topology: Topology) -> BlueprintAction {
    match topology {
        Topology::Cnn => BlueprintAction::ConvLight,
        Topology::Transformer => BlueprintAction::MlpSmall,
    }
}

/// The scripted ceiling controller (see the module docs).
#[derive(Debug, Clone)]
pub struct MaxGrowthController {
    masks: MaskConfig,
    blueprint: BlueprintAction,
}

impl MaxGrowthController {
    /// Grows under `masks` (set `max_seeds` to the environment's limit),
    /// germinating the [`scripted_blueprint`] of `masks.topology`.
    pub fn new(masks: MaskConfig) -> MaxGrowthController {
        MaxGrowthController {
            masks,
            blueprint: scripted_blueprint(masks.topology),
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
        Ok(move_a_seed_on(observation, &masks, "max_growth").unwrap_or_else(Decision::wait))
    }
}

/// The ADVANCE or FOSSILIZE that moves a seed on, if the masks allow one:
/// the earliest stage first, then a HOLDING seed's fossilization.
fn move_a_seed_on(
    observation: &EpochObservation,
    masks: &crate::masks::ActionMasks,
    reason: &'static str,
) -> Option<Decision> {
    if masks.allows(LifecycleOp::Advance) {
        let allowed = masks.slots_for(LifecycleOp::Advance);
        for stage in [
            SeedStage::Germinated,
            SeedStage::Training,
            SeedStage::Blending,
        ] {
            if let Some(slot) = slot_in_stage(observation, allowed, stage) {
                return Some(Decision::advance(slot).because(reason, 1.0));
            }
        }
    }
    if masks.allows(LifecycleOp::Fossilize) {
        let allowed = masks.slots_for(LifecycleOp::Fossilize);
        if let Some(slot) = slot_in_stage(observation, allowed, SeedStage::Holding) {
            return Some(Decision::fossilize(slot).because(reason, 1.0));
        }
    }
    None
}

/// WAIT every epoch: the host grown by no one. It still refuses a broken
/// observation (a NaN or infinity anywhere), as every controller does.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGrowthController;

impl NoGrowthController {
    /// WAIT, after checking `observation`'s numbers.
    pub fn decide_checked(&self, observation: &EpochObservation) -> crate::Result<Decision> {
        crate::features::check_observation(observation)?;
        Ok(Decision::wait().because("no_growth", 1.0))
    }
}

impl Controller for NoGrowthController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.decide_checked(observation)
            .map_err(|error| tolaria::Error::Controller {
                field: error.field().unwrap_or("tamiyo.no_growth"),
                reason: error.to_string(),
            })
    }
}

/// Germinates one seed, takes it to FOSSILIZED, then holds (see the module
/// docs). Its one piece of state, whether it has seen a seed, is set by the
/// first observation that shows one (a germination the trainer refused does
/// not count), so a model restored with a seed is never germinated again.
#[derive(Debug, Clone)]
pub struct GerminateOnceController {
    masks: MaskConfig,
    blueprint: BlueprintAction,
    seen_seed: bool,
}

impl GerminateOnceController {
    /// Germinates one seed of the [`scripted_blueprint`] of
    /// `masks.topology` under `masks`.
    pub fn new(masks: MaskConfig) -> GerminateOnceController {
        GerminateOnceController {
            masks,
            blueprint: scripted_blueprint(masks.topology),
            seen_seed: false,
        }
    }

    /// The same controller germinating `blueprint` instead.
    pub fn with_blueprint(mut self, blueprint: BlueprintAction) -> GerminateOnceController {
        self.blueprint = blueprint;
        self
    }

    /// Whether it has seen its seed (and so will not germinate again).
    pub fn has_germinated(&self) -> bool {
        self.seen_seed
    }

    /// The controller as it was after seeing a seed, or not (a checkpoint's
    /// restore).
    pub fn with_germinated(mut self, germinated: bool) -> GerminateOnceController {
        self.seen_seed = germinated;
        self
    }

    /// The decision for `observation` (see the module docs), with Tamiyo's
    /// error for an observation with a NaN or infinity anywhere (refused
    /// before any state changes).
    pub fn decide_checked(&mut self, observation: &EpochObservation) -> crate::Result<Decision> {
        crate::features::check_observation(observation)?;
        let masks = observation_masks(observation, &self.masks)?;
        if !observation.seeds.is_empty() {
            self.seen_seed = true;
        }
        if !self.seen_seed {
            let blueprint_allowed = usize::try_from(self.blueprint.value())
                .ok()
                .and_then(|index| masks.head(BLUEPRINT).get(index).copied())
                .unwrap_or(false);
            if masks.allows(LifecycleOp::Germinate) && blueprint_allowed {
                let slot = first_allowed(observation, masks.slots_for(LifecycleOp::Germinate));
                if let Some(slot) = slot {
                    return Ok(
                        Decision::germinate(slot, self.blueprint).because("germinate_once", 1.0)
                    );
                }
            }
        }
        Ok(move_a_seed_on(observation, &masks, "germinate_once").unwrap_or_else(Decision::wait))
    }
}

impl Controller for GerminateOnceController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.decide_checked(observation)
            .map_err(|error| tolaria::Error::Controller {
                field: error.field().unwrap_or("tamiyo.germinate_once"),
                reason: error.to_string(),
            })
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
