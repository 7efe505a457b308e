//! The action heads as the policy uses them: each head's position in
//! leyline's [`HEAD_NAMES`] (found by name, never re-spelt), its size, the
//! causal relevance of each head for an op (leyline's
//! [`LifecycleOp::relevant_heads`], reference §3.1), the canonical action an
//! irrelevant head is forced to, and [`FactoredAction`], one decision as
//! leyline enums.

use leyline::action::ACTION_HEADS;
use leyline::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, GerminationStyle,
    HEAD_NAMES, LifecycleOp, NUM_ACTION_HEADS, TempoAction,
};

use crate::{Error, Result};

const fn same(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.split_first(), b.split_first()) {
            (None, None) => return true,
            (Some((x, a_rest)), Some((y, b_rest))) => {
                if *x != *y {
                    return false;
                }
                a = a_rest;
                b = b_rest;
            }
            _ => return false,
        }
    }
}

/// Position of `name` in [`HEAD_NAMES`] (`NUM_ACTION_HEADS` when absent,
/// which the assertion below turns into a build error).
const fn position(name: &str) -> usize {
    let mut rest: &[&str] = &HEAD_NAMES;
    let mut index = 0;
    while let Some((head, tail)) = rest.split_first() {
        if same(head, name) {
            return index;
        }
        rest = tail;
        index = index.saturating_add(1);
    }
    NUM_ACTION_HEADS
}

/// Index of the `slot` head.
pub const SLOT: usize = position("slot");
/// Index of the `blueprint` head.
pub const BLUEPRINT: usize = position("blueprint");
/// Index of the `style` head.
pub const STYLE: usize = position("style");
/// Index of the `tempo` head.
pub const TEMPO: usize = position("tempo");
/// Index of the `alpha_target` head.
pub const ALPHA_TARGET: usize = position("alpha_target");
/// Index of the `alpha_speed` head.
pub const ALPHA_SPEED: usize = position("alpha_speed");
/// Index of the `alpha_curve` head.
pub const ALPHA_CURVE: usize = position("alpha_curve");
/// Index of the `op` head.
pub const OP: usize = position("op");

const _: () = assert!(
    SLOT < NUM_ACTION_HEADS
        && BLUEPRINT < NUM_ACTION_HEADS
        && STYLE < NUM_ACTION_HEADS
        && TEMPO < NUM_ACTION_HEADS
        && ALPHA_TARGET < NUM_ACTION_HEADS
        && ALPHA_SPEED < NUM_ACTION_HEADS
        && ALPHA_CURVE < NUM_ACTION_HEADS
        && OP < NUM_ACTION_HEADS,
    "a head name is missing from leyline's HEAD_NAMES"
);

/// Number of options of head `head` with `num_slots` slots (`None` for an
/// index past the last head).
pub fn head_size(head: usize, num_slots: usize) -> Option<usize> {
    if head == SLOT {
        Some(num_slots)
    } else {
        ACTION_HEADS.get(head).map(|spec| spec.size)
    }
}

/// The sizes of every head, in [`HEAD_NAMES`] order.
pub fn head_sizes(num_slots: usize) -> [usize; NUM_ACTION_HEADS] {
    let mut sizes = [0; NUM_ACTION_HEADS];
    for (head, size) in sizes.iter_mut().enumerate() {
        *size = head_size(head, num_slots).unwrap_or(0);
    }
    sizes
}

/// Which heads causally matter for `op`, in [`HEAD_NAMES`] order
/// (leyline's table, reference §3.1).
pub fn relevance(op: LifecycleOp) -> [bool; NUM_ACTION_HEADS] {
    op.relevant_heads()
}

/// How many heads matter for `op` (1 for WAIT: the op head alone).
pub fn relevant_head_count(op: LifecycleOp) -> usize {
    relevance(op).iter().filter(|&&relevant| relevant).count()
}

