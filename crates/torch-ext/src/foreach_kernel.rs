//! `fused::foreach_zero_`, `foreach_copy_` and `foreach_add_` as
//! torch-ext's own kernel on CUDA: one launch zeroes, copies or adds up to
//! [`MAX_TENSORS`] tensors, a block taking 1,024 four-byte words of one
//! tensor. The same kernel casts `f32` tensors into `bf16` ones
//! ([`crate::nn::Bf16Shadows`]), a block taking 1,024 values.
//!
//! libtorch's `_foreach_*` kernels give each block one chunk of 65,536
//! values of one tensor, so a list of small tensors (a transformer's
//! weights and biases, a few hundred thousand values in all) runs a few
//! dozen blocks that each loop over their chunk: 7 - 13 us a launch on an
//! H200 in the `tolaria-lm` profile, where the same bytes take a few
//! microseconds spread over a few hundred blocks.
//!
//! Where it applies: every tensor on one CUDA device, contiguous, each
//! target the size (and for copies and adds the dtype) of its source, a
//! whole number of four-byte words at a four-byte aligned address; adds in
//! `f32` only (`t + alpha·o` with `alpha` cast to `f32`, libtorch's
//! arithmetic). Zeroing and copying move the words as they are, so every
//! dtype of four-byte multiples takes them. Anything else runs libtorch's
//! `_foreach_*` op. Casts take an `f32` source and a `bf16` target of as
//! many values, both contiguous, and round to nearest even as libtorch's
//! `to(bf16)` does (`cvt.rn.bf16.f32` from compute capability 8.0, the
//! same rounding in integer arithmetic before). Nothing is read back: a captured CUDA graph holds the
//! launches (the addresses travel by value in the kernel's parameters).

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::jit::{Arg, JitKernel, KernelCache};

/// Tensors one launch takes (the parameter table stays under 4 KiB).
pub(crate) const MAX_TENSORS: usize = 96;

/// Words a block moves (256 threads, four words each).
const BLOCK_WORDS: i64 = 1024;

/// Bytes of the table: the header (`count`, `op`, `alpha`) and
/// [`MAX_TENSORS`] entries (`dst`, `src`, `words`, `first_block`), eight
/// bytes each.
const TABLE_BYTES: usize = 3 * 8 + MAX_TENSORS * 4 * 8;

// The table travels as a kernel parameter: within the 4 KiB limit.
const _: () = assert!(TABLE_BYTES <= 4096);

/// The CUDA helper both multi-tensor kernels (this one and AdamW's) use: the
/// table entry a block works on, the last whose `first_block` is at most the
/// block's index (a binary search over the table's `count` entries).
pub(crate) const ENTRY_OF_BLOCK: &str = r#"
template <typename Table>
__device__ __forceinline__ int entry_of_block(const Table& t) {
    int lo = 0, hi = (int)t.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (t.entries[mid].first_block <= (long long)blockIdx.x) lo = mid; else hi = mid - 1;
    }
    return lo;
}
"#;

const SOURCE: &str = r#"
struct Entry { long long dst, src, words, first_block; };
struct Table { long long count, op; double alpha; Entry entries[96]; };

__device__ __forceinline__ unsigned short esper_to_bf16(float x) {
#if __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
#else
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0u;
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
#endif
}

// op 0: dst = 0; op 1: dst = src (words as they are); op 2: dst += alpha src (f32);
// op 3: dst (bf16) = src (f32) rounded to nearest even, `words` counting values.
extern "C" __global__ void esper_foreach(const Table t) {
    ESPER_PDL_ENTRY();
    const Entry e = t.entries[entry_of_block(t)];
    const long long start = ((long long)blockIdx.x - e.first_block) * 1024;
    if (t.op == 3) {
        unsigned short* out = reinterpret_cast<unsigned short*>(e.dst);
        const float* in = reinterpret_cast<const float*>(e.src);
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long i = start + threadIdx.x + u * 256;
            if (i < e.words) out[i] = esper_to_bf16(in[i]);
        }
        return;
    }
    unsigned int* dst = reinterpret_cast<unsigned int*>(e.dst);
    const unsigned int* src = reinterpret_cast<const unsigned int*>(e.src);
    if (t.op == 0) {
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long i = start + threadIdx.x + u * 256;
            if (i < e.words) dst[i] = 0u;
        }
        return;
    }
    unsigned int s[4], d[4];
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long i = start + threadIdx.x + u * 256;
        if (i < e.words) {
            s[u] = src[i];
            if (t.op == 2) d[u] = dst[i];
        }
    }
    const float alpha = (float)t.alpha;
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long i = start + threadIdx.x + u * 256;
        if (i >= e.words) continue;
        if (t.op == 1) {
            dst[i] = s[u];
        } else {
            const float sum = __uint_as_float(d[u]) + alpha * __uint_as_float(s[u]);
            dst[i] = __float_as_uint(sum);
        }
    }
}
"#;

/// What one launch does to each target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `dst = 0`.
    Zero,
    /// `dst = src`.
    Copy,
    /// `dst += alpha · src` (`f32`).
    Add,
    /// `dst = src` from `f32` into `bf16`, rounded to nearest even.
    CastBf16,
}

fn kernel(device: usize) -> Result<std::sync::Arc<JitKernel>> {
    static CACHE: KernelCache<usize, JitKernel> = KernelCache::new();
    CACHE
        .get_or_build(device, || {
            let arch = crate::cuda::device_capability(device).map_err(|e| e.to_string())?;
            crate::jit::compile(&format!("{ENTRY_OF_BLOCK}{SOURCE}"), "esper_foreach", arch)
                .and_then(|cubin| JitKernel::load(&cubin, device))
                .map_err(|e| e.to_string())
        })
        .map_err(|message| Error::Cpp {
            op: "fused::foreach",
            message,
        })
}

