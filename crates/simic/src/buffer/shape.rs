//! A buffer's sizes ([`BufferShape`]) and the limits they are checked
//! against before anything is allocated.

use crate::{Error, Result};
use leyline::NUM_ACTION_HEADS;

/// Sizes of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferShape {
    /// Environments (rows).
    pub n_envs: usize,
    /// Steps per environment per round (columns).
    pub max_steps: usize,
    /// Observation width.
    pub obs_dim: usize,
    /// Slots of every environment.
    pub num_slots: usize,
}

/// Most transitions (`n_envs · max_steps`) a buffer holds.
pub const MAX_TRANSITIONS: usize = 1 << 24;

/// Most elements of any one of a buffer's tensors or host lists
/// (`n_envs · max_steps · width`, the widest being the observations or the
/// `ops × slots` mask).
pub const MAX_ELEMENTS: usize = 1 << 28;

impl BufferShape {
    /// Checks the sizes: each at least 1, at most [`MAX_TRANSITIONS`]
    /// transitions, at most [`MAX_ELEMENTS`] elements in any one tensor
    /// (checked before anything is allocated: an absurd shape is a typed
    /// error, not an allocation failure).
    pub fn check(&self) -> Result<()> {
        for (field, value) in [
            ("BufferShape.n_envs", self.n_envs),
            ("BufferShape.max_steps", self.max_steps),
            ("BufferShape.obs_dim", self.obs_dim),
            ("BufferShape.num_slots", self.num_slots),
        ] {
            if value == 0 || i64::try_from(value).is_err() {
                return Err(Error::InvalidConfig {
                    field,
                    reason: format!("{value}; must be at least 1 and fit i64"),
                });
            }
        }
        let transitions = self
            .n_envs
            .checked_mul(self.max_steps)
            .filter(|&cells| cells <= MAX_TRANSITIONS)
            .ok_or_else(|| Error::InvalidConfig {
                field: "BufferShape.max_steps",
                reason: format!(
                    "{} environments × {} steps is more than {MAX_TRANSITIONS} transitions",
                    self.n_envs, self.max_steps
                ),
            })?;
        let widest = self
            .obs_dim
            .max(tamiyo::features::NUM_OPS.saturating_mul(self.num_slots))
            .max(NUM_ACTION_HEADS);
        let fits = transitions
            .checked_mul(widest)
            .is_some_and(|elements| elements <= MAX_ELEMENTS)
            && tamiyo::heads::head_sizes(self.num_slots)
                .iter()
                .all(|&size| {
                    transitions
                        .checked_mul(size)
                        .is_some_and(|elements| elements <= MAX_ELEMENTS)
                });
        if !fits {
            return Err(Error::InvalidConfig {
                field: "BufferShape.obs_dim",
                reason: format!(
                    "{transitions} transitions of width up to {widest} is more than \
                     {MAX_ELEMENTS} elements in one tensor"
                ),
            });
        }
        Ok(())
    }
}
