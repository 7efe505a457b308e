//! [`causal_attention`]: causal multi-head self-attention over a packed
//! query-key-value projection, one run-time compiled kernel each way where
//! it applies (see the parent module's docs), libtorch's fused
//! scaled-dot-product attention otherwise.

use std::ffi::CString;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::attention_source::ATTENTION_SOURCE;
use super::{fused_kernels_enabled, shim_tensor, torch};
use crate::error::{Error, Result};
use crate::ffi;
use crate::jit::{JitKernel, KernelCache};

/// Longest sequence [`causal_attention`]'s own kernels take (a block holds
/// a whole head's queries, keys and values); longer ones use libtorch's.
pub const MAX_FUSED_ATTENTION_TIME: i64 = 64;

/// The head widths [`causal_attention`]'s own kernels take.
pub const FUSED_ATTENTION_HEAD_DIMS: [i64; 2] = [16, 32];

/// `attention(qkv)`: the causal self-attention of a packed projection
/// `qkv = [q | k | v]` (each `C = heads x D` wide) with `heads` heads,
/// scaled by `1 / sqrt(D)`, the heads merged back into `[B, T, C]`: what
/// `scaled_dot_product_attention(q, k, v, is_causal = true)` computes on
/// `[B, heads, T, D]` views, transposed back and made contiguous.
///
/// The own path takes a contiguous, 16-byte aligned `bf16` CUDA tensor
/// (the projection's output under `bf16` autocast) on a device of compute
/// capability 8.0 or newer, with at most [`MAX_FUSED_ATTENTION_TIME`]
/// positions and heads of a width in [`FUSED_ATTENTION_HEAD_DIMS`]. Its
/// forward is one kernel (a block a sequence and head: the scores on bf16
/// tensor cores with `f32` sums, the mask and softmax in registers); its
/// backward is one kernel that recomputes the probabilities and writes the
/// gradient of `qkv` in its own layout. libtorch's path launches separate
/// layout copies, its attention kernels, two helper kernels and a
/// concatenation of the three gradients. Results match libtorch's up to
/// bf16 rounding (the probabilities enter the value product in `bf16`, as
/// in flash attention). Anything else takes libtorch's composition, and
/// [`super::set_fused_kernels`] turns the own path off.
///
/// # Shapes
/// `qkv: [B, T, 3C]` with `C` divisible by `heads`; returns `[B, T, C]` in
/// `qkv`'s dtype.
///
/// # Errors
/// [`Error::InvalidArgument`] for a `qkv` that is not three-dimensional or
/// whose last dimension is not `3 x heads x D`, or `heads < 1`;
/// [`Error::Cpp`] when the kernels cannot be compiled or launched, or for
/// libtorch's errors on its path.
///
/// ```ignore
/// use tch::{Device, Kind, Tensor};
/// // 8 sequences of 64 tokens, width 128 in 4 heads of 32.
/// let qkv = Tensor::randn([8, 64, 384], (Kind::BFloat16, Device::Cuda(0)))
///     .set_requires_grad(true);
/// let attended = torch_ext::nn::causal_attention(&qkv, 4)?; // [8, 64, 128]
/// attended.sum(Kind::Float).backward(); // qkv.grad(): [8, 64, 384]
/// # Ok::<(), torch_ext::Error>(())
/// ```
pub fn causal_attention(qkv: &Tensor, heads: i64) -> Result<Tensor> {
    const OP: &str = "nn::causal_attention";
    let size = qkv.size();
    let &[batch, time, packed] = size.as_slice() else {
        return Err(Error::InvalidArgument {
            op: OP,
            message: format!("expected a projection [B, T, 3C], got shape {size:?}"),
        });
    };
    if heads < 1 || packed % 3 != 0 || (packed / 3) % heads != 0 {
        return Err(Error::InvalidArgument {
            op: OP,
            message: format!("the last dimension {packed} is not 3 x {heads} heads x a head width"),
        });
    }
    let width = packed / 3;
    let head_dim = width / heads;
    if let Some(device) = attention_target(qkv, batch, time, heads, head_dim) {
        let k = attention_kernels(OP, device)?;
        let (forward, backward) = if head_dim == 16 { &k.d16 } else { &k.d32 };
        let handles = [forward.raw(), backward.raw()];
        // SAFETY: the tensor pointer is live for the call; the kernels are
        // live (the cache never drops them, so the autograd node's backward
        // may use them later).
        return unsafe {
            shim_tensor(OP, |out| {
                ffi::esper_causal_attention(ffi::tensor_ptr(qkv), heads, handles.as_ptr(), out)
            })
        };
    }
    libtorch_attention(qkv, batch, time, heads, head_dim).map_err(|error| torch(OP, error))
}

