//! The engine: Tolaria's one epoch loop, for any [`Step`].
//!
//! A batch's path reads top to bottom:
//!
//! 1. **data**: [`staging::StagedData`] holds the training set where the
//!    steps read it (resident on the device by default, shuffled there once
//!    per epoch; or in pinned host memory, staged batch by batch through two
//!    buffers on a staging stream, eager only);
//! 2. **stage**: the engine gathers each batch's samples into place (an
//!    `index_select` on the device; inside a captured step graph, from a
//!    static index buffer);
//! 3. **step**: [`Step::run`] enqueues what one batch does (forward,
//!    backward, update) and adds its loss and hits into the engine's device
//!    accumulator; nothing is read back;
//! 4. **deferred metrics**: whatever the step gathers on the device during
//!    the epoch (gradient norms, aggregation counters) stays there;
//! 5. **end of epoch**: one readback of the accumulator.
//!
//! The engine owns streams, staging, capture, replay and readback; the step
//! owns what a batch does. Execution modes ([`ExecutionMode`]): eager; one
//! CUDA graph per (step shape, batch size, step variant), captured after
//! `warmup_steps` eager steps of that shape on the capture stream and
//! replayed for every later batch; or the whole epoch captured at an epoch
//! boundary after an eager warm-up epoch, as a chain of graphs of
//! [`EngineConfig::epoch_graph_steps`] steps each (one huge graph replays
//! slower), replayed with no per-step host work. Graph-epoch gathers
//! shuffled resident data into the epoch's order once before the replays
//! (two kernels an epoch, a second copy of data up to
//! [`staging::MAX_EPOCH_ORDER_BYTES`]), so its steps read views where they
//! would gather two kernels each. The step's
//! [`StepKey`] names everything that changes its kernel sequence (active
//! seeds, stages, precision); when it changes at an epoch boundary every
//! graph of the old key is dropped and the new shape is captured again.
//! Graphs share one memory pool per device and process
//! ([`shared_pool`]), so a second trainer's capture reuses the first one's
//! memory instead of growing its own.
//!
//! A capture that fails (the step reads back, or does something else
//! a graph cannot hold) is discarded by torch-ext, the step is told
//! ([`Step::abandon`]), a `tolaria.graph_fallback` event with the reason is
//! queued, and that shape runs eagerly from then on; training continues.
//!
//! Bad input: a batch size of 0 or larger than the data set, and a data set
//! whose device differs from the step's, are errors before anything runs.

mod accumulator;
pub mod batches;
pub mod bench;
mod execution;
mod mode;
pub mod model_step;
mod pool;
pub mod prewarm;
pub mod staging;
pub mod trainer;

pub use accumulator::EpochAccumulator;
pub use mode::{DataPlacement, ExecutionMode};
pub use pool::shared_pool;

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use leyline::proto::TelemetryEvent;
use tch::{Device, Tensor};
use torch_ext::{CudaEvent, CudaGraph, CudaStream, GraphPool};

use crate::error::{Error, Result};
use execution::{EpochCounts, SyncGuard};
use staging::StagedData;

/// One batch as the step sees it: inputs `[B, ...]` and `i64` labels `[B]`
/// on the step's device.
#[derive(Debug)]
pub struct Batch<'a> {
    /// Input samples.
    pub inputs: &'a Tensor,
    /// Class ids.
    pub labels: &'a Tensor,
    /// Zero-based index of the batch in its epoch.
    pub index: usize,
}

/// One captured graph's shape `(batch size, variant)` (the epoch graph is
/// `(steps, u8::MAX)`) and its `(count, node)` pairs.
pub type GraphSummary = ((i64, u8), Vec<(usize, String)>);

/// What changes a step's kernel sequence: equal keys may share a graph.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepKey(pub String);

/// What one batch does. The general implementation is
/// [`model_step::ModelStep`] (any Kasmina model, autograd); the special one
/// is the hand-derived linear step of `tolaria-reference`
/// (`tolaria::reference::step`, driven by `tolaria::reference::Trainer`),
/// which does not implement this trait.
pub trait Step {
    /// Called at each epoch boundary, before the epoch, outside any capture:
    /// adopt layout changes (new or removed parameter groups, stages,
    /// alphas) and return the key of the step's shape.
    fn prepare(&mut self) -> Result<StepKey>;

