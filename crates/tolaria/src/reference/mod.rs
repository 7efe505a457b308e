//! The special reference path: the hand-derived fused step of
//! `tolaria-reference` and its own [`Trainer`], kept beside the engine as the
//! `fused-*` variants of that benchmark.
//!
//! `tolaria-reference` is a `Linear(16->4)` host, softmax cross-entropy and
//! SGD with momentum on a seeded synthetic task. The general path trains it
//! like any other workload (the engine and
//! [`ModelStep`](crate::engine::model_step::ModelStep) over a Kasmina
//! `LinearHost`, the benchmark's `eager`, `graph-step` and `graph-epoch`
//! variants); this module trains it with a hand-written backward and fused
//! SGD on device-resident parameters, with its own streams and epoch loop.
//! It is explicitly special: nothing of the engine, the data layer, the
//! optimizers or the controller depends on it (`xtask/tests/layering.rs`),
//! and it uses theirs: [`ExecutionMode`] and [`DataPlacement`] (the
//! engine's), the engine's one process-wide graph pool
//! ([`shared_pool`](crate::engine::shared_pool)), amp's
//! [`PrecisionConfig`](crate::amp::PrecisionConfig) and [`apply_precision`],
//! and the data layer's reference task and packed layout
//! ([`crate::data::reference`]).
//!
//! - [`config`]: the serde [`TrainerConfig`] (the workload's settings),
//!   [`StepKind`] and the trainer's bounds.
//! - [`step`]: the step (hand-derived fused backward, or autograd) on
//!   device-resident parameters.
//! - `graph`: streams, events, step/epoch graph capture and fallback.
//! - `placement`: the packed training set on the host and the device.
//! - `epoch`: `Trainer::train_epoch` and `Trainer::train`, the epoch on the
//!   CPU and on CUDA.
//! - `telemetry`: the trainer's packets; they leave through the
//!   [`leyline::Telemetry`] handle given to [`Trainer::with_telemetry`].
//! - [`bench`](mod@bench): the `tolaria-reference` benchmark behind
//!   `esper bench`.
//!
//! The trainer runs epochs over the reference workload in eager, graph-step
//! or graph-epoch mode, with the staging stream, graph capture and fallback,
//! the once-per-epoch readback and the trainer's telemetry.
//!
//! On CUDA every step runs on a dedicated compute stream (also the capture
//! stream, so warm-up and capture share it); microbatches come from a packed
//! pinned host buffer, staged by one transfer per epoch on a separate staging
//! stream timed with events (queued at the end of the previous epoch, behind
//! its steps, so it overlaps that epoch's readback), or from a device-resident
//! copy. Nothing is read
//! back to the host inside an epoch: the metric buffer is copied to pinned
//! memory after the last step and the host waits on one event.

pub mod bench;
pub mod config;
mod epoch;
mod graph;
mod placement;
pub mod step;
mod telemetry;

pub use config::{StepKind, TrainerConfig};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use leyline::telemetry::{self as names, TelemetryLevel};
use leyline::{Telemetry, metric};
use serde::Serialize;
use tch::{Device, Tensor};
use torch_ext::CudaGraph;

use crate::amp::apply_precision;
use crate::data::{Dataset, ReferenceData, pack_epoch};
use crate::engine::{DataPlacement, ExecutionMode};
use crate::error::{Error, Result, TorchResultExt};
use graph::{CudaContext, EpochGraph, StepGraphs};
use placement::{EpochData, place_training_set};
use step::{LinearCeState, StepViews};

/// What one training epoch did and how long it took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochReport {
    /// Zero-based epoch index.
    pub epoch: usize,
    /// Host wall time from the epoch's first launch to its metrics on the
    /// host (staging, every step, readback).
    pub epoch_ms: f64,
    /// Device time of the epoch's host-to-device staging copy (from events);
    /// `None` when nothing was staged (device-resident data, CPU).
    pub h2d_ms: Option<f64>,
    /// Mean of the microbatch mean losses.
    pub loss: f64,
    /// Fraction of training samples classified correctly (before each update).
    pub accuracy: f64,
    /// Steps replayed from a CUDA graph.
    pub replayed_steps: usize,
    /// Steps launched eagerly (eager mode, warm-up, fallback).
    pub eager_steps: usize,
    /// Capture time of a graph captured during this epoch.
    pub capture_ms: Option<f64>,
}

