//! `tolaria-reference` through the general trainer: the reference
//! `Linear(16->4)` workload as a Kasmina host trained by the engine and
//! [`ModelStep`](crate::engine::model_step::ModelStep), for the record beside the fused special path.

use std::collections::BTreeMap;

use kasmina::host::LinearHost;
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use leyline::baseline::percentile;
use tch::Device;

use super::variants::put;
use crate::amp::Precision;
use crate::data::{ReferenceData, ReferenceTask};
use crate::engine::model_step::{ModelStep, ModelStepConfig};
use crate::engine::staging::StagedData;
use crate::engine::{Engine, EngineConfig, ExecutionMode};
use crate::error::{Error, Result, TorchResultExt};
use crate::optim::{GroupOptimizerConfig, OptimizerConfig};

/// The `tolaria-reference` workload as the general path trains it: the task
/// (data and initial parameters) and the SGD, batch and warm-up settings.
/// The benchmark (`tolaria::reference::bench`) passes the special trainer's
/// `TrainerConfig::reference()` values, so both paths train the same
/// workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReferenceWorkload {
    /// Seed and sizes of the data set (the host is `Linear(16->4)`).
    pub task: ReferenceTask,
    /// Samples per batch.
    pub batch_size: usize,
    /// SGD learning rate.
    pub learning_rate: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// Eager steps of a shape before its capture.
    pub graph_warmup_steps: usize,
}

/// `tolaria-reference` through the general path: a `Linear(16->4)` host
/// with no slot, the reference data and initial parameters of
/// `workload.task`, SGD with the workload's learning rate and momentum
/// (0.01 / 0.9), its batch size (4), no shuffle, trained by the engine and
/// [`ModelStep`](crate::engine::model_step::ModelStep) in `mode`. Returns the figures of the record's entry: `epoch_ms_*` from
/// epochs without the engine's CUDA timing events (the Python peers time
/// their epochs without events too), with each epoch's host launch and
/// finish (device wait and readback) time; then as many epochs with the
/// events for `device_epoch_ms_p50` and `timed_epoch_ms_p50`.
pub fn run_reference_general(
    workload: &ReferenceWorkload,
    mode: ExecutionMode,
    device: Device,
    warmup_epochs: usize,
    measured_epochs: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<BTreeMap<String, f64>> {
    let data = ReferenceData::generate(&workload.task)?;
    let host =
        LinearHost::reference(device).map_err(|source| Error::Lifecycle { op: "host", source })?;
    let initial = tch::Tensor::f_from_slice(&data.initial_parameters)
        .op("initial parameters")?
        .f_view([4, 17])
        .op("view")?
        .f_to_device(device)
        .op("to device")?;
    tch::no_grad(|| -> Result<()> {
        let linear = host.linear();
        linear
            .weight
            .shallow_clone()
            .f_copy_(&initial.f_narrow(1, 0, 16).op("narrow")?)
            .op("weight init")?;
        if let Some(bias) = &linear.bias {
            bias.shallow_clone()
                .f_copy_(&initial.f_select(1, 16).op("select")?)
                .op("bias init")?;
        }
        Ok(())
    })?;
    let model = MorphogeneticModel::new(host, &[], SlotConfig::default(), Telemetry::disabled())
        .map_err(|source| Error::Lifecycle {
            op: "model",
            source,
        })?;
    let mut step = ModelStep::new(
        model,
        ModelStepConfig {
            precision: Precision::Fp32,
            gradient_telemetry_stride: crate::seed_metrics::NEVER,
            max_seeds: 1,
            optimizer: OptimizerConfig {
                host: GroupOptimizerConfig::sgd(workload.learning_rate, workload.momentum),
                seed: GroupOptimizerConfig::sgd(workload.learning_rate, workload.momentum),
            },
            ..ModelStepConfig::default()
        },
    )?;
    let staged = StagedData::resident(&data.train, device, false, workload.task.seed)?;
    let mut engine = Engine::new(
        device,
        EngineConfig {
            mode,
            warmup_steps: workload.graph_warmup_steps,
            epoch_graph_steps: 0,
            batch_size: workload.batch_size,
            drop_last: false,
            forbid_syncs: false,
            pool_lane: 0,
        },
    )?;
    let mut metrics = BTreeMap::new();
    for _ in 0..warmup_epochs {
        let epoch = engine.run_epoch(&mut step, &staged)?;
        if epoch.capture_ms.is_some() {
            put(&mut metrics, "capture_ms", epoch.capture_ms);
        }
        for event in &epoch.events {
            if event.name == leyline::telemetry::TOLARIA_GRAPH_FALLBACK {
                progress(&format!(
                    "[rust {}] graph fallback: {:?}",
                    mode.name(),
                    event.attributes
                ));
            }
        }
    }
    // Epoch times without the engine's CUDA timing events, as the Python
    // peers time theirs; then as many epochs with them, for the device time.
    let mut epoch_ms = Vec::with_capacity(measured_epochs);
    let mut launch_ms = Vec::with_capacity(measured_epochs);
    let mut finish_ms = Vec::with_capacity(measured_epochs);
    let mut last = None;
    engine.set_device_timing(false);
    for _ in 0..measured_epochs {
        let epoch = engine.run_epoch(&mut step, &staged)?;
        epoch_ms.push(epoch.epoch_ms);
        launch_ms.push(epoch.launch_ms);
        finish_ms.push(epoch.epoch_ms - epoch.launch_ms);
        last = Some(epoch);
    }
    engine.set_device_timing(true);
    let mut device_ms = Vec::with_capacity(measured_epochs);
    let mut timed_epoch_ms = Vec::with_capacity(measured_epochs);
    for _ in 0..measured_epochs {
        let epoch = engine.run_epoch(&mut step, &staged)?;
        timed_epoch_ms.push(epoch.epoch_ms);
        if let Some(ms) = epoch.device_ms {
            device_ms.push(ms);
        }
    }
    put(
        &mut metrics,
        "device_epoch_ms_p50",
        percentile(&device_ms, 50.0),
    );
    put(
        &mut metrics,
        "timed_epoch_ms_p50",
        percentile(&timed_epoch_ms, 50.0),
    );
    put(
        &mut metrics,
        "host_launch_ms_p50",
        percentile(&launch_ms, 50.0),
    );
    put(
        &mut metrics,
        "host_finish_ms_p50",
        percentile(&finish_ms, 50.0),
    );
    put(&mut metrics, "epoch_ms_p50", percentile(&epoch_ms, 50.0));
    put(&mut metrics, "epoch_ms_p95", percentile(&epoch_ms, 95.0));
    put(&mut metrics, "epoch_ms_max", percentile(&epoch_ms, 100.0));
    put(&mut metrics, "measured_epochs", Some(epoch_ms.len() as f64));
    if let Some(epoch) = &last {
        // Kernels per step of the captured graph (graph modes).
        put(
            &mut metrics,
            "kernels_per_step",
            engine.kernels_per_step(epoch.steps)?,
        );
    }
    if let Some(epoch) = last {
        put(&mut metrics, "final_train_loss", Some(epoch.loss));
        put(
            &mut metrics,
            "final_train_accuracy",
            Some(epoch.accuracy / 100.0),
        );
        put(
            &mut metrics,
            "graph_replayed_epochs_fraction",
            Some(if epoch.replayed_steps > 0 { 1.0 } else { 0.0 }),
        );
    }
    Ok(metrics)
}
