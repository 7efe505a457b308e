//! Masked sampling of a factored action for a batch of environments
//! (reference §3.1 "Sampling (HEAD)"), all on the device.
//!
//! 1. The op is chosen first from its masked logits (masked options at
//!    [`MASKED_LOGIT_VALUE`], −1e4 as in the reference).
//! 2. Every other head's mask is conditioned on the op: a head that does not
//!    matter for it (leyline's causal relevance, [`crate::heads::relevance`])
//!    is forced to its canonical action ([`crate::heads::canonical_action`];
//!    the slot head for WAIT to the first allowed slot), and the slot head
//!    takes the op's row of `slot_by_op`. Masking the raw logits with the
//!    conditioned mask gives a forced head log-probability 0 and entropy 0.
//! 3. Each head is then chosen: greedy (argmax over the valid options) or
//!    sampled by Gumbel-max over the valid options, with Gumbel noise from
//!    [`PolicyRng`] (seeded per controller, counter-based, the same on the
//!    CPU and CUDA). A masked option is never chosen, whatever its logit.
//!
//! Log-probabilities are `log_softmax` of the masked logits in fp32 at the
//! chosen action; entropies are normalised by `ln(valid options)` (0 when
//! one option is valid), as the reference's. An optional per-head
//! probability floor (reference §4.2, floor capped at `0.99 / valid` and the
//! other options rescaled) changes the logits before both, so sampling and
//! log-probabilities describe the same distribution.
//!
//! [`SampledActions::relevance`] is the causal mask `[B, 8]` PPO applies to
//! per-head log-probabilities; [`Sampler::evaluate_actions`] recomputes
//! log-probabilities and entropies of stored actions the same way.
//!
//! Refused inputs: masks with an all-false row are [`Error::EmptyMask`]
//! (checked where masks are built, and at every use on the CPU: see
//! [`crate::masks`]), so a masked option is never returned; on the CPU, NaN
//! or infinite logits are [`Error::NonFinite`] when sampling (the PPO
//! update's [`Sampler::evaluate_actions`] leaves non-finite logits to the
//! update's own loss check). A refused call leaves the generator where it
//! was.

use leyline::{HEAD_NAMES, LifecycleOp, NUM_ACTION_HEADS};
use tch::{Device, Kind, Tensor};

mod actions;
mod conditioned;
mod distribution;
mod evaluate;

pub use actions::{ActionReadback, SampledActions};
use distribution::{Noise, choose};
pub use distribution::{
    apply_probability_floor, log_prob, mask_all, mask_logits, normalized_entropy,
};

use super::fused_sampling::FusedSampler;
use super::rng::PolicyRng;
use crate::error::{TorchResultExt, shape_mismatch};
use crate::finite::check_finite_on_host;
use crate::heads::{OP, SLOT, head_sizes, relevance};
use crate::masks::MaskTensors;
use crate::{Error, Result};

/// Logit of a masked option (the reference's `MASKED_LOGIT_VALUE`: large
/// enough to zero its probability in fp32, small enough for fp16/bf16).
pub const MASKED_LOGIT_VALUE: f64 = -1e4;

/// The reference's per-head probability floors (§4.2), [`HEAD_NAMES`]
/// order: slot .05, blueprint .12, style .08, tempo .12, alpha_target .08,
/// alpha_speed .06, alpha_curve .06, op .15.
pub fn reference_probability_floors() -> [f64; NUM_ACTION_HEADS] {
    let mut floors = [0.0; NUM_ACTION_HEADS];
    for (floor, name) in floors.iter_mut().zip(HEAD_NAMES.iter()) {
        *floor = match *name {
            "slot" => 0.05,
            "blueprint" | "tempo" => 0.12,
            "style" | "alpha_target" => 0.08,
            "alpha_speed" | "alpha_curve" => 0.06,
            "op" => 0.15,
            _ => 0.0,
        };
    }
    floors
}

/// Greedy or sampled choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SampleMode {
    /// The most likely valid option of each head.
    Greedy,
    /// A sample from each head's masked distribution.
    Stochastic,
}