    /// Which variant batch `index` of an epoch runs (e.g. whether it
    /// gathers gradient norms): a step graph is captured per variant.
    fn variant(&self, index: usize) -> u8 {
        let _ = index;
        0
    }

    /// Enqueues one batch and adds its loss and hits to `accumulator`.
    /// Must not read device values back (it may be captured).
    fn run(&mut self, batch: &Batch<'_>, accumulator: &EpochAccumulator) -> Result<()>;

    /// Forgets host-side state of a batch that did not finish (a capture
    /// that failed part-way).
    fn abandon(&mut self);
}

/// Graph-epoch's training steps per captured graph by default
/// ([`EngineConfig::epoch_graph_steps`]). On an H200 (`tolaria-fmnist`, 234
/// steps of about 80 kernels) the epoch replayed as graphs of 1 or 4 steps
/// ran 5 - 8 ms faster than as one graph of every step, at equal GPU time.
pub const DEFAULT_EPOCH_GRAPH_STEPS: usize = 4;

/// [`DEFAULT_EPOCH_GRAPH_STEPS`], for serde defaults.
pub(crate) fn default_epoch_graph_steps() -> usize {
    DEFAULT_EPOCH_GRAPH_STEPS
}

/// How the engine runs steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Eager, graph per step, or graph per epoch.
    pub mode: ExecutionMode,
    /// Eager steps of a shape (graph-step) before its capture; graph-epoch
    /// warms up for one whole epoch of the shape.
    pub warmup_steps: usize,
    /// Graph-epoch: training steps per captured graph. The epoch is
    /// captured as a chain of such graphs (the first also zeroes the
    /// epoch's sums), replayed in order after one copy of the epoch's
    /// permutation; 0 captures the whole epoch as one graph. One launch per
    /// graph is the host's whole work per epoch; one huge graph replays
    /// slower than a chain of small ones ([`DEFAULT_EPOCH_GRAPH_STEPS`]).
    pub epoch_graph_steps: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Drop the last, smaller batch of an epoch.
    pub drop_last: bool,
    /// Turn CUDA sync debugging to "error" around each epoch's steps: any
    /// device-to-host synchronisation inside an epoch then fails it (tests).
    pub forbid_syncs: bool,
    /// The graph memory pool lane ([`shared_pool`]): engines whose epochs
    /// run at the same time on different streams (a vectorized driver's
    /// environments) must use different lanes; engines that run one after
    /// another share one (lane 0 by default).
    pub pool_lane: usize,
}

/// What one epoch of the engine did.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineEpoch {
    /// Mean training loss over the epoch's samples.
    pub loss: f64,
    /// Training accuracy, percent.
    pub accuracy: f64,
    /// Samples trained.
    pub samples: usize,
    /// Batches run.
    pub steps: usize,
    /// Batches replayed from graphs.
    pub replayed_steps: usize,
    /// Batches run eagerly.
    pub eager_steps: usize,
    /// Wall time from the first enqueue to the readback, ms.
    pub epoch_ms: f64,
    /// Device time of the epoch's steps (CUDA events), ms; `None` on the
    /// CPU or with device timing off ([`Engine::set_device_timing`]).
    pub device_ms: Option<f64>,
    /// Host time of [`Engine::launch_epoch`] (preparing the step and
    /// queueing every batch), ms; the rest of `epoch_ms` is the device
    /// finishing and the readback.
    pub launch_ms: f64,
    /// Graph captures made this epoch, and their total time, ms.
    pub captures: usize,
    /// Total capture time this epoch, ms.
    pub capture_ms: Option<f64>,
    /// Pinned staging: the summed time of the epoch's host-to-device
    /// copies (CUDA events), ms; `None` for device-resident data.
    pub h2d_ms: Option<f64>,
    /// Telemetry events of the epoch (`tolaria.graph_enabled`,
    /// `tolaria.graph_fallback`).
    pub events: Vec<TelemetryEvent>,
}

impl EngineEpoch {
    /// Whether any batch of the epoch replayed a graph.
    pub fn graph_enabled(&self) -> bool {
        self.replayed_steps > 0
    }
}

struct CudaParts {
    device_index: usize,
    compute: CudaStream,
    pool: GraphPool,
    start: CudaEvent,
    end: CudaEvent,
}

