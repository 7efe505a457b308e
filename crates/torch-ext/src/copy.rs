//! Tensor copies tch cannot express: `copy_` with `non_blocking = true`,
//! writing bytes straight into a host tensor ([`write_host_bytes`]), and a
//! raw asynchronous copy a CUDA graph can capture ([`memcpy_async`]).

use crate::error::{Error, Result};
use crate::ffi;

/// `dst.copy_(src, non_blocking=true)`.
///
/// A host-to-device copy from pinned memory (`Tensor::pin_memory`) or a
/// device-to-device copy is queued on the current stream and returns at once;
/// other copies behave like a blocking `copy_`. The caller must keep `src`
/// unchanged until the copy has run (synchronise the stream or an event).
/// Shapes must broadcast and dtypes convert exactly as for `copy_`.
pub fn copy_non_blocking(dst: &mut tch::Tensor, src: &tch::Tensor) -> Result<()> {
    // SAFETY: both pointers are the live `at::Tensor`s behind tch tensors that
    // outlive the call; `dst` is borrowed mutably, matching the in-place write.
    unsafe {
        ffi::check(
            "copy_non_blocking",
            ffi::esper_copy_(ffi::tensor_ptr(dst), ffi::tensor_ptr(src), 1),
        )
    }
}

/// Writes `src` into the host memory of `dst` from its first element on,
/// without a libtorch op: `dst` must be a contiguous CPU tensor (pinned or
/// not) of at least `src.len()` bytes. The packing path of an upload: write
/// the step's bytes straight into a page-locked buffer, then queue one
/// [`copy_non_blocking`] to the device. The caller must not write while an
/// earlier copy from `dst` may still be running (synchronise an event
/// recorded after it).
pub fn write_host_bytes(dst: &tch::Tensor, src: &[u8]) -> Result<()> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "write_host_bytes",
        message,
    };
    if dst.device() != tch::Device::Cpu {
        return Err(refuse(format!(
            "the target is on {:?}, not the host",
            dst.device()
        )));
    }
    if !dst.is_contiguous() {
        return Err(refuse("the target is not contiguous".to_owned()));
    }
    let element = dst.kind().elt_size_in_bytes();
    let capacity = dst.numel().saturating_mul(element);
    if src.len() > capacity {
        return Err(refuse(format!(
            "{} bytes do not fit a target of {capacity} bytes",
            src.len()
        )));
    }
    if src.is_empty() {
        return Ok(());
    }
    let target = dst.data_ptr().cast::<u8>();
    if target.is_null() {
        return Err(refuse("the target has no storage".to_owned()));
    }
    // SAFETY: `dst` is a live, contiguous host tensor whose storage spans
    // at least `capacity >= src.len()` bytes from `data_ptr` (checked
    // above); `src` is a distinct Rust slice, so the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), target, src.len()) };
    Ok(())
}

/// The bytes of `src` into `dst` with one `cudaMemcpyAsync` on the current
/// stream of the CUDA side's device. Unlike [`copy_non_blocking`] it
/// touches neither the dispatcher nor libtorch's pinned-memory allocator,
/// so a CUDA graph can capture it: each replay then copies what the host
/// memory holds at that moment (the upload of a step's inputs, the
/// readback of its outputs, inside the step's graph).
///
/// Both tensors must be contiguous with the same size in bytes (dtypes may
/// differ: the bytes are copied as they are); at least one must be on a
/// CUDA device, and a host side must be page-locked ([`crate::memory::pin`]).
/// The caller keeps the host memory alive and does not touch it until the
/// copy (or the replay that holds it) has run.
pub fn memcpy_async(dst: &tch::Tensor, src: &tch::Tensor) -> Result<()> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "memcpy_async",
        message,
    };
    let sides = [("target", dst), ("source", src)];
    for (side, tensor) in sides {
        if !tensor.is_contiguous() {
            return Err(refuse(format!("the {side} is not contiguous")));
        }
    }
    for (side, tensor) in sides {
        if tensor.device() == tch::Device::Cpu && !crate::memory::is_pinned(tensor) {
            return Err(refuse(format!(
                "the {side} is in pageable host memory (pin it first)"
            )));
        }
    }
    if dst.device() == tch::Device::Cpu && src.device() == tch::Device::Cpu {
        return Err(refuse("neither side is on a CUDA device".to_owned()));
    }
    let bytes = |tensor: &tch::Tensor| {
        tensor
            .numel()
            .saturating_mul(tensor.kind().elt_size_in_bytes())
    };
    if bytes(dst) != bytes(src) {
        return Err(refuse(format!(
            "the target holds {} bytes, the source {}",
            bytes(dst),
            bytes(src)
        )));
    }
    // SAFETY: both pointers are the live `at::Tensor`s behind tch tensors
    // that outlive the call; the shim checks layouts and sizes again.
    unsafe {
        ffi::check(
            "memcpy_async",
            ffi::esper_memcpy_async(ffi::tensor_ptr(dst), ffi::tensor_ptr(src)),
        )
    }
}