/// How actions are chosen.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// Greedy or sampled.
    pub mode: SampleMode,
    /// Per-head probability floors in `[0, 1)` ([`HEAD_NAMES`] order), or
    /// none.
    pub floors: Option<[f64; NUM_ACTION_HEADS]>,
}

impl Default for SamplingConfig {
    /// Sampled, no floors.
    fn default() -> Self {
        SamplingConfig {
            mode: SampleMode::Stochastic,
            floors: None,
        }
    }
}

impl SamplingConfig {
    /// Checks the floors (finite, in `[0, 1)`).
    pub fn validate(&self) -> Result<()> {
        for floor in self.floors.iter().flatten() {
            if !(0.0..1.0).contains(floor) {
                return Err(Error::InvalidConfig {
                    field: "SamplingConfig.floors",
                    reason: format!("{floor} is outside [0, 1)"),
                });
            }
        }
        Ok(())
    }

    fn floor(&self, head: usize) -> Option<f64> {
        self.floors
            .and_then(|floors| floors.get(head).copied())
            .filter(|floor| *floor > 0.0)
    }
}

/// The batch size (rows of the op head) and slot count (width of the slot
/// head) of per-head `logits`; 0 where a head is missing.
fn batch_and_slots(logits: &[Tensor; NUM_ACTION_HEADS]) -> (i64, usize) {
    let batch = logits
        .get(OP)
        .and_then(|logits| logits.size().first().copied())
        .unwrap_or(0);
    let num_slots = logits
        .get(SLOT)
        .and_then(|logits| logits.size().get(1).copied())
        .and_then(|slots| usize::try_from(slots).ok())
        .unwrap_or(0);
    (batch, num_slots)
}

/// Per-op relevance and canonical actions on a device, built once.
#[derive(Debug)]
pub struct Sampler {
    config: SamplingConfig,
    rng: PolicyRng,
    /// `[NUM_OPS, 8]` bool: leyline's relevance table.
    relevance: Tensor,
    device: Device,
    /// Sample with the fused CUDA kernel where it can be built.
    fused: bool,
}

impl Sampler {
    /// A sampler on `device` with generator seed `seed`.
    pub fn new(config: SamplingConfig, seed: u64, device: Device) -> Result<Sampler> {
        config.validate()?;
        let table: Vec<u8> = LifecycleOp::ALL
            .iter()
            .flat_map(|op| relevance(*op).map(u8::from))
            .collect();
        let relevance = Tensor::f_from_slice(&table)
            .op("relevance table")?
            .f_view([
                i64::try_from(LifecycleOp::ALL.len()).unwrap_or(i64::MAX),
                i64::try_from(NUM_ACTION_HEADS).unwrap_or(i64::MAX),
            ])
            .op("relevance table")?
            .f_to_kind(Kind::Bool)
            .op("relevance table")?
            .f_to_device(device)
            .op("relevance table")?;
        Ok(Sampler {
            config,
            rng: PolicyRng::new(seed),
            relevance,
            device,
            fused: true,
        })
    }

    /// Uses the fused CUDA kernel ([`super::fused_sampling`]) for
    /// [`Sampler::sample`] and [`Sampler::sample_with_bases`] on CUDA
    /// (`true`, the default) or the libtorch implementation everywhere.
    pub fn set_fused(&mut self, fused: bool) {
        self.fused = fused;
    }

    /// Why sampling for `num_slots` slots does not use the fused kernel
    /// (`None` when it does): turned off, a non-CUDA device, or the
    /// kernel's build error.
    pub fn fused_fallback(&self, num_slots: usize) -> Option<String> {
        match self.fused_sampler(num_slots) {
            Ok(_) => None,
            Err(error) => Some(error.to_string()),
        }
    }

    fn fused_sampler(&self, num_slots: usize) -> Result<FusedSampler> {
        if !self.fused {
            return Err(Error::InvalidConfig {
                field: "Sampler.fused",
                reason: "turned off".to_owned(),
            });
        }
        FusedSampler::new(num_slots, self.device)
    }

