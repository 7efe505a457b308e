//! The sampler as one CUDA kernel: op choice, op-conditioned masks, the
//! probability floors, Gumbel-max choice of every head, log-probabilities,
//! normalised entropies and relevance for a whole batch in a single launch
//! (one thread per environment), instead of several hundred small libtorch
//! kernels.
//!
//! It computes what [`super::sampling`]'s libtorch implementation computes,
//! step for step (the same SplitMix64 noise from the same draw bases, the
//! same floor renormalisation, the same masking constants), so the two give
//! the same actions and log-probabilities equal to float rounding; a GPU
//! test holds them to that. The kernel is compiled at run time with NVRTC
//! ([`torch_ext::jit`]) once per process, slot count and device, and
//! launched on the current stream, so the graphed policy step captures it.
//! Where it cannot be built (no NVRTC, an unknown architecture) the sampler
//! keeps the libtorch implementation and says why
//! ([`super::Sampler::fused_fallback`]).

use std::fmt::Write as _;
use std::sync::Arc;

use leyline::{LifecycleOp, NUM_ACTION_HEADS};
use tch::{Device, Kind, Tensor};
use torch_ext::jit::{Arg, JitKernel, KernelCache};

use super::sampling::{MASKED_LOGIT_VALUE, SampleMode, SampledActions};
use crate::error::{TorchResultExt, shape_mismatch};
use crate::heads::{OP, SLOT, canonical_action, head_sizes};
use crate::masks::MaskTensors;
use crate::{Error, Result};

/// The kernel's name in its source.
const KERNEL: &str = "tamiyo_sample";
/// Threads per block (one environment each).
const BLOCK: u32 = 128;

/// The sampling kernel's CUDA C source for `num_slots` slots.
fn source(num_slots: usize) -> String {
    let sizes = head_sizes(num_slots);
    let mut offsets = [0_usize; NUM_ACTION_HEADS];
    let mut total = 0;
    for (offset, size) in offsets.iter_mut().zip(sizes) {
        *offset = total;
        total = total.saturating_add(size);
    }
    let widest = sizes.iter().copied().max().unwrap_or(1).max(1);
    // Draw numbers: the op first, then the other heads in order.
    let mut draws = [0_usize; NUM_ACTION_HEADS];
    let mut next = 1;
    for (head, draw) in draws.iter_mut().enumerate() {
        if head != OP {
            *draw = next;
            next = next.saturating_add(1);
        }
    }
    let canonical: Vec<i64> = (0..NUM_ACTION_HEADS)
        .map(|head| canonical_action(head).unwrap_or(-1))
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "#define H {NUM_ACTION_HEADS}");
    let _ = writeln!(out, "#define S {num_slots}");
    let _ = writeln!(out, "#define TOTAL {total}");
    let _ = writeln!(out, "#define NOPS {}", LifecycleOp::ALL.len());
    let _ = writeln!(out, "#define MAXW {widest}");
    let _ = writeln!(out, "#define OP_HEAD {OP}");
    let _ = writeln!(out, "#define SLOT_HEAD {SLOT}");
    let _ = writeln!(out, "#define MASKED {MASKED_LOGIT_VALUE:?}f");
    let tables: [(&str, Vec<String>); 4] = [
        ("SIZE", sizes.iter().map(ToString::to_string).collect()),
        ("OFFSET", offsets.iter().map(ToString::to_string).collect()),
        ("DRAW", draws.iter().map(ToString::to_string).collect()),
        (
            "CANONICAL",
            canonical.iter().map(ToString::to_string).collect(),
        ),
    ];
    for (name, values) in tables {
        let _ = writeln!(
            out,
            "__constant__ int {name}[H] = {{{}}};",
            values.join(", ")
        );
    }
    out.push_str(BODY);
    out
}

/// The kernel body (after the generated constants).
const BODY: &str = r#"
typedef unsigned long long u64;
#define INFINITY __int_as_float(0x7f800000)

