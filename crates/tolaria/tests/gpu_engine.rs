//! GPU behaviour of the general trainer (run on the GPU machine; every test
//! prints a reason and returns when no CUDA device is present): graph-step
//! and eager give the same parameters with two blending seeds (fp32);
//! steady-state graph epochs never synchronise (sync debug "error" inside
//! the epoch); a second trainer's first capture reuses the shared pool; a
//! step that reads back cannot be captured, falls back to eager with
//! `tolaria.graph_fallback` and training goes on; bf16 and fp16 train;
//! device timing turns off and on; the blueprint prewarm runs every
//! blueprint at every slot and leaves the model alone; a channels-last
//! trainer stages its validation data channels-last, with the results of
//! a contiguous one.

use kasmina::model::MorphogeneticModel;
use leyline::telemetry as names;
use leyline::{Collector, Telemetry};
use tch::{Device, Tensor};
use tolaria::ExecutionMode;
use tolaria::amp::Precision;
use tolaria::data::Dataset;
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::bench::{bring_to_blending, fmnist_model};
use tolaria::engine::model_step::{ModelStep, ModelStepConfig};
use tolaria::engine::staging::StagedData;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use tolaria::engine::{Batch, Engine, EngineConfig, EpochAccumulator, Step, StepKey};

fn cuda_or_skip(test: &str) -> bool {
    if torch_ext::cuda::is_available() {
        true
    } else {
        println!("skipping {test}: no CUDA device on this machine");
        false
    }
}

fn data(samples: usize, seed: u64) -> Dataset {
    image_task(&ImageTaskOptions::fashion_like(samples, seed)).expect("synthetic images")
}

/// The two-seed benchmark model, seeds blending at 0.5, on CUDA.
fn blending_model(train: &Dataset) -> MorphogeneticModel {
    tch::manual_seed(5);
    let model = fmnist_model(Device::Cuda(0), Telemetry::disabled()).expect("model");
    bring_to_blending(model, train, 40).expect("seeds blending")
}

fn config(mode: ExecutionMode, precision: Precision) -> ModelTrainerConfig {
    ModelTrainerConfig {
        mode,
        precision: Some(precision),
        batch_size: 128,
        validation_batch_size: 512,
        counterfactual_samples: 0,
        gradient_telemetry_stride: 2,
        ..ModelTrainerConfig::default()
    }
}

fn parameters(model: &MorphogeneticModel) -> Vec<f32> {
    model
        .parameters()
        .iter()
        .flat_map(|parameter| {
            Vec::<f32>::try_from(parameter.tensor.to_device(Device::Cpu).flatten(0, -1))
                .expect("to vec")
        })
        .collect()
}