/// A captured step graph and its static index buffer.
struct StepGraph {
    graph: CudaGraph,
    indices: Tensor,
}

/// Graph-epoch's captured epoch: its graphs, replayed in order, and what
/// they read.
struct EpochGraph {
    graphs: Vec<CudaGraph>,
    /// Steps of the epoch.
    steps: usize,
    input: EpochInput,
}

/// What graph-epoch's graphs read their batches from.
enum EpochInput {
    /// A static copy of the permutation, each step's batch gathered from
    /// it; refreshed before each replay where the data is shuffled.
    Permutation(Tensor),
    /// The epoch's samples (inputs, labels) in its order, gathered before
    /// each replay; each step reads views.
    Order((Tensor, Tensor)),
}

/// The epoch loop (see the module docs).
pub struct Engine {
    device: Device,
    config: EngineConfig,
    cuda: Option<CudaParts>,
    accumulator: EpochAccumulator,
    key: Option<StepKey>,
    /// Graph-step graphs of the current key, by (batch size, variant).
    step_graphs: HashMap<(i64, u8), StepGraph>,
    /// Eager steps run per (batch size, variant) under the current key.
    warm: HashMap<(i64, u8), usize>,
    /// The graph-epoch graphs of the current key and their permutation
    /// buffer.
    epoch_graph: Option<EpochGraph>,
    /// Epochs run eagerly under the current key (graph-epoch warm-up).
    warm_epochs: usize,
    /// Shapes whose capture failed under the current key: eager.
    failed: BTreeSet<(i64, u8)>,
    epoch_failed: bool,
    /// Captures made over the engine's life.
    total_captures: usize,
    /// Time of the first capture of this engine, ms.
    first_capture_ms: Option<f64>,
    /// The epoch launched and not yet read back.
    launched: Option<Launched>,
    /// Record CUDA events around each epoch (`device_ms`).
    time_device: bool,
}

/// What [`Engine::finish_epoch`] needs of a launched epoch.
struct Launched {
    wall: Instant,
    launch_ms: f64,
    timed: bool,
    samples: f64,
    steps: usize,
    outcome: EpochCounts,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.device)
            .field("config", &self.config)
            .field("key", &self.key)
            .field("step_graphs", &self.step_graphs.len())
            .field("epoch_graph", &self.epoch_graph.is_some())
            .finish()
    }
}

impl Engine {
    /// An engine on `device`. Graph modes need a CUDA device
    /// ([`Error::CudaRequired`]); the batch size must be at least 1.
    pub fn new(device: Device, config: EngineConfig) -> Result<Engine> {
        if config.batch_size == 0 {
            return Err(Error::InvalidConfig {
                field: "batch_size",
                reason: "0; a batch needs at least one sample".to_owned(),
            });
        }
        let cuda = match device {
            Device::Cuda(index) => {
                let compute = CudaStream::from_pool(index, false)?;
                Some(CudaParts {
                    device_index: index,
                    compute,
                    pool: shared_pool(index, config.pool_lane)?,
                    start: CudaEvent::new(true)?,
                    end: CudaEvent::new(true)?,
                })
            }
            _ if config.mode.uses_graphs() => {
                return Err(Error::CudaRequired {
                    what: "graph execution modes",
                    reason: format!("the engine runs on {device:?}"),
                });
            }
            _ => None,
        };
        Ok(Engine {
            device,
            config,
            cuda,
            accumulator: EpochAccumulator::new(device)?,
            key: None,
            step_graphs: HashMap::new(),
            warm: HashMap::new(),
            epoch_graph: None,
            warm_epochs: 0,
            failed: BTreeSet::new(),
            epoch_failed: false,
            total_captures: 0,
            first_capture_ms: None,
            launched: None,
            time_device: true,
        })
    }

