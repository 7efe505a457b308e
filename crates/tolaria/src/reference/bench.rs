//! The `tolaria-reference` benchmark: every execution mode on one device,
//! warm-up epochs then measured epochs, summarised as the figures of a
//! `leyline::baseline::BaselineRecord` (DESIGN.md §7). It lives with the
//! special reference path: its `fused-*` variants run the hand-derived
//! [`Trainer`]; its general variants (`eager`, `graph-step`, `graph-epoch`)
//! run the same workload through the engine
//! ([`run_reference_general`]).
//!
//! Per mode it records epoch latency percentiles (host wall time of a whole
//! epoch, staging and readback included), the first epoch, capture time,
//! staging time, device time per replayed step, four bare replays of the
//! captured step (the floor a graph-step epoch approaches) and peak device
//! memory. [`run`] returns the figures with the device they came from; it
//! probes no machine and writes no record: `esper bench tolaria-reference`
//! adds the environment and writes it.

use std::collections::{BTreeMap, BTreeSet};

use leyline::baseline::{Measurements, ResultEntry, percentile};
use leyline::{Collector, Telemetry};
use serde::{Deserialize, Serialize};
use tch::Device;
use torch_ext::DeviceChoice;

use super::Trainer;
use super::config::{DataPlacement, StepKind, TrainerConfig};
use crate::engine::ExecutionMode;
use crate::engine::bench::{ReferenceWorkload, run_reference_general};
use crate::error::{Error, Result};

/// Workload name in records.
pub const WORKLOAD: &str = "tolaria-reference";

/// One benchmarked configuration: an execution mode and a step kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    /// Execution mode.
    pub mode: ExecutionMode,
    /// Step implementation.
    pub step: StepKind,
}

impl Variant {
    /// The record's mode name: the execution mode, with `-autograd` appended
    /// for the autograd step.
    pub fn name(&self) -> String {
        match self.step {
            StepKind::Fused => format!("fused-{}", self.mode.name()),
            StepKind::Autograd => format!("fused-{}-autograd", self.mode.name()),
        }
    }

    /// Parses [`Variant::name`].
    pub fn from_name(name: &str) -> Option<Variant> {
        let name = name.strip_prefix("fused-")?;
        let (mode_name, step) = match name.strip_suffix("-autograd") {
            Some(mode_name) => (mode_name, StepKind::Autograd),
            None => (name, StepKind::Fused),
        };
        ExecutionMode::from_name(mode_name).map(|mode| Variant { mode, step })
    }

    /// The variants `esper bench` runs by default on `device`: every mode
    /// with the fused step, then eager and graph-step with autograd for
    /// comparison (only eager ones on the CPU).
    pub fn defaults(cuda: bool) -> Vec<Variant> {
        let fused = |mode| Variant {
            mode,
            step: StepKind::Fused,
        };
        let autograd = |mode| Variant {
            mode,
            step: StepKind::Autograd,
        };
        let _ = autograd;
        if cuda {
            vec![
                fused(ExecutionMode::Eager),
                fused(ExecutionMode::GraphStep),
                fused(ExecutionMode::GraphEpoch),
            ]
        } else {
            vec![fused(ExecutionMode::Eager)]
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// Device to run on.
    pub device: DeviceChoice,
    /// Variants to run (empty: [`Variant::defaults`]).
    pub variants: Vec<Variant>,
    /// Unmeasured epochs first (graph capture happens in them).
    pub warmup_epochs: usize,
    /// Measured epochs.
    pub measured_epochs: usize,
    /// Samples of bare replays (each: one epoch's worth of step replays, or
    /// one epoch replay, then one synchronization).
    pub bare_replay_samples: usize,
    /// Back-to-back replays timed with events for `replay_us_per_step`.
    pub timed_replays: usize,
    /// Also run the general trainer's modes (named `eager`, `graph-step`,
    /// `graph-epoch`; the fused special variants are `fused-*`).
    pub general: bool,
}

impl BenchOptions {
    /// Full settings (20 warm-up, 300 measured epochs), or a smoke run.
    pub fn new(device: DeviceChoice, quick: bool) -> BenchOptions {
        BenchOptions {
            device,
            variants: Vec::new(),
            warmup_epochs: if quick { 5 } else { 20 },
            measured_epochs: if quick { 30 } else { 300 },
            bare_replay_samples: if quick { 30 } else { 300 },
            timed_replays: if quick { 50 } else { 500 },
            general: true,
        }
    }
}

impl BenchOptions {
    /// Checks the counts against [`MAX_BENCH_EPOCHS`] and
    /// [`MAX_BENCH_REPLAYS`] (per-epoch vectors are allocated from them).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        for (field, value, limit) in [
            ("warmup_epochs", self.warmup_epochs, MAX_BENCH_EPOCHS),
            ("measured_epochs", self.measured_epochs, MAX_BENCH_EPOCHS),
            (
                "bare_replay_samples",
                self.bare_replay_samples,
                MAX_BENCH_REPLAYS,
            ),
            ("timed_replays", self.timed_replays, MAX_BENCH_REPLAYS),
        ] {
            if value > limit {
                return Err(Error::InvalidConfig {
                    field,
                    reason: format!("{value} is above the bound of {limit}"),
                });
            }
        }
        Ok(())
    }
}