#[test]
fn graph_step_and_eager_train_two_seeds_to_the_same_parameters() {
    if !cuda_or_skip("graph_step_and_eager_train_two_seeds_to_the_same_parameters") {
        return;
    }
    torch_ext::precision::set_cudnn_deterministic(true);
    let train = data(1024, 1);
    let test = data(256, 2);
    let mut finals = Vec::new();
    let mut epoch_kernels = Vec::new();
    // Graph-step after Tolaria's warm-up steps, and with none: a shape's
    // first step is then captured and run by the capture's replay. Then
    // graph-epoch with the whole epoch (8 steps) as one graph, and as
    // graphs of 1 and of 3 steps (3 + 3 + 2).
    // Last, the whole epoch again with the convolutions' weight gradients
    // kept on the step's stream (no side stream).
    let runs = [
        (ExecutionMode::Eager, None, "eager", true),
        (ExecutionMode::GraphStep, None, "graph-step", true),
        (
            ExecutionMode::GraphStep,
            Some(0),
            "graph-step, no warm-up",
            true,
        ),
        (
            ExecutionMode::GraphEpoch,
            Some(0),
            "graph-epoch, one graph",
            true,
        ),
        (
            ExecutionMode::GraphEpoch,
            Some(1),
            "graph-epoch, 1 step a graph",
            true,
        ),
        (
            ExecutionMode::GraphEpoch,
            Some(3),
            "graph-epoch, 3 steps a graph",
            true,
        ),
        (
            ExecutionMode::GraphEpoch,
            Some(0),
            "graph-epoch, one graph, no side stream",
            false,
        ),
    ];
    for (mode, setting, label, overlap) in runs {
        let model = blending_model(&train);
        let mut config = config(mode, Precision::Fp32);
        config.matmul.allow_tf32 = false;
        config.overlap_weight_grads = overlap;
        match (mode, setting) {
            (ExecutionMode::GraphStep, Some(steps)) => config.graph_warmup_steps = steps,
            (ExecutionMode::GraphEpoch, Some(steps)) => config.epoch_graph_steps = steps,
            _ => {}
        }
        let mut trainer =
            ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled())
                .expect("trainer");
        let (mut replayed, mut eager, mut steps) = (0, 0, 0);
        for _ in 0..4 {
            let report = trainer.train_epoch().expect("epoch");
            replayed += report.train.replayed_steps;
            eager += report.train.eager_steps;
            steps = report.train.steps;
        }
        if mode != ExecutionMode::Eager {
            assert!(replayed > 0, "{label} replayed no step");
        }
        if mode == ExecutionMode::GraphStep && setting == Some(0) {
            assert_eq!(eager, 0, "no warm-up: every step is a replay");
        }
        if mode == ExecutionMode::GraphEpoch {
            // Whole epochs, eager (warming up) or replayed, whatever the
            // graphs' size; and every step's kernels in them.
            assert_eq!(eager + replayed, 4 * steps, "{label}");
            assert!(eager >= steps, "{label}: no eager warm-up epoch");
            let kernels = trainer.engine().kernels_per_step(steps).expect("kernels");
            epoch_kernels.push((label, kernels.expect("an epoch graph")));
        }
        finals.push((label, parameters(trainer.model())));
    }
    torch_ext::precision::set_cudnn_deterministic(false);
    let (_, eager) = &finals[0];
    for (label, graph) in &finals[1..] {
        assert_eq!(eager.len(), graph.len());
        let worst = eager
            .iter()
            .zip(graph)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0_f32, f32::max);
        println!("eager vs {label}, 4 epochs, two seeds: max |difference| {worst:e}");
        assert!(worst < 1e-4, "{label}: parameters differ by {worst}");
    }
    // The same kernels in any chunking, on one stream or two: the same
    // parameters, bit for bit.
    let (whole_label, whole) = &finals[3];
    for (label, chunked) in &finals[4..] {
        assert!(whole == chunked, "{label} differs from {whole_label}");
    }
    println!("graph-epoch kernels a step: {epoch_kernels:?}");
    assert!(
        epoch_kernels
            .iter()
            .all(|(_, k)| *k == epoch_kernels[0].1 && *k > 0.0),
        "{epoch_kernels:?}"
    );
}

#[test]
fn steady_state_graph_epochs_never_synchronise() {
    if !cuda_or_skip("steady_state_graph_epochs_never_synchronise") {
        return;
    }
    let train = data(2048, 3);
    for mode in [ExecutionMode::GraphStep, ExecutionMode::GraphEpoch] {
        let model = blending_model(&train);
        let mut config = config(mode, Precision::Bf16);
        config.forbid_syncs = true;
        let mut trainer =
            ModelTrainer::new(model, &train, None, config, Telemetry::disabled()).expect("trainer");
        for epoch in 0..4 {
            let report = trainer
                .train_epoch()
                .unwrap_or_else(|error| panic!("{mode:?} epoch {epoch} synchronised: {error}"));
            if epoch == 3 {
                assert_eq!(
                    report.train.replayed_steps, report.train.steps,
                    "{mode:?}: every step of a steady-state epoch replays"
                );
            }
        }
    }
}

#[test]
fn a_second_trainer_captures_into_the_shared_pool() {
    if !cuda_or_skip("a_second_trainer_captures_into_the_shared_pool") {
        return;
    }
    let train = data(2048, 4);
    let mut captures = Vec::new();
    for _ in 0..2 {
        let model = blending_model(&train);
        let mut trainer = ModelTrainer::new(
            model,
            &train,
            None,
            config(ExecutionMode::GraphStep, Precision::Bf16),
            Telemetry::disabled(),
        )
        .expect("trainer");
        let _ = trainer.train_epoch().expect("epoch");
        captures.push(trainer.engine().first_capture_ms().expect("captured"));
    }
    println!(
        "first capture: first trainer {:.2} ms, second trainer {:.2} ms",
        captures[0], captures[1]
    );
}

/// The general step, plus a host readback after each batch: fine eagerly,
/// impossible inside a graph capture.
struct ReadingBack {
    inner: ModelStep,
    readbacks: usize,
}

