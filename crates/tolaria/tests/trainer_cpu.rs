//! CPU behaviour of the trainer: it learns the reference task, it is
//! deterministic, the fused backward matches autograd, and CUDA-only modes
//! and absent CUDA devices refuse to run on the CPU with the documented
//! errors.

use leyline::telemetry as names;
use leyline::{Collector, Telemetry};
use tolaria::data::{Dataset, ReferenceData};
use tolaria::reference::{StepKind, Trainer, TrainerConfig};
use tolaria::{DataPlacement, DeviceChoice, Error, ExecutionMode};

fn cpu_config() -> TrainerConfig {
    TrainerConfig {
        device: DeviceChoice::Cpu,
        ..TrainerConfig::reference()
    }
}

fn max_abs_difference(left: &[f32], right: &[f32]) -> f32 {
    assert_eq!(left.len(), right.len());
    left.iter()
        .zip(right)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn eager_training_drives_the_reference_loss_below_0_3_within_40_epochs() -> anyhow::Result<()> {
    let mut trainer = Trainer::new(cpu_config())?;
    let reports = trainer.train(40)?;
    let first = &reports[0];
    let last = reports.last().expect("40 reports");
    // Four classes start near ln(4) = 1.39.
    assert!(first.loss > 0.8, "first epoch loss {}", first.loss);
    assert!(last.loss < 0.3, "loss after 40 epochs {}", last.loss);
    assert!(
        last.accuracy >= 0.9,
        "accuracy after 40 epochs {}",
        last.accuracy
    );
    assert!(
        reports
            .iter()
            .all(|report| report.eager_steps == 4 && report.replayed_steps == 0)
    );
    let validation = trainer
        .validate()?
        .expect("the reference config has a validation set");
    assert!(validation.loss.is_finite() && validation.loss < first.loss);
    assert!((0.0..=1.0).contains(&validation.accuracy));
    Ok(())
}

#[test]
fn the_same_seed_twice_gives_bitwise_identical_parameters() -> anyhow::Result<()> {
    let run = |config: TrainerConfig| -> anyhow::Result<Vec<f32>> {
        let mut trainer = Trainer::new(config)?;
        trainer.train(5)?;
        Ok(trainer.parameters()?)
    };
    let first = run(cpu_config())?;
    let second = run(cpu_config())?;
    let first_bits: Vec<u32> = first.iter().map(|value| value.to_bits()).collect();
    let second_bits: Vec<u32> = second.iter().map(|value| value.to_bits()).collect();
    assert_eq!(first_bits, second_bits);
    let other_seed = run(TrainerConfig {
        seed: 7,
        ..cpu_config()
    })?;
    assert_ne!(first, other_seed);
    Ok(())
}

#[test]
fn fused_backward_matches_autograd_with_and_without_the_fused_sgd_kernel() -> anyhow::Result<()> {
    let run = |step: StepKind, fused_sgd: bool| -> anyhow::Result<(Vec<f32>, f64)> {
        let mut trainer = Trainer::new(TrainerConfig {
            step,
            fused_sgd,
            ..cpu_config()
        })?;
        let reports = trainer.train(6)?;
        Ok((
            trainer.parameters()?,
            reports.last().expect("6 reports").loss,
        ))
    };
    let (autograd, autograd_loss) = run(StepKind::Autograd, false)?;
    let (manual, manual_loss) = run(StepKind::Fused, false)?;
    let (fused_kernel, fused_loss) = run(StepKind::Fused, true)?;
    let initial = ReferenceData::generate(&cpu_config().task())?.initial_parameters;
    assert!(
        max_abs_difference(&autograd, &initial) > 1e-3,
        "training moved the parameters"
    );
    assert!(max_abs_difference(&manual, &autograd) < 1e-5);
    assert!(max_abs_difference(&fused_kernel, &autograd) < 1e-5);
    assert!((manual_loss - autograd_loss).abs() < 1e-5);
    assert!((fused_loss - autograd_loss).abs() < 1e-5);
    Ok(())
}

/// Without momentum the fused SGD kernel takes no buffer list (libtorch
/// refuses one; found by `trainer_configs_never_panic`), and the three step
/// paths still agree.
#[test]
fn plain_sgd_without_momentum_trains_on_every_step_path() -> anyhow::Result<()> {
    let run = |step: StepKind, fused_sgd: bool| -> anyhow::Result<Vec<f32>> {
        let mut trainer = Trainer::new(TrainerConfig {
            step,
            fused_sgd,
            momentum: 0.0,
            ..cpu_config()
        })?;
        trainer.train(3)?;
        Ok(trainer.parameters()?)
    };
    let autograd = run(StepKind::Autograd, false)?;
    let initial = ReferenceData::generate(&cpu_config().task())?.initial_parameters;
    assert!(max_abs_difference(&autograd, &initial) > 1e-4);
    assert!(max_abs_difference(&run(StepKind::Fused, false)?, &autograd) < 1e-5);
    assert!(max_abs_difference(&run(StepKind::Fused, true)?, &autograd) < 1e-5);
    Ok(())
}

#[test]
fn graph_modes_return_cuda_required_and_absent_cuda_devices_a_device_error_on_the_cpu() {
    for mode in [ExecutionMode::GraphStep, ExecutionMode::GraphEpoch] {
        let config = TrainerConfig {
            mode,
            data_placement: DataPlacement::Device,
            ..cpu_config()
        };
        match Trainer::new(config) {
            Err(Error::CudaRequired { what, .. }) => assert_eq!(what, mode.name()),
            other => panic!("{mode:?} on the CPU gave {other:?}"),
        }
    }
    if !torch_ext::cuda::is_available() {
        let config = TrainerConfig {
            device: DeviceChoice::Cuda(0),
            ..TrainerConfig::reference()
        };
        // Device selection is torch-ext's: its typed error comes through.
        assert!(matches!(
            Trainer::new(config),
            Err(Error::TorchExt(torch_ext::Error::CudaUnavailable))
        ));
    }
}

#[test]
fn invalid_configurations_are_refused() {
    let graph_epoch_on_host = TrainerConfig {
        mode: ExecutionMode::GraphEpoch,
        data_placement: DataPlacement::PinnedHost,
        ..cpu_config()
    };
    assert!(matches!(
        Trainer::new(graph_epoch_on_host),
        Err(Error::InvalidConfig {
            field: "data_placement",
            ..
        })
    ));
    let zero_batch = TrainerConfig {
        batch_size: 0,
        ..cpu_config()
    };
    assert!(matches!(
        Trainer::new(zero_batch),
        Err(Error::InvalidConfig {
            field: "batch_size",
            ..
        })
    ));
}

#[test]
fn every_epoch_emits_latency_and_graph_state_telemetry() -> anyhow::Result<()> {
    let sink = Collector::new();
    let mut trainer = Trainer::with_telemetry(cpu_config(), Telemetry::new(sink.clone()))?;
    let reports = trainer.train(3)?;
    let latencies = sink.metric_values(names::TOLARIA_TRAINING_LATENCY_MS);
    let reported: Vec<f64> = reports.iter().map(|report| report.epoch_ms).collect();
    assert_eq!(latencies, reported);
    assert_eq!(
        sink.metric_values(names::TOLARIA_TRAIN_GRAPH_ENABLED),
        vec![0.0; 3]
    );
    assert!(sink.events_named(names::TOLARIA_GRAPH_FALLBACK).is_empty());
    // Staging is a CUDA concept: nothing is timed on the CPU.
    assert!(sink.metric_values(names::TOLARIA_H2D_COPY_MS).is_empty());
    assert!(reports.iter().all(|report| report.h2d_ms.is_none()));
    Ok(())
}

#[test]
fn a_replaced_training_set_with_a_partial_last_batch_trains() -> anyhow::Result<()> {
    let mut trainer = Trainer::new(cpu_config())?;
    trainer.train(2)?;
    let reference = ReferenceData::generate(&cpu_config().task())?;
    let mut inputs = reference.train.features_to_vec()?;
    inputs.extend_from_slice(&reference.validation.features_to_vec()?[..2 * 16]);
    let mut labels = reference.train.labels_to_vec()?;
    labels.extend_from_slice(&reference.validation.labels_to_vec()?[..2]);
    let set = Dataset::from_rows("eighteen", &inputs, &labels, 16, 4)?;
    trainer.replace_training_set(&set, 4)?;
    let report = trainer.train_epoch()?;
    assert_eq!(report.eager_steps, 5, "18 samples in batches of 4");
    assert!(report.loss.is_finite());
    let correct = report.accuracy * 18.0;
    assert!(
        (correct - correct.round()).abs() < 1e-9,
        "accuracy {}",
        report.accuracy
    );
    Ok(())
}

#[test]
fn epochs_reach_a_nissa_hub() -> anyhow::Result<()> {
    let memory = nissa::MemorySink::new();
    let hub = nissa::Hub::builder().sink(memory.clone()).build()?;
    let mut trainer = Trainer::with_telemetry(cpu_config(), hub.telemetry())?;
    trainer.train(2)?;
    let flushed = hub.flush(std::time::Duration::from_secs(5));
    assert!(flushed.is_complete(), "{flushed:?}");
    let latencies = memory.metrics_named(names::TOLARIA_TRAINING_LATENCY_MS);
    assert_eq!(latencies.len(), 2, "{flushed:?}");
    assert!(
        latencies
            .iter()
            .all(|metric| metric.value > 0.0 && metric.unit == "ms")
    );
    hub.close();
    Ok(())
}