/// Writes per launch of the one-kernel path of [`index_copy_many`].
const MAX_INDEXED_WRITES: usize = 24;

/// The kernel of [`index_copy_many`]: block row `y` copies write `y` of the
/// table, byte by byte (the writes are a few kilobytes in all), at the
/// index the device holds; an index outside the target's extent copies
/// nothing.
const INDEXED_COPY_SOURCE: &str = r#"
struct Write {
    long long dst, src, outer, inner, dst_outer_stride, dst_index_stride, src_outer_stride, extent;
};
struct Table {
    long long count;
    Write writes[24];
};
extern "C" __global__ void esper_index_copy_many(Table table, const long long* index) {
    ESPER_PDL_ENTRY();
    if (blockIdx.y >= table.count) return;
    const Write w = table.writes[blockIdx.y];
    const long long at = *index;
    if (at < 0 || at >= w.extent) return;
    const long long total = w.outer * w.inner;
    char* dst = reinterpret_cast<char*>(w.dst) + at * w.dst_index_stride;
    const char* src = reinterpret_cast<const char*>(w.src);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long o = i / w.inner;
        const long long b = i - o * w.inner;
        dst[o * w.dst_outer_stride + b] = src[o * w.src_outer_stride + b];
    }
}
"#;

/// One write of the one-kernel path, in bytes (the kernel's `Write`).
#[derive(Debug, Clone, Copy)]
struct IndexedWrite {
    dst: i64,
    src: i64,
    outer: i64,
    inner: i64,
    dst_outer_stride: i64,
    dst_index_stride: i64,
    src_outer_stride: i64,
    extent: i64,
}

fn indexed_copy_kernel(device: usize) -> Result<std::sync::Arc<crate::jit::JitKernel>> {
    static CACHE: crate::jit::KernelCache<usize, crate::jit::JitKernel> =
        crate::jit::KernelCache::new();
    CACHE
        .get_or_build(device, || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            crate::jit::compile(INDEXED_COPY_SOURCE, "esper_index_copy_many", arch)
                .and_then(|cubin| crate::jit::JitKernel::load(&cubin, device))
                .map_err(|e| e.to_string())
        })
        .map_err(|message| Error::Cpp {
            op: "index_copy_many",
            message,
        })
}

/// The byte layout of `(dst, dim, src)` for the kernel, or `None` when the
/// layouts do not fit it (the caller then uses `index_copy_`): `dst`
/// contiguous; `src`'s dimensions from `dim` on contiguous, and those
/// before it one strided row dimension (or contiguous).
fn indexed_write(dst: &tch::Tensor, dim: usize, src: &tch::Tensor) -> Option<IndexedWrite> {
    if !dst.is_contiguous() {
        return None;
    }
    let element = i64::try_from(dst.kind().elt_size_in_bytes()).ok()?;
    let shape = dst.size();
    let extent = *shape.get(dim)?;
    let outer: i64 = shape.get(..dim)?.iter().product();
    let inner = shape
        .get(dim + 1..)?
        .iter()
        .product::<i64>()
        .checked_mul(element)?;
    // `src`'s trailing dimensions (those of `dst` after `dim`) contiguous.
    let src_shape = src.size();
    let src_strides = src.stride();
    let mut expected = 1_i64;
    for (size, stride) in src_shape.iter().zip(&src_strides).skip(dim).rev() {
        if *size != 1 && *stride != expected {
            return None;
        }
        expected = expected.checked_mul(*size)?;
    }
    let src_outer_stride = match dim {
        0 => 0,
        1 => src_strides.first()?.checked_mul(element)?,
        _ if src.is_contiguous() => inner,
        _ => return None,
    };
    Some(IndexedWrite {
        dst: dst.data_ptr() as i64,
        src: src.data_ptr() as i64,
        outer,
        inner,
        dst_outer_stride: extent.checked_mul(inner)?,
        dst_index_stride: inner,
        src_outer_stride,
        extent,
    })
}