impl Step for ReadingBack {
    fn prepare(&mut self) -> tolaria::Result<StepKey> {
        self.inner.prepare()
    }

    fn run(&mut self, batch: &Batch<'_>, accumulator: &EpochAccumulator) -> tolaria::Result<()> {
        self.inner.run(batch, accumulator)?;
        let first = batch
            .labels
            .f_select(0, 0)
            .and_then(|label| i64::try_from(&label))
            .map_err(|source| tolaria::Error::Torch {
                op: "readback inside the step",
                source,
            })?;
        let _ = first;
        self.readbacks += 1;
        Ok(())
    }

    fn abandon(&mut self) {
        self.inner.abandon();
    }
}

#[test]
fn an_uncapturable_step_falls_back_to_eager_and_keeps_training() {
    if !cuda_or_skip("an_uncapturable_step_falls_back_to_eager_and_keeps_training") {
        return;
    }
    let train = data(1024, 5);
    let model = blending_model(&train);
    let step = ModelStep::new(
        model,
        ModelStepConfig {
            precision: Precision::Bf16,
            ..ModelStepConfig::default()
        },
    )
    .expect("step");
    let mut step = ReadingBack {
        inner: step,
        readbacks: 0,
    };
    let staged = StagedData::resident(&train, Device::Cuda(0), true, 9).expect("staged");
    let mut engine = Engine::new(
        Device::Cuda(0),
        EngineConfig {
            mode: ExecutionMode::GraphStep,
            warmup_steps: 2,
            epoch_graph_steps: 0,
            batch_size: 128,
            drop_last: true,
            forbid_syncs: false,
            pool_lane: 0,
        },
    )
    .expect("engine");
    let first = engine.run_epoch(&mut step, &staged).expect("epoch 0");
    let fallbacks: Vec<_> = first
        .events
        .iter()
        .filter(|event| event.name == names::TOLARIA_GRAPH_FALLBACK)
        .collect();
    assert!(!fallbacks.is_empty(), "a fallback event");
    println!("fallback reason: {:?}", fallbacks[0].attributes);
    assert_eq!(first.replayed_steps, 0);
    assert_eq!(first.eager_steps, first.steps, "every step ran eagerly");
    let before = parameters(step.inner.model());
    for _ in 0..3 {
        let epoch = engine.run_epoch(&mut step, &staged).expect("epoch");
        assert_eq!(epoch.replayed_steps, 0);
        assert!(epoch.loss.is_finite());
    }
    let after = parameters(step.inner.model());
    let moved = before
        .iter()
        .zip(&after)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0_f32, f32::max);
    assert!(
        moved > 0.0,
        "training went on after the fallback (parameters moved {moved})"
    );
    assert_eq!(step.readbacks, 4 * first.steps);
}

#[test]
fn half_precision_trains_and_the_fp16_scaler_keeps_a_finite_scale() {
    if !cuda_or_skip("half_precision_trains_and_the_fp16_scaler_keeps_a_finite_scale") {
        return;
    }
    let train = data(2048, 6);
    for precision in [Precision::Bf16, Precision::Fp16] {
        let collector = Collector::new();
        let model = blending_model(&train);
        let mut trainer = ModelTrainer::new(
            model,
            &train,
            None,
            config(ExecutionMode::GraphStep, precision),
            Telemetry::new(collector),
        )
        .expect("trainer");
        let mut losses = Vec::new();
        for _ in 0..4 {
            losses.push(trainer.train_epoch().expect("epoch").train.loss);
        }
        assert!(losses[3] < losses[0], "{precision}: {losses:?}");
        let state = trainer.step().scaler().state().expect("scaler state");
        assert!(state.scale.is_finite() && state.scale > 0.0, "{state:?}");
    }
    let _ = Tensor::zeros([1], (tch::Kind::Float, Device::Cpu));
}

