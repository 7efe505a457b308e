//! Per-sample, per-seed attribution: which seeds influenced each sample of a
//! batch, and by how much.
//!
//! For a batch `x` of `B` samples and the `K` seeds on the forward path
//! (execution order), [`attribute_batch`] runs one fused, no-grad,
//! evaluation-mode forward over `(K + 1) B` samples: block 0 with every seed
//! at its own alpha (the model's output `y`), block `k` with seed `k`'s alpha
//! forced to 0 and every other seed unchanged (`y_k`). Then
//!
//! - `influence[b, k] = || y[b] - y_k[b] ||_2`: how far the logits of sample
//!   `b` move when seed `k` is switched off (0 for a seed in the incubator,
//!   whose alpha is already 0);
//! - `share[b, k] = influence[b, k] / sum_j influence[b, j]`, 0 where the sum
//!   is 0: the seed's fraction of the total single-seed influence on `b`
//!   (shares sum to 1 per influenced sample; they are not Shapley values, as
//!   interactions between seeds are not split).
//!
//! Evaluation mode keeps samples independent (BatchNorm uses running
//! statistics), so the fused blocks do not see each other. Both this and
//! [`counterfactual_contribution`] read nothing back inside a step and must be
//! called outside any captured CUDA graph.
//!
//! Shapes are checked before libtorch sees them: `x` needs a batch dimension
//! (the host checks the rest), `labels` must be integer class ids, `[B]` on
//! CNN hosts and `[B, T]` on transformers ([`Error::ShapeMismatch`]).

#![warn(clippy::arithmetic_side_effects)]

use tch::{Kind, Tensor};

use crate::host::SlotId;
use crate::model::MorphogeneticModel;
use crate::{Error, Result};

/// The batch size of `x`, which must have at least one dimension.
fn batch_of(op: &'static str, x: &Tensor) -> Result<i64> {
    x.size()
        .first()
        .copied()
        .ok_or_else(|| Error::ShapeMismatch {
            op,
            expected: vec![-1],
            got: Vec::new(),
        })
}

/// The first sample of `block` in a fused batch of `batch`-sample blocks.
fn block_start(block: i64, batch: i64) -> Result<i64> {
    i64::try_from(fused_samples(block, batch)?).map_err(|_| Error::OutOfRange {
        field: "attribution (block start)",
        value: format!("{block} x {batch}"),
        allowed: "a sample index that fits i64".to_owned(),
    })
}

/// `blocks * batch` samples, or an error where that overflows.
fn fused_samples(blocks: i64, batch: i64) -> Result<usize> {
    blocks
        .checked_mul(batch)
        .and_then(|samples| usize::try_from(samples).ok())
        .ok_or_else(|| Error::OutOfRange {
            field: "attribution (fused samples)",
            value: format!("{blocks} x {batch}"),
            allowed: "a sample count that fits usize".to_owned(),
        })
}

/// The attribution of one batch.
#[derive(Debug)]
pub struct BatchAttribution {
    /// Slots of the attributed seeds, in execution order (the `K` columns).
    pub slots: Vec<SlotId>,
    /// Seed ids, same order.
    pub seed_ids: Vec<String>,
    /// The model's output with every seed on, `[B, ...]`.
    pub output: Tensor,
    /// `[B, K]` L2 change of each sample's output when the seed is off.
    pub influence: Tensor,
    /// `[B, K]` influence normalised per sample (rows sum to 1 or are 0).
    pub share: Tensor,
}

/// Alphas `[blocks B, 1, ...]` (float32; the blend casts them to the
/// features' dtype), `alpha` everywhere except block `zero_block`.
fn per_sample_alpha(
    alpha: f64,
    blocks: i64,
    zero_block: Option<i64>,
    batch: i64,
    feature_rank: usize,
    kind: Kind,
    device: tch::Device,
) -> Result<Tensor> {
    let samples = fused_samples(blocks, batch)?;
    let mut values = vec![alpha as f32; samples];
    if let Some(block) = zero_block {
        // block < blocks, so this block's samples lie within `values`.
        let start = fused_samples(block, batch)?;
        let end = fused_samples(block.saturating_add(1), batch)?;
        if let Some(zeroed) = values.get_mut(start..end) {
            zeroed.iter_mut().for_each(|v| *v = 0.0);
        }
    }
    let mut shape = vec![i64::try_from(samples).map_err(|_| Error::OutOfRange {
        field: "attribution (fused samples)",
        value: samples.to_string(),
        allowed: "a sample count that fits i64".to_owned(),
    })?];
    shape.extend(std::iter::repeat_n(1, feature_rank.saturating_sub(1)));
    Ok(Tensor::f_from_slice(&values)?
        .f_reshape(shape.as_slice())?
        .f_to_kind(kind)?
        .f_to_device(device)?)
}

