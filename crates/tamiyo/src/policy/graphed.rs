//! [`GraphedAct`]: the batched policy step (forward and masked sampling for
//! every environment) captured once in a CUDA graph and replayed, for a
//! fixed batch.
//!
//! The step's inputs are copied into static device buffers (observations,
//! blueprint indices, the LSTM state, the base masks) and the sample's noise
//! comes from a static tensor of per-draw bases that the host fills before
//! each replay ([`Sampler::next_bases`]), so a replay gives exactly what the
//! eager [`Policy::act`] would have for the same generator state. The first
//! call warms up, captures (on a side stream, into a private memory pool)
//! and replays; later calls only copy and replay. A capture that fails, a
//! CPU device, or a batch, slot count or sampling mode other than the
//! captured one runs the eager step instead ([`GraphedAct::fallback`] says
//! why).
//!
//! Two ways in. [`GraphedAct::act`] takes the inputs as device tensors and
//! copies each into its static buffer. [`GraphedAct::stage`] takes them from
//! the host (raw observations, blueprint indices, [`crate::masks::ActionMasks`]) and
//! uploads them with the noise bases in one copy ([`StepStaging`]) straight
//! into the buffers the graph reads; the caller normalises
//! [`GraphedAct::staged_obs`] and [`GraphedAct::act_staged`] replays. The
//! second is what a rollout uses: one upload and no stream synchronisation
//! before the replay, against one blocking copy per input.
//!
//! The returned [`Act`] holds views of the static outputs: consume it (copy
//! what you keep) before the next call overwrites them.

use std::cell::RefCell;

use tch::{Device, Kind, Tensor};
use torch_ext::{CudaEvent, CudaGraph, CudaStream};

use super::network::LstmState;
use super::rng::PolicyRng;
use super::sampling::{ActionReadback, SampleMode, SampledActions, Sampler};
use super::staging::StepStaging;
use super::{Act, Policy};
use crate::error::{TorchResultExt, shape_mismatch};
use crate::masks::MaskTensors;
use crate::{Error, Result};

mod staged;

pub use staged::{StepRecord, StepSink};

/// Eager warm-up calls before the capture.
const WARMUP_ITERS: usize = 2;

/// The static inputs of the captured step.
#[derive(Debug)]
struct Inputs {
    obs: Tensor,
    h: Tensor,
    c: Tensor,
    /// The blueprint indices, the masks and the noise bases: views of the
    /// staging's device buffer ([`GraphedAct::stage`] uploads them in one
    /// copy; [`GraphedAct::act`] copies device tensors into them).
    staging: StepStaging,
    /// The actions' page-locked readback; a staged graph copies into it.
    readback: ActionReadback,
}

/// What [`GraphedAct::stage`] decided for the next
/// [`GraphedAct::act_staged`].
#[derive(Debug)]
struct Staged {
    /// Whether the step replays the graph (the bases were drawn and staged).
    graph: bool,
    /// The generator before the bases were drawn, restored if the step fails.
    rng: PolicyRng,
}

/// The captured step's static outputs.
#[derive(Debug)]
struct Outputs {
    sample: SampledActions,
    value: Tensor,
    hidden: LstmState,
}

/// A graph of the policy step for a fixed batch (see the module docs).
#[derive(Debug)]
pub struct GraphedAct {
    inputs: Inputs,
    outputs: Option<Outputs>,
    graph: Option<CudaGraph>,
    mode: SampleMode,
    fallback: Option<String>,
    /// Events around the last replay (the device time of the step itself).
    timing: Option<(CudaEvent, CudaEvent)>,
    replay_pending: bool,
    staged: Option<Staged>,
    /// What the graph was captured for; a step of another kind captures
    /// again.
    captured: Option<CaptureKind>,
    /// Whether the captured graph copies its actions into the inputs'
    /// readback.
    graph_reads_back: bool,
    /// Whether the last step was a replay that filled `readback`.
    filled: bool,
}

/// What a graph was captured for: the device tensors of [`GraphedAct::act`],
/// or the staged inputs of [`GraphedAct::act_staged`] with the memory of the
/// normaliser and the sink it read and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CaptureKind {
    Plain,
    Staged {
        normaliser: Option<[usize; 2]>,
        sink: Option<Vec<usize>>,
    },
}

