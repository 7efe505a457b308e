//! [`MaskTensors`]: the masks of a batch of environments as boolean device
//! tensors, built from [`ActionMasks`] or gathered tensors, and their checks.

use leyline::{HEAD_NAMES, LifecycleOp, NUM_ACTION_HEADS};
use tch::{Device, Kind, Tensor};

use super::ActionMasks;
use crate::error::{TorchResultExt, shape_mismatch};
use crate::features::batch::MAX_ENVS;
use crate::features::{MAX_SLOTS, NUM_OPS};
use crate::heads::{OP, SLOT, head_sizes};
use crate::{Error, Result};

/// The masks of a batch of environments as boolean device tensors.
#[derive(Debug)]
pub struct MaskTensors {
    /// One `[n_envs, head size]` mask per head, [`HEAD_NAMES`] order.
    pub heads: [Tensor; NUM_ACTION_HEADS],
    /// `[n_envs, NUM_OPS, num_slots]`.
    pub slot_by_op: Tensor,
}

/// Bytes in one environment's packed row of masks with `num_slots` slots:
/// every head's options, then `slot_by_op`.
pub(crate) fn packed_row_width(num_slots: usize) -> usize {
    let heads: usize = head_sizes(num_slots).iter().sum();
    heads.saturating_add(NUM_OPS.saturating_mul(num_slots))
}

/// Checks `masks` (one per environment, all with the same slot count, at
/// most [`MAX_ENVS`]) on the host and packs them, row after row, as bytes
/// (0 or 1) in the layout of [`MaskTensors::from_packed`]. Returns the slot
/// count and the bytes.
pub(crate) fn pack_masks(masks: &[ActionMasks]) -> Result<(usize, Vec<u8>)> {
    let first = masks
        .first()
        .ok_or_else(|| shape_mismatch("MaskTensors.from_masks", "at least one", 0))?;
    let num_slots = first.num_slots();
    if let Some(other) = masks.iter().find(|mask| mask.num_slots() != num_slots) {
        return Err(shape_mismatch(
            "MaskTensors.from_masks.slots",
            num_slots,
            other.num_slots(),
        ));
    }
    if masks.len() > MAX_ENVS {
        return Err(shape_mismatch(
            "MaskTensors.from_masks",
            format!("at most {MAX_ENVS} environments"),
            masks.len(),
        ));
    }
    for (row, mask) in masks.iter().enumerate() {
        mask.check_row(row)?;
    }
    let expected = masks.len().saturating_mul(packed_row_width(num_slots));
    let mut bytes = Vec::with_capacity(expected);
    for mask in masks {
        for head in 0..NUM_ACTION_HEADS {
            bytes.extend(mask.head(head).iter().map(|&allowed| u8::from(allowed)));
        }
        bytes.extend(
            mask.slot_by_op
                .iter()
                .flatten()
                .map(|&allowed| u8::from(allowed)),
        );
    }
    if bytes.len() != expected {
        return Err(shape_mismatch(
            "MaskTensors.from_masks",
            expected,
            bytes.len(),
        ));
    }
    Ok((num_slots, bytes))
}

impl MaskTensors {
    /// Stacks `masks` (one per environment, all with the same slot count)
    /// on `device`, in one host-to-device copy: every head's mask and
    /// `slot_by_op` are views of one packed `[n_envs, total]` tensor.
    ///
    /// Every environment's masks are checked on the host first
    /// ([`ActionMasks::check`]): an all-false row of any head, or an allowed
    /// op without a slot, is [`Error::EmptyMask`] naming the head and the
    /// environment's row, and nothing is built.
    pub fn from_masks(masks: &[ActionMasks], device: Device) -> Result<MaskTensors> {
        let (num_slots, bytes) = pack_masks(masks)?;
        let rows = i64::try_from(masks.len()).unwrap_or(i64::MAX);
        let row_width = i64::try_from(packed_row_width(num_slots)).unwrap_or(i64::MAX);
        let packed = Tensor::f_from_slice(&bytes)
            .op("mask from host")?
            .f_view([rows, row_width])
            .op("mask view")?
            .f_to_kind(Kind::Bool)
            .op("mask to bool")?
            .f_to_device(device)
            .op("mask to device")?;
        MaskTensors::from_packed(&packed, num_slots)
    }

