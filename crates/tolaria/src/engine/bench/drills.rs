//! The `tolaria-timeout` and `tolaria-rollback` drills: a controller slower
//! than its deadline, and NaN weights rolled back by the governor, each
//! reported as a baseline record's figures.

use std::collections::BTreeMap;

use kasmina::host::SlotId;
use kasmina::host::cnn::{CnnHost, CnnHostConfig};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::baseline::{Measurements, ResultEntry, percentile};
use leyline::{Collector, Telemetry};
use tch::Device;
use torch_ext::DeviceChoice;

use super::BenchRun;
use super::variants::put;
use crate::amp::Precision;
use crate::data::Dataset;
use crate::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use crate::error::{Error, Result, TorchResultExt};

/// Workload name of the decision-deadline drill.
pub const TIMEOUT_WORKLOAD: &str = "tolaria-timeout";
/// Workload name of the governor-rollback drill.
pub const ROLLBACK_WORKLOAD: &str = "tolaria-rollback";

/// A controller slower than any deadline the drill sets: it sleeps, then
/// answers WAIT (too late to count).
#[derive(Debug)]
struct SlowController {
    delay: std::time::Duration,
}

impl crate::controller::Controller for SlowController {
    fn decide(
        &mut self,
        _observation: &crate::controller::EpochObservation,
    ) -> Result<crate::controller::Decision> {
        std::thread::sleep(self.delay);
        Ok(crate::controller::Decision::wait())
    }
}

fn drill_data() -> Result<(Dataset, Dataset)> {
    let train = crate::data::synthetic::image_task(
        &crate::data::synthetic::ImageTaskOptions::fashion_like(2048, 31),
    )?;
    let test = crate::data::synthetic::image_task(
        &crate::data::synthetic::ImageTaskOptions::fashion_like(512, 32),
    )?;
    Ok((train, test))
}

fn drill_config() -> ModelTrainerConfig {
    ModelTrainerConfig {
        precision: Some(Precision::Fp32),
        counterfactual_samples: 0,
        snapshot_interval_epochs: 1,
        ..ModelTrainerConfig::default()
    }
}

fn drill_model(device: Device, telemetry: Telemetry) -> Result<MorphogeneticModel> {
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), device)
        .map_err(|source| Error::Lifecycle { op: "host", source })?;
    MorphogeneticModel::with_slot_names(host, &["r0c1"], SlotConfig::default(), telemetry).map_err(
        |source| Error::Lifecycle {
            op: "model",
            source,
        },
    )
}

/// The `tolaria-timeout` drill: a controller that always answers after the
/// deadline; every epoch must go on with WAIT and emit `tolaria.timeout.*`.
/// Figures: timeouts, the deadline, how long each boundary waited
/// (`decision_wait_ms_*`) and how far past the deadline the trainer carried
/// on (`recovery_ms_*`), epochs completed.
pub fn run_timeout_drill(device_choice: DeviceChoice, quick: bool) -> Result<BenchRun> {
    let device = torch_ext::device::select(device_choice)?;
    let (train, test) = drill_data()?;
    let deadline = std::time::Duration::from_millis(20);
    let epochs = if quick { 3 } else { 8 };
    let sink = Collector::new();
    let telemetry = Telemetry::new(sink.clone());
    let mut trainer = ModelTrainer::new(
        drill_model(device, telemetry.clone())?,
        &train,
        Some(&test),
        drill_config(),
        telemetry,
    )?
    .with_controller(
        SlowController {
            delay: std::time::Duration::from_millis(60),
        },
        deadline,
    )?;
    let mut waits = Vec::new();
    let mut recovery = Vec::new();
    let mut timeouts = 0_usize;
    for _ in 0..epochs {
        let report = trainer.train_epoch()?;
        if let Some((crate::controller::DeadlineOutcome::TimedOut { elapsed }, applied)) =
            &report.decision
        {
            timeouts = timeouts.saturating_add(1);
            let waited = elapsed.as_secs_f64() * 1000.0;
            waits.push(waited);
            recovery.push((waited - deadline.as_secs_f64() * 1000.0).max(0.0));
            if *applied != crate::controller::Applied::Waited {
                return Err(Error::Controller {
                    field: "timeout drill",
                    reason: format!("a timed-out decision applied {applied:?}, not WAIT"),
                });
            }
        }
    }
    let mut metrics = BTreeMap::new();
    put(&mut metrics, "epochs", Some(epochs as f64));
    put(&mut metrics, "timeouts", Some(timeouts as f64));
    put(
        &mut metrics,
        "deadline_ms",
        Some(deadline.as_secs_f64() * 1000.0),
    );
    put(
        &mut metrics,
        "decision_wait_ms_p50",
        percentile(&waits, 50.0),
    );
    put(
        &mut metrics,
        "decision_wait_ms_max",
        percentile(&waits, 100.0),
    );
    put(&mut metrics, "recovery_ms_p50", percentile(&recovery, 50.0));
    put(
        &mut metrics,
        "recovery_ms_max",
        percentile(&recovery, 100.0),
    );
    let names = sink.names();
    Ok(BenchRun {
        measurements: Measurements {
            params: serde_json::json!({
                "model": "CnnHost fashion_mnist, slot r0c1, synthetic fashion-like data (2048 train)",
                "deadline_ms": deadline.as_secs_f64() * 1000.0,
                "controller_delay_ms": 60,
                "epochs": epochs,
                "recovery_ms": "time waited beyond the deadline before WAIT applied",
            }),
            results: vec![ResultEntry {
                amp: None,
                implementation: "rust".to_owned(),
                mode: "drill".to_owned(),
                metrics,
                error: None,
            }],
            telemetry_names: names.into_iter().collect(),
        },
        device,
    })
}