/// Copies every `(what, target, source)` pair, once every shape and dtype
/// has been checked: a refused call copies nothing.
fn copy_checked(pairs: &[(&'static str, &Tensor, &Tensor)]) -> Result<()> {
    for (what, target, source) in pairs {
        if target.size() != source.size() || target.kind() != source.kind() {
            return Err(shape_mismatch(
                what,
                format!("{:?} {:?}", target.kind(), target.size()),
                (source.kind(), source.size()),
            ));
        }
    }
    for (_, target, source) in pairs {
        target
            .shallow_clone()
            .f_copy_(source)
            .op("graph input copy")?;
    }
    Ok(())
}

impl GraphedAct {
    /// Static buffers for `n_envs` environments of `policy` on its device,
    /// sampling in `sampler`'s mode. Nothing is captured until the first
    /// [`GraphedAct::act`].
    pub fn new(policy: &Policy, sampler: &Sampler, n_envs: usize) -> Result<GraphedAct> {
        let network = policy.network();
        let config = network.config();
        let device = network.device();
        let rows = i64::try_from(n_envs).map_err(|_| Error::InvalidConfig {
            field: "GraphedAct.n_envs",
            reason: format!("{n_envs} does not fit i64"),
        })?;
        let obs_dim = i64::try_from(config.obs_dim()).unwrap_or(i64::MAX);
        let hidden = network.initial_state(n_envs)?;
        Ok(GraphedAct {
            inputs: Inputs {
                obs: Tensor::f_zeros([rows, obs_dim], (Kind::Float, device)).op("graph obs")?,
                h: hidden.h,
                c: hidden.c,
                staging: StepStaging::new(
                    n_envs,
                    config.num_slots,
                    sampler.draws_per_sample(),
                    device,
                )?,
                readback: ActionReadback::new(n_envs, device)?,
            },
            outputs: None,
            graph: None,
            timing: None,
            replay_pending: false,
            staged: None,
            captured: None,
            graph_reads_back: false,
            filled: false,
            mode: sampler.config().mode,
            fallback: match device {
                Device::Cuda(_) => None,
                other => Some(format!("the policy is on {other:?}; graphs need CUDA")),
            },
        })
    }

    /// A step that never captures: the eager [`Policy::act`] every time,
    /// with `reason` as its [`GraphedAct::fallback`]. It stages its inputs
    /// as the captured one does ([`GraphedAct::stage`]).
    pub fn eager(
        policy: &Policy,
        sampler: &Sampler,
        n_envs: usize,
        reason: impl Into<String>,
    ) -> Result<GraphedAct> {
        let mut step = GraphedAct::new(policy, sampler, n_envs)?;
        step.fallback = Some(reason.into());
        Ok(step)
    }

    /// Whether the step is captured and replaying.
    pub fn is_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// Whether the captured graph also holds the upload of the staged
    /// inputs and the copy of the actions to the host (a staged step on
    /// CUDA): the host then packs, replays and reads host memory.
    pub fn reads_back_in_graph(&self) -> bool {
        self.graph.is_some() && self.graph_reads_back
    }

    /// Why the step runs eagerly, if it does.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    fn set_inputs(
        &self,
        obs: &Tensor,
        blueprints: &Tensor,
        hidden: &LstmState,
        masks: &MaskTensors,
        bases: &[i64],
    ) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let inputs = &self.inputs;
        // Every shape first (`copy_checked`), so a refused call copies
        // nothing.
        let mut pairs: Vec<(&'static str, &Tensor, &Tensor)> = vec![
            ("GraphedAct.obs", &inputs.obs, obs),
            (
                "GraphedAct.blueprints",
                inputs.staging.blueprints(),
                blueprints,
            ),
            ("GraphedAct.hidden.h", &inputs.h, &hidden.h),
            ("GraphedAct.hidden.c", &inputs.c, &hidden.c),
            (
                "GraphedAct.slot_by_op",
                &inputs.staging.masks().slot_by_op,
                &masks.slot_by_op,
            ),
        ];
        for (target, source) in inputs.staging.masks().heads.iter().zip(masks.heads.iter()) {
            pairs.push(("GraphedAct.masks", target, source));
        }
        if !bases.is_empty()
            && inputs.staging.bases().size() != [i64::try_from(bases.len()).unwrap_or(-1)]
        {
            return Err(shape_mismatch(
                "GraphedAct.bases",
                format!("{:?}", inputs.staging.bases().size()),
                bases.len(),
            ));
        }
        let host_bases = if bases.is_empty() {
            None
        } else {
            Some(Tensor::f_from_slice(bases).op("noise bases")?)
        };
        if let Some(host) = &host_bases {
            pairs.push(("GraphedAct.bases", inputs.staging.bases(), host));
        }
        copy_checked(&pairs)?;
        Ok(())
    }

    /// One batched step: the captured graph replayed (captured on the first
    /// call), or the eager [`Policy::act`] where the graph cannot serve
    /// (see the module docs). Advances `sampler`'s generator exactly as the
    /// eager step does.
    pub fn act(
        &mut self,
        policy: &Policy,
        sampler: &mut Sampler,
        obs: &Tensor,
        blueprints: &Tensor,
        hidden: &LstmState,
        masks: &MaskTensors,
    ) -> Result<Act> {
        // This call writes the staged inputs' buffers.
        self.staged = None;
        let fits = obs.size() == self.inputs.obs.size()
            && sampler.config().mode == self.mode
            && masks.slot_by_op.size() == self.inputs.staging.masks().slot_by_op.size();
        if self.fallback.is_some() || !fits {
            return policy.act(obs, blueprints, hidden, masks, sampler);
        }
        // The generator moves only when the step runs: a refused call
        // leaves it where it was.
        let rng = sampler.rng().clone();
        let bases = sampler.next_bases();
        let act = self
            .set_inputs(obs, blueprints, hidden, masks, &bases)
            .and_then(|()| self.run(policy, sampler));
        if act.is_err() {
            sampler.set_rng(rng);
        }
        act
    }

    /// The step on the static inputs: captured on the first call, then
    /// replayed (the eager step on the same inputs and draws when the
    /// capture failed).
    fn run(&mut self, policy: &Policy, sampler: &Sampler) -> Result<Act> {
        self.forget_unless(&CaptureKind::Plain);
        if self.graph.is_none() {
            self.capture(policy, sampler)?;
        }
        if self.graph.is_none() || self.outputs.is_none() {
            // The capture failed: the eager step with the same draws.
            let _guard = tch::no_grad_guard();
            let output = policy.network().step(
                &self.inputs.obs,
                self.inputs.staging.blueprints(),
                &LstmState {
                    h: self.inputs.h.shallow_clone(),
                    c: self.inputs.c.shallow_clone(),
                },
                self.inputs.staging.masks(),
            )?;
            let sample = sampler.sample_with_bases(
                &output.logits,
                self.inputs.staging.masks(),
                self.inputs.staging.bases(),
            )?;
            return Ok(Act {
                sample,
                value: output.value,
                hidden: output.hidden,
            });
        }
        self.replay(policy.network().device()).map(|(act, _)| act)
    }

    /// Drops the graph when it was captured for another kind of step.
    fn forget_unless(&mut self, kind: &CaptureKind) {
        if self.captured.as_ref() != Some(kind) {
            self.graph = None;
            self.graph_reads_back = false;
            self.outputs = None;
            self.captured = None;
        }
    }

    /// Replays the captured graph on the current stream (between the timing
    /// events) and returns views of its outputs.
    fn replay(&mut self, device: Device) -> Result<(Act, CudaStream)> {
        let (Some(graph), Some(outputs)) = (&self.graph, &self.outputs) else {
            return Err(Error::InvalidInput {
                field: "GraphedAct.replay",
                reason: "nothing captured".to_owned(),
            });
        };
        let Device::Cuda(index) = device else {
            return Err(Error::InvalidConfig {
                field: "GraphedAct",
                reason: "a captured step on a non-CUDA device".to_owned(),
            });
        };
        let current = CudaStream::current(index).map_err(|error| Error::InvalidInput {
            field: "GraphedAct.stream",
            reason: error.to_string(),
        })?;
        let timing_error = |error: torch_ext::Error| Error::InvalidInput {
            field: "GraphedAct.timing",
            reason: error.to_string(),
        };
        if let Some((start, _)) = &self.timing {
            start.record(&current).map_err(timing_error)?;
        }
        graph
            .replay_on(&current)
            .map_err(|error| Error::InvalidInput {
                field: "GraphedAct.replay",
                reason: error.to_string(),
            })?;
        if let Some((_, end)) = &self.timing {
            end.record(&current).map_err(timing_error)?;
        }
        let act = Act {
            sample: SampledActions {
                actions: outputs.sample.actions.shallow_clone(),
                log_probs: outputs.sample.log_probs.shallow_clone(),
                entropies: outputs.sample.entropies.shallow_clone(),
                relevance: outputs.sample.relevance.shallow_clone(),
                masks: outputs.sample.masks.each_ref().map(Tensor::shallow_clone),
            },
            value: outputs.value.shallow_clone(),
            hidden: outputs.hidden.shallow_clone(),
        };
        self.replay_pending = self.timing.is_some();
        Ok((act, current))
    }

    /// Device time of the last replay in ms, from CUDA events around it;
    /// once per replay, and only after it finished (e.g. its actions were
    /// read back). `None` before the graph replays.
    pub fn take_replay_ms(&mut self) -> Option<f64> {
        if !std::mem::take(&mut self.replay_pending) {
            return None;
        }
        let (start, end) = self.timing.as_ref()?;
        start.elapsed_ms(end).ok().map(f64::from)
    }

    /// Warms up and captures the step from the static inputs; a failure
    /// is kept as the fallback reason (the step then runs eagerly).
    fn capture(&mut self, policy: &Policy, sampler: &Sampler) -> Result<()> {
        let network = policy.network();
        self.capture_with(network.device(), CaptureKind::Plain, |inputs| {
            let hidden = LstmState {
                h: inputs.h.shallow_clone(),
                c: inputs.c.shallow_clone(),
            };
            let output = network.step(
                &inputs.obs,
                inputs.staging.blueprints(),
                &hidden,
                inputs.staging.masks(),
            )?;
            let sample = sampler.sample_with_bases(
                &output.logits,
                inputs.staging.masks(),
                inputs.staging.bases(),
            )?;
            Ok(Outputs {
                sample,
                value: output.value,
                hidden: output.hidden,
            })
        })
    }

    /// Warms up and captures `body` (run without gradients on the static
    /// inputs) as the step of `kind` on `device`; a failure is kept as the
    /// fallback reason (the step then runs eagerly). The LSTM state in the
    /// static inputs is put back after the warm-up runs.
    fn capture_with<F>(&mut self, device: Device, kind: CaptureKind, body: F) -> Result<()>
    where
        F: Fn(&Inputs) -> Result<Outputs>,
    {
        let Device::Cuda(index) = device else {
            self.fallback = Some("graphs need CUDA".to_owned());
            return Ok(());
        };
        let stream = match CudaStream::from_pool(index, false) {
            Ok(stream) => stream,
            Err(error) => {
                self.fallback = Some(format!("no side stream: {error}"));
                return Ok(());
            }
        };
        let inputs = &self.inputs;
        let snapshot = |tensor: &Tensor| -> Result<Tensor> {
            let mut out = tensor.f_empty_like().op("graph state")?;
            out.f_copy_(tensor).op("graph state")?;
            Ok(out)
        };
        let saved = (snapshot(&inputs.h)?, snapshot(&inputs.c)?);
        let produced: RefCell<Option<Outputs>> = RefCell::new(None);
        let captured = CudaGraph::capture(&stream, None, WARMUP_ITERS, || {
            let _guard = tch::no_grad_guard();
            let outputs = body(inputs).map_err(|error| error.to_string())?;
            *produced.borrow_mut() = Some(outputs);
            Ok(())
        });
        inputs
            .h
            .shallow_clone()
            .f_copy_(&saved.0)
            .op("graph state")?;
        inputs
            .c
            .shallow_clone()
            .f_copy_(&saved.1)
            .op("graph state")?;
        match captured {
            Ok(graph) => {
                self.graph = Some(graph);
                self.outputs = produced.into_inner();
                self.captured = Some(kind);
                self.timing = CudaEvent::new(true).ok().zip(CudaEvent::new(true).ok());
            }
            Err(error) => {
                self.fallback = Some(format!("capture failed: {error}"));
                self.outputs = None;
                self.captured = None;
            }
        }
        Ok(())
    }
}