impl EpochReport {
    /// Whether every step of the epoch came from a graph replay.
    pub fn graph_enabled(&self) -> bool {
        self.eager_steps == 0 && self.replayed_steps > 0
    }
}

/// Validation loss and accuracy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationReport {
    /// Mean cross-entropy over the validation set.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
    /// Host wall time of the pass.
    pub elapsed_ms: f64,
}

/// The `tolaria-reference` trainer.
pub struct Trainer {
    config: TrainerConfig,
    device: Device,
    state: LinearCeState,
    data: EpochData,
    /// Buffers of replaced training sets, kept alive because a captured graph
    /// may still point at them.
    retired: Vec<EpochData>,
    validation: Option<(Tensor, Tensor)>,
    cuda: Option<CudaContext>,
    step_graphs: StepGraphs,
    epoch_graph: EpochGraph,
    telemetry: Telemetry,
    epochs_done: usize,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Trainer")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("epochs_done", &self.epochs_done)
            .finish_non_exhaustive()
    }
}

impl Trainer {
    /// A trainer for `config` without telemetry ([`Telemetry::disabled`]).
    pub fn new(config: TrainerConfig) -> Result<Trainer> {
        Trainer::with_telemetry(config, Telemetry::disabled())
    }

    /// A trainer for `config` that emits to `telemetry` (a Nissa hub's
    /// `nissa::Hub::telemetry()`, a [`leyline::Collector`], ...).
    ///
    /// Applies the precision settings, generates the data, places it, and on
    /// CUDA creates the compute and staging streams, events and graph pool.
    /// Graph modes on the CPU return [`Error::CudaRequired`].
    pub fn with_telemetry(config: TrainerConfig, telemetry: Telemetry) -> Result<Trainer> {
        config.validate()?;
        let device = torch_ext::device::select(config.device)?;
        if config.mode.uses_graphs() && !device.is_cuda() {
            return Err(Error::CudaRequired {
                what: config.mode.name(),
                reason: "CUDA graphs exist only on CUDA devices; this trainer runs on the CPU"
                    .to_owned(),
            });
        }
        apply_precision(&config.precision)?;
        let reference = ReferenceData::generate(&config.task())?;
        let mut state = LinearCeState::new(
            config.step,
            &reference.initial_parameters,
            config.n_features,
            config.n_classes,
            config.learning_rate,
            config.momentum,
            device,
        )?;
        let cuda = match device {
            Device::Cuda(index) => Some(CudaContext::new(index, config.n_classes)?),
            _ => None,
        };
        state.set_fused_sgd(config.fused_sgd);
        let data = place_training_set(&config, device, &reference.train)?;
        let validation = if reference.validation.is_empty() {
            None
        } else {
            let packed = pack_epoch(&reference.validation, reference.validation.len())?;
            let span = packed.spans.first().copied().ok_or(Error::InvalidData {
                field: "validation",
                reason: "a non-empty validation set packed into no microbatch".to_owned(),
            })?;
            let flat = Tensor::f_from_slice(&packed.values)
                .op("from_slice")?
                .f_to_device(device)
                .op("to_device")?;
            let views = StepViews::new(&flat, span, config.n_features, config.n_classes)?;
            Some((views.inputs, views.onehot))
        };
        let step_graphs = StepGraphs::new(config.graph_warmup_steps, &data.spans);
        let epoch_graph = EpochGraph::new(config.graph_warmup_steps);
        Ok(Trainer {
            config,
            device,
            state,
            data,
            retired: Vec::new(),
            validation,
            cuda,
            step_graphs,
            epoch_graph,
            telemetry,
            epochs_done: 0,
        })
    }

    /// The configuration the trainer runs.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// The device the trainer runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Epochs trained so far.
    pub fn epochs_done(&self) -> usize {
        self.epochs_done
    }

    /// Whether the fused step updates with torch-ext's fused SGD kernel.
    pub fn uses_fused_sgd(&self) -> bool {
        self.state.uses_fused_sgd()
    }

