//! [`embedding`]: a token embedding (see the parent module's docs) whose
//! backward sums the gradient by token id without a sort, where libtorch's
//! op applies otherwise.

use tch::{Device, Kind, Tensor};

use super::{
    MAX_FUSED_EMBEDDING_ROWS, MAX_FUSED_EMBEDDING_VALUES, MAX_FUSED_EMBEDDING_WIDTH,
    fused_kernels_enabled, kernels, shim_tensor, torch,
};
use crate::error::Result;
use crate::ffi;

/// `embedding(weight, ids)`: row `ids[i]` of `weight` for every id, as an
/// autograd function with its own backward where it applies (see the
/// module docs), libtorch's `embedding` otherwise (no padding index, no
/// frequency scaling, dense gradient).
///
/// The own path takes a contiguous CUDA weight in `f32` or `bf16` of at
/// most [`MAX_FUSED_EMBEDDING_ROWS`] rows of at most
/// [`MAX_FUSED_EMBEDDING_WIDTH`] values, [`MAX_FUSED_EMBEDDING_VALUES`] in
/// all, that wants a gradient, and `int64`
/// ids on its device. Its forward is libtorch's; its backward sums each
/// vocabulary row's output-gradient rows per chunk of ids and adds the
/// chunks in a fixed order (deterministic, as libtorch's sorting backward,
/// and equal to it up to float rounding). An id outside the vocabulary is
/// libtorch's forward error.
///
/// # Shapes
/// `weight: [V, C]`, `ids: [...]`; returns `[..., C]` in the weight's dtype.
///
/// # Errors
/// libtorch's error for ids of another dtype or tensors that do not fit
/// together; [`Error::Cpp`](crate::Error::Cpp) when the kernels cannot be
/// compiled or launched.
pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
    const OP: &str = "nn::embedding";
    let Some((device, bf16)) = embedding_target(weight, ids) else {
        return Tensor::f_embedding(weight, ids, -1, false, false)
            .map_err(|error| torch(OP, error));
    };
    let k = kernels(OP, device, bf16, true)?;
    let handles = [k.embedding_backward.raw(), k.conv_reduce.raw()];
    // SAFETY: both tensor pointers are live for the call; the kernels are
    // live (the cache never drops them, so the autograd node's backward may
    // use them later).
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_embedding(
                ffi::tensor_ptr(weight),
                ffi::tensor_ptr(ids),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// The CUDA device and whether the weight is `bf16`, where [`embedding`]'s
/// own path applies.
fn embedding_target(weight: &Tensor, ids: &Tensor) -> Option<(usize, bool)> {
    if !fused_kernels_enabled() || !weight.requires_grad() {
        return None;
    }
    let Device::Cuda(device) = weight.device() else {
        return None;
    };
    let size = weight.size();
    let [rows, width] = size[..] else {
        return None;
    };
    let fits = (1..=MAX_FUSED_EMBEDDING_ROWS).contains(&rows)
        && (1..=MAX_FUSED_EMBEDDING_WIDTH).contains(&width)
        && rows
            .checked_mul(width)
            .is_some_and(|values| values <= MAX_FUSED_EMBEDDING_VALUES)
        && weight.is_contiguous()
        && ids.kind() == Kind::Int64
        && ids.device() == weight.device();
    match weight.kind() {
        Kind::Float if fits => Some((device, false)),
        Kind::BFloat16 if fits => Some((device, true)),
        _ => None,
    }
}
