//! Seed masks: which ranges of the flattened parameter vector belong to the
//! host and to each seed (for Tolaria's gradient aggregation).
//!
//! Parameter order (the one [`crate::model::MorphogeneticModel::parameters`]
//! returns, and the order a flattened gradient must follow): first the host's
//! trainable parameters sorted by `VarStore` name, then, for each enabled
//! slot in execution order that holds a live seed, that seed's trainable
//! parameters (module, then gate network; together sorted by name). Each
//! tensor contributes `numel` consecutive elements. Buffers (BatchNorm running
//! statistics) are not parameters and are not in the vector. Frozen
//! parameters (blend-out freeze) stay in place, so the layout changes only
//! when a seed germinates or leaves.
//!
//! [`SeedMasks::to_tensor`] accepts any mask, including hand-built ones: a
//! range outside the layout, or a layout of more than `MAX_MASK_ELEMENTS`
//! elements, is an error, never an out-of-bounds index or a huge host
//! allocation.

#![warn(clippy::arithmetic_side_effects)]

use std::collections::HashSet;
use std::ops::Range;

use tch::{Device, Kind, Tensor, nn};

use crate::validate::MAX_PARAMETERS;
use crate::{Error, Result};

/// Largest flattened layout [`SeedMasks::to_tensor`] builds (host plus
/// seeds, each at most `MAX_PARAMETERS`): `4 MAX_PARAMETERS`.
pub const MAX_MASK_ELEMENTS: i64 = 4 * MAX_PARAMETERS;

/// The trainable variables of `var_store`, sorted by name.
pub fn trainable_parameters(var_store: &nn::VarStore) -> Vec<(String, Tensor)> {
    let trainable: HashSet<usize> = var_store
        .trainable_variables()
        .iter()
        .map(|tensor| tensor.data_ptr() as usize)
        .collect();
    let mut named: Vec<(String, Tensor)> = var_store
        .variables()
        .into_iter()
        .filter(|(_, tensor)| trainable.contains(&(tensor.data_ptr() as usize)))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// One named tensor's place in the flattened vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamRange {
    /// `VarStore` name.
    pub name: String,
    /// Element range.
    pub range: Range<usize>,
}

/// The ranges one owner (host or seed) holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerMask {
    /// `host`, or the slot id (`r0c1`).
    pub owner: String,
    /// Seed id, for seeds.
    pub seed_id: Option<String>,
    /// One range per tensor, in order; they are contiguous.
    pub ranges: Vec<ParamRange>,
}

impl OwnerMask {
    /// Elements owned.
    pub fn numel(&self) -> usize {
        self.ranges.iter().map(|r| r.range.len()).sum()
    }

    /// The covering range (owners are contiguous).
    pub fn span(&self) -> Range<usize> {
        match (self.ranges.first(), self.ranges.last()) {
            (Some(first), Some(last)) => first.range.start..last.range.end,
            _ => 0..0,
        }
    }
}

/// One owner's parameters for [`SeedMasks::layout`]: owner name, seed id,
/// named tensors in order.
pub(crate) type OwnerParameters = (String, Option<String>, Vec<(String, Tensor)>);

/// The whole layout: host first, then one mask per live seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedMasks {
    /// Total elements in the flattened vector.
    pub total: usize,
    /// Host ranges.
    pub host: OwnerMask,
    /// Seed ranges, in slot execution order.
    pub seeds: Vec<OwnerMask>,
}

impl SeedMasks {
    /// Lays out `owners` (`(owner, seed_id, parameters)`, host first) in order.
    pub(crate) fn layout(owners: Vec<OwnerParameters>) -> SeedMasks {
        let mut offset: usize = 0;
        let mut masks = Vec::with_capacity(owners.len());
        for (owner, seed_id, parameters) in owners {
            let ranges = parameters
                .iter()
                .map(|(name, tensor)| {
                    let start = offset;
                    // Element counts of tensors that exist in memory: their
                    // sum cannot reach usize::MAX.
                    offset = offset.saturating_add(tensor.numel());
                    ParamRange {
                        name: name.clone(),
                        range: start..offset,
                    }
                })
                .collect();
            masks.push(OwnerMask {
                owner,
                seed_id,
                ranges,
            });
        }
        let mut masks = masks.into_iter();
        let host = masks.next().unwrap_or(OwnerMask {
            owner: "host".to_owned(),
            seed_id: None,
            ranges: Vec::new(),
        });
        SeedMasks {
            total: offset,
            host,
            seeds: masks.collect(),
        }
    }

    /// The mask of the seed in `slot`, if it has one.
    pub fn seed(&self, slot: &str) -> Option<&OwnerMask> {
        self.seeds.iter().find(|mask| mask.owner == slot)
    }

    /// A boolean tensor `[total]` on `device`, true on the elements `mask`
    /// owns. Every range must lie within `0..total` and `total` be at most
    /// `MAX_MASK_ELEMENTS` ([`Error::OutOfRange`] otherwise).
    pub fn to_tensor(&self, mask: &OwnerMask, device: Device) -> Result<Tensor> {
        let total = i64::try_from(self.total)
            .ok()
            .filter(|total| *total <= MAX_MASK_ELEMENTS)
            .ok_or_else(|| Error::OutOfRange {
                field: "SeedMasks.total",
                value: self.total.to_string(),
                allowed: format!("[0, {MAX_MASK_ELEMENTS}]"),
            })?;
        let mut spans = Vec::with_capacity(mask.ranges.len());
        for range in &mask.ranges {
            let span = &range.range;
            let fits = span.start <= span.end && span.end <= self.total;
            // Both ends are at most `total`, which fits i64 (checked above).
            let start = i64::try_from(span.start).ok().filter(|_| fits);
            let end = i64::try_from(span.end).ok().filter(|_| fits);
            let (Some(start), Some(end)) = (start, end) else {
                return Err(Error::OutOfRange {
                    field: "OwnerMask.ranges",
                    value: format!("{} {:?}", range.name, span),
                    allowed: format!("ranges within 0..{}", self.total),
                });
            };
            spans.push((start, end.saturating_sub(start)));
        }
        let values = Tensor::f_zeros([total].as_slice(), (Kind::Bool, device))?;
        for (start, length) in spans {
            if length > 0 {
                let mut owned = values.f_narrow(0, start, length)?;
                let _filled = owned.f_fill_(1)?;
            }
        }
        Ok(values)
    }
}