    fn floors_f32(&self) -> [f32; NUM_ACTION_HEADS] {
        let mut floors = [0.0_f32; NUM_ACTION_HEADS];
        for (head, floor) in floors.iter_mut().enumerate() {
            *floor = self.config.floor(head).unwrap_or(0.0) as f32;
        }
        floors
    }

    /// The fused kernel's sample, when it serves this batch.
    fn sample_fused(
        &self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        masks: &MaskTensors,
        bases: Option<&Tensor>,
    ) -> Option<Result<SampledActions>> {
        if !self.fused || !self.device.is_cuda() {
            return None;
        }
        let (batch, num_slots) = batch_and_slots(logits);
        if let Err(error) = self
            .check_logits(logits, batch, num_slots)
            .and_then(|()| masks.check(batch, num_slots, self.device))
        {
            return Some(Err(error));
        }
        let fused = self.fused_sampler(num_slots).ok()?;
        Some(fused.sample(
            logits,
            masks,
            &self.relevance,
            bases,
            self.config.mode,
            self.floors_f32(),
        ))
    }

    /// The configuration.
    pub fn config(&self) -> SamplingConfig {
        self.config
    }

    /// Sets greedy or sampled choice.
    pub fn set_mode(&mut self, mode: SampleMode) {
        self.config.mode = mode;
    }

    /// The generator.
    pub fn rng(&self) -> &PolicyRng {
        &self.rng
    }

    /// Puts the generator back where a checkpoint left it.
    pub fn set_rng(&mut self, rng: PolicyRng) {
        self.rng = rng;
    }

    /// `[B, 8]` relevance of each head for `ops` (`[B]` i64).
    pub fn relevance(&self, ops: &Tensor) -> Result<Tensor> {
        self.relevance.f_index_select(0, ops).op("relevance select")
    }

    /// Masked (and floored) logits of head `head` under `mask`.
    fn head_logits(&self, head: usize, logits: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let masked = mask_logits(logits, mask)?;
        match self.config.floor(head) {
            Some(floor) => apply_probability_floor(&masked, mask, floor),
            None => Ok(masked),
        }
    }

    /// Samples one action per row from raw `logits` (as
    /// [`super::PolicyOutput::logits`]) under the base `masks` (see the
    /// module docs).
    pub fn sample(
        &mut self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        masks: &MaskTensors,
    ) -> Result<SampledActions> {
        let mut rng = self.rng.clone();
        if self.fused && self.device.is_cuda() {
            let count = self.draws_per_sample();
            let bases = if count > 0 {
                Some(
                    Tensor::f_from_slice(&rng.next_bases(count))
                        .op("noise bases")?
                        .f_to_device(self.device)
                        .op("noise bases")?,
                )
            } else {
                None
            };
            if let Some(sampled) = self.sample_fused(logits, masks, bases.as_ref()) {
                if sampled.is_ok() {
                    self.rng = rng;
                }
                return sampled;
            }
            rng = self.rng.clone();
        }
        let sampled = self.sample_with(logits, masks, &mut |_, shape, device| {
            rng.gumbel(shape, device)
        });
        if sampled.is_ok() {
            self.rng = rng;
        }
        sampled
    }

    /// Draws a sample takes from the generator: one per head when
    /// stochastic, none when greedy.
    pub fn draws_per_sample(&self) -> usize {
        match self.config.mode {
            SampleMode::Greedy => 0,
            SampleMode::Stochastic => NUM_ACTION_HEADS,
        }
    }

    /// The bases of the next sample's draws, advancing the generator past
    /// them ([`PolicyRng::next_bases`]); [`Sampler::sample_with_bases`] fed
    /// these gives exactly what [`Sampler::sample`] would have.
    pub fn next_bases(&mut self) -> Vec<i64> {
        let count = self.draws_per_sample();
        self.rng.next_bases(count)
    }

