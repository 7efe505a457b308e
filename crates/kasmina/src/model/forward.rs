//! The morphogenetic model's forward pass: one walk over the host segments
//! and the enabled slots, in execution order.
//!
//! Every public forward ([`MorphogeneticModel::forward`],
//! [`MorphogeneticModel::forward_with_alpha`],
//! [`MorphogeneticModel::forward_tapped`] and
//! [`MorphogeneticModel::forward_from`]) is this one walk: from a start
//! boundary the host runs up to the next active slot's boundary, the slot is
//! applied (with its per-sample alpha override, if any), and after the last
//! active slot the host runs to the logits. Where the host's next segment
//! is a 2x2 max-pool ([`crate::host::Host::pools_after`]), the slot's blend
//! and that pool run as one node and the host resumes after the pool (not
//! in the replicated walk). The first three start at the
//! input (boundary 0); [`MorphogeneticModel::forward_from`] starts at a
//! later boundary with host activations the caller computed, which lets a
//! caller run the host prefix once and reuse it (the counterfactual pass
//! runs it once for every alpha configuration).

use tch::Tensor;

use super::MorphogeneticModel;
use crate::host::SlotId;
use crate::{Error, Result};

impl MorphogeneticModel {
    /// The forward pass. `train` selects batch statistics in the host.
    ///
    /// # Shapes
    /// `[B, ...host input] -> [B, classes]`.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_with_alpha(x, &[], train)
    }

    /// The forward pass with per-sample alpha overrides: `overrides[i]`
    /// (`[B, 1, 1, 1]` on CNN hosts, `[B, 1, 1]` on transformers) replaces
    /// slot `i`'s alpha (execution order); a missing or `None` entry keeps
    /// the slot's own alpha. Overrides bypass the incubator (see
    /// [`crate::slot::SeedSlot::forward`]). More overrides than slots are an
    /// error.
    pub fn forward_with_alpha(
        &self,
        x: &Tensor,
        overrides: &[Option<&Tensor>],
        train: bool,
    ) -> Result<Tensor> {
        self.check_overrides("forward_with_alpha.overrides", overrides)?;
        self.forward_walk(x, 0, overrides, train, Walk::Plain(None))
    }

    /// [`MorphogeneticModel::forward_with_alpha`] that also returns the
    /// gradient taps of the seeds whose branch feeds the host gradient (see
    /// [`crate::slot::SeedSlot::forward_tapped`]): one `(slot, tap)` per
    /// live, non-isolated seed on the forward path, in execution order. With
    /// gradient isolation (CNN hosts) the list is empty.
    pub fn forward_tapped(
        &self,
        x: &Tensor,
        overrides: &[Option<&Tensor>],
        train: bool,
    ) -> Result<(Tensor, Vec<(SlotId, Tensor)>)> {
        self.check_overrides("forward_with_alpha.overrides", overrides)?;
        let mut taps = Vec::new();
        let logits = self.forward_walk(x, 0, overrides, train, Walk::Plain(Some(&mut taps)))?;
        Ok((logits, taps))
    }

    /// The host boundary of the first seed on the forward path, or the
    /// logits' boundary (`host().num_segments()`) when no seed is active:
    /// the latest boundary [`MorphogeneticModel::forward_from`] accepts.
    /// Everything before it is the host alone, whatever the alphas.
    pub fn first_active_boundary(&self) -> usize {
        self.slots
            .iter()
            .find(|slot| slot.is_active())
            .map_or(self.host.num_segments(), |slot| slot.spec().boundary)
    }

    /// The rest of the forward pass from host activations at `boundary`:
    /// given `features = host().forward_segment(x, 0, boundary, train)`, it
    /// returns what [`MorphogeneticModel::forward_with_alpha`]`(x,
    /// overrides, train)` returns (the same walk, from `boundary`). A slot
    /// sitting exactly at `boundary` is applied to `features`.
    ///
    /// `boundary` must be at most [`MorphogeneticModel::first_active_boundary`]
    /// (a later start would skip a seed): a larger one is
    /// [`Error::OutOfRange`], as are more overrides than slots. `features`
    /// are shape-checked by the host at `boundary` and the overrides by each
    /// slot against the features (their batch is `features`' batch), before
    /// libtorch sees them ([`Error::ShapeMismatch`]).
    ///
    /// Reusing one prefix for several batches (replicated along the batch,
    /// each copy with its own overrides) gives each copy exactly its own
    /// forward only in evaluation mode (`train == false`): in training mode
    /// BatchNorm's batch statistics depend on the whole batch.
    ///
    /// # Shapes
    /// `[B, ...activation at boundary] -> [B, classes]` (CNN hosts) or
    /// `[B, T, vocab]` (transformer hosts); overrides as in
    /// [`MorphogeneticModel::forward_with_alpha`].
    pub fn forward_from(
        &self,
        features: &Tensor,
        boundary: usize,
        overrides: &[Option<&Tensor>],
        train: bool,
    ) -> Result<Tensor> {
        self.check_start("forward_from.boundary", boundary)?;
        self.check_overrides("forward_from.overrides", overrides)?;
        self.forward_walk(features, boundary, overrides, train, Walk::Plain(None))
    }

    /// [`MorphogeneticModel::forward_from`] on `replicas` copies of
    /// `features` stacked along the batch (block `k` is copy `k`, each with
    /// its own rows of the `[replicas·B, …]` overrides): what
    /// `forward_from(&features.repeat([replicas, 1, …]), boundary,
    /// overrides, train)` returns, with the host's segments up to the first
    /// active seed and that seed itself run once, on `features`
    /// ([`crate::slot::SeedSlot::forward_replicated`]); the copies are made at that seed
    /// (at the logits when no seed is active). Evaluation mode only
    /// (`train == false`): in training mode BatchNorm's batch statistics
    /// would see one copy, not all of them, so that is refused.
    ///
    /// # Shapes
    /// `[B, ...activation at boundary] -> [replicas·B, classes]` (CNN
    /// hosts) or `[replicas·B, T, vocab]` (transformer hosts).
    pub fn forward_from_replicated(
        &self,
        features: &Tensor,
        replicas: i64,
        boundary: usize,
        overrides: &[Option<&Tensor>],
        train: bool,
    ) -> Result<Tensor> {
        if train {
            return Err(Error::InvalidConfig {
                reason: "forward_from_replicated: evaluation mode only (train must be false)"
                    .to_owned(),
            });
        }
        self.check_start("forward_from_replicated.boundary", boundary)?;
        if replicas < 1 {
            return Err(Error::OutOfRange {
                field: "forward_from_replicated.replicas",
                value: replicas.to_string(),
                allowed: "at least 1".to_owned(),
            });
        }
        self.check_overrides("forward_from_replicated.overrides", overrides)?;
        self.forward_walk(
            features,
            boundary,
            overrides,
            train,
            Walk::Replicated(replicas),
        )
    }

    /// A start `boundary` the walk may take: a host boundary at or before
    /// the first seed on the forward path (a later one would skip it).
    fn check_start(&self, field: &'static str, boundary: usize) -> Result<()> {
        let segments = self.host.num_segments();
        if boundary > segments {
            return Err(Error::OutOfRange {
                field,
                value: boundary.to_string(),
                allowed: format!("[0, {segments}] (the host's boundaries)"),
            });
        }
        let first_active = self.first_active_boundary();
        if boundary > first_active {
            return Err(Error::OutOfRange {
                field,
                value: boundary.to_string(),
                allowed: format!(
                    "[0, {first_active}] (at or before the first seed on the forward path)"
                ),
            });
        }
        Ok(())
    }

    /// At most one override per enabled slot.
    fn check_overrides(&self, field: &'static str, overrides: &[Option<&Tensor>]) -> Result<()> {
        if overrides.len() > self.slots.len() {
            return Err(Error::OutOfRange {
                field,
                value: format!("{} overrides", overrides.len()),
                allowed: format!("at most one per enabled slot ({})", self.slots.len()),
            });
        }
        Ok(())
    }

    /// The walk from `start` (at or before the first active slot; checked
    /// by the callers) to the logits: collecting gradient taps when `walk`
    /// gives their list, or making `walk`'s copies at the first active
    /// slot (at the logits when none is active).
    fn forward_walk(
        &self,
        features: &Tensor,
        start: usize,
        overrides: &[Option<&Tensor>],
        train: bool,
        mut walk: Walk<'_>,
    ) -> Result<Tensor> {
        let mut boundary = start;
        let mut features = features.shallow_clone();
        for (index, slot) in self.slots.iter().enumerate() {
            if !slot.is_active() {
                continue;
            }
            let target = slot.spec().boundary;
            features = self
                .host
                .forward_segment(&features, boundary, target, train)?;
            let alpha_override = overrides.get(index).copied().flatten();
            let mut pooled = false;
            features = match &mut walk {
                Walk::Replicated(replicas) => {
                    let copies = *replicas;
                    walk = Walk::Plain(None);
                    slot.forward_replicated(&features, copies, alpha_override)?
                }
                Walk::Plain(taps) => {
                    // A pool right after the slot runs with its blend.
                    pooled = self.host.pools_after(target);
                    let (output, tap) = slot.forward_tapped_then(
                        &features,
                        alpha_override,
                        taps.is_some(),
                        pooled,
                    )?;
                    if let (Some(taps), Some(tap)) = (taps.as_deref_mut(), tap) {
                        taps.push((slot.id(), tap));
                    }
                    output
                }
            };
            boundary = if pooled { target + 1 } else { target };
        }
        let logits =
            self.host
                .forward_segment(&features, boundary, self.host.num_segments(), train)?;
        match walk {
            Walk::Replicated(replicas) => crate::blend::replicate_batch(&logits, replicas),
            Walk::Plain(_) => Ok(logits),
        }
    }
}

/// How `MorphogeneticModel::forward_walk` treats the batch: as it is
/// (collecting gradient taps into the list when given one), or copied
/// `n` times at the first active slot, whose seed runs once.
enum Walk<'a> {
    Plain(Option<&'a mut Vec<(SlotId, Tensor)>>),
    Replicated(i64),
}