    /// The masks as views of one packed boolean `[n_envs, total]` tensor
    /// (every head's columns in [`HEAD_NAMES`] order, then `slot_by_op`
    /// flattened), the layout [`MaskTensors::from_masks`] uploads.
    pub(crate) fn from_packed(packed: &Tensor, num_slots: usize) -> Result<MaskTensors> {
        let width = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let rows = packed.size().first().copied().unwrap_or(0);
        let sizes = head_sizes(num_slots);
        let mut heads = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut offset = 0_i64;
        for size in sizes {
            heads.push(packed.f_narrow(1, offset, width(size)).op("mask view")?);
            offset = offset.saturating_add(width(size));
        }
        let slot_by_op = packed
            .f_narrow(1, offset, width(NUM_OPS.saturating_mul(num_slots)))
            .op("mask view")?
            .f_view([rows, width(NUM_OPS), width(num_slots)])
            .op("mask view")?;
        let heads: [Tensor; NUM_ACTION_HEADS] = heads
            .try_into()
            .map_err(|_| shape_mismatch("MaskTensors.heads", NUM_ACTION_HEADS, "fewer"))?;
        Ok(MaskTensors { heads, slot_by_op })
    }

    /// Masks that allow everything (every op on every slot), for
    /// `n_envs` (`1..=MAX_ENVS`) environments with `num_slots`
    /// (`1..=MAX_SLOTS`) slots: never an empty row.
    pub fn allow_all(n_envs: usize, num_slots: usize, device: Device) -> Result<MaskTensors> {
        if !(1..=MAX_ENVS).contains(&n_envs) {
            return Err(Error::InvalidConfig {
                field: "MaskTensors.allow_all.n_envs",
                reason: format!("{n_envs} is outside [1, {MAX_ENVS}]"),
            });
        }
        if !(1..=MAX_SLOTS).contains(&num_slots) {
            return Err(Error::InvalidConfig {
                field: "MaskTensors.allow_all.num_slots",
                reason: format!("{num_slots} is outside [1, {MAX_SLOTS}]"),
            });
        }
        let rows = i64::try_from(n_envs).unwrap_or(i64::MAX);
        let width = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let mut heads = Vec::with_capacity(NUM_ACTION_HEADS);
        for size in head_sizes(num_slots) {
            heads.push(Tensor::f_ones([rows, width(size)], (Kind::Bool, device)).op("mask ones")?);
        }
        let heads: [Tensor; NUM_ACTION_HEADS] = heads
            .try_into()
            .map_err(|_| shape_mismatch("MaskTensors.heads", NUM_ACTION_HEADS, "fewer"))?;
        Ok(MaskTensors {
            heads,
            slot_by_op: Tensor::f_ones(
                [rows, width(NUM_OPS), width(num_slots)],
                (Kind::Bool, device),
            )
            .op("mask ones")?,
        })
    }

    /// Masks from boolean tensors built elsewhere (e.g. rows gathered from
    /// a rollout buffer): `heads` `[n_envs, head size]` per head and
    /// `slot_by_op` `[n_envs, NUM_OPS, num_slots]`, all on one device. The
    /// shapes are checked, then the values ([`MaskTensors::check_rows`]:
    /// one read-back, so not inside a CUDA graph capture).
    pub fn from_tensors(
        heads: [Tensor; NUM_ACTION_HEADS],
        slot_by_op: Tensor,
    ) -> Result<MaskTensors> {
        let size = slot_by_op.size();
        let (n_envs, num_slots) = match size.as_slice() {
            [rows, ops, slots]
                if *rows >= 1
                    && usize::try_from(*ops).ok() == Some(NUM_OPS)
                    && usize::try_from(*slots).is_ok_and(|s| (1..=MAX_SLOTS).contains(&s)) =>
            {
                (*rows, usize::try_from(*slots).unwrap_or(0))
            }
            _ => {
                return Err(shape_mismatch(
                    "MaskTensors.slot_by_op",
                    format!("[n >= 1, {NUM_OPS}, 1..={MAX_SLOTS}]"),
                    size,
                ));
            }
        };
        let masks = MaskTensors { heads, slot_by_op };
        masks.check_shapes(n_envs, num_slots, masks.slot_by_op.device())?;
        masks.check_rows()?;
        Ok(masks)
    }

