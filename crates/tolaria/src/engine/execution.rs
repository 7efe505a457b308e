//! How the batches of one epoch run under each execution mode: eager (from
//! device-resident data or, double-buffered, from pinned host memory), one
//! captured graph per step shape, or the whole epoch as a chain of graphs; the
//! capture itself, its fallback to eager, and the sync-debug guard around
//! an epoch's steps.

use std::time::Instant;

use leyline::event;
use leyline::proto::TelemetryEvent;
use leyline::telemetry as names;
use tch::Tensor;
use torch_ext::CudaGraph;

use super::ExecutionMode;
use super::staging::StagedData;
use super::{Batch, Engine, EpochAccumulator, EpochGraph, EpochInput, Step, StepGraph};
use crate::error::{Error, Result, TorchResultExt};

impl Engine {
    /// Eager epochs from pinned host memory: the copy of batch `b + 1` is
    /// queued before the step of batch `b`, into the other buffer.
    pub(super) fn pinned_epoch(
        &mut self,
        step: &mut dyn Step,
        data: &StagedData,
        plan: &[(i64, i64)],
        permutation: &Tensor,
        outcome: &mut EpochCounts,
    ) -> Result<()> {
        if let Some(&(start, len)) = plan.first() {
            data.stage(0, &permutation.f_narrow(0, start, len).op("narrow")?)?;
        }
        for (index, _) in plan.iter().enumerate() {
            let slot = index % 2;
            let (inputs, labels) = data.staged(slot)?;
            if let Some(&(start, len)) = plan.get(index.saturating_add(1)) {
                data.stage(slot ^ 1, &permutation.f_narrow(0, start, len).op("narrow")?)?;
            }
            step.run(
                &Batch {
                    inputs: &inputs,
                    labels: &labels,
                    index,
                },
                &self.accumulator,
            )?;
            data.consumed(slot)?;
            outcome.eager = outcome.eager.saturating_add(1);
        }
        Ok(())
    }

    /// Eager and graph-step epochs: batch by batch.
    pub(super) fn step_epoch(
        &mut self,
        step: &mut dyn Step,
        data: &StagedData,
        plan: &[(i64, i64)],
        permutation: &Tensor,
        outcome: &mut EpochCounts,
    ) -> Result<()> {
        for (index, &(start, len)) in plan.iter().enumerate() {
            let indices = permutation.f_narrow(0, start, len).op("narrow")?;
            let shape = (len, step.variant(index));
            if self.config.mode == ExecutionMode::GraphStep && !self.failed.contains(&shape) {
                if let Some(graph) = self.step_graphs.get(&shape) {
                    graph
                        .indices
                        .shallow_clone()
                        .f_copy_(&indices)
                        .op("index copy")?;
                    graph.graph.replay()?;
                    outcome.replayed = outcome.replayed.saturating_add(1);
                    continue;
                }
                let warm = self.warm.get(&shape).copied().unwrap_or(0);
                if warm >= self.config.warmup_steps {
                    if self.capture_step(step, data, &indices, index, shape, outcome)? {
                        outcome.replayed = outcome.replayed.saturating_add(1);
                        continue;
                    }
                } else {
                    let _ = self.warm.insert(shape, warm.saturating_add(1));
                }
            }
            run_range(
                step,
                data,
                permutation,
                (start, len),
                index,
                &self.accumulator,
            )?;
            outcome.eager = outcome.eager.saturating_add(1);
        }
        Ok(())
    }

    /// Captures the step graph for `shape` and replays it for this batch;
    /// `false` (after queuing the fallback event) when the capture failed.
    fn capture_step(
        &mut self,
        step: &mut dyn Step,
        data: &StagedData,
        indices: &Tensor,
        index: usize,
        shape: (i64, u8),
        outcome: &mut EpochCounts,
    ) -> Result<bool> {
        let Some(cuda) = &self.cuda else {
            return Ok(false);
        };
        let static_indices = deep_copy(indices)?;
        let started = Instant::now();
        let accumulator = &self.accumulator;
        let captured = {
            // The sync-debug guard must not see the capture's own device
            // synchronisation.
            let _relaxed = SyncGuard::relax()?;
            CudaGraph::capture(&cuda.compute, Some(&cuda.pool), 0, || {
                run_one(step, data, &static_indices, index, accumulator)
                    .map_err(|error| error.to_string())
            })
        };
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        match captured {
            Ok(graph) => {
                graph.replay()?;
                self.note_capture(elapsed, outcome, shape);
                let _ = self.step_graphs.insert(
                    shape,
                    StepGraph {
                        graph,
                        indices: static_indices,
                    },
                );
                Ok(true)
            }
            Err(error) => {
                step.abandon();
                let _ = self.failed.insert(shape);
                outcome.events.push(fallback_event(&error.to_string()));
                Ok(false)
            }
        }
    }