/// Runs the model on `blocks` copies of `x` where, in block `b`, the slots
/// listed in `switched_off[b]` (indices into `model.slots()`) have alpha 0.
fn fused_forward(
    model: &MorphogeneticModel,
    x: &Tensor,
    switched_off: &[Option<usize>],
) -> Result<Tensor> {
    let blocks = i64::try_from(switched_off.len()).map_err(|_| Error::OutOfRange {
        field: "attribution (blocks)",
        value: switched_off.len().to_string(),
        allowed: "a block count that fits i64".to_owned(),
    })?;
    let batch = batch_of("attribution input", x)?;
    let mut repeats = vec![blocks];
    repeats.extend(std::iter::repeat_n(1, x.dim().saturating_sub(1)));
    let fused_input = x.f_repeat(repeats.as_slice())?;
    let feature_rank = match model.host().topology() {
        crate::host::Topology::Cnn => 4,
        crate::host::Topology::Transformer => 3,
    };
    let mut overrides = Vec::with_capacity(model.slots().len());
    for (index, slot) in model.slots().iter().enumerate() {
        if !slot.is_active() {
            overrides.push(None);
            continue;
        }
        let zero_block = switched_off
            .iter()
            .position(|off| *off == Some(index))
            .map(|block| block as i64);
        overrides.push(Some(per_sample_alpha(
            slot.alpha(),
            blocks,
            zero_block,
            batch,
            feature_rank,
            Kind::Float,
            x.device(),
        )?));
    }
    let references: Vec<Option<&Tensor>> = overrides.iter().map(Option::as_ref).collect();
    tch::no_grad(|| model.forward_with_alpha(&fused_input, &references, false))
}

/// Attributes `x` (`[B, ...]`) to the seeds on the forward path (see the
/// module docs for what the numbers mean).
pub fn attribute_batch(model: &MorphogeneticModel, x: &Tensor) -> Result<BatchAttribution> {
    let batch = batch_of("attribute_batch input", x)?;
    let active: Vec<usize> = model
        .slots()
        .iter()
        .enumerate()
        .filter(|(_, slot)| slot.is_active())
        .map(|(index, _)| index)
        .collect();
    let mut switched_off = vec![None];
    switched_off.extend(active.iter().map(|&index| Some(index)));
    let fused = fused_forward(model, x, &switched_off)?;
    let output = fused.f_narrow(0, 0, batch)?;
    let flat_output = output.f_reshape([batch, -1])?;
    let mut columns = Vec::with_capacity(active.len());
    for block in (1..).take(active.len()) {
        let counterfactual = fused
            .f_narrow(0, block_start(block, batch)?, batch)?
            .f_reshape([batch, -1])?;
        let distance = flat_output
            .f_sub(&counterfactual)?
            .f_square()?
            .f_sum_dim_intlist([1i64].as_slice(), false, Kind::Float)?
            .f_sqrt()?; // [B]
        columns.push(distance);
    }
    let influence = if columns.is_empty() {
        Tensor::f_zeros([batch, 0], (Kind::Float, x.device()))?
    } else {
        Tensor::f_stack(&columns, 1)? // [B, K]
    };
    let totals = influence.f_sum_dim_intlist([1i64].as_slice(), true, Kind::Float)?; // [B, 1]
    let safe_totals = totals.f_clamp_min(f64::MIN_POSITIVE)?;
    let share = influence.f_div(&safe_totals)?;
    let active_slots: Vec<_> = active
        .iter()
        .filter_map(|&index| model.slots().get(index))
        .collect();
    let slots = active_slots.iter().map(|slot| slot.id()).collect();
    let seed_ids = active_slots
        .iter()
        .map(|slot| {
            slot.state()
                .map(|state| state.seed_id().to_owned())
                .unwrap_or_default()
        })
        .collect();
    Ok(BatchAttribution {
        slots,
        seed_ids,
        output,
        influence,
        share,
    })
}

/// Counterfactual contribution of the seed in `slot`, in percentage points:
/// accuracy on (`x`, `labels`) with the model as is, minus accuracy with that
/// seed's alpha forced to 0 (evaluation mode, one fused forward). This is the
/// value G5 reads ([`crate::slot::SeedSlot::set_counterfactual_contribution`]).
pub fn counterfactual_contribution(
    model: &MorphogeneticModel,
    slot: SlotId,
    x: &Tensor,
    labels: &Tensor,
) -> Result<f64> {
    let index = model
        .slot_ids()
        .iter()
        .position(|id| *id == slot)
        .ok_or_else(|| Error::UnknownSlot {
            slot: slot.to_string(),
            available: model
                .slot_ids()
                .iter()
                .map(SlotId::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let batch = batch_of("counterfactual input", x)?;
    let integer = matches!(
        labels.kind(),
        Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8
    );
    // One class id per sample (CNN) or per token (transformer, `[B, T]`).
    let expected: Vec<i64> = match model.host().topology() {
        crate::host::Topology::Cnn => vec![batch],
        crate::host::Topology::Transformer => x.size().into_iter().take(2).collect(),
    };
    if labels.size() != expected || !integer {
        return Err(Error::ShapeMismatch {
            op: "counterfactual labels (integer class ids)",
            expected,
            got: labels.size(),
        });
    }
    if batch == 0 || !model.slots().get(index).is_some_and(|s| s.is_active()) {
        return Ok(0.0);
    }
    let fused = fused_forward(model, x, &[None, Some(index)])?;
    let accuracy = |block: i64| -> Result<f64> {
        let logits = fused.f_narrow(0, block_start(block, batch)?, batch)?;
        let correct = logits
            .f_argmax(-1, false)?
            .f_eq_tensor(&labels.f_to_device(logits.device())?)?
            .f_to_kind(Kind::Double)?
            .f_mean(Kind::Double)?;
        Ok(100.0 * f64::try_from(&correct)?)
    };
    Ok(accuracy(0)? - accuracy(1)?)
}
