//! GPU behaviour of the trainer (run on the GPU machine; every test prints a
//! reason and returns when no CUDA device is present):
//! graph modes match eager, steady-state graph epochs never synchronize, an
//! unseen shape falls back with telemetry, and a panic inside a captured
//! closure is an error; (module `grad_agg`) the aggregator's fused PCGrad
//! kernels against its libtorch path.

use leyline::telemetry as names;
use leyline::{Collector, Telemetry};
use tolaria::data::{Dataset, MicrobatchSpan, ReferenceData, pack_epoch};
use tolaria::reference::step::{LinearCeState, StepViews};
use tolaria::reference::{StepKind, Trainer, TrainerConfig};
use tolaria::{DataPlacement, DeviceChoice, ExecutionMode};
use torch_ext::cuda::SyncDebugMode;

#[path = "gpu/grad_agg.rs"]
mod grad_agg;

fn cuda_or_skip(test: &str) -> bool {
    if torch_ext::cuda::is_available() {
        true
    } else {
        println!("skipping {test}: no CUDA device on this machine");
        false
    }
}

fn config(mode: ExecutionMode, step: StepKind) -> TrainerConfig {
    TrainerConfig {
        device: DeviceChoice::Cuda(0),
        mode,
        step,
        data_placement: if mode == ExecutionMode::GraphEpoch {
            DataPlacement::Device
        } else {
            DataPlacement::PinnedHost
        },
        ..TrainerConfig::reference()
    }
}