/// Four-byte words of `t` where the kernel can move it whole: defined,
/// on `device`, contiguous, a whole number of words at an aligned address.
fn words(t: &Tensor, device: Device) -> Option<i64> {
    if !t.defined() || t.device() != device || !t.is_contiguous() {
        return None;
    }
    let bytes = t.numel().checked_mul(t.kind().elt_size_in_bytes())?;
    if !bytes.is_multiple_of(4) || !(t.data_ptr() as usize).is_multiple_of(4) {
        return None;
    }
    i64::try_from(bytes / 4).ok()
}

/// Values of a cast's `bf16` target and `f32` source where the kernel can
/// take them: both contiguous on `device`, as many values, the source
/// four-byte aligned.
fn cast_values(target: &Tensor, source: &Tensor, device: Device) -> Option<i64> {
    let fits = |t: &Tensor, kind: Kind| {
        t.defined() && t.device() == device && t.is_contiguous() && t.kind() == kind
    };
    (fits(target, Kind::BFloat16)
        && fits(source, Kind::Float)
        && target.numel() == source.numel()
        && (source.data_ptr() as usize).is_multiple_of(4))
    .then(|| i64::try_from(source.numel()).ok())
    .flatten()
}

/// Runs `op` over `dst` (and `src`, the same length, for copies and adds)
/// with the kernel and returns `true`, or returns `false` having done
/// nothing when a tensor does not fit it (the caller runs libtorch's op).
pub(crate) fn run(op: Op, dst: &[Tensor], src: &[Tensor], alpha: f64) -> Result<bool> {
    if !crate::nn::fused_kernels_enabled() {
        return Ok(false);
    }
    let Some(first) = dst.first() else {
        return Ok(false);
    };
    let device = first.device();
    let Device::Cuda(index) = device else {
        return Ok(false);
    };
    if op != Op::Zero && src.len() != dst.len() {
        return Ok(false);
    }
    let mut entries = Vec::with_capacity(dst.len());
    for (position, target) in dst.iter().enumerate() {
        if op == Op::CastBf16 {
            let Some(source) = src.get(position) else {
                return Ok(false);
            };
            let Some(values) = cast_values(target, source, device) else {
                return Ok(false);
            };
            entries.push((target.data_ptr() as i64, source.data_ptr() as i64, values));
            continue;
        }
        let Some(count) = words(target, device) else {
            return Ok(false);
        };
        let source = match op {
            Op::Zero => 0,
            Op::Copy | Op::Add | Op::CastBf16 => {
                let Some(source) = src.get(position) else {
                    return Ok(false);
                };
                if words(source, device) != Some(count)
                    || source.kind() != target.kind()
                    || (op == Op::Add && target.kind() != Kind::Float)
                {
                    return Ok(false);
                }
                source.data_ptr() as i64
            }
        };
        entries.push((target.data_ptr() as i64, source, count));
    }
    let k = kernel(index)?;
    let code: i64 = match op {
        Op::Zero => 0,
        Op::Copy => 1,
        Op::Add => 2,
        Op::CastBf16 => 3,
    };
    for chunk in entries.chunks(MAX_TENSORS) {
        let mut table = Vec::with_capacity(TABLE_BYTES);
        let count = i64::try_from(chunk.len()).unwrap_or(0);
        table.extend_from_slice(&count.to_ne_bytes());
        table.extend_from_slice(&code.to_ne_bytes());
        table.extend_from_slice(&alpha.to_ne_bytes());
        let mut blocks = 0_i64;
        for &(target, source, count) in chunk {
            for word in [target, source, count, blocks] {
                table.extend_from_slice(&word.to_ne_bytes());
            }
            blocks = blocks.saturating_add(count.saturating_add(BLOCK_WORDS - 1) / BLOCK_WORDS);
        }
        table.resize(TABLE_BYTES, 0);
        if blocks == 0 {
            continue;
        }
        let grid = u32::try_from(blocks).map_err(|_| Error::InvalidArgument {
            op: "fused::foreach",
            message: format!("{blocks} blocks do not fit one launch"),
        })?;
        k.launch([grid, 1, 1], [256, 1, 1], 0, &[Arg::Bytes(&table)])?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_foreach_kernel_compiles_without_a_gpu() {
        let cubin = crate::jit::compile(
            &format!("{ENTRY_OF_BLOCK}{SOURCE}"),
            "esper_foreach",
            (9, 0),
        )
        .expect("NVRTC compiles it");
        assert!(cubin.contains_symbol("esper_foreach"));
        assert!(SOURCE.contains(&format!("Entry entries[{MAX_TENSORS}]")));
        // Before compute capability 8.0 the cast rounds in integers.
        let older = crate::jit::compile(
            &format!("{ENTRY_OF_BLOCK}{SOURCE}"),
            "esper_foreach",
            (7, 5),
        )
        .expect("NVRTC compiles it for sm_75");
        assert!(older.contains_symbol("esper_foreach"));
    }

    #[test]
    fn tensors_off_cuda_go_to_libtorch() {
        let t = vec![Tensor::zeros([3], (Kind::Float, Device::Cpu))];
        for op in [Op::Zero, Op::Copy, Op::Add, Op::CastBf16] {
            assert!(!run(op, &t, &t, 1.0).unwrap());
        }
    }
}
