//! The trainer's epochs: one training epoch on the CPU or on CUDA (eager,
//! graph-step or graph-epoch), read back once and turned into its report.

use std::time::Instant;

use super::{EpochReport, Trainer};
use crate::engine::{DataPlacement, ExecutionMode};
use crate::error::{Error, Result, TorchResultExt};

impl Trainer {
    /// Trains one epoch and reports it (and emits its telemetry).
    ///
    /// The loss and accuracy are read back once, after the last step; that
    /// is where they are checked (never inside the epoch).
    ///
    /// # Errors
    /// [`Error::NonFiniteLoss`] when the epoch's loss is NaN or
    /// infinite (the run diverged): the epoch still counts as trained (its
    /// updates were applied) and its latency telemetry is emitted, but no
    /// report is produced, so a diverged loss is never recorded as a result.
    /// Device, capture and readback failures as [`Error`].
    pub fn train_epoch(&mut self) -> Result<EpochReport> {
        let mut events = Vec::new();
        let started = Instant::now();
        let outcome = if self.cuda.is_some() {
            self.cuda_epoch(&mut events)?
        } else {
            self.cpu_epoch()?
        };
        let epoch_ms = started.elapsed().as_secs_f64() * 1e3;
        let metrics = self.state.interpret_metrics(
            &outcome.metric_values,
            self.data.spans.len(),
            self.data.samples,
        )?;
        let h2d_ms = match (&self.cuda, outcome.staged) {
            (Some(cuda), true) => Some(cuda.h2d_elapsed_ms()?),
            _ => None,
        };
        let report = EpochReport {
            epoch: self.epochs_done,
            epoch_ms,
            h2d_ms,
            loss: metrics.loss,
            accuracy: metrics.accuracy(),
            replayed_steps: outcome.replayed_steps,
            eager_steps: outcome.eager_steps,
            capture_ms: outcome.capture_ms,
        };
        self.epochs_done = self.epochs_done.saturating_add(1);
        self.emit_epoch(&report, events);
        if !report.loss.is_finite() {
            return Err(Error::NonFiniteLoss {
                phase: "training",
                epoch: report.epoch,
                value: report.loss,
            });
        }
        Ok(report)
    }

    /// Trains `epochs` epochs, returning every report.
    pub fn train(&mut self, epochs: usize) -> Result<Vec<EpochReport>> {
        (0..epochs).map(|_| self.train_epoch()).collect()
    }

    fn cpu_epoch(&mut self) -> Result<EpochOutcome> {
        for views in &self.data.views {
            self.state.step(views)?;
        }
        let values = Vec::<f32>::try_from(self.state.metric_buffer()).op("metrics to_vec")?;
        self.state.reset_metrics()?;
        Ok(EpochOutcome {
            metric_values: values,
            staged: false,
            replayed_steps: 0,
            eager_steps: self.data.views.len(),
            capture_ms: None,
        })
    }

    fn cuda_epoch(
        &mut self,
        events: &mut Vec<leyline::proto::TelemetryEvent>,
    ) -> Result<EpochOutcome> {
        let Some(cuda) = self.cuda.as_ref() else {
            return Err(Error::CudaRequired {
                what: "cuda epoch",
                reason: "no CUDA context".to_owned(),
            });
        };
        let _compute = cuda.compute.make_current()?;
        let staged = self.config.data_placement == DataPlacement::PinnedHost;
        if staged {
            cuda.stage(&self.data.device, &self.data.host)?;
        }
        let mut outcome = EpochOutcome {
            metric_values: Vec::new(),
            staged,
            replayed_steps: 0,
            eager_steps: 0,
            capture_ms: None,
        };
        match self.config.mode {
            ExecutionMode::Eager => {
                for views in &self.data.views {
                    self.state.step(views)?;
                }
                outcome.eager_steps = self.data.views.len();
            }
            ExecutionMode::GraphStep => {
                for (views, span) in self.data.views.iter().zip(&self.data.spans) {
                    let (n_features, n_classes) = (self.config.n_features, self.config.n_classes);
                    // Spans come from pack_epoch: offsets and lengths are
                    // within a buffer of at most MAX_PACKED_VALUES f32s.
                    let flat = self
                        .data
                        .device
                        .f_narrow(
                            0,
                            span.offset as i64,
                            span.len(n_features, n_classes)? as i64,
                        )
                        .op("narrow")?;
                    let slot_span = self
                        .data
                        .spans
                        .iter()
                        .find(|candidate| candidate.batch == span.batch)
                        .copied()
                        .unwrap_or(*span);
                    let static_slot = if staged {
                        Some(
                            self.data
                                .device
                                .f_narrow(
                                    0,
                                    slot_span.offset as i64,
                                    slot_span.len(n_features, n_classes)? as i64,
                                )
                                .op("narrow")?,
                        )
                    } else {
                        None
                    };
                    let step = self.step_graphs.run_step(
                        cuda,
                        &mut self.state,
                        views,
                        &flat,
                        static_slot.as_ref(),
                        (self.config.n_features, self.config.n_classes),
                        events,
                    )?;
                    if step.replayed {
                        outcome.replayed_steps = outcome.replayed_steps.saturating_add(1);
                    } else {
                        outcome.eager_steps = outcome.eager_steps.saturating_add(1);
                    }
                    if step.capture_ms.is_some() {
                        outcome.capture_ms = step.capture_ms;
                    }
                }
            }
            ExecutionMode::GraphEpoch => {
                let step =
                    self.epoch_graph
                        .run_epoch(cuda, &mut self.state, &self.data.views, events)?;
                if step.replayed {
                    outcome.replayed_steps = self.data.views.len();
                } else {
                    outcome.eager_steps = self.data.views.len();
                }
                outcome.capture_ms = step.capture_ms;
            }
        }
        let prefetch = staged.then_some((&self.data.device, &self.data.host));
        outcome.metric_values = cuda.finish_epoch(&mut self.state, prefetch)?;
        Ok(outcome)
    }
}

/// What an epoch produced before it is turned into a report.
struct EpochOutcome {
    metric_values: Vec<f32>,
    staged: bool,
    replayed_steps: usize,
    eager_steps: usize,
    capture_ms: Option<f64>,
}
