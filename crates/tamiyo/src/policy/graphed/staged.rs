//! The staged policy step of [`GraphedAct`]: its host inputs uploaded in
//! one copy ([`GraphedAct::stage`]), then one step on them
//! ([`GraphedAct::act_staged`]) that, when captured, does everything a
//! rollout step does on the device inside the one graph: the observations'
//! normalisation (with the normaliser's moments read in place), the
//! network, the sampling, the write of the step's tensors into the caller's
//! rollout storage ([`StepSink`], at the step index the staging uploaded)
//! and the carry of the LSTM state to the next step. The graph's first
//! node uploads the inputs [`GraphedAct::stage`] packed into page-locked
//! memory, and its last copies the actions into page-locked memory
//! ([`GraphedAct::read_actions`] reads them there): the host packs,
//! replays, waits and reads, with no libtorch op of its own.
//!
//! A graph depends on the memory it reads and writes: the normaliser's
//! moments ([`RunningMeanStd::memory_key`]) and the sink's storage
//! ([`StepSink::memory_key`]). When either moves (a reset, a restored
//! checkpoint, a new rollout buffer), the next step captures again.

use std::cell::Cell;

use tch::Tensor;

use super::{CaptureKind, GraphedAct, Outputs, Staged, copy_checked};
use crate::error::TorchResultExt;
use crate::heads::FactoredAction;
use crate::masks::{ActionMasks, MaskTensors};
use crate::normaliser::RunningMeanStd;
use crate::policy::network::LstmState;
use crate::policy::sampling::{SampledActions, Sampler};
use crate::policy::{Act, Policy, StepStaging};
use crate::{Error, Result};

/// One step's tensors, as a [`StepSink`] receives them (views, valid
/// during the call).
#[derive(Debug)]
pub struct StepRecord<'a> {
    /// The step's index in its episode, `[1]` `i64` on the device (an
    /// index for `index_copy_`; never read on the host).
    pub step: &'a Tensor,
    /// The raw observations, `[n_envs, obs_dim]` `f32`.
    pub raw_obs: &'a Tensor,
    /// The observations the policy saw (normalised where a normaliser was
    /// given, else the raw ones).
    pub obs: &'a Tensor,
    /// The slots' blueprint indices, `[n_envs, num_slots]` `i64`.
    pub blueprints: &'a Tensor,
    /// The masks the actions were sampled under.
    pub masks: &'a MaskTensors,
    /// The critic's values, `[n_envs]` `f32`.
    pub value: &'a Tensor,
    /// The sampled actions.
    pub sample: &'a SampledActions,
}

/// Where a staged step's tensors go, on the device: a rollout buffer's
/// column at [`StepRecord::step`].
pub trait StepSink {
    /// Queues the writes of `step` on the current stream. Device work
    /// only: no readback and no host-side decision on device values, since
    /// it may run inside a CUDA graph capture (and then at every replay).
    ///
    /// # Errors
    /// A tensor the sink cannot take (shape, dtype, device).
    fn record(&self, step: &StepRecord<'_>) -> Result<()>;

    /// Identifies the device memory [`StepSink::record`] writes (e.g. the
    /// data pointers of the buffer's tensors): a graph captured with one
    /// key is captured again for another.
    fn memory_key(&self) -> Vec<usize>;
}

impl GraphedAct {
    /// Packs one step's host inputs (`obs`: `n_envs × obs_dim` raw
    /// observations, row after row; `blueprints`: `n_envs × num_slots`
    /// blueprint indices; `masks`: one per environment; `step`: the step's
    /// index in its episode) with the noise bases the captured step needs,
    /// and uploads them in one copy ([`crate::policy::StepStaging::stage`]);
    /// when the step will replay the graph, only packs them
    /// ([`crate::policy::StepStaging::pack`]): the graph uploads them.
    /// When the step will replay the graph, the bases are drawn from
    /// `sampler` here; a refused call leaves the generator and the staged
    /// inputs as they were.
    pub fn stage(
        &mut self,
        sampler: &mut Sampler,
        obs: &[f32],
        blueprints: &[i64],
        masks: &[ActionMasks],
        step: i64,
    ) -> Result<()> {
        self.staged = None;
        let graph = self.fallback.is_none() && sampler.config().mode == self.mode;
        let rng = sampler.rng().clone();
        let bases = if graph {
            sampler.next_bases()
        } else {
            Vec::new()
        };
        self.filled = false;
        // A step that replays the graph uploads there (the graph's first
        // node copies the packed buffer); any other uploads now.
        let staging = &mut self.inputs.staging;
        let staged = if graph {
            staging.pack(obs, blueprints, masks, &bases, step)
        } else {
            staging.stage(obs, blueprints, masks, &bases, step)
        };
        if let Err(error) = staged {
            sampler.set_rng(rng);
            return Err(error);
        }
        self.staged = Some(Staged { graph, rng });
        Ok(())
    }

