//! Action masks per head (reference §3.2, HEAD `compute_action_masks`).
//!
//! Masks block only what is physically impossible; timing is the policy's
//! to learn. For an environment whose enabled slots are `s₀ … sₙ₋₁` (the
//! observation's slot order):
//!
//! - **slot**: every enabled slot.
//! - **op**: WAIT always; any other op iff at least one slot allows it
//!   (`slot_by_op`, shape `[NUM_OPS, num_slots]`, says which):
//!   - GERMINATE: the slot is empty, the seed limit is not reached
//!     (`max_seeds`, 0 = unlimited; live and fossilized seeds count) and no
//!     seed anywhere is GERMINATED, TRAINING, PRUNED, EMBARGOED or RESETTING
//!     (the HEAD "D3" block: one seed develops at a time, and a pruned slot
//!     must clear before the next germination);
//!   - ADVANCE: the seed is GERMINATED, TRAINING or BLENDING (unless
//!     `disable_advance`);
//!   - FOSSILIZE: the seed is HOLDING;
//!   - PRUNE: the stage can move to PRUNED (GERMINATED, TRAINING, BLENDING,
//!     HOLDING), the seed is at least `MIN_PRUNE_AGE` epochs old and its
//!     alpha controller holds (unless `allow_governor_override`);
//!   - SET_ALPHA_TARGET: the seed is BLENDING or HOLDING with its alpha
//!     controller holding;
//!   - WAIT: every enabled slot (the slot does not matter).
//! - **blueprint**: the topology's blueprints, NOOP never, nor any the
//!   configuration excludes (`excluded_blueprints`, not a reference option:
//!   a study's departure; excluding every blueprint of the topology is an
//!   error).
//! - **style**, **alpha_target**: every option while GERMINATE or
//!   SET_ALPHA_TARGET is possible, otherwise only SIGMOID_ADD / FULL.
//! - **tempo**, **alpha_speed**, **alpha_curve**: every option.
//!
//! WAIT is always valid, so the op head always has an action, and every
//! other head has at least one; `slot_by_op[op]` has a slot exactly when the
//! op is valid ([`ActionMasks::check`]).
//!
//! [`action_masks`] also intersects the rules with Kasmina's
//! [`OpAvailability`] (per slot for GERMINATE, FOSSILIZE and PRUNE, per op
//! for ADVANCE and SET_ALPHA_TARGET), so a mask never offers what Kasmina
//! would refuse. `disable_set_alpha_target` (not a reference option) removes
//! SET_ALPHA_TARGET for drivers that cannot carry it out yet (Tolaria's
//! `apply`).
//!
//! [`MaskTensors`] stacks the masks of many environments into boolean
//! tensors `[n_envs, head size]` plus `[n_envs, NUM_OPS, num_slots]`.
//!
//! **An all-false row is refused where masks enter, never sampled.** Under
//! a row that allows nothing, the sampler's masked argmax would have to
//! return some option the mask forbids. The check runs where the values are
//! on the host, so it never reads back from a GPU on the per-step path or
//! inside a captured graph:
//! - [`MaskTensors::from_masks`] checks every environment's
//!   [`ActionMasks`] on the host before the one upload
//!   ([`ActionMasks::check`]: a head without a valid option, or an allowed
//!   op without a slot, is [`Error::EmptyMask`] naming the head, the op and
//!   the environment's row); [`MaskTensors::allow_all`] allows everything
//!   (and refuses zero slots or environments);
//! - [`MaskTensors::from_tensors`] (masks gathered on a device, e.g. from a
//!   rollout buffer) checks the values once with
//!   [`MaskTensors::check_rows`], one read-back of one flag, outside any
//!   capture;
//! - masks on the CPU are checked again at every use
//!   ([`MaskTensors::check`], called by the network and the sampler): host
//!   memory, no synchronisation. Masks on CUDA assembled from the public
//!   fields by hand are the builder's to check with
//!   [`MaskTensors::check_rows`].

