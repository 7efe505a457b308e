//! CUDA execution pieces of the special reference trainer: the
//! compute/staging streams and events (`CudaContext`), per-shape step graphs
//! (`StepGraphs`) and the whole-epoch graph (`EpochGraph`) of the
//! hand-derived fused step. (The engine runs every other step,
//! [`crate::engine`].)
//!
//! Capture rules (DESIGN.md §4): warm up on the capture stream (the trainer's
//! compute stream, where every step runs), never read back inside a step, keep
//! inputs in static device buffers, capture into the engine's one
//! process-wide graph pool of the device ([`shared_pool`], lane
//! [`GRAPH_POOL_LANE`]). A failed capture or an unseen shape falls back to
//! eager and reports a `tolaria.graph_fallback` event with the reason.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use leyline::event;
use leyline::proto::TelemetryEvent;
use leyline::telemetry as names;
use tch::{Device, Kind, Tensor};
use torch_ext::{CudaEvent, CudaGraph, CudaStream, GraphPool};

use super::step::{LinearCeState, StepViews};
use crate::engine::shared_pool;
use crate::error::{Result, TorchResultExt};

/// The lane of the engine's shared graph pool ([`shared_pool`]) the
/// reference trainer captures into: lane 0, the one engines that run one
/// after another share. A reference trainer's graphs never replay while
/// another trainer's epoch runs: each epoch, and each timed replay run,
/// ends in a synchronisation.
pub(crate) const GRAPH_POOL_LANE: usize = 0;

/// Streams, events and the graph pool of a trainer on one CUDA device.
///
/// Staging is pipelined: at the end of an epoch, once its steps are queued,
/// the staging stream waits for them and copies the next epoch's microbatches
/// into the device buffer, concurrently with the metric readback. Two pairs of
/// timing events alternate, so the copy that fed an epoch can be timed when
/// that epoch ends while the next copy is still in flight.
pub(crate) struct CudaContext {
    /// Where every step runs, warm-up and capture included.
    pub(crate) compute: CudaStream,
    /// Where host-to-device staging copies run.
    staging: CudaStream,
    /// The engine's process-wide pool of this device and
    /// [`GRAPH_POOL_LANE`].
    pool: GraphPool,
    /// Start/end timing events of the two alternating staging copies.
    h2d: [(CudaEvent, CudaEvent); 2],
    /// The event pair of a staging copy queued for the next epoch.
    pending: Cell<Option<usize>>,
    /// The event pair of the copy that fed the current epoch.
    fed: Cell<Option<usize>>,
    /// Recorded on `compute` after an epoch's last step: the device buffer
    /// may be overwritten by the next staging copy once it completes.
    consumed: CudaEvent,
    /// Recorded on `compute` after the metric readback copy.
    pub(crate) done: CudaEvent,
    /// Start event for replay timing.
    pub(crate) timing_start: CudaEvent,
    /// Page-locked destination of the metric readback.
    readback: Tensor,
}

impl CudaContext {
    pub(crate) fn new(device_index: usize, n_classes: usize) -> Result<CudaContext> {
        let metrics_len = n_classes
            .checked_mul(n_classes)
            .and_then(|len| len.checked_add(1))
            .and_then(|len| i64::try_from(len).ok())
            .ok_or_else(|| crate::Error::InvalidConfig {
                field: "n_classes",
                reason: format!("{n_classes}^2 + 1 metric values overflow"),
            })?;
        let compute = CudaStream::from_pool(device_index, false)?;
        let staging = CudaStream::from_pool(device_index, false)?;
        let readback = torch_ext::memory::pin(
            &Tensor::f_zeros([metrics_len], (Kind::Float, Device::Cpu)).op("zeros")?,
        )?;
        Ok(CudaContext {
            compute,
            staging,
            pool: shared_pool(device_index, GRAPH_POOL_LANE)?,
            h2d: [
                (CudaEvent::new(true)?, CudaEvent::new(true)?),
                (CudaEvent::new(true)?, CudaEvent::new(true)?),
            ],
            pending: Cell::new(None),
            fed: Cell::new(None),
            consumed: CudaEvent::new(false)?,
            done: CudaEvent::new(true)?,
            timing_start: CudaEvent::new(true)?,
            readback,
        })
    }