    /// The staged raw observations, `[n_envs, obs_dim]` `f32` on the device
    /// (once the step has uploaded them: after [`GraphedAct::act_staged`],
    /// until the next [`GraphedAct::stage`]).
    pub fn staged_obs(&self) -> &Tensor {
        self.inputs.staging.obs()
    }

    /// The staged blueprint indices, `[n_envs, num_slots]` `i64`.
    pub fn staged_blueprints(&self) -> &Tensor {
        self.inputs.staging.blueprints()
    }

    /// The staged masks.
    pub fn staged_masks(&self) -> &MaskTensors {
        self.inputs.staging.masks()
    }

    /// The step on the inputs of the last [`GraphedAct::stage`] from the
    /// LSTM state `hidden`: the staged observations normalised by
    /// `normaliser` (its statistics as they are; none: the raw
    /// observations), the network, the sampling, and `sink` given the
    /// step's tensors. Captured on the first call (and again when the
    /// normaliser's or the sink's memory moved), replayed after; eager on
    /// the CPU or where the graph cannot serve, with the same results. When
    /// `hidden` is the state the last replay returned, the graph already
    /// carried it over and nothing is copied. Each staging serves one step:
    /// without a new one the call is refused. A failed step puts the
    /// generator back where it was before the staging.
    pub fn act_staged(
        &mut self,
        policy: &Policy,
        sampler: &mut Sampler,
        normaliser: Option<&RunningMeanStd>,
        hidden: &LstmState,
        sink: Option<&dyn StepSink>,
    ) -> Result<Act> {
        let Some(staged) = self.staged.take() else {
            return Err(Error::InvalidInput {
                field: "GraphedAct.act_staged",
                reason: "nothing staged: call GraphedAct::stage before each step".to_owned(),
            });
        };
        if !staged.graph {
            return self.eager_staged(policy, sampler, normaliser, hidden, sink, false);
        }
        let act = if sampler.config().mode == self.mode {
            self.run_staged(policy, sampler, normaliser, hidden, sink)
        } else {
            Err(Error::InvalidInput {
                field: "GraphedAct.act_staged",
                reason: "the sampling mode changed between stage and act_staged".to_owned(),
            })
        };
        if act.is_err() {
            sampler.set_rng(staged.rng);
        }
        act
    }

    /// [`GraphedAct::act_staged`] once the bases are staged: the graph
    /// (captured for this normaliser and sink when it is not), or the eager
    /// step with the staged bases when the capture failed.
    fn run_staged(
        &mut self,
        policy: &Policy,
        sampler: &mut Sampler,
        normaliser: Option<&RunningMeanStd>,
        hidden: &LstmState,
        sink: Option<&dyn StepSink>,
    ) -> Result<Act> {
        let kind = CaptureKind::Staged {
            normaliser: normaliser.map(RunningMeanStd::memory_key),
            sink: sink.map(StepSink::memory_key),
        };
        self.forget_unless(&kind);
        let carried = self.outputs.as_ref().is_some_and(|outputs| {
            outputs.hidden.h.data_ptr() == hidden.h.data_ptr()
                && outputs.hidden.c.data_ptr() == hidden.c.data_ptr()
        });
        if !carried {
            self.set_hidden(hidden)?;
        }
        if self.graph.is_none() {
            let network = policy.network();
            let sampler: &Sampler = sampler;
            let reads_back = Cell::new(false);
            self.capture_with(network.device(), kind, |inputs| {
                // The upload of the packed inputs is the graph's first node.
                inputs.staging.upload_captured()?;
                let hidden = LstmState {
                    h: inputs.h.shallow_clone(),
                    c: inputs.c.shallow_clone(),
                };
                let act = step_on(
                    policy,
                    Draw::Staged(sampler),
                    normaliser,
                    &hidden,
                    sink,
                    &inputs.staging,
                )?;
                // The next step starts from this one's state.
                inputs
                    .h
                    .shallow_clone()
                    .f_copy_(&act.hidden.h)
                    .op("carry the LSTM state")?;
                inputs
                    .c
                    .shallow_clone()
                    .f_copy_(&act.hidden.c)
                    .op("carry the LSTM state")?;
                // And its last node copies the actions to the host.
                reads_back.set(inputs.readback.capture_copy(&act.sample.actions)?);
                Ok(Outputs {
                    sample: act.sample,
                    value: act.value,
                    hidden: act.hidden,
                })
            })?;
            self.graph_reads_back = self.graph.is_some() && reads_back.get();
        }
        if self.graph.is_none() || self.outputs.is_none() {
            // The capture failed: the eager step with the staged draws, on
            // the inputs uploaded now.
            self.inputs.staging.upload()?;
            let state = LstmState {
                h: self.inputs.h.shallow_clone(),
                c: self.inputs.c.shallow_clone(),
            };
            return self.eager_staged(policy, sampler, normaliser, &state, sink, true);
        }
        let (act, stream) = self.replay(policy.network().device())?;
        // The packed buffer may be written again once this replay has
        // copied it; the actions are on the host once it has run.
        self.inputs.staging.mark_read(&stream)?;
        if self.graph_reads_back {
            self.inputs.readback.mark_filled(&stream)?;
            self.filled = true;
        }
        Ok(act)
    }