/// The action a head is forced to when it does not matter for the chosen op
/// (reference §3.1 sampling): blueprint NOOP, style SIGMOID_ADD, tempo
/// STANDARD, alpha target FULL, speed INSTANT, curve LINEAR. `None` for the
/// slot head (forced to the first allowed slot, which depends on the masks)
/// and the op head (always chosen).
pub fn canonical_action(head: usize) -> Option<i64> {
    let value = match head {
        BLUEPRINT => BlueprintAction::Noop.value(),
        STYLE => GerminationStyle::SigmoidAdd.value(),
        TEMPO => TempoAction::Standard.value(),
        ALPHA_TARGET => AlphaTargetAction::Full.value(),
        ALPHA_SPEED => AlphaSpeedAction::Instant.value(),
        ALPHA_CURVE => AlphaCurveAction::Linear.value(),
        _ => return None,
    };
    Some(i64::from(value))
}

/// One factored action: a value for every head, as leyline enums (the index
/// of an option is its contract value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FactoredAction {
    /// Slot position in the observation's slot order.
    pub slot: usize,
    /// Blueprint (meaningful for GERMINATE).
    pub blueprint: BlueprintAction,
    /// Germination style.
    pub style: GerminationStyle,
    /// Blend tempo.
    pub tempo: TempoAction,
    /// Alpha target.
    pub alpha_target: AlphaTargetAction,
    /// Alpha speed.
    pub alpha_speed: AlphaSpeedAction,
    /// Alpha curve.
    pub alpha_curve: AlphaCurveAction,
    /// The lifecycle op.
    pub op: LifecycleOp,
}

fn enum_value(head: usize, indices: &[i64; NUM_ACTION_HEADS]) -> Result<i32> {
    let value = indices.get(head).copied().unwrap_or(-1);
    i32::try_from(value).map_err(|_| Error::InvalidInput {
        field: "action index",
        reason: format!("{value} for head {}", HEAD_NAMES.get(head).unwrap_or(&"?")),
    })
}

impl FactoredAction {
    /// The action from one index per head ([`HEAD_NAMES`] order); the slot
    /// index must be below `num_slots`, every other index a value of its
    /// head's enum.
    pub fn from_indices(
        indices: &[i64; NUM_ACTION_HEADS],
        num_slots: usize,
    ) -> Result<FactoredAction> {
        let slot = indices.get(SLOT).copied().unwrap_or(-1);
        let slot = usize::try_from(slot)
            .ok()
            .filter(|slot| *slot < num_slots)
            .ok_or_else(|| Error::InvalidInput {
                field: "action.slot",
                reason: format!("{slot} is not a slot index below {num_slots}"),
            })?;
        Ok(FactoredAction {
            slot,
            blueprint: BlueprintAction::from_value(enum_value(BLUEPRINT, indices)?)?,
            style: GerminationStyle::from_value(enum_value(STYLE, indices)?)?,
            tempo: TempoAction::from_value(enum_value(TEMPO, indices)?)?,
            alpha_target: AlphaTargetAction::from_value(enum_value(ALPHA_TARGET, indices)?)?,
            alpha_speed: AlphaSpeedAction::from_value(enum_value(ALPHA_SPEED, indices)?)?,
            alpha_curve: AlphaCurveAction::from_value(enum_value(ALPHA_CURVE, indices)?)?,
            op: LifecycleOp::from_value(enum_value(OP, indices)?)?,
        })
    }

    /// One index per head, in [`HEAD_NAMES`] order.
    pub fn indices(&self) -> [i64; NUM_ACTION_HEADS] {
        let mut out = [0; NUM_ACTION_HEADS];
        for (head, value) in out.iter_mut().enumerate() {
            *value = match head {
                SLOT => i64::try_from(self.slot).unwrap_or(i64::MAX),
                BLUEPRINT => i64::from(self.blueprint.value()),
                STYLE => i64::from(self.style.value()),
                TEMPO => i64::from(self.tempo.value()),
                ALPHA_TARGET => i64::from(self.alpha_target.value()),
                ALPHA_SPEED => i64::from(self.alpha_speed.value()),
                ALPHA_CURVE => i64::from(self.alpha_curve.value()),
                _ => i64::from(self.op.value()),
            };
        }
        out
    }
}