    /// Capture time of the first captured graph of this trainer, if any.
    pub fn capture_ms(&self) -> Option<f64> {
        match self.config.mode {
            ExecutionMode::Eager => None,
            ExecutionMode::GraphStep => self.step_graphs.first_capture_ms(),
            ExecutionMode::GraphEpoch => self.epoch_graph.capture_ms(),
        }
    }

    /// The parameters as a host `[C, F + 1]` row-major vector (weight
    /// columns, then bias). Synchronizes with the device.
    pub fn parameters(&self) -> Result<Vec<f32>> {
        let host = self
            .state
            .parameters()
            .f_detach()
            .op("detach")?
            .f_to_device(Device::Cpu)
            .op("to_cpu")?
            .f_flatten(0, -1)
            .op("flatten")?;
        Vec::<f32>::try_from(&host).op("to_vec")
    }

    /// Replaces the training set (re-packed with `batch_size`). Graphs stay:
    /// a microbatch shape that was not captured runs eagerly and reports a
    /// `tolaria.graph_fallback`.
    ///
    /// The set was validated when it was built ([`Dataset::new`]: lengths,
    /// label range, finite values); here it must hold between 1 and
    /// [`config::MAX_TRAINER_SAMPLES`] samples of `[n_features]` and the
    /// trainer's classes, and `batch_size` must lie in
    /// `1..=`[`config::MAX_TRAINER_SAMPLES`]. Packing reads the set back to
    /// the host once, here, never inside an epoch.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `batch_size`, `training set`,
    /// `n_features` or `n_classes`; [`Error::InvalidData`] when the
    /// samples are not rows or the packed set is above the bound.
    pub fn replace_training_set(&mut self, set: &Dataset, batch_size: usize) -> Result<()> {
        placement::check_replacement(&self.config, set, batch_size)?;
        let mut config = self.config.clone();
        config.batch_size = batch_size;
        config.n_samples = set.len();
        let data = place_training_set(&config, self.device, set)?;
        if let Some(cuda) = &self.cuda {
            cuda.cancel_prefetch();
        }
        let previous = std::mem::replace(&mut self.data, data);
        self.retired.push(previous);
        self.config.batch_size = batch_size;
        self.config.n_samples = set.len();
        Ok(())
    }

    /// Evaluates the validation set under inference mode (one readback).
    ///
    /// # Errors
    /// [`Error::NonFiniteLoss`] (phase `validation`) when the loss is
    /// NaN or infinite; [`Error::Readback`] for a short readback;
    /// [`Error::TorchExt`] when inference mode cannot be entered.
    pub fn validate(&mut self) -> Result<Option<ValidationReport>> {
        let Some((inputs, onehot)) = &self.validation else {
            return Ok(None);
        };
        let started = Instant::now();
        let _stream = match &self.cuda {
            Some(cuda) => Some(cuda.compute.make_current()?),
            None => None,
        };
        let values = {
            let _inference = torch_ext::InferenceModeGuard::new()?;
            let result = self.state.evaluate(inputs, onehot)?;
            let host = result.f_to_device(Device::Cpu).op("to_cpu")?;
            Vec::<f32>::try_from(&host).op("to_vec")?
        };
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        let &[loss, correct] = values.as_slice() else {
            return Err(Error::Readback {
                what: "validation metrics",
                expected: 2,
                got: values.len(),
            });
        };
        let samples = onehot.size().first().copied().unwrap_or(0).max(1) as f64;
        let report = ValidationReport {
            loss: f64::from(loss),
            accuracy: f64::from(correct) / samples,
            elapsed_ms,
        };
        self.telemetry.emit_metrics(
            leyline::telemetry::sources::TOLARIA,
            TelemetryLevel::Info,
            [metric(names::TOLARIA_VALIDATION_LATENCY_MS, elapsed_ms)],
        );
        if !report.loss.is_finite() {
            return Err(Error::NonFiniteLoss {
                phase: "validation",
                epoch: self.epochs_done,
                value: report.loss,
            });
        }
        Ok(Some(report))
    }

    /// Peak device memory allocated since start-up or the last reset (CUDA only).
    pub fn peak_memory_bytes(&self) -> Result<Option<u64>> {
        match self.device {
            Device::Cuda(index) => Ok(Some(torch_ext::cuda::max_memory_allocated(index)?)),
            _ => Ok(None),
        }
    }