    /// The actions of `sample` on the host, `sample` being what the last
    /// step returned: when that step replayed a graph that copies its
    /// actions to the host, a wait for the replay and a read of host
    /// memory; otherwise one queued copy through the same page-locked
    /// buffer ([`SampledActions::to_host_via`]).
    pub fn read_actions(
        &mut self,
        sample: &SampledActions,
        num_slots: usize,
    ) -> Result<Vec<FactoredAction>> {
        let replayed = self
            .outputs
            .as_ref()
            .is_some_and(|outputs| outputs.sample.actions.data_ptr() == sample.actions.data_ptr());
        if std::mem::take(&mut self.filled) && replayed {
            let values = self.inputs.readback.read_filled()?;
            return sample.decode(values, num_slots);
        }
        sample.to_host_via(&mut self.inputs.readback, num_slots)
    }

    /// The eager step on the staged inputs (`with_bases`: with the staged
    /// noise bases, else drawing from `sampler`), its tensors given to
    /// `sink`.
    fn eager_staged(
        &self,
        policy: &Policy,
        sampler: &mut Sampler,
        normaliser: Option<&RunningMeanStd>,
        hidden: &LstmState,
        sink: Option<&dyn StepSink>,
        with_bases: bool,
    ) -> Result<Act> {
        let _guard = tch::no_grad_guard();
        let draw = if with_bases {
            Draw::Staged(sampler)
        } else {
            Draw::Fresh(sampler)
        };
        step_on(policy, draw, normaliser, hidden, sink, &self.inputs.staging)
    }

    /// Copies `hidden` into the static LSTM state (shapes checked first).
    fn set_hidden(&self, hidden: &LstmState) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let inputs = &self.inputs;
        copy_checked(&[
            ("GraphedAct.hidden.h", &inputs.h, &hidden.h),
            ("GraphedAct.hidden.c", &inputs.c, &hidden.c),
        ])
    }
}

/// Where a step's sampling noise comes from.
enum Draw<'a> {
    /// The staged noise bases: device work only (what the graph captures).
    Staged(&'a Sampler),
    /// The sampler's generator, drawn on the host (the eager step).
    Fresh(&'a mut Sampler),
}

/// The staged step: normalise, step, sample (from `draw`), record.
fn step_on(
    policy: &Policy,
    draw: Draw<'_>,
    normaliser: Option<&RunningMeanStd>,
    hidden: &LstmState,
    sink: Option<&dyn StepSink>,
    staging: &StepStaging,
) -> Result<Act> {
    let raw = staging.obs();
    let obs = match normaliser {
        Some(normaliser) => normaliser.normalize(raw)?,
        None => raw.shallow_clone(),
    };
    let output = policy
        .network()
        .step(&obs, staging.blueprints(), hidden, staging.masks())?;
    let sample = match draw {
        Draw::Staged(sampler) => {
            sampler.sample_with_bases(&output.logits, staging.masks(), staging.bases())?
        }
        Draw::Fresh(sampler) => sampler.sample(&output.logits, staging.masks())?,
    };
    if let Some(sink) = sink {
        sink.record(&StepRecord {
            step: staging.step(),
            raw_obs: raw,
            obs: &obs,
            blueprints: staging.blueprints(),
            masks: staging.masks(),
            value: &output.value,
            sample: &sample,
        })?;
    }
    Ok(Act {
        sample,
        value: output.value,
        hidden: output.hidden,
    })
}
