//! Finiteness checks of tensors where values enter Tamiyo's state or its
//! decisions.
//!
//! Two kinds of check, chosen by where the data lives and when the call
//! runs:
//!
//! - [`check_finite`] always looks: one read-back of one flag when every
//!   value is finite (a few more to name the first bad value when one is
//!   not). It is for calls that change long-lived state and run outside any
//!   captured CUDA graph (the observation normaliser's update).
//! - [`check_finite_on_host`] looks only when the tensor lives on the CPU,
//!   where the check reads host memory and costs no device synchronisation.
//!   On CUDA it does nothing: the per-step policy calls must neither
//!   synchronise nor read back inside a graph capture, and their device
//!   inputs are built from values already checked on the host (the encoded
//!   observations of [`crate::features`], the masks of [`crate::masks`],
//!   the normaliser's checked state).

use tch::{Device, Kind, Tensor};

use crate::error::TorchResultExt;
use crate::{Error, Result};

/// Whether every value of every tensor is finite, in one read-back (tensors
/// that are not floating point hold no NaN and count as finite).
pub(crate) fn all_finite(tensors: &[&Tensor]) -> Result<bool> {
    let what = "finiteness check";
    let checked: Vec<&Tensor> = tensors
        .iter()
        .copied()
        .filter(|tensor| tensor.is_floating_point() && tensor.numel() > 0)
        .collect();
    let Some(first) = checked.first() else {
        return Ok(true);
    };
    // One flag per tensor, gathered on the first tensor's device so that a
    // single copy reads them all.
    let device = first.device();
    let mut flags = Vec::with_capacity(checked.len());
    for tensor in checked {
        flags.push(
            tensor
                .f_isfinite()
                .op(what)?
                .f_all()
                .op(what)?
                .f_to_device(device)
                .op(what)?,
        );
    }
    let all = Tensor::f_stack(&flags, 0)
        .op(what)?
        .f_all()
        .op(what)?
        .f_to_kind(Kind::Int64)
        .op(what)?
        .f_to_device(Device::Cpu)
        .op(what)?
        .f_int64_value(&[])
        .op(what)?;
    Ok(all != 0)
}

/// The first non-finite value of `tensor` and its position (row-major),
/// `None` when every value is finite.
pub(crate) fn first_non_finite(tensor: &Tensor) -> Result<Option<(f64, Vec<usize>)>> {
    let what = "finiteness check";
    if all_finite(&[tensor])? {
        return Ok(None);
    }
    let bad = tensor
        .f_isfinite()
        .op(what)?
        .f_logical_not()
        .op(what)?
        .f_nonzero()
        .op(what)?
        .f_to_device(Device::Cpu)
        .op(what)?;
    if bad.size().first().copied().unwrap_or(0) < 1 {
        return Ok(None);
    }
    let first = Vec::<i64>::try_from(&bad.f_select(0, 0).op(what)?).op(what)?;
    let value = tensor
        .f_to_kind(Kind::Double)
        .op(what)?
        .f_double_value(&first)
        .op(what)?;
    let index = first
        .iter()
        .map(|&i| usize::try_from(i).unwrap_or(0))
        .collect();
    Ok(Some((value, index)))
}

/// [`Error::NonFinite`] naming `field` when `tensor` holds a NaN or an
/// infinity (always reads back: see the module docs).
pub(crate) fn check_finite(field: &'static str, tensor: &Tensor) -> Result<()> {
    match first_non_finite(tensor)? {
        None => Ok(()),
        Some((value, index)) => Err(Error::NonFinite {
            field,
            value,
            index,
        }),
    }
}

/// [`check_finite`] for a tensor on the CPU; nothing for a device tensor
/// (see the module docs).
pub(crate) fn check_finite_on_host(field: &'static str, tensor: &Tensor) -> Result<()> {
    if tensor.device() == Device::Cpu {
        check_finite(field, tensor)
    } else {
        Ok(())
    }
}