// Gumbel noise of element `index` of the draw with base `base`: the
// SplitMix64 finaliser of (index + 1) * golden + base, top 24 bits, as
// PolicyRng computes it with tensor ops.
__device__ float gumbel(u64 index, u64 base) {
    u64 x = (index + 1ULL) * 0x9E3779B97F4A7C15ULL + base;
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27; x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    float u = ((float)(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
    return -logf(-logf(u));
}

// Masked (and floored) logits of one head: `raw` its logits, `m` its mask.
__device__ void head_logits(const float* raw, const unsigned char* m, int n, float floor_p,
                            float* out) {
    for (int j = 0; j < n; ++j) out[j] = m[j] ? raw[j] : MASKED;
    if (floor_p <= 0.0f) return;
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) mx = fmaxf(mx, out[j]);
    float sum = 0.0f;
    float probs[MAXW];
    for (int j = 0; j < n; ++j) { probs[j] = expf(out[j] - mx); sum += probs[j]; }
    float valid = 0.0f;
    for (int j = 0; j < n; ++j) { probs[j] = probs[j] / sum; valid += m[j] ? 1.0f : 0.0f; }
    valid = fmaxf(valid, 1.0f);
    float effective = fminf((1.0f / valid) * 0.99f, floor_p);
    float under_count = 0.0f, over_total = 0.0f;
    for (int j = 0; j < n; ++j) {
        if (!m[j]) continue;
        if (probs[j] < effective) under_count += 1.0f; else over_total += probs[j];
    }
    float floor_mass = under_count * effective;
    over_total = fmaxf(over_total, 1e-8f);
    float scale = fmaxf(1.0f - floor_mass, 1e-8f) / over_total;
    for (int j = 0; j < n; ++j) {
        float p = probs[j];
        float floored = p;
        if (m[j]) floored = p < effective ? effective : p * scale;
        out[j] = m[j] ? logf(fmaxf(floored, 1e-8f)) : MASKED;
    }
}

// Index of the best valid option (first on ties; 0 when none is valid).
__device__ int choose(const float* ml, const unsigned char* m, int n, int stochastic,
                      u64 first_index, u64 base) {
    int best = 0;
    float best_score = -INFINITY;
    bool found = false;
    for (int j = 0; j < n; ++j) {
        if (!m[j]) continue;
        float score = stochastic ? ml[j] + gumbel(first_index + (u64)j, base) : ml[j];
        if (!found || score > best_score) { best = j; best_score = score; found = true; }
    }
    return best;
}

extern "C" __global__ void tamiyo_sample(
    const float* __restrict__ logits, const unsigned char* __restrict__ masks,
    const unsigned char* __restrict__ slot_by_op, const unsigned char* __restrict__ relevance,
    const long long* __restrict__ bases,
    long long* __restrict__ actions, float* __restrict__ log_probs,
    float* __restrict__ entropies, unsigned char* __restrict__ relevant_out,
    unsigned char* __restrict__ conditioned,
    int batch, int stochastic,
    float f0, float f1, float f2, float f3, float f4, float f5, float f6, float f7) {
    ESPER_PDL_ENTRY();
    const float floors[8] = {f0, f1, f2, f3, f4, f5, f6, f7};
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const float* lg = logits + (long long)b * TOTAL;
    const unsigned char* mk = masks + (long long)b * TOTAL;
    float ml[MAXW];
    unsigned char m[MAXW];

    // 1. The op, from its base mask.
    int op_n = SIZE[OP_HEAD];
    for (int j = 0; j < op_n; ++j) m[j] = mk[OFFSET[OP_HEAD] + j];
    head_logits(lg + OFFSET[OP_HEAD], m, op_n, floors[OP_HEAD], ml);
    int op = choose(ml, m, op_n, stochastic, (u64)b * (u64)op_n,
                    stochastic ? (u64)bases[DRAW[OP_HEAD]] : 0ULL);

    // 2. Every head under its op-conditioned mask.
    for (int h = 0; h < H; ++h) {
        int n = SIZE[h];
        bool rel = relevance[op * H + h] != 0;
        const unsigned char* base_mask =
            h == SLOT_HEAD ? slot_by_op + ((long long)b * NOPS + op) * S : mk + OFFSET[h];
        if (h == OP_HEAD) {
            for (int j = 0; j < n; ++j) m[j] = base_mask[j];
        } else {
            int canonical = CANONICAL[h];
            if (canonical < 0) {
                canonical = 0;
                for (int j = 0; j < n; ++j) { if (base_mask[j]) { canonical = j; break; } }
            }
            for (int j = 0; j < n; ++j) m[j] = rel ? base_mask[j] : (unsigned char)(j == canonical);
        }
        head_logits(lg + OFFSET[h], m, n, floors[h], ml);
        int action = h == OP_HEAD
            ? op
            : choose(ml, m, n, stochastic, (u64)b * (u64)n, stochastic ? (u64)bases[DRAW[h]] : 0ULL);
        float mx = -INFINITY;
        for (int j = 0; j < n; ++j) mx = fmaxf(mx, ml[j]);
        float sum = 0.0f;
        for (int j = 0; j < n; ++j) sum += expf(ml[j] - mx);
        float lse = logf(sum);
        float raw_entropy = 0.0f, valid = 0.0f;
        for (int j = 0; j < n; ++j) {
            float lp = ml[j] - mx - lse;
            if (m[j]) { raw_entropy += expf(lp) * lp; valid += 1.0f; }
        }
        raw_entropy = -raw_entropy;
        float entropy = 0.0f;
        if (valid > 1.0f) entropy = raw_entropy / fmaxf(logf(fmaxf(valid, 1.0f)), 1e-8f);
        long long out = (long long)b * H + h;
        actions[out] = action;
        log_probs[out] = ml[action] - mx - lse;
        entropies[out] = entropy;
        relevant_out[out] = (unsigned char)rel;
        for (int j = 0; j < n; ++j) conditioned[(long long)b * TOTAL + OFFSET[h] + j] = m[j];
    }
}
"#;

/// Kernels built so far, per slot count and device: compiled once per
/// process and never dropped (captured graphs keep launching them).
static CACHE: KernelCache<(usize, usize), JitKernel> = KernelCache::new();

/// The fused sampler for one device and slot count.
#[derive(Debug, Clone)]
pub struct FusedSampler {
    kernel: Arc<JitKernel>,
    num_slots: usize,
    device: usize,
}

impl FusedSampler {
    /// Builds (or takes from the process cache) the kernel for `num_slots`
    /// slots on `device`; an error says why it cannot run there.
    pub fn new(num_slots: usize, device: Device) -> Result<FusedSampler> {
        let Device::Cuda(index) = device else {
            return Err(Error::InvalidConfig {
                field: "FusedSampler.device",
                reason: format!("the fused sampler runs on CUDA, not {device:?}"),
            });
        };
        if !(1..=crate::features::MAX_SLOTS).contains(&num_slots) {
            return Err(Error::InvalidConfig {
                field: "FusedSampler.num_slots",
                reason: format!("{num_slots} is outside 1..={}", crate::features::MAX_SLOTS),
            });
        }
        let kernel = CACHE
            .get_or_build((num_slots, index), || {
                JitKernel::build(&source(num_slots), KERNEL, index)
                    .map_err(|error| format!("the sampling kernel could not be built: {error}"))
            })
            .map_err(|reason| Error::InvalidConfig {
                field: "FusedSampler",
                reason,
            })?;
        Ok(FusedSampler {
            kernel,
            num_slots,
            device: index,
        })
    }

    /// Samples one action per row (see the module docs): `logits` per head
    /// (`[B, n]`, floating), `masks` the base masks, `relevance` the
    /// `[NUM_OPS, 8]` table, `bases` the draws' bases (`[8]` i64 on the
    /// device; ignored when greedy), `floors` per head (0 = none).
    pub fn sample(
        &self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        masks: &MaskTensors,
        relevance: &Tensor,
        bases: Option<&Tensor>,
        mode: SampleMode,
        floors: [f32; NUM_ACTION_HEADS],
    ) -> Result<SampledActions> {
        let device = Device::Cuda(self.device);
        let batch = logits
            .get(OP)
            .and_then(|logits| logits.size().first().copied())
            .unwrap_or(0);
        let stochastic = mode == SampleMode::Stochastic;
        let bases = match (stochastic, bases) {
            (true, Some(bases)) => {
                if bases.size() != [i64::try_from(NUM_ACTION_HEADS).unwrap_or(8)]
                    || bases.kind() != Kind::Int64
                    || bases.device() != device
                {
                    return Err(shape_mismatch(
                        "FusedSampler.bases",
                        format!("Int64 [{NUM_ACTION_HEADS}] on {device:?}"),
                        (bases.kind(), bases.size(), bases.device()),
                    ));
                }
                bases.f_contiguous().op("bases")?
            }
            (true, None) => {
                return Err(shape_mismatch(
                    "FusedSampler.bases",
                    "draw bases for stochastic sampling",
                    "none",
                ));
            }
            (false, _) => Tensor::f_zeros([1], (Kind::Int64, device)).op("bases")?,
        };
        let rows = i32::try_from(batch).map_err(|_| shape_mismatch("batch", "i32", batch))?;
        let packed = Tensor::f_cat(
            &logits
                .iter()
                .map(|logits| logits.f_to_kind(Kind::Float))
                .collect::<std::result::Result<Vec<_>, _>>()
                .op("logits to f32")?,
            1,
        )
        .op("pack logits")?;
        let packed_masks = Tensor::f_cat(&masks.heads, 1).op("pack masks")?;
        let slot_by_op = masks.slot_by_op.f_contiguous().op("slot_by_op")?;
        let heads = i64::try_from(NUM_ACTION_HEADS).unwrap_or(8);
        let total = packed.size().get(1).copied().unwrap_or(0);
        let actions = Tensor::f_empty([batch, heads], (Kind::Int64, device)).op("actions")?;
        let log_probs = Tensor::f_empty([batch, heads], (Kind::Float, device)).op("log probs")?;
        let entropies = Tensor::f_empty([batch, heads], (Kind::Float, device)).op("entropies")?;
        let relevant = Tensor::f_empty([batch, heads], (Kind::Bool, device)).op("relevance")?;
        let conditioned = Tensor::f_empty([batch, total], (Kind::Bool, device)).op("masks")?;
        let blocks = u32::try_from(batch)
            .unwrap_or(u32::MAX)
            .div_ceil(BLOCK)
            .max(1);
        let mut args = vec![
            Arg::Tensor(&packed),
            Arg::Tensor(&packed_masks),
            Arg::Tensor(&slot_by_op),
            Arg::Tensor(relevance),
            Arg::Tensor(&bases),
            Arg::Tensor(&actions),
            Arg::Tensor(&log_probs),
            Arg::Tensor(&entropies),
            Arg::Tensor(&relevant),
            Arg::Tensor(&conditioned),
            Arg::I32(rows),
            Arg::I32(i32::from(stochastic)),
        ];
        args.extend(floors.iter().map(|floor| Arg::F32(*floor)));
        self.kernel
            .launch([blocks, 1, 1], [BLOCK, 1, 1], 0, &args)
            .map_err(|error| Error::InvalidInput {
                field: "FusedSampler.launch",
                reason: error.to_string(),
            })?;
        let mut masks_out = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut offset = 0_i64;
        for size in head_sizes(self.num_slots) {
            let size = i64::try_from(size).unwrap_or(0);
            masks_out.push(conditioned.f_narrow(1, offset, size).op("mask view")?);
            offset = offset.saturating_add(size);
        }
        let masks_out: [Tensor; NUM_ACTION_HEADS] = masks_out
            .try_into()
            .map_err(|_| shape_mismatch("FusedSampler.masks", NUM_ACTION_HEADS, "fewer"))?;
        Ok(SampledActions {
            actions,
            log_probs,
            entropies,
            relevance: relevant,
            masks: masks_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_compiles_for_hopper_without_a_gpu() {
        // NVRTC needs no GPU: the kernel must compile for the H100's
        // architecture (and every slot count) on the CPU-only CI machine.
        for slots in [1, 3, 5] {
            let cubin = torch_ext::jit::compile(&source(slots), KERNEL, (9, 0))
                .unwrap_or_else(|error| panic!("{slots} slots: {error}"));
            assert!(cubin.len() > 1000, "a cubin of {} bytes", cubin.len());
            assert_eq!(cubin.arch(), (9, 0));
        }
    }

    #[test]
    fn source_lays_out_every_head() {
        let text = source(3);
        assert!(text.contains("#define TOTAL"));
        assert!(text.contains("__constant__ int SIZE[H] = {3,"));
        assert!(text.contains("extern \"C\" __global__ void tamiyo_sample"));
    }
}
