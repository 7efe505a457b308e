//! [`blend_lerp`]: the alpha blend `lerp(h, s, w)` with a weight per sample
//! (see the parent module's docs), from run-time compiled kernels where they
//! apply and libtorch's `lerp` otherwise; [`blend_lerp_replicated`]: the
//! same blend of a batch's replicated copies, forward only, without making
//! the copies; [`blend_lerp_pool2x2`] and [`blend_lerp_clamped_pool2x2`]:
//! the blend followed by a 2x2 max-pool as one node.

use tch::{Device, Kind, Tensor};

use super::{
    four_channels, fused_kernels_enabled, is_nhwc, kernels, max_pool2x2, shim_tensor, torch,
};
use crate::error::Result;
use crate::ffi;

/// `host.lerp(seed, weight)`: `host + weight · (seed − host)`, with
/// `weight` one value per sample.
///
/// The fused kernels run where they apply: `host` and `seed` CUDA tensors of
/// `f32` or `bf16` with the same shape and strides, dense (contiguous, or
/// channels-last 4-D), and a `weight` without gradient holding one value
/// for each sample or one for all (`[N, 1, ..., 1]` or `[1, 1, ..., 1]`,
/// the host's rank). The weight is read as `f32` on the device, nothing is
/// read back, and the step can be captured in a CUDA graph. Anything else
/// (the CPU, a weight that learns, as a gated blend's does, a layout the
/// two do not share) takes libtorch's `lerp`, with the same results up to
/// float rounding (the formula is libtorch's).
///
/// # Shapes
/// `host`, `seed`: `[N, ...]`; `weight`: `[N or 1, 1, ..., 1]`; returns
/// `[N, ...]` in `host`'s layout and dtype.
///
/// # Errors
/// libtorch's error for tensors that do not fit together; [`crate::Error::Cpp`]
/// when the kernels cannot be compiled or launched.
pub fn blend_lerp(host: &Tensor, seed: &Tensor, weight: &Tensor) -> Result<Tensor> {
    lerp(host, seed, weight, false)
}

/// [`blend_lerp`] with the weight clamped to `[0, 1]` first:
/// `host.lerp(seed, weight.clamp(0, 1))` (a NaN weight stays NaN), the
/// blend of an alpha schedule that may step outside the interval.
///
/// Where [`blend_lerp`]'s kernels run, they clamp each weight as they read
/// it (no clamp kernel, and a captured step replays a new weight clamped);
/// elsewhere libtorch's `clamp` and `lerp` run.
///
/// # Shapes
/// As [`blend_lerp`].
///
/// # Errors
/// As [`blend_lerp`].
pub fn blend_lerp_clamped(host: &Tensor, seed: &Tensor, weight: &Tensor) -> Result<Tensor> {
    lerp(host, seed, weight, true)
}

/// `max_pool2d(host.lerp(seed, weight), 2, 2)` (floor): [`blend_lerp`]
/// followed by [`max_pool2x2`], what a seed blended just before a host's
/// pool computes.
///
/// One kernel each way runs where both would run fused: 4-D `host` and
/// `seed` as [`blend_lerp`] takes them, channels-last (more than one
/// channel) or contiguous NCHW, at least two pixels a side, and sizes that
/// 32-bit indices cover. The forward writes only each window's maximum (the
/// four blends rounded to the dtype first, as the stored blend would be);
/// the backward recomputes each window's blends and argmax from `host`,
/// `seed` and `weight` (saved), routes the pooled gradient to the argmax
/// and splits it between `host` and `seed` as the blend's backward does.
/// Values and gradients equal the two nodes' bit for bit. Anything else runs
/// the two nodes.
///
/// # Shapes
/// `host`, `seed`: `[N, C, H, W]`; `weight`: `[N or 1, 1, 1, 1]`; returns
/// `[N, C, H / 2, W / 2]` in `host`'s layout and dtype.
///
/// # Errors
/// As [`blend_lerp`].
pub fn blend_lerp_pool2x2(host: &Tensor, seed: &Tensor, weight: &Tensor) -> Result<Tensor> {
    lerp_pool(host, seed, weight, false)
}