#[test]
fn pinned_host_staging_on_a_side_stream_trains_exactly_like_resident_data() {
    if !cuda_or_skip("pinned_host_staging_on_a_side_stream_trains_exactly_like_resident_data") {
        return;
    }
    torch_ext::precision::set_cudnn_deterministic(true);
    let train = data(1024, 8);
    let mut finals = Vec::new();
    for placement in [
        tolaria::DataPlacement::Device,
        tolaria::DataPlacement::PinnedHost,
    ] {
        let model = blending_model(&train);
        let mut config = config(ExecutionMode::Eager, Precision::Fp32);
        config.matmul.allow_tf32 = false;
        config.data_placement = placement;
        let mut trainer =
            ModelTrainer::new(model, &train, None, config, Telemetry::disabled()).expect("trainer");
        let mut copy_ms = None;
        for _ in 0..3 {
            copy_ms = trainer.train_epoch().expect("epoch").train.h2d_ms;
        }
        if placement == tolaria::DataPlacement::PinnedHost {
            let ms = copy_ms.expect("pinned staging times its copies");
            println!("pinned staging: {ms:.3} ms of copies per epoch");
            assert!(ms > 0.0);
        }
        finals.push(parameters(trainer.model()));
    }
    torch_ext::precision::set_cudnn_deterministic(false);
    assert!(
        finals[0] == finals[1],
        "pinned staging changed the training"
    );
}

#[test]
fn the_fused_loss_trains_like_libtorchs_cross_entropy() {
    if !cuda_or_skip("the_fused_loss_trains_like_libtorchs_cross_entropy") {
        return;
    }
    torch_ext::precision::set_cudnn_deterministic(true);
    let train = data(1024, 7);
    let mut runs = Vec::new();
    for fused in [true, false] {
        let model = blending_model(&train);
        let mut step = ModelStep::new(
            model,
            ModelStepConfig {
                precision: Precision::Fp32,
                ..ModelStepConfig::default()
            },
        )
        .expect("step");
        if fused {
            assert_eq!(
                step.fused_loss_fallback(),
                None,
                "the fused loss did not build"
            );
        } else {
            step.set_fused_loss(false).expect("libtorch loss");
            assert!(step.fused_loss_fallback().is_some());
        }
        let staged = StagedData::resident(&train, Device::Cuda(0), true, 3).expect("staged");
        let mut engine = Engine::new(
            Device::Cuda(0),
            EngineConfig {
                mode: ExecutionMode::GraphStep,
                warmup_steps: 2,
                epoch_graph_steps: 0,
                batch_size: 100,
                drop_last: false,
                forbid_syncs: false,
                pool_lane: 0,
            },
        )
        .expect("engine");
        let mut figures = Vec::new();
        for _ in 0..3 {
            let epoch = engine.run_epoch(&mut step, &staged).expect("epoch");
            figures.push((epoch.loss, epoch.accuracy));
        }
        runs.push((figures, parameters(step.model())));
    }
    torch_ext::precision::set_cudnn_deterministic(false);
    let ((fused, fused_params), (plain, plain_params)) = (&runs[0], &runs[1]);
    for (epoch, (a, b)) in fused.iter().zip(plain).enumerate() {
        println!(
            "epoch {epoch}: fused loss {} acc {}; libtorch loss {} acc {}",
            a.0, a.1, b.0, b.1
        );
        assert!(
            (a.0 - b.0).abs() < 1e-3 * b.0.abs().max(1.0),
            "epoch {epoch} loss"
        );
        assert!((a.1 - b.1).abs() < 0.5, "epoch {epoch} accuracy (percent)");
    }
    let worst = fused_params
        .iter()
        .zip(plain_params)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0_f32, f32::max);
    println!("fused vs libtorch loss, 3 epochs: max |parameter difference| {worst:e}");
    assert!(worst < 1e-3, "parameters differ by {worst}");
}

/// Device timing is on by default (`device_ms` from CUDA events) and can be
/// turned off; either way the epoch's host launch time is part of its wall
/// time.
#[test]
fn device_timing_can_be_turned_off_and_launch_time_is_reported() {
    if !cuda_or_skip("device_timing_can_be_turned_off_and_launch_time_is_reported") {
        return;
    }
    let train = data(512, 4);
    let model = blending_model(&train);
    let mut step = ModelStep::new(model, ModelStepConfig::default()).expect("step");
    let staged = StagedData::resident(&train, Device::Cuda(0), true, 1).expect("staged");
    let mut engine = Engine::new(
        Device::Cuda(0),
        EngineConfig {
            mode: ExecutionMode::GraphEpoch,
            warmup_steps: 2,
            epoch_graph_steps: 0,
            batch_size: 128,
            drop_last: true,
            forbid_syncs: false,
            pool_lane: 0,
        },
    )
    .expect("engine");
    for epoch in 0..3 {
        let report = engine.run_epoch(&mut step, &staged).expect("epoch");
        let device = report.device_ms.expect("timed by default");
        assert!(device > 0.0, "epoch {epoch}: device {device}");
        assert!(report.launch_ms > 0.0 && report.launch_ms <= report.epoch_ms);
    }
    engine.set_device_timing(false);
    let report = engine.run_epoch(&mut step, &staged).expect("untimed epoch");
    assert_eq!(report.device_ms, None);
    assert_eq!(
        report.replayed_steps, report.steps,
        "replayed the epoch graph"
    );
    assert!(report.launch_ms > 0.0 && report.launch_ms <= report.epoch_ms);
    engine.set_device_timing(true);
    let report = engine.run_epoch(&mut step, &staged).expect("timed epoch");
    assert!(report.device_ms.is_some());
}