use kasmina::host::{SlotId, Topology};
use kasmina::model::OpAvailability;
use leyline::gate::thresholds::MIN_PRUNE_AGE;
use leyline::proto::SeedState;
use leyline::{
    AlphaMode, AlphaTargetAction, BlueprintAction, GerminationStyle, HEAD_NAMES, LifecycleOp,
    NUM_ACTION_HEADS, SeedStage,
};
use tolaria::controller::EpochObservation;

use crate::error::shape_mismatch;
use crate::features::{MAX_SLOTS, NUM_OPS};
use crate::heads::{ALPHA_TARGET, BLUEPRINT, OP, SLOT, STYLE, head_sizes};
use crate::{Error, Result};

pub(crate) mod tensors;

pub use tensors::MaskTensors;

/// Options of the mask rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskConfig {
    /// Most seeds (live and fossilized) at once; 0 = unlimited.
    pub max_seeds: usize,
    /// The host's topology (selects the blueprint set).
    pub topology: Topology,
    /// Allow PRUNE while the alpha controller is moving (the governor's
    /// override).
    pub allow_governor_override: bool,
    /// Never offer ADVANCE (Kasmina auto-advances every gate).
    pub disable_advance: bool,
    /// Never offer SET_ALPHA_TARGET (not a reference option: for drivers
    /// that cannot carry it out).
    pub disable_set_alpha_target: bool,
    /// Blueprints never offered, one bit per [`BlueprintAction::value`]
    /// (not a reference option: a study that takes a blueprint out of the
    /// learned policy's choices; see [`MaskConfig::excluding`]).
    pub excluded_blueprints: u32,
}

impl MaskConfig {
    /// The same rules with `blueprint` never offered.
    pub fn excluding(mut self, blueprint: BlueprintAction) -> MaskConfig {
        self.excluded_blueprints |= blueprint_bit(blueprint);
        self
    }

    /// The same rules with `blueprint` offered again (where the topology
    /// has it).
    pub fn including(mut self, blueprint: BlueprintAction) -> MaskConfig {
        self.excluded_blueprints &= !blueprint_bit(blueprint);
        self
    }

    /// Whether `blueprint` is excluded.
    pub fn excludes(&self, blueprint: BlueprintAction) -> bool {
        self.excluded_blueprints & blueprint_bit(blueprint) != 0
    }
}

/// `blueprint`'s bit in [`MaskConfig::excluded_blueprints`].
fn blueprint_bit(blueprint: BlueprintAction) -> u32 {
    u32::try_from(blueprint.value())
        .ok()
        .and_then(|value| 1u32.checked_shl(value))
        .unwrap_or(0)
}

impl Default for MaskConfig {
    /// Unlimited seeds, CNN host, the reference's rules.
    fn default() -> Self {
        MaskConfig {
            max_seeds: 0,
            topology: Topology::Cnn,
            allow_governor_override: false,
            disable_advance: false,
            disable_set_alpha_target: false,
            excluded_blueprints: 0,
        }
    }
}

/// What the mask rules need to know about a slot holding a seed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMaskInfo {
    /// Lifecycle stage.
    pub stage: SeedStage,
    /// Seed age in epochs.
    pub epochs_total: u32,
    /// Alpha controller mode.
    pub alpha_mode: AlphaMode,
}

impl SlotMaskInfo {
    /// The mask inputs of an exported seed state (stage and alpha mode must
    /// be contract values).
    pub fn from_seed(seed: &SeedState) -> Result<SlotMaskInfo> {
        Ok(SlotMaskInfo {
            stage: SeedStage::from_value(seed.stage)?,
            epochs_total: seed.metrics.map_or(0, |metrics| metrics.epochs_total),
            alpha_mode: AlphaMode::from_value(seed.alpha_mode)?,
        })
    }
}

/// The masks of one environment (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionMasks {
    heads: [Vec<bool>; NUM_ACTION_HEADS],
    slot_by_op: Vec<Vec<bool>>,
}