fn max_abs_difference(left: &[f32], right: &[f32]) -> f32 {
    left.iter()
        .zip(right)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn graph_modes_give_the_parameters_of_eager_after_the_same_steps() -> anyhow::Result<()> {
    if !cuda_or_skip("graph_modes_give_the_parameters_of_eager_after_the_same_steps") {
        return Ok(());
    }
    let epochs = 8; // 32 steps: warm-up, capture, then replays
    for step in [StepKind::Fused, StepKind::Autograd] {
        let run = |mode| -> anyhow::Result<(Vec<f32>, Vec<tolaria::reference::EpochReport>)> {
            let mut trainer = Trainer::new(config(mode, step))?;
            let reports = trainer.train(epochs)?;
            Ok((trainer.parameters()?, reports))
        };
        let (eager, eager_reports) = run(ExecutionMode::Eager)?;
        let (graph_step, step_reports) = run(ExecutionMode::GraphStep)?;
        let (graph_epoch, epoch_reports) = run(ExecutionMode::GraphEpoch)?;
        let step_difference = max_abs_difference(&eager, &graph_step);
        let epoch_difference = max_abs_difference(&eager, &graph_epoch);
        println!("{step:?}: graph-step {step_difference:e}, graph-epoch {epoch_difference:e}");
        assert!(
            step_difference <= 1e-5,
            "{step:?} graph-step differs by {step_difference}"
        );
        assert!(
            epoch_difference <= 1e-5,
            "{step:?} graph-epoch differs by {epoch_difference}"
        );
        // The graphs were really used after warm-up.
        assert!(
            step_reports
                .last()
                .is_some_and(|report| report.graph_enabled())
        );
        assert!(
            epoch_reports
                .last()
                .is_some_and(|report| report.graph_enabled())
        );
        assert_eq!(
            step_reports[0].replayed_steps, 1,
            "3 warm-up steps, capture, replay"
        );
        assert!(step_reports[0].capture_ms.is_some());
        for (eager_report, graph_report) in eager_reports.iter().zip(&step_reports) {
            assert!((eager_report.loss - graph_report.loss).abs() < 1e-5);
            assert_eq!(eager_report.accuracy, graph_report.accuracy);
        }
        assert!(eager_reports.iter().all(|report| report.h2d_ms.is_some()));
        assert!(epoch_reports.iter().all(|report| report.h2d_ms.is_none()));
    }
    Ok(())
}

#[test]
fn steady_state_graph_epochs_never_synchronize() -> anyhow::Result<()> {
    if !cuda_or_skip("steady_state_graph_epochs_never_synchronize") {
        return Ok(());
    }
    for mode in [ExecutionMode::GraphStep, ExecutionMode::GraphEpoch] {
        let mut trainer = Trainer::new(config(mode, StepKind::Fused))?;
        trainer.train(3)?;
        torch_ext::cuda::set_sync_debug_mode(SyncDebugMode::Error)?;
        let steady = trainer.train(5);
        torch_ext::cuda::set_sync_debug_mode(SyncDebugMode::Off)?;
        let steady = steady?;
        assert!(
            steady.iter().all(|report| report.graph_enabled()),
            "{mode:?}"
        );
    }
    Ok(())
}

#[test]
fn a_new_batch_shape_falls_back_to_eager_with_telemetry() -> anyhow::Result<()> {
    if !cuda_or_skip("a_new_batch_shape_falls_back_to_eager_with_telemetry") {
        return Ok(());
    }
    let reference = ReferenceData::generate(&TrainerConfig::reference().task())?;
    let mut inputs = reference.train.features_to_vec()?;
    inputs.extend_from_slice(&reference.validation.features_to_vec()?[..2 * 16]);
    let mut labels = reference.train.labels_to_vec()?;
    labels.extend_from_slice(&reference.validation.labels_to_vec()?[..2]);
    let eighteen = Dataset::from_rows("eighteen", &inputs, &labels, 16, 4)?;
    for mode in [ExecutionMode::GraphStep, ExecutionMode::GraphEpoch] {
        let sink = Collector::new();
        let mut trainer =
            Trainer::with_telemetry(config(mode, StepKind::Fused), Telemetry::new(sink.clone()))?;
        trainer.train(3)?;
        let enabled = sink.events_named(names::TOLARIA_GRAPH_ENABLED);
        assert_eq!(enabled.len(), 1, "{mode:?}: one capture");
        let capture_ms: f64 = enabled[0].attributes["capture_ms"].parse()?;
        assert!(capture_ms > 0.0);
        assert!(sink.events_named(names::TOLARIA_GRAPH_FALLBACK).is_empty());

        trainer.replace_training_set(&eighteen, 4)?;
        let report = trainer.train_epoch()?;
        assert!(report.loss.is_finite());
        let fallbacks = sink.events_named(names::TOLARIA_GRAPH_FALLBACK);
        assert_eq!(fallbacks.len(), 1, "{mode:?}: {fallbacks:?}");
        assert!(
            fallbacks[0].attributes["reason"].contains("unseen"),
            "{fallbacks:?}"
        );
        assert_eq!(
            sink.metric_values(names::TOLARIA_TRAIN_GRAPH_ENABLED)
                .last(),
            Some(&0.0)
        );
        match mode {
            // The four full batches still replay; the batch of two runs eagerly.
            ExecutionMode::GraphStep => {
                assert_eq!((report.replayed_steps, report.eager_steps), (4, 1));
            }
            _ => assert_eq!((report.replayed_steps, report.eager_steps), (0, 5)),
        }
        // Reported once per new shape, not every epoch.
        trainer.train_epoch()?;
        assert_eq!(sink.events_named(names::TOLARIA_GRAPH_FALLBACK).len(), 1);
    }
    Ok(())
}

#[test]
fn a_panic_inside_a_captured_step_is_an_error_and_eager_training_continues() -> anyhow::Result<()> {
    if !cuda_or_skip("a_panic_inside_a_captured_step_is_an_error_and_eager_training_continues") {
        return Ok(());
    }
    let config = config(ExecutionMode::Eager, StepKind::Fused);
    let reference = ReferenceData::generate(&config.task())?;
    let packed = pack_epoch(&reference.train, 4)?;
    let device = tch::Device::Cuda(0);
    let buffer = tch::Tensor::from_slice(&packed.values).to_device(device);
    let views = StepViews::new(
        &buffer,
        MicrobatchSpan {
            offset: 0,
            batch: 4,
        },
        16,
        4,
    )?;
    let mut state = LinearCeState::new(
        StepKind::Fused,
        &reference.initial_parameters,
        16,
        4,
        0.01,
        0.9,
        device,
    )?;
    let stream = torch_ext::CudaStream::from_pool(0, false)?;
    let _current = stream.make_current()?;
    let result = torch_ext::CudaGraph::capture(&stream, None, 3, || {
        state.step(&views).map_err(|error| error.to_string())?;
        if torch_ext::CudaStream::current(0)
            .is_ok_and(|current| current.is_capturing().unwrap_or(false))
        {
            panic!("deliberate panic inside the captured step");
        }
        Ok(())
    });
    match result {
        Err(torch_ext::Error::Panic { message }) => assert!(message.contains("deliberate")),
        other => panic!("expected a caught panic, got {other:?}"),
    }
    // The process and the stream are still usable for eager steps.
    state.reset_metrics()?;
    state.step(&views)?;
    let metrics = Vec::<f32>::try_from(state.metric_buffer().to_device(tch::Device::Cpu))?;
    assert!(metrics[0].is_finite() && metrics[0] > 0.0, "{metrics:?}");
    Ok(())
}

#[test]
fn bench_measurements_exist_for_graph_modes() -> anyhow::Result<()> {
    if !cuda_or_skip("bench_measurements_exist_for_graph_modes") {
        return Ok(());
    }
    for mode in [ExecutionMode::GraphStep, ExecutionMode::GraphEpoch] {
        let mut trainer = Trainer::new(config(mode, StepKind::Fused))?;
        trainer.train(3)?;
        let bare = trainer.time_bare_replays(4)?.expect("a graph exists");
        let per_step = trainer.replay_us_per_step(20)?.expect("a graph exists");
        assert!(bare > 0.0 && per_step > 0.0);
        assert!(trainer.capture_ms().is_some_and(|ms| ms > 0.0));
        assert!(trainer.peak_memory_bytes()?.is_some_and(|bytes| bytes > 0));
    }
    Ok(())
}
