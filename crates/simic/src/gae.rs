//! Generalised advantage estimation (GAE, Schulman et al. 2016) over
//! `[E, T]` rollouts: one row per environment, one column per step.
//!
//! For step `t` of a row, with `V(s')` the value of the state the step led
//! to:
//!
//! - a *terminal* step (`terminated[t]`) has no next value (`V(s') = 0`) and
//!   resets the recursion;
//! - a *truncated* step (`truncated[t]`, and not terminal) uses
//!   `bootstrap_values[t]` as `V(s')` and also cuts the recursion: the next
//!   column of the row is a new episode (at the row's end this is the
//!   reference's behaviour anyway, its episodes end at `max_epochs`);
//! - any other step uses `values[t + 1]`, or `bootstrap_values[t]` in the
//!   last column (the rollout stopped mid-episode).
//!
//! `δ_t = r_t + γ·V(s') − V(s_t)`, `A_t = δ_t + γλ·c_t·A_{t+1}` with
//! `c_t = 0` when the step is terminal or truncated (1 otherwise) and
//! `A_T = 0`; the returns (critic targets) are `A_t + V(s_t)`.
//!
//! Everything runs on the tensors' device as one backward loop of tensor
//! operations over `T`. The flags may be `bool` or any numeric kind
//! (non-zero is set); the result has the kind of `values`.
//!
//! Non-finite values never pass through: after the loop is queued, one
//! readback counts the NaN and infinite elements of every input and of both
//! results, a few integers once per rollout. A
//! non-finite reward, value, bootstrap value or floating-point flag is
//! refused as [`Error::InvalidInput`] naming the argument; finite inputs so
//! large that the results overflow their kind are refused as
//! [`Error::NonFinite`] naming the result. Nothing is kept between calls, so
//! a refused call changes nothing.

use tch::Tensor;

use crate::error::TorchResultExt;
use crate::finite::Rule;
use crate::{Error, Result};

fn shape_error(what: &'static str, expected: String, got: impl std::fmt::Debug) -> Error {
    Error::ShapeMismatch {
        what,
        expected,
        got: format!("{got:?}"),
    }
}

fn discount(field: &'static str, value: f64) -> Result<()> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            field,
            reason: format!("{value} is outside [0, 1]"),
        })
    }
}