    /// [`Sampler::sample`] with draw `k`'s noise from `bases[k]` (an i64
    /// device tensor with one base per draw, see [`Sampler::next_bases`]):
    /// nothing on the host enters the computation, so it can be captured in
    /// a CUDA graph.
    pub fn sample_with_bases(
        &self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        masks: &MaskTensors,
        bases: &Tensor,
    ) -> Result<SampledActions> {
        let expected = i64::try_from(self.draws_per_sample()).unwrap_or(0);
        if bases.size() != [expected] && self.draws_per_sample() > 0 {
            return Err(shape_mismatch(
                "sample_with_bases.bases",
                format!("[{expected}] Int64"),
                bases.size(),
            ));
        }
        if let Some(sampled) = self.sample_fused(logits, masks, Some(bases)) {
            return sampled;
        }
        self.sample_with(logits, masks, &mut |k, shape, device| {
            let base = bases
                .f_narrow(0, i64::try_from(k).unwrap_or(0), 1)
                .op("noise base")?;
            PolicyRng::gumbel_from_base(&base, shape, device)
        })
    }

    fn sample_with(
        &self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        masks: &MaskTensors,
        noise: &mut Noise<'_>,
    ) -> Result<SampledActions> {
        let mut draw = 0_usize;
        let (batch, num_slots) = batch_and_slots(logits);
        self.check_logits(logits, batch, num_slots)?;
        masks.check(batch, num_slots, self.device)?;
        for head in logits {
            check_finite_on_host("sample.logits", head)?;
        }
        let op_mask = masks
            .heads
            .get(OP)
            .ok_or_else(|| shape_mismatch("sample.masks", NUM_ACTION_HEADS, "fewer"))?;
        let op_logits = logits
            .get(OP)
            .ok_or_else(|| shape_mismatch("sample.logits", NUM_ACTION_HEADS, "fewer"))?;
        let op_masked = self.head_logits(OP, op_logits, op_mask)?;
        let ops = choose(&op_masked, op_mask, self.config.mode, noise, &mut draw)?;
        let conditioned = self.conditioned_masks(masks, &ops)?;
        let mut actions = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut log_probs = Vec::with_capacity(NUM_ACTION_HEADS);
        let mut entropies = Vec::with_capacity(NUM_ACTION_HEADS);
        for (head, (logits, mask)) in logits.iter().zip(conditioned.iter()).enumerate() {
            let (masked, action) = if head == OP {
                (op_masked.shallow_clone(), ops.shallow_clone())
            } else {
                let masked = self.head_logits(head, logits, mask)?;
                let action = choose(&masked, mask, self.config.mode, noise, &mut draw)?;
                (masked, action)
            };
            log_probs.push(log_prob(&masked, &action)?);
            entropies.push(normalized_entropy(&masked, mask)?);
            actions.push(action);
        }
        Ok(SampledActions {
            actions: Tensor::f_stack(&actions, 1).op("stack actions")?,
            log_probs: Tensor::f_stack(&log_probs, 1).op("stack log probs")?,
            entropies: Tensor::f_stack(&entropies, 1).op("stack entropies")?,
            relevance: self.relevance(&ops)?,
            masks: conditioned,
        })
    }

    fn check_logits(
        &self,
        logits: &[Tensor; NUM_ACTION_HEADS],
        batch: i64,
        num_slots: usize,
    ) -> Result<()> {
        if batch < 1 || num_slots < 1 {
            return Err(shape_mismatch(
                "sample.logits",
                "[B >= 1, n] per head",
                (batch, num_slots),
            ));
        }
        for (head, (logits, size)) in logits.iter().zip(head_sizes(num_slots)).enumerate() {
            let expected = [batch, i64::try_from(size).unwrap_or(i64::MAX)];
            if logits.size() != expected
                || !logits.is_floating_point()
                || logits.device() != self.device
            {
                return Err(shape_mismatch(
                    "sample.logits",
                    format!(
                        "floating {expected:?} on {:?} for head {}",
                        self.device,
                        HEAD_NAMES.get(head).unwrap_or(&"?")
                    ),
                    (logits.kind(), logits.size(), logits.device()),
                ));
            }
        }
        Ok(())
    }
}
