//! The value checks [`Dataset::new`] runs once on its inputs: labels in
//! range and finite images, each naming the first offending sample.

use tch::{Kind, Tensor};

use crate::data::{DataError, Result, torch_error};

#[cfg(doc)]
use super::Dataset;

/// Every label of `labels` (1-D `i64`) in `0..n_classes`, or the first that
/// is not.
pub(super) fn check_labels(name: &str, labels: &Tensor, n_classes: usize) -> Result<()> {
    const OP: &str = "Dataset::new";
    if labels.numel() == 0 {
        return Ok(());
    }
    // n_classes <= MAX_CLASSES fits an i64.
    let classes = n_classes as i64;
    let bad = labels
        .f_lt(0)
        .and_then(|low| low.f_logical_or(&labels.f_ge(classes)?))
        .map_err(torch_error(OP))?;
    let any_bad = bad
        .f_any()
        .and_then(|t| t.f_int64_value(&[]))
        .map_err(torch_error(OP))?;
    if any_bad == 0 {
        return Ok(());
    }
    // The first offending sample: argmax of a bool mask is its first true.
    let index = bad
        .f_to_kind(Kind::Uint8)
        .and_then(|t| t.f_argmax(0, false))
        .and_then(|t| t.f_int64_value(&[]))
        .map_err(torch_error(OP))?;
    let label = labels.f_int64_value(&[index]).map_err(torch_error(OP))?;
    Err(DataError::LabelOutOfRange {
        dataset: name.to_string(),
        index: usize::try_from(index).unwrap_or(usize::MAX),
        label,
        n_classes,
    })
}

/// Every value of a floating-point `images` tensor finite and, for images
/// wider than f32 (f64), within f32's range, or the first that is not (other
/// kinds hold only finite values within range).
pub(super) fn check_finite(name: &str, images: &Tensor) -> Result<()> {
    const OP: &str = "Dataset::new";
    let is_float = images.f_is_floating_point().map_err(torch_error(OP))?;
    if !is_float || images.numel() == 0 {
        return Ok(());
    }
    let wide = images.kind() == Kind::Double;
    let limit = f64::from(f32::MAX);
    let bad = images
        .f_isfinite()
        .and_then(|finite| finite.f_logical_not())
        .and_then(|bad| {
            if wide {
                bad.f_logical_or(&images.f_abs()?.f_gt(limit)?)
            } else {
                Ok(bad)
            }
        })
        .and_then(|bad| bad.f_flatten(0, -1))
        .map_err(torch_error(OP))?;
    let any_bad = bad
        .f_any()
        .and_then(|t| t.f_int64_value(&[]))
        .map_err(torch_error(OP))?;
    if any_bad == 0 {
        return Ok(());
    }
    let flat = bad
        .f_to_kind(Kind::Uint8)
        .and_then(|t| t.f_argmax(0, false))
        .and_then(|t| t.f_int64_value(&[]))
        .map_err(torch_error(OP))?;
    let value = images
        .f_flatten(0, -1)
        .and_then(|t| t.f_double_value(&[flat]))
        .map_err(torch_error(OP))?;
    let per_sample = images
        .size()
        .get(1..)
        .map_or(1, |rest| rest.iter().product::<i64>())
        .max(1);
    let flat = usize::try_from(flat).unwrap_or(0);
    let per_sample = usize::try_from(per_sample).unwrap_or(1);
    let dataset = name.to_string();
    let sample = flat.checked_div(per_sample).unwrap_or(flat);
    let element = flat.checked_rem(per_sample).unwrap_or(0);
    if value.is_finite() {
        return Err(DataError::ValueOutOfRange {
            dataset,
            sample,
            element,
            value,
            limit,
        });
    }
    Err(DataError::NonFiniteValue {
        dataset,
        sample,
        element,
        value,
    })
}