    /// The staging timing events of `pair` (0 or 1; any other value reads
    /// as 1, which cannot happen: pairs only ever alternate between the two).
    fn event_pair(&self, pair: usize) -> &(CudaEvent, CudaEvent) {
        let [first, second] = &self.h2d;
        if pair == 0 { first } else { second }
    }

    /// Queues `host -> device` on the staging stream between the timing
    /// events of `pair`.
    fn queue_copy(&self, device: &Tensor, host: &Tensor, pair: usize) -> Result<()> {
        let _staging = self.staging.make_current()?;
        let (start, end) = self.event_pair(pair);
        start.record(&self.staging)?;
        torch_ext::copy_non_blocking(&mut device.shallow_clone(), host)?;
        end.record(&self.staging)?;
        self.pending.set(Some(pair));
        Ok(())
    }

    /// Makes the compute stream wait for this epoch's staged data, staging it
    /// now when no copy was queued by the previous epoch.
    pub(crate) fn stage(&self, device: &Tensor, host: &Tensor) -> Result<()> {
        if self.pending.get().is_none() {
            let pair = self.fed.get().map_or(0, |fed| usize::from(fed == 0));
            self.queue_copy(device, host, pair)?;
        }
        let pair = self.pending.take().unwrap_or(0);
        self.fed.set(Some(pair));
        self.compute.wait_event(&self.event_pair(pair).1)?;
        Ok(())
    }

    /// Forgets a queued copy (the training set was replaced).
    pub(crate) fn cancel_prefetch(&self) {
        self.pending.set(None);
    }

    /// Device time of the staging copy that fed the last epoch (valid once
    /// that epoch's readback completed).
    pub(crate) fn h2d_elapsed_ms(&self) -> Result<f64> {
        let pair = self.fed.get().unwrap_or(0);
        let (start, end) = self.event_pair(pair);
        Ok(f64::from(start.elapsed_ms(end)?))
    }

    /// Ends an epoch: queues the next epoch's staging copy behind this
    /// epoch's steps (when `prefetch` names the buffers), copies the metric
    /// buffer to pinned memory, queues the accumulator reset behind that copy,
    /// and waits for the copy's event only: the epoch's single device-to-host
    /// synchronization, with staging and reset off its critical path.
    pub(crate) fn finish_epoch(
        &self,
        state: &mut LinearCeState,
        prefetch: Option<(&Tensor, &Tensor)>,
    ) -> Result<Vec<f32>> {
        if let Some((device, host)) = prefetch {
            self.consumed.record(&self.compute)?;
            self.staging.wait_event(&self.consumed)?;
            let pair = self.fed.get().map_or(0, |fed| usize::from(fed == 0));
            self.queue_copy(device, host, pair)?;
        }
        torch_ext::copy_non_blocking(&mut self.readback.shallow_clone(), state.metric_buffer())?;
        self.done.record(&self.compute)?;
        state.reset_metrics()?;
        self.done.synchronize()?;
        Vec::<f32>::try_from(&self.readback).op("metrics to_vec")
    }

    /// Captures `body` on the compute stream into the engine's shared pool.
    fn capture(
        &self,
        body: impl FnMut() -> std::result::Result<(), String>,
    ) -> std::result::Result<(CudaGraph, f64), String> {
        let started = Instant::now();
        let graph = CudaGraph::capture(&self.compute, Some(&self.pool), 0, body)
            .map_err(|error| error.to_string())?;
        Ok((graph, started.elapsed().as_secs_f64() * 1e3))
    }
}

/// What running one step or epoch through the graph machinery did.
pub(crate) struct GraphRun {
    pub(crate) replayed: bool,
    pub(crate) capture_ms: Option<f64>,
}

/// A captured step graph with the static buffer it reads.
struct CapturedStep {
    graph: CudaGraph,
    static_buffer: Tensor,
    capture_ms: f64,
}

/// Step graphs by microbatch shape, for graph-step mode.
pub(crate) struct StepGraphs {
    warmup_remaining: usize,
    /// Shapes (batch sizes) the trainer was built for; only these are captured.
    planned: BTreeSet<usize>,
    captured: BTreeMap<usize, CapturedStep>,
    /// Shapes whose capture failed, with the reason.
    failed: BTreeMap<usize, String>,
    /// Shapes for which an unseen-shape fallback was already reported.
    reported_unseen: BTreeSet<usize>,
}