    fn note_capture(&mut self, elapsed: f64, outcome: &mut EpochCounts, shape: (i64, u8)) {
        self.total_captures = self.total_captures.saturating_add(1);
        if self.first_capture_ms.is_none() {
            self.first_capture_ms = Some(elapsed);
        }
        outcome.captures = outcome.captures.saturating_add(1);
        outcome.capture_ms += elapsed;
        outcome.events.push(event(
            names::TOLARIA_GRAPH_ENABLED,
            "training step captured",
            vec![
                ("batch", shape.0.to_string()),
                ("variant", shape.1.to_string()),
                ("capture_ms", format!("{elapsed:.3}")),
                ("mode", self.config.mode.name().to_owned()),
            ],
        ));
    }

    /// Graph-epoch: eager warm-up epochs, then the whole epoch captured as
    /// graphs of `epoch_graph_steps` steps each (0: one graph), all replayed
    /// in order from then on. A capture that fails drops the graphs captured
    /// before it; the epoch then runs eagerly, as do later ones.
    pub(super) fn epoch_graph_epoch(
        &mut self,
        step: &mut dyn Step,
        data: &StagedData,
        plan: &[(i64, i64)],
        permutation: &Tensor,
        outcome: &mut EpochCounts,
    ) -> Result<()> {
        let steps = plan.len();
        if let Some(epoch) = &self.epoch_graph {
            // Ordered data: the graphs read views, not the permutation; with
            // an epoch-order buffer, views of it, gathered here.
            match &epoch.input {
                EpochInput::Order(order) => data.gather_epoch(permutation, order)?,
                EpochInput::Permutation(copy) if !data.is_ordered() => {
                    copy.shallow_clone()
                        .f_copy_(permutation)
                        .op("permutation copy")?;
                }
                EpochInput::Permutation(_) => {}
            }
            for graph in &epoch.graphs {
                graph.replay()?;
            }
            outcome.replayed = outcome.replayed.saturating_add(steps);
            return Ok(());
        }
        let warm_steps = self.warm_epochs.saturating_mul(steps);
        if self.epoch_failed || warm_steps < self.config.warmup_steps.max(1) {
            self.warm_epochs = self.warm_epochs.saturating_add(1);
            for (index, &range) in plan.iter().enumerate() {
                run_range(step, data, permutation, range, index, &self.accumulator)?;
            }
            outcome.eager = outcome.eager.saturating_add(steps);
            return Ok(());
        }
        let Some(cuda) = &self.cuda else {
            return Err(Error::CudaRequired {
                what: "graph-epoch mode",
                reason: "no CUDA device".to_owned(),
            });
        };
        // Shuffled resident data that fits: the epoch gathered into its
        // order once (two kernels), each step a view of that; otherwise a
        // static copy of the permutation that each step gathers from.
        let input = match data.epoch_order_buffers()? {
            Some(order) => {
                data.gather_epoch(permutation, &order)?;
                EpochInput::Order(order)
            }
            None => EpochInput::Permutation(deep_copy(permutation)?),
        };
        let started = Instant::now();
        let accumulator = &self.accumulator;
        let per_graph = match self.config.epoch_graph_steps {
            0 => steps.max(1),
            n => n,
        };
        let captured = {
            let _relaxed = SyncGuard::relax()?;
            let mut graphs = Vec::with_capacity(steps.div_ceil(per_graph));
            let mut result = Ok(());
            for (chunk, ranges) in plan.chunks(per_graph).enumerate() {
                let first = chunk.saturating_mul(per_graph);
                let graph = CudaGraph::capture(&cuda.compute, Some(&cuda.pool), 0, || {
                    (|| -> Result<()> {
                        if chunk == 0 {
                            accumulator.zero()?;
                        }
                        for (offset, &range) in ranges.iter().enumerate() {
                            let index = first.saturating_add(offset);
                            match &input {
                                EpochInput::Order(order) => {
                                    run_view(step, order, range, index, accumulator)?;
                                }
                                EpochInput::Permutation(copy) => {
                                    run_range(step, data, copy, range, index, accumulator)?;
                                }
                            }
                        }
                        Ok(())
                    })()
                    .map_err(|error| error.to_string())
                });
                match graph {
                    Ok(graph) => graphs.push(graph),
                    Err(error) => {
                        result = Err(error);
                        break;
                    }
                }
            }
            result.map(|()| graphs)
        };
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        match captured {
            Ok(graphs) => {
                for graph in &graphs {
                    graph.replay()?;
                }
                self.note_capture(elapsed, outcome, (plan.len() as i64, u8::MAX));
                self.epoch_graph = Some(EpochGraph {
                    graphs,
                    steps,
                    input,
                });
                outcome.replayed = outcome.replayed.saturating_add(steps);
            }
            Err(error) => {
                step.abandon();
                self.epoch_failed = true;
                outcome.events.push(fallback_event(&error.to_string()));
                for (index, &range) in plan.iter().enumerate() {
                    run_range(step, data, permutation, range, index, &self.accumulator)?;
                }
                outcome.eager = outcome.eager.saturating_add(steps);
            }
        }
        Ok(())
    }
}