/// GAE over `[E, T]` tensors (see the module docs): returns
/// `(advantages, returns)`.
///
/// # Shapes
/// `rewards`, `values`, `terminated`, `truncated`, `bootstrap_values`: all
/// `[E, T]` with `E, T ≥ 1`, on one device; `values` floating point.
///
/// # Errors
/// [`Error::InvalidConfig`] for `gamma` or `lambda` outside `[0, 1]`,
/// [`Error::ShapeMismatch`] for a shape, device or kind that does not fit,
/// [`Error::InvalidInput`] naming the argument (`compute_gae.rewards`, …)
/// that holds NaN or infinite values, [`Error::NonFinite`] naming the result
/// (`compute_gae.advantages` or `compute_gae.returns`) that overflowed.
pub fn compute_gae(
    rewards: &Tensor,
    values: &Tensor,
    terminated: &Tensor,
    truncated: &Tensor,
    bootstrap_values: &Tensor,
    gamma: f64,
    lambda: f64,
) -> Result<(Tensor, Tensor)> {
    discount("compute_gae.gamma", gamma)?;
    discount("compute_gae.lambda", lambda)?;
    let size = values.size();
    let steps = match size.as_slice() {
        [rows, steps] if *rows >= 1 && *steps >= 1 => *steps,
        _ => {
            return Err(shape_error(
                "compute_gae.values",
                "[E >= 1, T >= 1]".to_owned(),
                size,
            ));
        }
    };
    if !values.is_floating_point() {
        return Err(shape_error(
            "compute_gae.values",
            "a floating-point tensor".to_owned(),
            values.kind(),
        ));
    }
    let device = values.device();
    for (what, tensor) in [
        ("compute_gae.rewards", rewards),
        ("compute_gae.terminated", terminated),
        ("compute_gae.truncated", truncated),
        ("compute_gae.bootstrap_values", bootstrap_values),
    ] {
        if tensor.size() != size {
            return Err(shape_error(what, format!("{size:?}"), tensor.size()));
        }
        if tensor.device() != device {
            return Err(shape_error(
                what,
                format!("a tensor on {device:?}"),
                tensor.device(),
            ));
        }
    }
    let kind = values.kind();
    let as_kind = |tensor: &Tensor, op: &'static str| tensor.f_to_kind(kind).op(op);
    let flag = |tensor: &Tensor, op: &'static str| -> Result<Tensor> {
        tensor.f_ne(0).op(op)?.f_to_kind(kind).op(op)
    };
    let values = values.f_detach().op("gae values")?;
    let rewards = as_kind(rewards, "gae rewards")?;
    let bootstrap = as_kind(bootstrap_values, "gae bootstrap")?;
    let (terminated_in, truncated_in) = (terminated, truncated);
    let terminal = flag(terminated, "gae terminated")?;
    let truncated = flag(truncated, "gae truncated")?;
    // 1 where the next value exists at all (not terminal).
    let alive = terminal
        .f_neg()
        .op("gae alive")?
        .f_add_scalar(1.0)
        .op("gae alive")?;
    // 1 where the recursion carries on (neither terminal nor truncated).
    let carry = alive
        .f_mul(
            &truncated
                .f_neg()
                .op("gae carry")?
                .f_add_scalar(1.0)
                .op("gae carry")?,
        )
        .op("gae carry")?;
    let mut columns: Vec<Tensor> = Vec::with_capacity(usize::try_from(steps).unwrap_or(0));
    let mut next_advantage: Option<Tensor> = None;
    let mut t = steps;
    while t > 0 {
        t = t.saturating_sub(1);
        let column = |tensor: &Tensor| tensor.f_select(1, t).op("gae column");
        let value = column(&values)?;
        let boot = column(&bootstrap)?;
        // V(s'): the bootstrap where the step is truncated or the row ends,
        // values[t + 1] otherwise; zero after a terminal step.
        let next_value = if t.saturating_add(1) == steps {
            boot
        } else {
            let following = values
                .f_select(1, t.saturating_add(1))
                .op("gae next value")?;
            let cut = column(&truncated)?.f_ne(0).op("gae cut")?;
            boot.f_where_self(&cut, &following).op("gae next value")?
        };
        let next_value = next_value.f_mul(&column(&alive)?).op("gae next value")?;
        let delta = column(&rewards)?
            .f_add(&next_value.f_mul_scalar(gamma).op("gae delta")?)
            .op("gae delta")?
            .f_sub(&value)
            .op("gae delta")?;
        let advantage = match &next_advantage {
            None => delta,
            Some(next) => delta
                .f_add(
                    &next
                        .f_mul(&column(&carry)?)
                        .op("gae recursion")?
                        .f_mul_scalar(gamma * lambda)
                        .op("gae recursion")?,
                )
                .op("gae recursion")?,
        };
        columns.push(advantage.shallow_clone());
        next_advantage = Some(advantage);
    }
    columns.reverse();
    let advantages = Tensor::f_stack(&columns, 1).op("gae stack")?;
    let returns = advantages.f_add(&values).op("gae returns")?;
    check_finite(
        &[
            ("compute_gae.rewards", &rewards),
            ("compute_gae.values", &values),
            ("compute_gae.terminated", terminated_in),
            ("compute_gae.truncated", truncated_in),
            ("compute_gae.bootstrap_values", &bootstrap),
        ],
        &[
            ("compute_gae.advantages", &advantages),
            ("compute_gae.returns", &returns),
        ],
    )?;
    Ok((advantages, returns))
}

/// One readback over the inputs and the results (see the module docs).
fn check_finite(
    inputs: &[(&'static str, &Tensor)],
    results: &[(&'static str, &Tensor)],
) -> Result<()> {
    let checks: Vec<(&'static str, &Tensor, Rule)> = inputs
        .iter()
        .chain(results)
        .map(|(name, tensor)| (*name, *tensor, Rule::Finite))
        .collect();
    let counts = crate::finite::bad_counts(&checks)?;
    for (index, ((name, tensor, rule), count)) in checks.iter().zip(counts).enumerate() {
        if count == 0 {
            continue;
        }
        if index < inputs.len() {
            return Err(crate::finite::invalid(name, tensor, *rule, count));
        }
        return Err(Error::NonFinite {
            what: name,
            value: crate::finite::first_non_finite(tensor),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn refuses_mismatched_shapes_and_discounts() {
        let a = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
        let b = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu));
        assert!(matches!(
            compute_gae(&a, &a, &a, &b, &a, 0.99, 0.95),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            compute_gae(&a, &a, &a, &a, &a, 1.5, 0.95),
            Err(Error::InvalidConfig { .. })
        ));
        let flat = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        assert!(matches!(
            compute_gae(&flat, &flat, &flat, &flat, &flat, 0.99, 0.95),
            Err(Error::ShapeMismatch { .. })
        ));
    }
}