impl StepGraphs {
    pub(crate) fn new(warmup_steps: usize, spans: &[crate::data::MicrobatchSpan]) -> StepGraphs {
        StepGraphs {
            warmup_remaining: warmup_steps,
            planned: spans.iter().map(|span| span.batch).collect(),
            captured: BTreeMap::new(),
            failed: BTreeMap::new(),
            reported_unseen: BTreeSet::new(),
        }
    }

    pub(crate) fn warmup_remaining(&self) -> usize {
        self.warmup_remaining
    }

    pub(crate) fn captured(&self) -> usize {
        self.captured.len()
    }

    pub(crate) fn first_capture_ms(&self) -> Option<f64> {
        self.captured.values().next().map(|step| step.capture_ms)
    }

    pub(crate) fn any_graph(&self) -> Option<&CudaGraph> {
        self.captured.values().next().map(|step| &step.graph)
    }

    /// Runs one step: replay when a graph exists for its shape (after copying
    /// the microbatch into the static buffer), eager during warm-up, capture
    /// then replay on the first step after warm-up, eager plus a fallback
    /// event for unseen shapes and failed captures.
    ///
    /// `static_slot`, when given, is where the static buffer of a new capture
    /// lives: the staging buffer's block of the epoch's first microbatch of
    /// this shape. Staging fills it every epoch and later microbatches are
    /// copied over it after it was consumed, so that microbatch needs no copy.
    /// `None` (device-resident data, which must not be overwritten): a
    /// separate buffer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_step(
        &mut self,
        cuda: &CudaContext,
        state: &mut LinearCeState,
        views: &StepViews,
        packed: &Tensor,
        static_slot: Option<&Tensor>,
        (n_features, n_classes): (usize, usize),
        events: &mut Vec<TelemetryEvent>,
    ) -> Result<GraphRun> {
        let batch = views.batch;
        if let Some(step) = self.captured.get_mut(&batch) {
            if step.static_buffer.data_ptr() != packed.data_ptr() {
                torch_ext::copy_non_blocking(&mut step.static_buffer, packed)?;
            }
            step.graph.replay()?;
            return Ok(GraphRun {
                replayed: true,
                capture_ms: None,
            });
        }
        if self.failed.contains_key(&batch) {
            state.step(views)?;
            return Ok(GraphRun {
                replayed: false,
                capture_ms: None,
            });
        }
        if !self.planned.contains(&batch) {
            if self.reported_unseen.insert(batch) {
                events.push(fallback_event(&format!(
                    "unseen microbatch shape {:?}; captured shapes {:?}",
                    views.shape(),
                    self.captured.keys().collect::<Vec<_>>()
                )));
            }
            state.step(views)?;
            return Ok(GraphRun {
                replayed: false,
                capture_ms: None,
            });
        }
        if self.warmup_remaining > 0 {
            self.warmup_remaining = self.warmup_remaining.saturating_sub(1);
            state.step(views)?;
            return Ok(GraphRun {
                replayed: false,
                capture_ms: None,
            });
        }
        // Capture: fill a static buffer with this microbatch, record one step
        // reading it, then replay to actually perform the step.
        let mut static_buffer = match static_slot {
            Some(slot) => slot.shallow_clone(),
            None => Tensor::f_empty_like(packed).op("empty_like")?,
        };
        if static_buffer.data_ptr() != packed.data_ptr() {
            torch_ext::copy_non_blocking(&mut static_buffer, packed)?;
        }
        let span = crate::data::MicrobatchSpan { offset: 0, batch };
        let static_views = StepViews::new(&static_buffer, span, n_features, n_classes)?;
        let captured =
            cuda.capture(|| state.step(&static_views).map_err(|error| error.to_string()));
        match captured {
            Ok((graph, capture_ms)) => {
                graph.replay()?;
                events.push(event(
                    names::TOLARIA_GRAPH_ENABLED,
                    "training step captured as a CUDA graph",
                    [
                        ("capture_ms", format!("{capture_ms:.3}")),
                        ("shape", format!("{:?}", views.shape())),
                        ("mode", "graph-step".to_owned()),
                    ],
                ));
                self.captured.insert(
                    batch,
                    CapturedStep {
                        graph,
                        static_buffer,
                        capture_ms,
                    },
                );
                Ok(GraphRun {
                    replayed: true,
                    capture_ms: Some(capture_ms),
                })
            }
            Err(reason) => {
                events.push(fallback_event(&format!("capture failed: {reason}")));
                self.failed.insert(batch, reason);
                state.step(views)?;
                Ok(GraphRun {
                    replayed: false,
                    capture_ms: None,
                })
            }
        }
    }
}