/// The `tolaria-rollback` drill: a seed trains beside the host, snapshots
/// are taken every epoch, then a host weight is overwritten with NaN; the
/// next epoch's loss is NaN, the governor rolls back (restores the host,
/// prunes the seed, clears the optimizers) and the epoch after trains with
/// a finite loss again. Figures: recovery ms (the governor's own clock),
/// restored tensors, pruned seeds, the losses around the incident.
pub fn run_rollback_drill(device_choice: DeviceChoice, quick: bool) -> Result<BenchRun> {
    let device = torch_ext::device::select(device_choice)?;
    let (train, test) = drill_data()?;
    let sink = Collector::new();
    let telemetry = Telemetry::new(sink.clone());
    let mut trainer = ModelTrainer::new(
        drill_model(device, telemetry.clone())?,
        &train,
        Some(&test),
        drill_config(),
        telemetry,
    )?;
    let healthy = if quick { 2 } else { 4 };
    let _ = trainer.train_epoch()?;
    trainer
        .model_mut()
        .germinate(
            SlotId::new(0, 1),
            "conv_light",
            GerminationOptions::new("drill-seed"),
        )
        .map_err(|source| Error::Lifecycle {
            op: "germinate",
            source,
        })?;
    let mut before = f64::NAN;
    for _ in 0..healthy {
        before = trainer.train_epoch()?.train.loss;
    }
    let poisoned = trainer
        .model()
        .host_parameters()
        .into_iter()
        .next()
        .map(|(_, tensor)| tensor)
        .ok_or_else(|| Error::InvalidConfig {
            field: "rollback drill",
            reason: "the host has no parameter".to_owned(),
        })?;
    let _ = tch::no_grad(|| poisoned.shallow_clone().f_fill_(f64::NAN)).op("poison")?;
    let incident = trainer.train_epoch()?;
    let report = incident.rollback.clone().ok_or_else(|| Error::Governor {
        field: "rollback drill",
        reason: format!(
            "the poisoned epoch (loss {}) did not roll back: {:?}",
            incident.train.loss, incident.verdict
        ),
    })?;
    let after = trainer.train_epoch()?;
    let mut metrics = BTreeMap::new();
    put(&mut metrics, "recovery_ms", Some(report.recovery_ms));
    put(
        &mut metrics,
        "restored_tensors",
        Some(report.restored_tensors as f64),
    );
    put(
        &mut metrics,
        "pruned_seeds",
        Some(report.pruned.len() as f64),
    );
    put(
        &mut metrics,
        "snapshot_epoch",
        Some(report.snapshot_epoch as f64),
    );
    put(&mut metrics, "loss_before", Some(before));
    put(
        &mut metrics,
        "incident_loss_finite",
        Some(f64::from(u8::from(incident.train.loss.is_finite()))),
    );
    put(&mut metrics, "loss_after", Some(after.train.loss));
    put(
        &mut metrics,
        "rollbacks",
        trainer
            .governor()
            .map(|governor| governor.rollbacks() as f64),
    );
    if !after.train.loss.is_finite() {
        return Err(Error::Governor {
            field: "rollback drill",
            reason: format!("the epoch after the rollback has loss {}", after.train.loss),
        });
    }
    Ok(BenchRun {
        measurements: Measurements {
            params: serde_json::json!({
                "model": "CnnHost fashion_mnist + conv_light@r0c1, synthetic fashion-like data (2048 train)",
                "healthy_epochs_before": healthy,
                "incident": "the host's first parameter filled with NaN between epochs",
                "snapshot_interval_epochs": 1,
            }),
            results: vec![ResultEntry {
                amp: None,
                implementation: "rust".to_owned(),
                mode: "drill".to_owned(),
                metrics,
                error: None,
            }],
            telemetry_names: sink.names().into_iter().collect(),
        },
        device,
    })
}