/// [`blend_lerp_pool2x2`] with the weight clamped to `[0, 1]` first, as
/// [`blend_lerp_clamped`] clamps it.
///
/// # Shapes
/// As [`blend_lerp_pool2x2`].
///
/// # Errors
/// As [`blend_lerp`].
pub fn blend_lerp_clamped_pool2x2(host: &Tensor, seed: &Tensor, weight: &Tensor) -> Result<Tensor> {
    lerp_pool(host, seed, weight, true)
}

/// [`blend_lerp_pool2x2`], its weight clamped to `[0, 1]` where `clamp`.
fn lerp_pool(host: &Tensor, seed: &Tensor, weight: &Tensor, clamp: bool) -> Result<Tensor> {
    const OP: &str = "nn::blend_lerp_pool2x2";
    let shape = host.size();
    let fits = shape.len() == 4
        && shape.get(2).is_some_and(|&h| h >= 2)
        && shape.get(3).is_some_and(|&w| w >= 2)
        && i32::try_from(host.numel()).is_ok();
    let batch = shape.first().copied().unwrap_or(0);
    let fused = if fits {
        fused_blend(host, seed, weight, batch)?
    } else {
        None
    };
    let channels = shape.get(1).copied().unwrap_or(0);
    let layout = if is_nhwc(host) && channels > 1 {
        Some(true)
    } else if host.is_contiguous() {
        Some(false)
    } else {
        None
    };
    let (Some((device, bf16, weights)), Some(channels_last)) = (fused, layout) else {
        return max_pool2x2(&lerp(host, seed, weight, clamp)?);
    };
    let vec4 = channels_last && four_channels(host, channels) && four_channels(seed, channels);
    let k = kernels(OP, device, bf16, vec4)?;
    let handles = [k.blend_pool_forward.raw(), k.blend_pool_backward.raw()];
    // SAFETY: as in `lerp`.
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_blend_lerp_pool2(
                ffi::tensor_ptr(host),
                ffi::tensor_ptr(seed),
                ffi::tensor_ptr(&weights),
                i32::from(channels_last),
                if vec4 { 4 } else { 1 },
                i32::from(clamp),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// [`blend_lerp`], its weight clamped to `[0, 1]` where `clamp`.
fn lerp(host: &Tensor, seed: &Tensor, weight: &Tensor, clamp: bool) -> Result<Tensor> {
    const OP: &str = "nn::blend_lerp";
    let batch = host.size().first().copied().unwrap_or(0);
    let Some((device, bf16, weights)) = fused_blend(host, seed, weight, batch)? else {
        let clamped;
        let weight = if clamp {
            clamped = weight.f_clamp(0.0, 1.0).map_err(|error| torch(OP, error))?;
            &clamped
        } else {
            weight
        };
        return host
            .f_lerp_tensor(seed, weight)
            .map_err(|error| torch(OP, error));
    };
    let vec4 = vec4_fits(host, seed);
    let k = kernels(OP, device, bf16, vec4)?;
    let handles = [k.blend_forward.raw(), k.blend_backward.raw()];
    // SAFETY: every tensor pointer is live for the call; `handles` are live
    // kernels (the cache never drops them, so the autograd node's backward
    // may use them later).
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_blend_lerp(
                ffi::tensor_ptr(host),
                ffi::tensor_ptr(seed),
                ffi::tensor_ptr(&weights),
                if vec4 { 4 } else { 1 },
                i32::from(clamp),
                handles.as_ptr(),
                out,
            )
        })
    }
}

