//! Finiteness checks of device tensors where values enter Simic's state: one
//! readback for a whole list of tensors.
//!
//! Each check counts, on the tensor's device, the elements that are NaN or
//! infinite (and, for [`Rule::NonNegative`], also those below 0); the counts
//! of every tensor in the list are stacked and read back together, so a
//! list costs one device-to-host copy of a few integers. The callers use it
//! once per call at the boundaries that are not in the per-step hot loop
//! ([`crate::gae::compute_gae`] and the PPO update once per round, the
//! value normaliser's update, a checkpoint's import).

use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;
use crate::{Error, Result};

/// What a tensor's elements must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Finite.
    Finite,
    /// Finite and `>= 0`.
    NonNegative,
}

impl Rule {
    fn wanted(self) -> &'static str {
        match self {
            Rule::Finite => "NaN or infinite",
            Rule::NonNegative => "NaN, infinite or negative",
        }
    }
}

/// The elements of `tensor` that break `rule`, as a 0-dim `i64` on its
/// device (0 for a tensor that is not floating point: it holds no NaN).
fn bad_count(tensor: &Tensor, rule: Rule) -> Result<Tensor> {
    let what = "finiteness check";
    if !tensor.is_floating_point() {
        return Tensor::f_zeros([], (Kind::Int64, tensor.device())).op(what);
    }
    let mut bad = tensor.f_isfinite().op(what)?.f_logical_not().op(what)?;
    if rule == Rule::NonNegative {
        bad = bad.f_logical_or(&tensor.f_lt(0.0).op(what)?).op(what)?;
    }
    bad.f_sum(Kind::Int64).op(what)
}

/// For each `(name, tensor, rule)` the number of elements that break the
/// rule, read back in one copy (the tensors may live on different devices;
/// each count is taken on its tensor's device).
pub(crate) fn bad_counts(checks: &[(&'static str, &Tensor, Rule)]) -> Result<Vec<i64>> {
    if checks.is_empty() {
        return Ok(Vec::new());
    }
    // Gathered on the first tensor's device, so that one copy reads all.
    let device = checks
        .first()
        .map_or(Device::Cpu, |(_, tensor, _)| tensor.device());
    let counts = checks
        .iter()
        .map(|(_, tensor, rule)| {
            bad_count(tensor, *rule)?
                .f_to_device(device)
                .op("finiteness check")
        })
        .collect::<Result<Vec<_>>>()?;
    let stacked = Tensor::f_stack(&counts, 0)
        .op("finiteness check")?
        .f_to_device(Device::Cpu)
        .op("finiteness check")?;
    let values = Vec::<i64>::try_from(&stacked).map_err(|source| Error::Readback {
        what: "finiteness check",
        reason: source.to_string(),
    })?;
    if values.len() != checks.len() {
        return Err(Error::Readback {
            what: "finiteness check",
            reason: format!("{} counts for {} tensors", values.len(), checks.len()),
        });
    }
    Ok(values)
}

/// The first check whose tensor breaks its rule, as
/// [`Error::InvalidInput`] naming the field with the count of bad elements.
pub(crate) fn require(checks: &[(&'static str, &Tensor, Rule)]) -> Result<()> {
    let counts = bad_counts(checks)?;
    for ((field, tensor, rule), count) in checks.iter().zip(counts) {
        if count > 0 {
            return Err(invalid(field, tensor, *rule, count));
        }
    }
    Ok(())
}

/// The error [`require`] returns for `count` bad elements of `tensor`.
pub(crate) fn invalid(field: &'static str, tensor: &Tensor, rule: Rule, count: i64) -> Error {
    Error::InvalidInput {
        field,
        reason: format!("{count} of {} values are {}", tensor.numel(), rule.wanted()),
    }
}

/// The first non-finite element of `tensor` (for an error message; read
/// back only on the error path), NaN when none is found.
pub(crate) fn first_non_finite(tensor: &Tensor) -> f64 {
    let found = || -> std::result::Result<f64, tch::TchError> {
        let flat = tensor.f_detach()?.f_reshape([-1])?;
        let bad = flat.f_isfinite()?.f_logical_not()?;
        let values = flat.f_masked_select(&bad)?;
        if values.numel() == 0 {
            return Ok(f64::NAN);
        }
        values.f_double_value(&[0])
    };
    found().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_bad_elements_per_rule() {
        let x = Tensor::from_slice(&[1.0_f32, f32::NAN, -2.0, f32::INFINITY]);
        let ok = Tensor::from_slice(&[0.0_f32, 3.0]);
        let ints = Tensor::from_slice(&[-1_i64, 5]);
        let counts = bad_counts(&[
            ("x", &x, Rule::Finite),
            ("x", &x, Rule::NonNegative),
            ("ok", &ok, Rule::NonNegative),
            ("ints", &ints, Rule::Finite),
        ])
        .unwrap();
        assert_eq!(counts, vec![2, 3, 0, 0]);
        assert!(matches!(
            require(&[("ok", &ok, Rule::Finite), ("x", &x, Rule::Finite)]),
            Err(Error::InvalidInput { field: "x", .. })
        ));
        assert!(first_non_finite(&x).is_nan());
        assert_eq!(
            first_non_finite(&Tensor::from_slice(&[1.0_f32, f32::INFINITY])),
            f64::INFINITY
        );
    }
}