/// `dst.index_copy_(dim, index, src.unsqueeze(dim))` for every
/// `(dst, dim, src)` of `writes`: each `src` (the shape of its `dst` without
/// dimension `dim`, same dtype and device) written at position `index`
/// (an `i64` tensor of one element, on the same device, never read on the
/// host) along `dim`. On CUDA, where the layouts allow (a contiguous
/// target; a source whose dimensions from `dim` on are contiguous), the
/// writes go in one kernel launch per 24 (a run-time compiled kernel, so a
/// CUDA graph captures it as one node), else one `index_copy_` each; an
/// index outside a target's extent writes nothing on the kernel path (the
/// caller checks it on the host first). Everything is checked before any
/// write: a refused call writes nothing.
pub fn index_copy_many(
    writes: &[(&tch::Tensor, i64, &tch::Tensor)],
    index: &tch::Tensor,
) -> Result<()> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "index_copy_many",
        message,
    };
    let device = index.device();
    if index.size() != [1] || index.kind() != tch::Kind::Int64 {
        return Err(refuse(format!(
            "the index must be one Int64 element, got {:?} {:?}",
            index.kind(),
            index.size()
        )));
    }
    let mut dims = Vec::with_capacity(writes.len());
    for (position, (dst, dim, src)) in writes.iter().enumerate() {
        let mut expected = dst.size();
        let dim = usize::try_from(*dim)
            .ok()
            .filter(|dim| *dim < expected.len())
            .ok_or_else(|| {
                refuse(format!(
                    "write {position}: dimension {dim} of a {}-dimensional target",
                    expected.len()
                ))
            })?;
        expected.remove(dim);
        if src.size() != expected
            || src.kind() != dst.kind()
            || src.device() != device
            || dst.device() != device
        {
            return Err(refuse(format!(
                "write {position}: a {:?} {:?} source on {:?} for a {:?} {:?} target on {:?} \
                 (index on {device:?})",
                src.kind(),
                src.size(),
                src.device(),
                dst.kind(),
                dst.size(),
                dst.device()
            )));
        }
        dims.push(dim);
    }
    let layouts: Option<Vec<IndexedWrite>> = match device {
        tch::Device::Cuda(_) => writes
            .iter()
            .zip(&dims)
            .map(|((dst, _, src), dim)| indexed_write(dst, *dim, src))
            .collect(),
        _ => None,
    };
    let (Some(layouts), tch::Device::Cuda(ordinal)) = (layouts, device) else {
        // (Each `dim` was checked above.)
        for (dst, dim, src) in writes {
            let source = src.f_unsqueeze(*dim).map_err(|e| refuse(e.to_string()))?;
            let _ = dst
                .shallow_clone()
                .f_index_copy_(*dim, index, &source)
                .map_err(|e| Error::Cpp {
                    op: "index_copy_many",
                    message: e.to_string(),
                })?;
        }
        return Ok(());
    };
    let kernel = indexed_copy_kernel(ordinal)?;
    for chunk in layouts.chunks(MAX_INDEXED_WRITES) {
        let mut table = Vec::with_capacity(8 + MAX_INDEXED_WRITES * 64);
        let count = i64::try_from(chunk.len()).unwrap_or(0);
        table.extend_from_slice(&count.to_ne_bytes());
        for write in chunk {
            for field in [
                write.dst,
                write.src,
                write.outer,
                write.inner,
                write.dst_outer_stride,
                write.dst_index_stride,
                write.src_outer_stride,
                write.extent,
            ] {
                table.extend_from_slice(&field.to_ne_bytes());
            }
        }
        table.resize(8 + MAX_INDEXED_WRITES * 64, 0);
        let largest = chunk
            .iter()
            .map(|write| write.outer.saturating_mul(write.inner))
            .max()
            .unwrap_or(1);
        let blocks = u32::try_from((largest.saturating_add(255) / 256).clamp(1, 16)).unwrap_or(16);
        let rows = u32::try_from(chunk.len()).unwrap_or(1);
        kernel.launch(
            [blocks, rows, 1],
            [256, 1, 1],
            0,
            &[
                crate::jit::Arg::Bytes(&table),
                crate::jit::Arg::Tensor(index),
            ],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_indexed_copy_kernel_compiles_without_a_gpu() {
        let cubin = crate::jit::compile(INDEXED_COPY_SOURCE, "esper_index_copy_many", (9, 0))
            .expect("NVRTC compiles it for sm_90");
        assert!(cubin.contains_symbol("esper_index_copy_many"));
    }

    #[test]
    fn layouts_the_kernel_cannot_take_are_left_to_index_copy() {
        let dst = tch::Tensor::zeros([4, 6, 3], (tch::Kind::Float, tch::Device::Cpu));
        let src = tch::Tensor::zeros([4, 3], (tch::Kind::Float, tch::Device::Cpu));
        let write = indexed_write(&dst, 1, &src).expect("contiguous fits");
        assert_eq!((write.outer, write.inner, write.extent), (4, 12, 6));
        assert_eq!((write.dst_outer_stride, write.dst_index_stride), (72, 12));
        assert_eq!(write.src_outer_stride, 12);
        // Rows of a wider tensor: the row stride is kept.
        let wide = tch::Tensor::zeros([4, 5], (tch::Kind::Float, tch::Device::Cpu));
        let rows = wide.narrow(1, 1, 3);
        assert_eq!(
            indexed_write(&dst, 1, &rows)
                .expect("strided rows")
                .src_outer_stride,
            20
        );
        // A transposed source or target is not for the kernel.
        let transposed = tch::Tensor::zeros([3, 4], (tch::Kind::Float, tch::Device::Cpu)).tr();
        assert!(indexed_write(&dst, 1, &transposed).is_none());
        assert!(indexed_write(&dst.transpose(0, 2), 1, &src).is_none());
    }
}