/// Largest number of warm-up or measured epochs of one benchmark variant.
pub const MAX_BENCH_EPOCHS: usize = 1_000_000;
/// Largest number of bare-replay samples or timed replays.
pub const MAX_BENCH_REPLAYS: usize = 10_000_000;

/// What [`run`] measured, and where: the record's figures, and the two
/// facts of its environment that only the run knows.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceRun {
    /// Parameters, one result entry per variant, telemetry names.
    pub measurements: Measurements,
    /// The device every variant ran on.
    pub device: Device,
    /// Whether the variants allowed TF32 matmuls (`environment.tf32`).
    pub tf32: bool,
}

/// Runs the benchmark; `progress` receives one line per stage.
///
/// # Errors
/// [`BenchOptions::validate`]'s errors, a device that is not there; a
/// variant that fails is recorded in the figures with its error instead.
pub fn run(options: &BenchOptions, progress: &mut dyn FnMut(&str)) -> Result<ReferenceRun> {
    options.validate()?;
    let device = torch_ext::device::select(options.device)?;
    let variants = if options.variants.is_empty() {
        Variant::defaults(device.is_cuda())
    } else {
        options.variants.clone()
    };
    let mut results = Vec::new();
    let mut telemetry_names = BTreeSet::new();
    let mut precision = None;
    for variant in &variants {
        let name = variant.name();
        progress(&format!(
            "[rust {name}] {} warm-up + {} measured epochs on {}",
            options.warmup_epochs,
            options.measured_epochs,
            device_label(device)
        ));
        let config = variant_config(*variant, device);
        precision.get_or_insert(config.precision);
        match run_variant(&config, options, progress) {
            Ok((metrics, names)) => {
                progress(&format!(
                    "[rust {name}] epoch p50 {:.4} ms, p95 {:.4} ms",
                    metrics.get("epoch_ms_p50").copied().unwrap_or(f64::NAN),
                    metrics.get("epoch_ms_p95").copied().unwrap_or(f64::NAN)
                ));
                telemetry_names.extend(names);
                results.push(ResultEntry {
                    amp: None,
                    implementation: "rust".to_owned(),
                    mode: name,
                    metrics,
                    error: None,
                });
            }
            Err(error) => {
                progress(&format!("[rust {name}] failed: {error}"));
                results.push(ResultEntry {
                    amp: None,
                    implementation: "rust".to_owned(),
                    mode: name,
                    metrics: BTreeMap::new(),
                    error: Some(error.to_string()),
                });
            }
        }
    }
    if options.general {
        let reference = TrainerConfig::reference();
        let workload = ReferenceWorkload {
            task: reference.task(),
            batch_size: reference.batch_size,
            learning_rate: reference.learning_rate,
            momentum: reference.momentum,
            graph_warmup_steps: reference.graph_warmup_steps,
        };
        let modes: &[ExecutionMode] = if device.is_cuda() {
            &ExecutionMode::ALL
        } else {
            &[ExecutionMode::Eager]
        };
        for mode in modes {
            let name = mode.name().to_owned();
            progress(&format!(
                "[rust {name}] general trainer: {} warm-up + {} measured epochs",
                options.warmup_epochs, options.measured_epochs
            ));
            let entry = match run_reference_general(
                &workload,
                *mode,
                device,
                options.warmup_epochs,
                options.measured_epochs,
                progress,
            ) {
                Ok(metrics) => {
                    progress(&format!(
                        "[rust {name}] epoch p50 {:.4} ms, p95 {:.4} ms",
                        metrics.get("epoch_ms_p50").copied().unwrap_or(f64::NAN),
                        metrics.get("epoch_ms_p95").copied().unwrap_or(f64::NAN)
                    ));
                    ResultEntry {
                        amp: None,
                        implementation: "rust".to_owned(),
                        mode: name,
                        metrics,
                        error: None,
                    }
                }
                Err(error) => {
                    progress(&format!("[rust {name}] failed: {error}"));
                    ResultEntry {
                        amp: None,
                        implementation: "rust".to_owned(),
                        mode: name,
                        metrics: BTreeMap::new(),
                        error: Some(error.to_string()),
                    }
                }
            };
            results.push(entry);
        }
    }
    let reference = TrainerConfig::reference();
    let params = serde_json::json!({
        "modes": "eager, graph-step, graph-epoch: the general trainer (engine + autograd ModelStep over a Kasmina Linear host, device-resident data); fused-*: the hand-derived special step",
        "model": format!("Linear({}->{})", reference.n_features, reference.n_classes),
        "n_samples": reference.n_samples,
        "n_features": reference.n_features,
        "n_classes": reference.n_classes,
        "batch_size": reference.batch_size,
        "steps_per_epoch": reference.steps_per_epoch(),
        "learning_rate": reference.learning_rate,
        "momentum": reference.momentum,
        "seed": reference.seed,
        "warmup_epochs": options.warmup_epochs,
        "measured_epochs": options.measured_epochs,
        "bare_replay_samples": options.bare_replay_samples,
        "timed_replays": options.timed_replays,
        "staging": "eager and graph-step: packed pinned host buffer, one H2D copy per epoch on a staging stream, queued at the end of the previous epoch behind its steps (overlapping its readback); graph-step copies each later microbatch over the first one, which is the static buffer; graph-epoch: device-resident",
        "readback": "one device-to-host copy of the loss/confusion buffer per epoch",
        "epoch_ms": "host wall time of a whole epoch including staging and readback",
        "trainer_config": serde_json::to_value(variant_config(variants.first().copied().unwrap_or(Variant { mode: ExecutionMode::Eager, step: StepKind::Fused }), device)).unwrap_or_default(),
    });
    Ok(ReferenceRun {
        measurements: Measurements {
            params,
            results,
            telemetry_names: telemetry_names.into_iter().collect(),
        },
        device,
        tf32: precision.is_some_and(|p| p.allow_tf32),
    })
}