    /// Whether each epoch records two CUDA events around its steps and
    /// reads their elapsed time back with the epoch (`device_ms`); on by
    /// default. Off, an epoch costs the host two event records and a query
    /// less, which matters only for epochs of tens of microseconds.
    pub fn set_device_timing(&mut self, on: bool) {
        self.time_device = on;
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Graphs captured over the engine's life.
    pub fn total_captures(&self) -> usize {
        self.total_captures
    }

    /// Duration of this engine's first capture, ms.
    pub fn first_capture_ms(&self) -> Option<f64> {
        self.first_capture_ms
    }

    /// Drops every graph (the next epoch warms up and captures again).
    pub fn invalidate(&mut self) {
        self.key = None;
        self.step_graphs.clear();
        self.warm.clear();
        self.epoch_graph = None;
        self.warm_epochs = 0;
        self.failed.clear();
        self.epoch_failed = false;
    }

    /// Runs `f` with the engine's compute stream current (a no-op wrapper
    /// on the CPU): work that must be ordered with the steps (alpha
    /// updates, snapshots, validation) goes through here.
    pub fn on_compute_stream<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match &self.cuda {
            Some(cuda) => {
                let _guard = cuda.compute.make_current()?;
                f()
            }
            None => f(),
        }
    }

    /// Trains one epoch of `data` with `step`: [`Engine::launch_epoch`]
    /// then [`Engine::finish_epoch`].
    pub fn run_epoch(&mut self, step: &mut dyn Step, data: &StagedData) -> Result<EngineEpoch> {
        self.launch_epoch(step, data)?;
        self.finish_epoch(data)
    }

    /// Queues one epoch of `data` with `step` on the compute stream and
    /// returns without reading anything back (on the CPU the work is done
    /// when it returns). Several engines (the environments of a vectorized
    /// run, each on its own stream) can be launched before any is finished,
    /// so their epochs overlap on the GPU. An epoch launched and not yet
    /// finished is replaced (its figures are lost) by the next launch.
    pub fn launch_epoch(&mut self, step: &mut dyn Step, data: &StagedData) -> Result<()> {
        self.launched = None;
        if data.device() != self.device {
            return Err(Error::InvalidConfig {
                field: "data",
                reason: format!(
                    "the data set is on {:?}, the engine on {:?}",
                    data.device(),
                    self.device
                ),
            });
        }
        let batch = i64::try_from(self.config.batch_size).map_err(|_| Error::InvalidConfig {
            field: "batch_size",
            reason: "does not fit i64".to_owned(),
        })?;
        let plan = data.plan(batch, self.config.drop_last)?;
        if data.is_pinned_host() && self.config.mode.uses_graphs() {
            return Err(Error::InvalidConfig {
                field: "data_placement",
                reason: format!(
                    "{} replays graphs over device-resident data; pinned-host staging runs eager \
                     (use mode eager, or device-resident data)",
                    self.config.mode.name()
                ),
            });
        }
        let wall = Instant::now();
        let compute = self.cuda.as_ref().map(|cuda| cuda.compute);
        let _guard = match &compute {
            Some(stream) => Some(stream.make_current()?),
            None => None,
        };
        let key = step.prepare()?;
        if self.key.as_ref() != Some(&key) {
            self.invalidate();
            self.key = Some(key);
        }
        // A captured epoch zeroes the sums itself.
        if !(self.config.mode == ExecutionMode::GraphEpoch && self.epoch_graph.is_some()) {
            self.accumulator.zero()?;
        }
        let permutation = data.permutation()?;
        let mut outcome = EpochCounts::default();
        let timed = self.time_device && self.cuda.is_some();
        if let Some(cuda) = self.cuda.as_ref().filter(|_| timed) {
            cuda.start.record(&cuda.compute)?;
        }
        let sync_guard = SyncGuard::new(self.config.forbid_syncs && self.cuda.is_some())?;
        let ran = match self.config.mode {
            ExecutionMode::GraphEpoch => {
                self.epoch_graph_epoch(step, data, &plan, &permutation, &mut outcome)
            }
            ExecutionMode::Eager if data.is_pinned_host() => {
                self.pinned_epoch(step, data, &plan, &permutation, &mut outcome)
            }
            ExecutionMode::GraphStep | ExecutionMode::Eager => {
                self.step_epoch(step, data, &plan, &permutation, &mut outcome)
            }
        };
        drop(sync_guard);
        ran?;
        if let Some(cuda) = self.cuda.as_ref().filter(|_| timed) {
            cuda.end.record(&cuda.compute)?;
        }
        self.launched = Some(Launched {
            wall,
            launch_ms: wall.elapsed().as_secs_f64() * 1000.0,
            timed,
            samples: plan.iter().map(|&(_, len)| len as f64).sum::<f64>(),
            steps: plan.len(),
            outcome,
        });
        Ok(())
    }