/// What the batches of one epoch did: replayed and eager steps, captures
/// and the epoch's graph events.
#[derive(Default)]
pub(super) struct EpochCounts {
    pub(super) replayed: usize,
    pub(super) eager: usize,
    pub(super) captures: usize,
    pub(super) capture_ms: f64,
    pub(super) events: Vec<TelemetryEvent>,
}

fn run_one(
    step: &mut dyn Step,
    data: &StagedData,
    indices: &Tensor,
    index: usize,
    accumulator: &EpochAccumulator,
) -> Result<()> {
    let (inputs, labels) = data.gather(indices)?;
    run_batch(step, &inputs, &labels, index, accumulator)
}

/// [`run_one`] for batch `range` of the epoch ordered by `permutation`: a
/// view of ordered data (no gather kernel), else the gathered samples.
fn run_range(
    step: &mut dyn Step,
    data: &StagedData,
    permutation: &Tensor,
    range: (i64, i64),
    index: usize,
    accumulator: &EpochAccumulator,
) -> Result<()> {
    let (inputs, labels) = data.batch(permutation, range)?;
    run_batch(step, &inputs, &labels, index, accumulator)
}

/// [`run_one`] for batch `range` of an epoch gathered into its order
/// (`order`: inputs and labels): views, no gather kernel.
fn run_view(
    step: &mut dyn Step,
    order: &(Tensor, Tensor),
    (start, len): (i64, i64),
    index: usize,
    accumulator: &EpochAccumulator,
) -> Result<()> {
    let inputs = order.0.f_narrow(0, start, len).op("batch view")?;
    let labels = order.1.f_narrow(0, start, len).op("batch view")?;
    run_batch(step, &inputs, &labels, index, accumulator)
}

fn run_batch(
    step: &mut dyn Step,
    inputs: &Tensor,
    labels: &Tensor,
    index: usize,
    accumulator: &EpochAccumulator,
) -> Result<()> {
    step.run(
        &Batch {
            inputs,
            labels,
            index,
        },
        accumulator,
    )
}

/// A fresh tensor holding a copy of `tensor` (a capture's static buffer).
fn deep_copy(tensor: &Tensor) -> Result<Tensor> {
    let copy = tensor.f_empty_like().op("empty_like")?;
    copy.shallow_clone().f_copy_(tensor).op("copy_")?;
    Ok(copy)
}

fn fallback_event(reason: &str) -> TelemetryEvent {
    event(
        names::TOLARIA_GRAPH_FALLBACK,
        "graph capture failed; the step runs eagerly",
        vec![("reason", reason.to_owned())],
    )
}

/// Sets CUDA sync debugging to "error" while alive (when `on`), restoring
/// the previous mode on drop.
pub(super) struct SyncGuard {
    previous: Option<torch_ext::cuda::SyncDebugMode>,
}

impl SyncGuard {
    pub(super) fn new(on: bool) -> Result<SyncGuard> {
        if !on {
            return Ok(SyncGuard { previous: None });
        }
        let previous = torch_ext::cuda::sync_debug_mode()?;
        torch_ext::cuda::set_sync_debug_mode(torch_ext::cuda::SyncDebugMode::Error)?;
        Ok(SyncGuard {
            previous: Some(previous),
        })
    }

    /// Turns sync debugging off for a capture (which synchronises the device
    /// on purpose), restoring it on drop.
    fn relax() -> Result<SyncGuard> {
        if !torch_ext::cuda::is_available() {
            return Ok(SyncGuard { previous: None });
        }
        let previous = torch_ext::cuda::sync_debug_mode()?;
        if previous == torch_ext::cuda::SyncDebugMode::Off {
            return Ok(SyncGuard { previous: None });
        }
        torch_ext::cuda::set_sync_debug_mode(torch_ext::cuda::SyncDebugMode::Off)?;
        Ok(SyncGuard {
            previous: Some(previous),
        })
    }
}

impl Drop for SyncGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            let _ = torch_ext::cuda::set_sync_debug_mode(previous);
        }
    }
}