/// The trainer configuration of one variant on `device`.
pub fn variant_config(variant: Variant, device: Device) -> TrainerConfig {
    TrainerConfig {
        mode: variant.mode,
        step: variant.step,
        device: DeviceChoice::of(device),
        data_placement: if variant.mode == ExecutionMode::GraphEpoch {
            DataPlacement::Device
        } else {
            DataPlacement::PinnedHost
        },
        ..TrainerConfig::reference()
    }
}

fn run_variant(
    config: &TrainerConfig,
    options: &BenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<(BTreeMap<String, f64>, BTreeSet<String>)> {
    let sink = Collector::new();
    let mut trainer = Trainer::with_telemetry(config.clone(), Telemetry::new(sink.clone()))?;
    // After the trainer exists: the caching allocator refuses to reset the
    // statistics of a device it has not initialised yet. The peak then starts
    // from what the trainer holds (parameters, data, buffers).
    // The baseline (memory allocated when the peak is reset) includes what
    // earlier variants of the same process left allocated, notably libtorch's
    // cuBLAS workspace for every stream that ran a matrix product.
    let mut memory_baseline = None;
    if let Device::Cuda(index) = trainer.device() {
        torch_ext::cuda::synchronize(index)?;
        torch_ext::cuda::reset_peak_memory_stats(index)?;
        memory_baseline = Some(torch_ext::cuda::memory_allocated(index)? as f64);
    }
    let mut metrics = BTreeMap::new();
    let mut warmup = Vec::with_capacity(options.warmup_epochs);
    for _ in 0..options.warmup_epochs {
        warmup.push(trainer.train_epoch()?);
    }
    if let Some(first) = warmup.first() {
        metrics.insert("first_epoch_ms".to_owned(), first.epoch_ms);
    }
    let mut epoch_ms = Vec::with_capacity(options.measured_epochs);
    let mut h2d_ms = Vec::new();
    let mut replayed_epochs = 0usize;
    let mut last = None;
    let report_every = options.measured_epochs.checked_div(4).unwrap_or(0).max(1);
    for index in 0..options.measured_epochs {
        let report = trainer.train_epoch()?;
        epoch_ms.push(report.epoch_ms);
        if let Some(ms) = report.h2d_ms {
            h2d_ms.push(ms);
        }
        if report.graph_enabled() {
            replayed_epochs = replayed_epochs.saturating_add(1);
        }
        let done = index.saturating_add(1);
        if done.checked_rem(report_every) == Some(0) {
            progress(&format!(
                "[rust {}] measured {}/{}",
                Variant {
                    mode: config.mode,
                    step: config.step
                }
                .name(),
                done,
                options.measured_epochs
            ));
        }
        last = Some(report);
    }
    let mut put = |key: &str, value: Option<f64>| {
        if let Some(value) = value {
            metrics.insert(key.to_owned(), value);
        }
    };
    put("epoch_ms_p50", percentile(&epoch_ms, 50.0));
    put("epoch_ms_p95", percentile(&epoch_ms, 95.0));
    put("epoch_ms_max", percentile(&epoch_ms, 100.0));
    put(
        "epoch_ms_mean",
        (!epoch_ms.is_empty()).then(|| epoch_ms.iter().sum::<f64>() / epoch_ms.len() as f64),
    );
    put("h2d_ms_p50", percentile(&h2d_ms, 50.0));
    put("h2d_ms_p95", percentile(&h2d_ms, 95.0));
    put("capture_ms", trainer.capture_ms());
    put("measured_epochs", Some(epoch_ms.len() as f64));
    put("steps_per_epoch", Some(config.steps_per_epoch() as f64));
    put(
        "graph_replayed_epochs_fraction",
        (!epoch_ms.is_empty()).then(|| replayed_epochs as f64 / epoch_ms.len() as f64),
    );
    put(
        "fused_sgd_kernel",
        Some(f64::from(u8::from(trainer.uses_fused_sgd()))),
    );
    if let Some(report) = &last {
        put("final_train_loss", Some(report.loss));
        put("final_train_accuracy", Some(report.accuracy));
    }
    put(
        "graph_fallback_events",
        Some(
            sink.events_named(leyline::telemetry::TOLARIA_GRAPH_FALLBACK)
                .len() as f64,
        ),
    );
    if let Some(validation) = trainer.validate()? {
        put("validation_loss", Some(validation.loss));
        put("validation_accuracy", Some(validation.accuracy));
    }
    if config.mode.uses_graphs() {
        let replays_per_sample = match config.mode {
            ExecutionMode::GraphEpoch => 1,
            _ => config.steps_per_epoch(),
        };
        let mut bare = Vec::with_capacity(options.bare_replay_samples);
        for _ in 0..options.bare_replay_samples {
            if let Some(ms) = trainer.time_bare_replays(replays_per_sample)? {
                bare.push(ms);
            }
        }
        put("bare_replays_per_sample", Some(replays_per_sample as f64));
        put("bare_replays_ms_p50", percentile(&bare, 50.0));
        put("bare_replays_ms_p95", percentile(&bare, 95.0));
        put(
            "replay_us_per_step",
            trainer.replay_us_per_step(options.timed_replays)?,
        );
    }
    if let Some(peak) = trainer.peak_memory_bytes()? {
        put("peak_device_memory_bytes", Some(peak as f64));
        put("device_memory_at_start_bytes", memory_baseline);
    }
    Ok((metrics, sink.names()))
}

fn device_label(device: Device) -> String {
    match device {
        Device::Cuda(index) => torch_ext::cuda::device_name(index).map_or_else(
            |_| format!("cuda:{index}"),
            |name| format!("{name} (cuda:{index})"),
        ),
        _ => "cpu".to_owned(),
    }
}