#[test]
fn the_blueprint_prewarm_runs_every_blueprint_at_every_slot_and_leaves_the_model_alone() {
    if !cuda_or_skip(
        "the_blueprint_prewarm_runs_every_blueprint_at_every_slot_and_leaves_the_model_alone",
    ) {
        return;
    }
    use kasmina::blueprint::Blueprint;
    use kasmina::host::Topology;
    use tolaria::engine::prewarm::prewarm_blueprints;
    let train = data(1024, 3);
    let model = blending_model(&train);
    let before = parameters(&model);
    let blueprints = Blueprint::for_topology(Topology::Cnn)
        .iter()
        .filter(|&&b| b != Blueprint::Noop)
        .count();
    for precision in [Precision::Fp32, Precision::Bf16] {
        let done = prewarm_blueprints(&model, precision, true, &[256, 100]).expect("prewarm");
        assert_eq!(
            done.runs,
            model.slots().len() * blueprints * 2,
            "{precision:?}"
        );
        assert!(done.ms > 0.0);
    }
    assert_eq!(
        parameters(&model),
        before,
        "the model's parameters are untouched"
    );
}

#[test]
fn a_channels_last_trainer_stages_its_validation_data_channels_last_with_the_same_results() {
    if !cuda_or_skip(
        "a_channels_last_trainer_stages_its_validation_data_channels_last_with_the_same_results",
    ) {
        return;
    }
    let train = data(512, 21);
    let test = data(700, 22);
    // The conversion alone, on three-channel images (a one-channel
    // contiguous batch is already channels-last): same shape and values,
    // channels-last storage.
    let images = image_task(&ImageTaskOptions::cifar_like(64, 23)).expect("images");
    let staged = StagedData::resident(&images, Device::Cuda(0), false, 0).expect("staged");
    assert!(!torch_ext::memory::is_channels_last(staged.inputs()).expect("layout"));
    let before = staged.inputs().to_device(Device::Cpu);
    let converted = staged.into_channels_last().expect("channels-last");
    let inputs = converted.inputs();
    assert!(torch_ext::memory::is_channels_last(inputs).expect("layout"));
    assert_eq!(inputs.size(), before.size());
    assert!(inputs.to_device(Device::Cpu).equal(&before));
    // A trainer's validation in either layout: the same loss and accuracy.
    torch_ext::precision::set_cudnn_deterministic(true);
    let mut results = Vec::new();
    for channels_last in [true, false] {
        let model = blending_model(&train);
        let mut config = config(ExecutionMode::Eager, Precision::Fp32);
        config.matmul.allow_tf32 = false;
        config.channels_last = channels_last;
        let mut trainer =
            ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled())
                .expect("trainer");
        if channels_last {
            let staged = trainer.validation_data().expect("validation data");
            assert!(torch_ext::memory::is_channels_last(staged.inputs()).expect("layout"));
        }
        let validation = trainer.validate().expect("validation").expect("a result");
        results.push((validation.loss, validation.accuracy));
    }
    torch_ext::precision::set_cudnn_deterministic(false);
    let ((cl_loss, cl_acc), (loss, acc)) = (results[0], results[1]);
    println!(
        "validation: channels-last {cl_loss:.6} / {cl_acc:.2}%, contiguous {loss:.6} / {acc:.2}%"
    );
    assert!(
        (cl_loss - loss).abs() <= 1e-3 * loss.abs().max(1.0),
        "{cl_loss} vs {loss}"
    );
    assert!((cl_acc - acc).abs() <= 0.5, "{cl_acc} vs {acc}");
}
