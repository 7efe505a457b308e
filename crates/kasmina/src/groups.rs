//! Parameter groups: what the trainer's optimizers train, and the events
//! that tell it when a group appears or goes.
//!
//! Kasmina owns no optimizer (the trainer does: `tolaria::optim`). It says
//! which parameters exist and who they belong to:
//!
//! - [`crate::model::MorphogeneticModel::parameter_groups`] lists one
//!   [`ParamGroup`] for the host ([`GroupKey::Host`]) and one per live seed
//!   ([`GroupKey::Seed`], keyed by its slot), each with its trainable tensors
//!   (shallow handles, sorted by name).
//! - Every operation that creates or frees seed parameters records a
//!   [`GroupEvent`]: germination records `Added(Seed(slot))` once the module
//!   is in the slot; whatever frees the module records `Removed(Seed(slot))`
//!   (a prune, a scheduled prune reaching alpha 0, an automatic prune inside
//!   `step_epoch`). The embargo and reset that follow a prune free nothing
//!   more (the module went at the prune), so they record nothing. Building a
//!   model records `Added(Host)`.
//!
//! **Queued, not returned.** Events are queued in each slot, in the order
//! they happened, and the caller drains them
//! ([`crate::model::MorphogeneticModel::drain_group_events`], or
//! [`crate::slot::SeedSlot::drain_group_events`] for a lone slot). A queue
//! because groups also change inside calls whose result means something
//! else (`step_epoch` can prune, `schedule_prune` returns what it did) and
//! because one call can touch several slots: returning events from every
//! call would let a caller that ignores one result lose a group change. The
//! trainer drains once before each optimizer step (outside any captured
//! graph) and applies the events in order; events of different slots are
//! independent, and per slot the order is kept (`Removed` then `Added` after
//! a re-germination gives fresh state for the new seed).
//!
//! **Fossilize keeps the group.** A FOSSILIZED seed keeps its own group and
//! keeps training with its own optimizer state, as in the reference ("each
//! seed has its own SGD optimiser … dropped when the slot becomes empty.
//! Seeds keep training through FOSSILIZED"): fossilizing records no event
//! and a fossil is never pruned, so its group lasts as long as the model.
//! The blend-out freeze does not change groups either: frozen parameters
//! stay in their group and simply receive no gradient.

use tch::Tensor;

use crate::host::SlotId;

/// Who a parameter group belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKey {
    /// The host network.
    Host,
    /// The seed in this slot.
    Seed(SlotId),
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupKey::Host => f.write_str("host"),
            GroupKey::Seed(slot) => write!(f, "seed {slot}"),
        }
    }
}

/// One group's trainable parameters.
#[derive(Debug)]
pub struct ParamGroup {
    /// Whose parameters these are.
    pub key: GroupKey,
    /// `VarStore` names, sorted, one per tensor.
    pub names: Vec<String>,
    /// The parameters (shallow handles to the variables), in `names` order.
    pub tensors: Vec<Tensor>,
}

impl ParamGroup {
    /// A group from `(name, tensor)` pairs (kept in the order given).
    pub fn new(key: GroupKey, parameters: Vec<(String, Tensor)>) -> ParamGroup {
        let (names, tensors) = parameters.into_iter().unzip();
        ParamGroup {
            key,
            names,
            tensors,
        }
    }

    /// Number of elements over all tensors.
    pub fn element_count(&self) -> i64 {
        crate::validate::element_count(&self.tensors)
    }
}

/// A parameter group appeared or went (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupEvent {
    /// The group exists now: build its optimizer state.
    Added(GroupKey),
    /// The group's parameters are gone: drop its optimizer state.
    Removed(GroupKey),
}

impl GroupEvent {
    /// The group the event is about.
    pub fn key(self) -> GroupKey {
        match self {
            GroupEvent::Added(key) | GroupEvent::Removed(key) => key,
        }
    }
}