    /// The captured graph of the current mode (any of the step graphs in
    /// graph-step mode), or `None` in eager mode and before capture.
    fn captured_graph(&self) -> Option<&CudaGraph> {
        match self.config.mode {
            ExecutionMode::Eager => None,
            ExecutionMode::GraphStep => self.step_graphs.any_graph(),
            ExecutionMode::GraphEpoch => self.epoch_graph.graph(),
        }
    }

    /// Host wall time of `replays` back-to-back replays of the captured step
    /// (or epoch) graph, synchronized once at the end: the floor a graph-mode
    /// epoch approaches. These replays train on whatever the static buffers
    /// hold. `None` before a graph exists.
    pub fn time_bare_replays(&mut self, replays: usize) -> Result<Option<f64>> {
        let Some(cuda) = self.cuda.as_ref() else {
            return Ok(None);
        };
        let Some(graph) = self.captured_graph() else {
            return Ok(None);
        };
        let _compute = cuda.compute.make_current()?;
        let started = Instant::now();
        for _ in 0..replays {
            graph.replay()?;
        }
        cuda.done.record(&cuda.compute)?;
        cuda.done.synchronize()?;
        Ok(Some(started.elapsed().as_secs_f64() * 1e3))
    }

    /// Device time per step of `replays` back-to-back graph replays, timed
    /// with events (for graph-epoch: per replay divided by the epoch's steps).
    pub fn replay_us_per_step(&mut self, replays: usize) -> Result<Option<f64>> {
        let steps_per_replay = match self.config.mode {
            ExecutionMode::GraphEpoch => self.data.views.len().max(1),
            _ => 1,
        };
        let Some(cuda) = self.cuda.as_ref() else {
            return Ok(None);
        };
        let Some(graph) = self.captured_graph() else {
            return Ok(None);
        };
        let _compute = cuda.compute.make_current()?;
        cuda.timing_start.record(&cuda.compute)?;
        for _ in 0..replays {
            graph.replay()?;
        }
        cuda.done.record(&cuda.compute)?;
        cuda.done.synchronize()?;
        let elapsed_ms = f64::from(cuda.timing_start.elapsed_ms(&cuda.done)?);
        Ok(Some(
            elapsed_ms * 1e3 / (replays.max(1) as f64 * steps_per_replay as f64),
        ))
    }

    fn emit_epoch(&self, report: &EpochReport, events: Vec<leyline::proto::TelemetryEvent>) {
        let warmup_remaining = match self.config.mode {
            ExecutionMode::Eager => None,
            ExecutionMode::GraphEpoch => Some(self.epoch_graph.warmup_remaining()),
            ExecutionMode::GraphStep => Some(self.step_graphs.warmup_remaining()),
        };
        self.telemetry
            .emit_packet(telemetry::epoch_packet(report, warmup_remaining, events));
    }

    /// The telemetry names this trainer's packets use (for records).
    pub fn telemetry_names(&self) -> BTreeSet<&'static str> {
        let mut used = BTreeSet::from([
            names::TOLARIA_TRAINING_LATENCY_MS,
            names::TOLARIA_TRAIN_GRAPH_ENABLED,
        ]);
        if self.config.data_placement == DataPlacement::PinnedHost && self.device.is_cuda() {
            used.insert(names::TOLARIA_H2D_COPY_MS);
        }
        if self.config.mode.uses_graphs() {
            used.extend([
                names::TOLARIA_GRAPH_WARMUP_REMAINING,
                names::TOLARIA_GRAPH_CAPTURE_MS,
                names::TOLARIA_GRAPH_ENABLED,
            ]);
        }
        used
    }

    /// The configuration as JSON, for records.
    pub fn config_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null)
    }

    /// Summary counters for records.
    pub fn counters(&self) -> BTreeMap<&'static str, f64> {
        BTreeMap::from([
            (
                "graphs_captured",
                self.step_graphs.captured() as f64
                    + f64::from(u8::from(self.epoch_graph.graph_ref().is_some())),
            ),
            ("epochs", self.epochs_done as f64),
        ])
    }
}