/// `blend_lerp` of `replicas` copies of the batch, stacked along the first
/// dimension: block `k` of the result is `host.lerp(seed, w_k)` with `w_k`
/// the `k`-th block of `N` weights. It is what the counterfactual pass
/// computes at its first seed, one block per alpha configuration.
///
/// The fused forward kernel reads `host` and `seed` once per block instead
/// of copying them `replicas` times first; it runs where [`blend_lerp`]'s
/// kernels would and neither `host` nor `seed` requires a gradient (it has
/// no backward). Anything else copies the batch (keeping a channels-last
/// layout, [`crate::memory::repeat_batch`]) and calls [`blend_lerp`], with
/// the same results up to float rounding.
///
/// # Shapes
/// `host`, `seed`: `[N, ...]`; `weight`: `[replicas · N or 1, 1, ..., 1]`;
/// returns `[replicas · N, ...]` in `host`'s layout and dtype.
///
/// # Errors
/// [`crate::Error::InvalidArgument`] for `replicas < 1`; otherwise as
/// [`blend_lerp`].
pub fn blend_lerp_replicated(
    host: &Tensor,
    seed: &Tensor,
    weight: &Tensor,
    replicas: i64,
) -> Result<Tensor> {
    const OP: &str = "nn::blend_lerp_replicated";
    if replicas < 1 {
        return Err(crate::Error::InvalidArgument {
            op: OP,
            message: format!("{replicas} replicas (at least 1)"),
        });
    }
    let batch = host.size().first().copied().unwrap_or(0);
    let fused = if host.requires_grad() || seed.requires_grad() {
        None
    } else {
        fused_blend(host, seed, weight, batch.saturating_mul(replicas))?
    };
    let Some((device, bf16, weights)) = fused else {
        let host = crate::memory::repeat_batch(host, replicas)?;
        let seed = crate::memory::repeat_batch(seed, replicas)?;
        return lerp(&host, &seed, weight, false);
    };
    let vec4 = vec4_fits(host, seed);
    let k = kernels(OP, device, bf16, vec4)?;
    // SAFETY: every tensor pointer is live for the call; the kernel is live
    // (the cache never drops it).
    unsafe {
        shim_tensor(OP, |out| {
            ffi::esper_blend_lerp_replicated(
                ffi::tensor_ptr(host),
                ffi::tensor_ptr(seed),
                ffi::tensor_ptr(&weights),
                replicas,
                if vec4 { 4 } else { 1 },
                k.blend_forward.raw(),
                out,
            )
        })
    }
}

/// Whether four values a thread fit: a sample's size a multiple of four
/// and both tensors 16-byte aligned.
fn vec4_fits(host: &Tensor, seed: &Tensor) -> bool {
    let per_sample = host
        .size()
        .first()
        .filter(|&&batch| batch > 0)
        .map_or(0, |&batch| {
            host.numel() / usize::try_from(batch).unwrap_or(1)
        });
    per_sample.is_multiple_of(4)
        && (host.data_ptr() as usize).is_multiple_of(16)
        && (seed.data_ptr() as usize).is_multiple_of(16)
}

/// The device, whether the dtype is `bf16`, and the weights as a contiguous
/// `f32` `[weight_batch]` or `[1]`, where the fused kernels take `host`,
/// `seed` and `weight` (see [`blend_lerp`]; `weight_batch` is the host's
/// batch there, and the copies' for [`blend_lerp_replicated`]); `None`
/// otherwise.
fn fused_blend(
    host: &Tensor,
    seed: &Tensor,
    weight: &Tensor,
    weight_batch: i64,
) -> Result<Option<(usize, bool, Tensor)>> {
    if !fused_kernels_enabled() || weight.requires_grad() {
        return Ok(None);
    }
    let Device::Cuda(device) = host.device() else {
        return Ok(None);
    };
    let bf16 = match host.kind() {
        Kind::Float => false,
        Kind::BFloat16 => true,
        _ => return Ok(None),
    };
    let shape = host.size();
    let Some(&batch) = shape.first() else {
        return Ok(None);
    };
    let same = seed.device() == host.device()
        && seed.kind() == host.kind()
        && seed.size() == shape
        && seed.stride() == host.stride();
    let dense = host.is_contiguous() || (shape.len() == 4 && is_nhwc(host));
    let weight_shape = weight.size();
    let per_sample_weight = weight_shape.len() == shape.len()
        && weight_shape.iter().skip(1).all(|&d| d == 1)
        && weight_shape
            .first()
            .is_some_and(|&n| n == weight_batch || n == 1);
    if !(same
        && dense
        && batch > 0
        && host.numel() > 0
        && per_sample_weight
        && weight.device() == host.device())
    {
        return Ok(None);
    }
    let weights = weight
        .f_to_kind(Kind::Float)
        .and_then(|w| w.f_reshape([-1]))
        .and_then(|w| w.f_contiguous())
        .map_err(|error| torch("nn::blend_lerp", error))?;
    Ok(Some((device, bf16, weights)))
}