/// libtorch's composition: `[B, H, T, D]` views, fused SDPA, merge.
fn libtorch_attention(
    qkv: &Tensor,
    batch: i64,
    time: i64,
    heads: i64,
    head_dim: i64,
) -> std::result::Result<Tensor, tch::TchError> {
    let width = heads * head_dim;
    // One split, not three narrows: its backward is one concatenation,
    // where each narrow's would zero-fill a full-width gradient and
    // autograd would add the three.
    let parts = qkv.f_split(width, 2)?;
    let [q, k, v] = parts.as_slice() else {
        return Err(tch::TchError::Shape(format!(
            "attention: {} parts of a [B, T, 3C] projection",
            parts.len()
        )));
    };
    let heads_view = |t: &Tensor| -> std::result::Result<Tensor, tch::TchError> {
        t.f_reshape([batch, time, heads, head_dim])?
            .f_transpose(1, 2)
    };
    let (q, k, v) = (heads_view(q)?, heads_view(k)?, heads_view(v)?);
    let attended =
        Tensor::f_scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, false)?;
    attended
        .f_transpose(1, 2)?
        .f_contiguous()?
        .f_reshape([batch, time, width])
}

/// The CUDA device where [`causal_attention`]'s own path applies.
fn attention_target(
    qkv: &Tensor,
    batch: i64,
    time: i64,
    heads: i64,
    head_dim: i64,
) -> Option<usize> {
    if !fused_kernels_enabled() {
        return None;
    }
    let Device::Cuda(device) = qkv.device() else {
        return None;
    };
    let fits = qkv.kind() == Kind::BFloat16
        && qkv.is_contiguous()
        && (qkv.data_ptr() as usize).is_multiple_of(16)
        && (1..=MAX_FUSED_ATTENTION_TIME).contains(&time)
        && FUSED_ATTENTION_HEAD_DIMS.contains(&head_dim)
        && batch >= 1
        && batch
            .checked_mul(heads)
            .is_some_and(|blocks| blocks <= i64::from(i32::MAX));
    let tensor_cores = crate::cuda::device_capability(device).is_ok_and(|(major, _)| major >= 8);
    (fits && tensor_cores).then_some(device)
}

/// The forward and backward kernels for each head width, on one device.
struct AttentionKernels {
    d16: (JitKernel, JitKernel),
    d32: (JitKernel, JitKernel),
}

fn attention_kernels(op: &'static str, device: usize) -> Result<Arc<AttentionKernels>> {
    static CACHE: KernelCache<usize, AttentionKernels> = KernelCache::new();
    CACHE
        .get_or_build(device, || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            let cubin = crate::jit::compile(ATTENTION_SOURCE, "esper_attention", arch)
                .map_err(|e| e.to_string())?;
            let load = |name: &str| {
                let name = CString::new(name).map_err(|e| e.to_string())?;
                JitKernel::load_named(&cubin, &name, device).map_err(|e| e.to_string())
            };
            Ok(AttentionKernels {
                d16: (
                    load("esper_attention_forward_d16")?,
                    load("esper_attention_backward_d16")?,
                ),
                d32: (
                    load("esper_attention_forward_d32")?,
                    load("esper_attention_backward_d32")?,
                ),
            })
        })
        .map_err(|message| Error::Cpp { op, message })
}