fn op_index(op: LifecycleOp) -> usize {
    LifecycleOp::ALL
        .iter()
        .position(|candidate| *candidate == op)
        .unwrap_or(0)
}

fn option_index(value: i32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

fn set(mask: &mut [bool], index: usize, value: bool) {
    if let Some(entry) = mask.get_mut(index) {
        *entry = value;
    }
}

impl ActionMasks {
    /// Number of slots.
    pub fn num_slots(&self) -> usize {
        self.heads.get(SLOT).map_or(0, Vec::len)
    }

    /// The mask of head `head` ([`HEAD_NAMES`] order; empty past the last).
    pub fn head(&self, head: usize) -> &[bool] {
        self.heads.get(head).map_or(&[], Vec::as_slice)
    }

    /// Every head's mask, in [`HEAD_NAMES`] order.
    pub fn heads(&self) -> &[Vec<bool>; NUM_ACTION_HEADS] {
        &self.heads
    }

    /// Whether `op` is valid.
    pub fn allows(&self, op: LifecycleOp) -> bool {
        self.head(OP).get(op_index(op)).copied().unwrap_or(false)
    }

    /// The slots `op` may target.
    pub fn slots_for(&self, op: LifecycleOp) -> &[bool] {
        self.slot_by_op.get(op_index(op)).map_or(&[], Vec::as_slice)
    }

    /// `slot_by_op`, one row per op in `LifecycleOp::ALL` order.
    pub fn slot_by_op(&self) -> &[Vec<bool>] {
        &self.slot_by_op
    }

    /// Narrows the masks to what Kasmina allows (see the module docs).
    /// `availability` must describe the same slots (one entry per slot, one
    /// per op).
    pub fn restrict(&mut self, availability: &OpAvailability) -> Result<()> {
        let num_slots = self.num_slots();
        for (what, values) in [
            (
                "OpAvailability.germinate_slots",
                &availability.germinate_slots,
            ),
            (
                "OpAvailability.fossilize_slots",
                &availability.fossilize_slots,
            ),
            ("OpAvailability.prune_slots", &availability.prune_slots),
        ] {
            if values.len() != num_slots {
                return Err(shape_mismatch(what, num_slots, values.len()));
            }
        }
        if availability.ops.len() != NUM_OPS {
            return Err(shape_mismatch(
                "OpAvailability.ops",
                NUM_OPS,
                availability.ops.len(),
            ));
        }
        for (op, allowed_slots) in [
            (LifecycleOp::Germinate, &availability.germinate_slots),
            (LifecycleOp::Fossilize, &availability.fossilize_slots),
            (LifecycleOp::Prune, &availability.prune_slots),
        ] {
            if let Some(row) = self.slot_by_op.get_mut(op_index(op)) {
                for (entry, allowed) in row.iter_mut().zip(allowed_slots) {
                    *entry &= *allowed;
                }
            }
        }
        for op in [LifecycleOp::Advance, LifecycleOp::SetAlphaTarget] {
            if !availability.allows(op)
                && let Some(row) = self.slot_by_op.get_mut(op_index(op))
            {
                row.fill(false);
            }
        }
        self.finish();
        Ok(())
    }

    /// Derives the op head and the style and alpha-target heads from
    /// `slot_by_op`.
    fn finish(&mut self) {
        let allowed: Vec<bool> = LifecycleOp::ALL
            .iter()
            .map(|op| *op == LifecycleOp::Wait || self.slots_for(*op).iter().any(|&slot| slot))
            .collect();
        let open = |op: LifecycleOp| allowed.get(op_index(op)).copied().unwrap_or(false);
        let choose = open(LifecycleOp::Germinate) || open(LifecycleOp::SetAlphaTarget);
        if let Some(style) = self.heads.get_mut(STYLE) {
            style.fill(choose);
            set(
                style,
                option_index(GerminationStyle::SigmoidAdd.value()),
                true,
            );
        }
        if let Some(target) = self.heads.get_mut(ALPHA_TARGET) {
            target.fill(choose);
            set(target, option_index(AlphaTargetAction::Full.value()), true);
        }
        if let Some(op) = self.heads.get_mut(OP) {
            *op = allowed;
        }
    }

    /// Checks the invariants: every head has at least one valid action
    /// ([`Error::EmptyMask`] otherwise), WAIT is valid, and `slot_by_op[op]`
    /// has a slot exactly when `op` is valid (an allowed op without a slot
    /// is [`Error::EmptyMask`] of the slot head for that op).
    pub fn check(&self) -> Result<()> {
        self.check_row(0)
    }

    /// [`ActionMasks::check`] for the masks of environment `row` of a batch
    /// (the row the errors name).
    fn check_row(&self, row: usize) -> Result<()> {
        let sizes = head_sizes(self.num_slots());
        for (head, mask) in self.heads.iter().enumerate() {
            let name = HEAD_NAMES.get(head).copied().unwrap_or("?");
            if mask.len() != sizes.get(head).copied().unwrap_or(0) {
                return Err(shape_mismatch(
                    "ActionMasks.heads",
                    sizes.get(head).copied().unwrap_or(0),
                    (name, mask.len()),
                ));
            }
            if !mask.iter().any(|&valid| valid) {
                return Err(Error::EmptyMask {
                    head: name,
                    op: None,
                    row,
                });
            }
        }
        if !self.allows(LifecycleOp::Wait) {
            return Err(Error::InvalidInput {
                field: "ActionMasks",
                reason: format!("WAIT is masked in row {row}"),
            });
        }
        if self.slot_by_op.len() != NUM_OPS
            || self
                .slot_by_op
                .iter()
                .any(|slots| slots.len() != self.num_slots())
        {
            return Err(shape_mismatch(
                "ActionMasks.slot_by_op",
                format!("[{NUM_OPS}, {}]", self.num_slots()),
                self.slot_by_op.iter().map(Vec::len).collect::<Vec<_>>(),
            ));
        }
        for op in LifecycleOp::ALL {
            let has_slot = self.slots_for(*op).iter().any(|&slot| slot);
            if self.allows(*op) && !has_slot {
                return Err(Error::EmptyMask {
                    head: HEAD_NAMES.get(SLOT).copied().unwrap_or("slot"),
                    op: Some(*op),
                    row,
                });
            }
            if has_slot && !self.allows(*op) {
                return Err(Error::InvalidInput {
                    field: "ActionMasks",
                    reason: format!("op {op} and its slots disagree in row {row}"),
                });
            }
        }
        Ok(())
    }
}

/// The masks of an environment whose enabled slots hold `slots` (`None`:
/// empty), in slot order, under `config` (reference rules only).
pub fn compute_masks(slots: &[Option<SlotMaskInfo>], config: &MaskConfig) -> Result<ActionMasks> {
    let num_slots = slots.len();
    if !(1..=MAX_SLOTS).contains(&num_slots) {
        return Err(Error::InvalidInput {
            field: "masks.slots",
            reason: format!("{num_slots} slots is outside [1, {MAX_SLOTS}]"),
        });
    }
    let sizes = head_sizes(num_slots);
    let mut heads: [Vec<bool>; NUM_ACTION_HEADS] =
        std::array::from_fn(|head| vec![true; sizes.get(head).copied().unwrap_or(0)]);
    if let Some(blueprints) = heads.get_mut(BLUEPRINT) {
        let allowed = match config.topology {
            Topology::Cnn => BlueprintAction::CNN,
            Topology::Transformer => BlueprintAction::TRANSFORMER,
        };
        blueprints.fill(false);
        let offered = allowed.iter().filter(|&&blueprint| {
            blueprint != BlueprintAction::Noop && !config.excludes(blueprint)
        });
        for blueprint in offered {
            set(blueprints, option_index(blueprint.value()), true);
        }
        if !blueprints.iter().any(|&offered| offered) {
            return Err(Error::InvalidInput {
                field: "masks.excluded_blueprints",
                reason: format!(
                    "every blueprint of the {:?} topology is excluded: nothing could be germinated",
                    config.topology
                ),
            });
        }
    }

    let live_seeds = slots
        .iter()
        .flatten()
        .filter(|info| !info.stage.is_failure())
        .count();
    let under_limit = config.max_seeds == 0 || live_seeds < config.max_seeds;
    // D3: one seed develops at a time; a pruned slot clears first.
    let developing = slots.iter().flatten().any(|info| {
        matches!(
            info.stage,
            SeedStage::Germinated
                | SeedStage::Training
                | SeedStage::Pruned
                | SeedStage::Embargoed
                | SeedStage::Resetting
        )
    });
    let can_germinate = under_limit && !developing;

    let mut slot_by_op = vec![vec![false; num_slots]; NUM_OPS];
    for (index, info) in slots.iter().enumerate() {
        let mut allow = |op: LifecycleOp| {
            if let Some(row) = slot_by_op.get_mut(op_index(op)) {
                set(row, index, true);
            }
        };
        allow(LifecycleOp::Wait);
        let Some(info) = info else {
            if can_germinate {
                allow(LifecycleOp::Germinate);
            }
            continue;
        };
        let holds = info.alpha_mode == AlphaMode::Hold;
        if !config.disable_advance
            && matches!(
                info.stage,
                SeedStage::Germinated | SeedStage::Training | SeedStage::Blending
            )
        {
            allow(LifecycleOp::Advance);
        }
        if info.stage.can_transition_to(SeedStage::Fossilized) {
            allow(LifecycleOp::Fossilize);
        }
        if info.stage.can_transition_to(SeedStage::Pruned)
            && info.epochs_total >= MIN_PRUNE_AGE
            && (holds || config.allow_governor_override)
        {
            allow(LifecycleOp::Prune);
        }
        if !config.disable_set_alpha_target
            && matches!(info.stage, SeedStage::Blending | SeedStage::Holding)
            && holds
        {
            allow(LifecycleOp::SetAlphaTarget);
        }
    }
    let mut masks = ActionMasks { heads, slot_by_op };
    masks.finish();
    Ok(masks)
}

/// The mask inputs of `observation`'s slots, in its slot order (seeds in
/// slots the observation does not list, or two seeds in one slot, are
/// errors).
pub fn slot_infos(observation: &EpochObservation) -> Result<Vec<Option<SlotMaskInfo>>> {
    let names: Vec<String> = observation.slots.iter().map(SlotId::to_string).collect();
    let mut infos: Vec<Option<SlotMaskInfo>> = vec![None; names.len()];
    for seed in &observation.seeds {
        let index = names
            .iter()
            .position(|name| *name == seed.slot_id)
            .ok_or_else(|| Error::InvalidInput {
                field: "seed.slot_id",
                reason: format!("`{}` is not an enabled slot", seed.slot_id),
            })?;
        match infos.get_mut(index) {
            Some(entry @ None) => *entry = Some(SlotMaskInfo::from_seed(seed)?),
            _ => {
                return Err(Error::InvalidInput {
                    field: "seed.slot_id",
                    reason: format!("slot `{}` holds two seed states", seed.slot_id),
                });
            }
        }
    }
    Ok(infos)
}

/// The reference rules on `observation` (no Kasmina availability).
pub fn observation_masks(
    observation: &EpochObservation,
    config: &MaskConfig,
) -> Result<ActionMasks> {
    compute_masks(&slot_infos(observation)?, config)
}

/// The reference rules on `observation`, narrowed to Kasmina's
/// `availability` of the same model (see the module docs).
pub fn action_masks(
    observation: &EpochObservation,
    availability: &OpAvailability,
    config: &MaskConfig,
) -> Result<ActionMasks> {
    let mut masks = observation_masks(observation, config)?;
    masks.restrict(availability)?;
    Ok(masks)
}