/// The whole-epoch graph of graph-epoch mode.
pub(crate) struct EpochGraph {
    warmup_remaining: usize,
    captured: Option<(Vec<usize>, CudaGraph, f64)>,
    failed: Option<String>,
    reported_unseen: BTreeSet<Vec<usize>>,
}

impl EpochGraph {
    pub(crate) fn new(warmup_steps: usize) -> EpochGraph {
        EpochGraph {
            warmup_remaining: warmup_steps,
            captured: None,
            failed: None,
            reported_unseen: BTreeSet::new(),
        }
    }

    pub(crate) fn warmup_remaining(&self) -> usize {
        self.warmup_remaining
    }

    pub(crate) fn capture_ms(&self) -> Option<f64> {
        self.captured.as_ref().map(|(_, _, capture_ms)| *capture_ms)
    }

    pub(crate) fn graph(&self) -> Option<&CudaGraph> {
        self.captured.as_ref().map(|(_, graph, _)| graph)
    }

    pub(crate) fn graph_ref(&self) -> Option<&CudaGraph> {
        self.graph()
    }

    /// Runs one epoch (metric reset plus every step): one replay when the
    /// captured epoch matches these microbatch shapes; eager while warming up
    /// (whole epochs, until the warm-up steps are used), then capture and
    /// replay; eager plus a fallback event otherwise.
    pub(crate) fn run_epoch(
        &mut self,
        cuda: &CudaContext,
        state: &mut LinearCeState,
        views: &[StepViews],
        events: &mut Vec<TelemetryEvent>,
    ) -> Result<GraphRun> {
        let key: Vec<usize> = views.iter().map(|step| step.batch).collect();
        let eager = |state: &mut LinearCeState| -> Result<GraphRun> {
            for step in views {
                state.step(step)?;
            }
            Ok(GraphRun {
                replayed: false,
                capture_ms: None,
            })
        };
        if let Some((captured_key, graph, _)) = &self.captured {
            if *captured_key == key {
                graph.replay()?;
                return Ok(GraphRun {
                    replayed: true,
                    capture_ms: None,
                });
            }
            if self.reported_unseen.insert(key.clone()) {
                events.push(fallback_event(&format!(
                    "unseen epoch shape (microbatch sizes {key:?}); captured {captured_key:?}"
                )));
            }
            return eager(state);
        }
        if self.failed.is_some() {
            return eager(state);
        }
        if self.warmup_remaining > 0 {
            self.warmup_remaining = self.warmup_remaining.saturating_sub(views.len());
            return eager(state);
        }
        let captured = cuda.capture(|| {
            for step in views {
                state.step(step).map_err(|error| error.to_string())?;
            }
            Ok(())
        });
        match captured {
            Ok((graph, capture_ms)) => {
                graph.replay()?;
                events.push(event(
                    names::TOLARIA_GRAPH_ENABLED,
                    "training epoch captured as one CUDA graph",
                    [
                        ("capture_ms", format!("{capture_ms:.3}")),
                        ("steps", views.len().to_string()),
                        ("mode", "graph-epoch".to_owned()),
                    ],
                ));
                self.captured = Some((key, graph, capture_ms));
                Ok(GraphRun {
                    replayed: true,
                    capture_ms: Some(capture_ms),
                })
            }
            Err(reason) => {
                events.push(fallback_event(&format!("capture failed: {reason}")));
                self.failed = Some(reason);
                eager(state)
            }
        }
    }
}

fn fallback_event(reason: &str) -> TelemetryEvent {
    event(
        names::TOLARIA_GRAPH_FALLBACK,
        "graph mode fell back to eager",
        [("reason", reason.to_owned())],
    )
}