    /// Reads back the epoch [`Engine::launch_epoch`] queued (one
    /// synchronisation with the compute stream) and returns its figures;
    /// `data` is the launched epoch's data set (for its copy timings).
    /// [`Error::InvalidConfig`] when no epoch is launched.
    pub fn finish_epoch(&mut self, data: &StagedData) -> Result<EngineEpoch> {
        let Some(launched) = self.launched.take() else {
            return Err(Error::InvalidConfig {
                field: "finish_epoch",
                reason: "no epoch was launched (launch_epoch first)".to_owned(),
            });
        };
        let Launched {
            wall,
            launch_ms,
            timed,
            samples,
            steps,
            outcome,
        } = launched;
        let compute = self.cuda.as_ref().map(|cuda| cuda.compute);
        let guard = match &compute {
            Some(stream) => Some(stream.make_current()?),
            None => None,
        };
        // The readback waits for the compute stream, so the end event has
        // completed when it returns: one synchronisation per epoch.
        let (loss_sum, correct) = self.accumulator.read()?;
        let device_ms = match self.cuda.as_ref().filter(|_| timed) {
            Some(cuda) => Some(f64::from(cuda.start.elapsed_ms(&cuda.end)?)),
            None => None,
        };
        drop(guard);
        let h2d_ms = data.take_copy_ms()?;
        let epoch_ms = wall.elapsed().as_secs_f64() * 1000.0;
        if samples <= 0.0 {
            return Err(Error::InvalidMetric {
                what: "epoch samples",
                value: samples,
            });
        }
        Ok(EngineEpoch {
            loss: loss_sum / samples,
            accuracy: 100.0 * correct / samples,
            samples: samples as usize,
            steps,
            replayed_steps: outcome.replayed,
            eager_steps: outcome.eager,
            epoch_ms,
            device_ms,
            launch_ms,
            captures: outcome.captures,
            capture_ms: (outcome.captures > 0).then_some(outcome.capture_ms),
            h2d_ms,
            events: outcome.events,
        })
    }

    /// Node summaries of the graphs held now: one entry per step graph
    /// (batch size, variant) and the epoch graph (`(steps, u8::MAX)`), each
    /// with [`CudaGraph::node_summary`]'s `(count, node)` pairs.
    pub fn graph_summaries(&self) -> Result<Vec<GraphSummary>> {
        let mut summaries = Vec::new();
        let mut shapes: Vec<&(i64, u8)> = self.step_graphs.keys().collect();
        shapes.sort();
        for shape in shapes {
            if let Some(graph) = self.step_graphs.get(shape) {
                summaries.push((*shape, graph.graph.node_summary()?));
            }
        }
        if let Some(epoch) = &self.epoch_graph {
            let steps = i64::try_from(epoch.steps).unwrap_or(i64::MAX);
            let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
            for graph in &epoch.graphs {
                for (count, node) in graph.node_summary()? {
                    let total = counts.entry(node).or_default();
                    *total = total.saturating_add(count);
                }
            }
            let merged = counts.into_iter().map(|(node, count)| (count, node));
            summaries.push(((steps, u8::MAX), merged.collect()));
        }
        Ok(summaries)
    }

    /// Kernel launches per training step in the captured graphs: the
    /// largest batch's variant-0 step graph, or the epoch graph's kernels
    /// over `steps`; `None` without a graph.
    pub fn kernels_per_step(&self, steps: usize) -> Result<Option<f64>> {
        if let Some(epoch) = &self.epoch_graph {
            let mut kernels = 0_usize;
            for graph in &epoch.graphs {
                kernels = kernels.saturating_add(graph.kernel_count()?);
            }
            return Ok(Some(kernels as f64 / steps.max(1) as f64));
        }
        let best = self
            .step_graphs
            .iter()
            .filter(|((_, variant), _)| *variant == 0)
            .max_by_key(|((batch, _), _)| *batch);
        match best {
            Some((_, graph)) => Ok(Some(graph.graph.kernel_count()? as f64)),
            None => Ok(None),
        }
    }

    /// The CUDA device index, if on CUDA.
    pub fn cuda_index(&self) -> Option<usize> {
        self.cuda.as_ref().map(|cuda| cuda.device_index)
    }
}
