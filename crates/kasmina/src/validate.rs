//! Validation where values enter Kasmina: finiteness, ranges and size bounds.
//!
//! Every number that can decide a lifecycle move (accuracies, gradient
//! norms, counterfactual contributions, alpha values and targets, schedule
//! steepness) and every configuration value is checked by one of these
//! helpers at the public call that receives it, never per element inside a
//! training step. A refused value is [`Error::NonFinite`] or
//! [`Error::OutOfRange`], naming the field and the value, and the call that
//! received it changes nothing.
//!
//! The contract ranges of measurements (accuracies in `[0, 100]` %,
//! contributions within ±100 pp) are leyline's
//! (`leyline::codec::MAX_ACCURACY_PERCENT`,
//! `leyline::codec::MAX_ABS_PERCENTAGE_POINTS`), not repeated here.
//!
//! Sizes have stated upper bounds (the constants below), checked with
//! checked arithmetic before any tensor is allocated, so a hostile
//! configuration is an error in debug and release builds alike instead of an
//! overflow, a panic or a petabyte allocation.

#![warn(clippy::arithmetic_side_effects)]

use crate::{Error, Result};

/// Largest channel count (feature width, model width) of a host or seed.
pub const MAX_CHANNELS: i64 = 1 << 16;
/// Largest spatial side (height, width, sequence length) of an input or slot.
pub const MAX_SPATIAL: i64 = 1 << 15;
/// Largest number of output classes (or vocabulary size).
pub const MAX_CLASSES: i64 = 1 << 24;
/// Largest number of input or output features of one layer.
pub const MAX_FEATURES: i64 = 1 << 24;
/// Largest number of blocks or layers of a host.
pub const MAX_LAYERS: usize = 1024;
/// Largest convolution kernel side.
pub const MAX_KERNEL_SIZE: i64 = 63;
/// Largest number of trainable parameters of a host, a seed or one layer
/// (2^32: 16 GiB in fp32).
pub const MAX_PARAMETERS: i64 = 1 << 32;
/// Largest number of elements of a germination probe tensor (2^28: 1 GiB
/// in fp32).
pub const MAX_PROBE_ELEMENTS: i64 = 1 << 28;

/// `value` if it is finite, else [`Error::NonFinite`].
pub fn finite(field: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::NonFinite { field, value })
    }
}

/// `value` if it is finite and in `[low, high]`.
pub fn in_range(field: &'static str, value: f64, low: f64, high: f64) -> Result<f64> {
    let value = finite(field, value)?;
    if (low..=high).contains(&value) {
        Ok(value)
    } else {
        Err(Error::OutOfRange {
            field,
            value: value.to_string(),
            allowed: format!("[{low}, {high}]"),
        })
    }
}

/// `value` if it is finite and in `[0, 1]` (alpha values and targets,
/// gradient health).
pub fn unit_interval(field: &'static str, value: f64) -> Result<f64> {
    in_range(field, value, 0.0, 1.0)
}

/// `value` if it is finite and `>= 0` (norms).
pub fn non_negative(field: &'static str, value: f64) -> Result<f64> {
    in_range(field, value, 0.0, f64::MAX)
}

/// `value` if it is finite and in `(0, high]`.
pub fn positive_at_most(field: &'static str, value: f64, high: f64) -> Result<f64> {
    let value = finite(field, value)?;
    if value > 0.0 && value <= high {
        Ok(value)
    } else {
        Err(Error::OutOfRange {
            field,
            value: value.to_string(),
            allowed: format!("(0, {high}]"),
        })
    }
}

/// `value` if it lies in `[low, high]` (integer sizes).
pub fn size_in<T>(field: &'static str, value: T, low: T, high: T) -> Result<T>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if value >= low && value <= high {
        Ok(value)
    } else {
        Err(Error::OutOfRange {
            field,
            value: value.to_string(),
            allowed: format!("[{low}, {high}]"),
        })
    }
}

/// The product of `factors`, if it neither overflows nor exceeds `limit`.
pub fn checked_product(field: &'static str, factors: &[i64], limit: i64) -> Result<i64> {
    checked_fold(field, factors, limit, "product", 1, i64::checked_mul)
}

/// The sum of `terms`, if it neither overflows nor exceeds `limit`.
pub fn checked_sum(field: &'static str, terms: &[i64], limit: i64) -> Result<i64> {
    checked_fold(field, terms, limit, "sum", 0, i64::checked_add)
}

/// Folds `values` with `op`, refusing any intermediate that overflows or
/// leaves `[0, limit]`.
fn checked_fold(
    field: &'static str,
    values: &[i64],
    limit: i64,
    what: &str,
    start: i64,
    op: fn(i64, i64) -> Option<i64>,
) -> Result<i64> {
    values.iter().try_fold(start, |acc, &value| {
        op(acc, value)
            .filter(|r| (0..=limit).contains(r))
            .ok_or_else(|| Error::OutOfRange {
                field,
                value: format!("{values:?} ({what})"),
                allowed: format!("a {what} in [0, {limit}]"),
            })
    })
}

/// The number of elements of `tensors` together (saturating: counts of
/// tensors that exist in memory are far below `i64::MAX`).
pub fn element_count(tensors: &[tch::Tensor]) -> i64 {
    tensors.iter().fold(0i64, |count, tensor| {
        count.saturating_add(i64::try_from(tensor.numel()).unwrap_or(i64::MAX))
    })
}

/// A feature shape check: `got` must have `expected.len()` dimensions and
/// equal `expected` wherever `expected` is not `-1`.
pub fn shape(op: &'static str, got: &[i64], expected: &[i64]) -> Result<()> {
    let fits =
        got.len() == expected.len() && got.iter().zip(expected).all(|(&g, &e)| e == -1 || g == e);
    if fits {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            expected: expected.to_vec(),
            got: got.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_name_the_field_and_refuse_what_they_must() {
        assert!(matches!(
            finite("x", f64::NAN),
            Err(Error::NonFinite { field: "x", .. })
        ));
        assert!(unit_interval("alpha", 1.0).is_ok());
        let error = unit_interval("alpha", 1.5).expect_err("out of range");
        assert!(error.to_string().contains("alpha"), "{error}");
        assert!(positive_at_most("lr", 0.0, 1.0).is_err());
        assert!(positive_at_most("lr", 1.0, 1.0).is_ok());
        assert!(non_negative("norm", -0.0).is_ok());
        assert!(non_negative("norm", -1e-300).is_err());
        assert!(size_in("n", 5usize, 1, 4).is_err());
        assert!(checked_product("p", &[i64::MAX, 2], i64::MAX).is_err());
        assert!(checked_product("p", &[-1, 2], i64::MAX).is_err());
        assert_eq!(checked_product("p", &[3, 4], 12).expect("fits"), 12);
        assert!(checked_sum("s", &[i64::MAX, 1], i64::MAX).is_err());
        assert!(shape("op", &[2, 3], &[-1, 3]).is_ok());
        assert!(shape("op", &[2, 3], &[-1, 4]).is_err());
        assert!(shape("op", &[2, 3, 1], &[-1, 3]).is_err());
    }
}