    /// Checks the values: in every row, every head allows at least one
    /// option and every op the op head allows has a slot in `slot_by_op`
    /// ([`Error::EmptyMask`] naming the first head and row that does not).
    /// Reads one flag back from the masks' device (more only to name a
    /// failure): not for a CUDA graph capture. Masks from
    /// [`MaskTensors::from_masks`], [`MaskTensors::allow_all`] and
    /// [`MaskTensors::from_tensors`] pass by construction; masks assembled
    /// from the public fields are checked here, and on the CPU at every use
    /// ([`MaskTensors::check`]).
    pub fn check_rows(&self) -> Result<()> {
        let what = "mask row check";
        let mut empty = Vec::with_capacity(NUM_ACTION_HEADS.saturating_add(1));
        for mask in &self.heads {
            empty.push(
                mask.f_any_dim(1, false)
                    .op(what)?
                    .f_logical_not()
                    .op(what)?
                    .f_unsqueeze(1)
                    .op(what)?,
            );
        }
        let op_mask = self
            .heads
            .get(OP)
            .ok_or_else(|| shape_mismatch("MaskTensors.heads", NUM_ACTION_HEADS, "fewer"))?;
        // An allowed op whose `slot_by_op` row is all false.
        let slotless = self
            .slot_by_op
            .f_any_dim(2, false)
            .op(what)?
            .f_logical_not()
            .op(what)?
            .f_logical_and(op_mask)
            .op(what)?;
        empty.push(slotless);
        let bad = Tensor::f_cat(&empty, 1).op(what)?;
        let any_bad = bad
            .f_any()
            .op(what)?
            .f_to_device(Device::Cpu)
            .op(what)?
            .f_int64_value(&[])
            .op(what)?;
        if any_bad == 0 {
            return Ok(());
        }
        let first = bad
            .f_nonzero()
            .op(what)?
            .f_to_device(Device::Cpu)
            .op(what)?
            .f_select(0, 0)
            .op(what)?;
        let first = Vec::<i64>::try_from(&first).op(what)?;
        let (row, column) = match first.as_slice() {
            [row, column] => (
                usize::try_from(*row).unwrap_or(0),
                usize::try_from(*column).unwrap_or(0),
            ),
            _ => (0, 0),
        };
        let slot_head = HEAD_NAMES.get(SLOT).copied().unwrap_or("slot");
        Err(match column.checked_sub(NUM_ACTION_HEADS) {
            None => Error::EmptyMask {
                head: HEAD_NAMES.get(column).copied().unwrap_or("?"),
                op: None,
                row,
            },
            Some(op) => Error::EmptyMask {
                head: slot_head,
                op: LifecycleOp::ALL.get(op).copied(),
                row,
            },
        })
    }

    /// Checks the shapes for `n_envs` environments with `num_slots` slots
    /// (boolean masks on `device`), and, for masks on the CPU (host memory:
    /// no device synchronisation), the values too
    /// ([`MaskTensors::check_rows`]). Masks on CUDA are not read back here:
    /// this runs on the per-step path and inside graph captures, and the
    /// constructors have checked them.
    pub fn check(&self, n_envs: i64, num_slots: usize, device: Device) -> Result<()> {
        self.check_shapes(n_envs, num_slots, device)?;
        if device == Device::Cpu {
            self.check_rows()?;
        }
        Ok(())
    }

    /// The shape, dtype and device part of [`MaskTensors::check`].
    fn check_shapes(&self, n_envs: i64, num_slots: usize, device: Device) -> Result<()> {
        for (head, size) in head_sizes(num_slots).iter().enumerate() {
            let Some(mask) = self.heads.get(head) else {
                continue;
            };
            let expected = [n_envs, i64::try_from(*size).unwrap_or(i64::MAX)];
            if mask.size() != expected || mask.kind() != Kind::Bool || mask.device() != device {
                return Err(shape_mismatch(
                    "MaskTensors.heads",
                    format!("bool {expected:?} on {device:?}"),
                    (mask.kind(), mask.size(), mask.device()),
                ));
            }
        }
        let expected = [
            n_envs,
            i64::try_from(NUM_OPS).unwrap_or(i64::MAX),
            i64::try_from(num_slots).unwrap_or(i64::MAX),
        ];
        let mask = &self.slot_by_op;
        if mask.size() != expected || mask.kind() != Kind::Bool || mask.device() != device {
            return Err(shape_mismatch(
                "MaskTensors.slot_by_op",
                format!("bool {expected:?} on {device:?}"),
                (mask.kind(), mask.size(), mask.device()),
            ));
        }
        Ok(())
    }
}
