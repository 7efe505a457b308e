//! The general trainer on the CPU: a Fashion-MNIST CNN host grows a seed
//! through its whole lifecycle while accuracy rises; deferred gradient
//! metrics and the device shuffle behave; transformer seeds that feed the
//! host gradient go through the aggregator; bad input is refused; a trainer
//! resumed at an epoch (checkpoints) continues its counters.

use std::time::Duration;

use kasmina::host::SlotId;
use kasmina::host::cnn::{CnnHost, CnnHostConfig};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::telemetry as names;
use leyline::{Collector, SeedStage, Telemetry};
use tch::Device;
use tolaria::ExecutionMode;
use tolaria::amp::Precision;
use tolaria::controller::{Controller, Decision, EpochObservation};
use tolaria::data::Dataset;
use tolaria::data::fashion_mnist::{self, FashionMnistOptions};
use tolaria::engine::staging::StagedData;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

fn subset(data: &Dataset, len: usize) -> Dataset {
    data.slice(0, len.min(data.len())).expect("subset")
}

fn fmnist(train: usize, test: usize) -> (Dataset, Dataset) {
    let (full_train, full_test) = fashion_mnist::load(FashionMnistOptions::default())
        .expect("Fashion-MNIST (install the dataset-fashion-mnist package)");
    (
        subset(&full_train.shuffled(7).expect("shuffle"), train),
        subset(&full_test, test),
    )
}

fn cnn_model(telemetry: Telemetry) -> MorphogeneticModel {
    tch::manual_seed(11);
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu).expect("host");
    MorphogeneticModel::with_slot_names(host, &["r0c1"], SlotConfig::default(), telemetry)
        .expect("model")
}

fn cpu_config() -> ModelTrainerConfig {
    ModelTrainerConfig {
        batch_size: 64,
        validation_batch_size: 500,
        precision: Some(Precision::Fp32),
        gradient_telemetry_stride: 4,
        counterfactual_samples: 500,
        ..ModelTrainerConfig::default()
    }
}

#[test]
fn a_fashion_mnist_seed_walks_germinate_to_fossilized_while_accuracy_rises() {
    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    let (train, test) = fmnist(2048, 500);
    let model = cnn_model(telemetry.clone());
    let mut trainer =
        ModelTrainer::new(model, &train, Some(&test), cpu_config(), telemetry).expect("trainer");
    let slot = SlotId::new(0, 1);
    let first = trainer.train_epoch().expect("epoch 0");
    let first_accuracy = first.validation.expect("validation").accuracy;
    trainer
        .model_mut()
        .germinate(slot, "conv_light", GerminationOptions::new("seed-0"))
        .expect("germinate");
    let mut stages = vec![SeedStage::Germinated];
    let mut last_accuracy = first_accuracy;
    for epoch in 1..40 {
        let stage = trainer.model().slot(slot).expect("slot").stage();
        match stage {
            Some(SeedStage::Holding) => {
                let _ = trainer.model_mut().fossilize(slot).expect("fossilize");
            }
            Some(SeedStage::Fossilized) => break,
            Some(_) => {
                let _ = trainer
                    .model_mut()
                    .advance_stage(slot, None)
                    .expect("advance");
            }
            None => panic!("the seed vanished at epoch {epoch}"),
        }
        let now = trainer.model().slot(slot).expect("slot").stage();
        if let Some(now) = now
            && stages.last() != Some(&now)
        {
            stages.push(now);
        }
        let report = trainer.train_epoch().expect("epoch");
        last_accuracy = report.validation.expect("validation").accuracy;
        assert!(report.train.loss.is_finite());
    }
    assert_eq!(
        stages,
        vec![
            SeedStage::Germinated,
            SeedStage::Training,
            SeedStage::Blending,
            SeedStage::Holding,
            SeedStage::Fossilized
        ],
        "stages walked"
    );
    assert!(
        last_accuracy > first_accuracy + 5.0,
        "validation accuracy {first_accuracy:.1}% -> {last_accuracy:.1}%"
    );
    let metric_names: Vec<String> = collector
        .packets()
        .iter()
        .flat_map(|packet| packet.metrics.iter().map(|metric| metric.name.clone()))
        .collect();
    for name in [
        names::TOLARIA_TRAINING_LATENCY_MS,
        names::TOLARIA_TRAIN_GRAPH_ENABLED,
        names::TOLARIA_VALIDATION_LATENCY_MS,
        names::KASMINA_SEED_GRADIENT_RATIO,
        names::KASMINA_SEEDS_ACTIVE,
    ] {
        assert!(metric_names.iter().any(|n| n == name), "{name} emitted");
    }
    // The seed's deferred gradient metrics reached its slot.
    let state = trainer
        .model()
        .slot(slot)
        .expect("slot")
        .state()
        .expect("state");
    assert!(
        state
            .metrics()
            .gradient_ratio
            .is_some_and(|ratio| ratio > 0.0)
    );
}

/// Waits two epochs, then germinates `conv_light` in r0c1 (the heuristic
/// controller lives in tamiyo, above tolaria).
struct GerminateAtTwo;

impl Controller for GerminateAtTwo {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        let slot = SlotId::new(0, 1);
        Ok(
            if observation.epoch >= 2 && observation.available_slots().contains(&slot) {
                Decision::germinate(slot, leyline::BlueprintAction::ConvLight)
            } else {
                Decision::wait()
            },
        )
    }
}

#[test]
fn a_controller_drives_the_trainer_through_the_deadline() {
    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    let (train, test) = fmnist(512, 300);
    let model = cnn_model(telemetry.clone());
    let config = ModelTrainerConfig {
        counterfactual_samples: 300,
        ..cpu_config()
    };
    let mut trainer = ModelTrainer::new(model, &train, Some(&test), config, telemetry)
        .expect("trainer")
        .with_controller(GerminateAtTwo, Duration::from_secs(5))
        .expect("controller");
    let slot = SlotId::new(0, 1);
    let mut epochs = 0;
    let mut decided = 0;
    while epochs < 100 {
        let report = trainer.train_epoch().expect("epoch");
        epochs += 1;
        if report.decision.is_some() {
            decided += 1;
        }
        if trainer.model().slot(slot).expect("slot").state().is_some() {
            break;
        }
    }
    assert_eq!(decided, epochs, "a decision every epoch");
    assert!(
        trainer.model().slot(slot).expect("slot").state().is_some(),
        "the controller germinated in the enabled slot within {epochs} epochs"
    );
}

#[test]
fn the_device_shuffle_is_a_seeded_permutation_that_changes_per_epoch() {
    let data = Dataset::from_rows(
        "rows",
        &(0..100).map(|i| i as f32).collect::<Vec<_>>(),
        &(0..100).map(|i| i % 2).collect::<Vec<i64>>(),
        1,
        2,
    )
    .expect("data");
    let staged = StagedData::resident(&data, Device::Cpu, true, 42).expect("staged");
    let first = Vec::<i64>::try_from(staged.permutation().expect("perm")).expect("vec");
    let second = Vec::<i64>::try_from(staged.permutation().expect("perm")).expect("vec");
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..100).collect::<Vec<i64>>(), "a permutation");
    assert_ne!(first, second, "a new order each epoch");
    assert_ne!(first, sorted, "shuffled");
    let again = StagedData::resident(&data, Device::Cpu, true, 42).expect("staged");
    let replay = Vec::<i64>::try_from(again.permutation().expect("perm")).expect("vec");
    assert_eq!(first, replay, "same seed, same order");
    again.set_epoch(1);
    let replay_second = Vec::<i64>::try_from(again.permutation().expect("perm")).expect("vec");
    assert_eq!(second, replay_second, "an epoch can be resumed");
}

#[test]
fn graph_modes_and_half_precision_refuse_the_cpu() {
    let (train, test) = fmnist(256, 100);
    for (mode, precision) in [
        (ExecutionMode::GraphStep, Precision::Fp32),
        (ExecutionMode::GraphEpoch, Precision::Fp32),
        (ExecutionMode::Eager, Precision::Bf16),
    ] {
        let config = ModelTrainerConfig {
            mode,
            precision: Some(precision),
            ..cpu_config()
        };
        let model = cnn_model(Telemetry::disabled());
        let error = ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled())
            .expect_err("refused");
        let text = error.to_string();
        assert!(text.contains("CUDA"), "{mode:?}/{precision}: {text}");
    }
}

#[test]
fn data_of_the_wrong_shape_is_refused_before_training() {
    let rows = Dataset::from_rows(
        "flat",
        &vec![0.5_f32; 64 * 16],
        &(0..64).map(|i| i % 10).collect::<Vec<i64>>(),
        16,
        10,
    )
    .expect("data");
    let model = cnn_model(Telemetry::disabled());
    let error = ModelTrainer::new(model, &rows, None, cpu_config(), Telemetry::disabled())
        .expect_err("refused");
    assert!(error.to_string().contains("sample shape"), "{error}");
}

#[test]
fn a_model_handed_from_one_trainer_to_the_next_keeps_training() {
    let (train, test) = fmnist(512, 100);
    let mut model = cnn_model(Telemetry::disabled());
    model
        .germinate(
            SlotId::new(0, 1),
            "conv_light",
            GerminationOptions::new("seed-0"),
        )
        .expect("germinate");
    let _ = model
        .advance_stage(SlotId::new(0, 1), Some(SeedStage::Training))
        .expect("training");
    let mut trainer = ModelTrainer::new(
        model,
        &train,
        Some(&test),
        cpu_config(),
        Telemetry::disabled(),
    )
    .expect("first trainer");
    let _ = trainer.train_epoch().expect("epoch");
    let model = trainer.into_model();
    let before: Vec<Vec<f32>> = model
        .parameters()
        .iter()
        .map(|p| Vec::<f32>::try_from(p.tensor.flatten(0, -1)).expect("vec"))
        .collect();
    let mut trainer = ModelTrainer::new(
        model,
        &train,
        Some(&test),
        cpu_config(),
        Telemetry::disabled(),
    )
    .expect("second trainer");
    assert_eq!(
        trainer.step().optimizers().keys().len(),
        2,
        "host and seed groups have state"
    );
    let _ = trainer.train_epoch().expect("epoch");
    let after: Vec<Vec<f32>> = trainer
        .model()
        .parameters()
        .iter()
        .map(|p| Vec::<f32>::try_from(p.tensor.flatten(0, -1)).expect("vec"))
        .collect();
    for (index, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(
            b != a,
            "parameter {index} did not move in the second trainer"
        );
    }
}

/// Two transformer seeds blending without isolation feed the host's
/// gradient: the step splits it with gradient taps and PCGrad aggregates
/// the parts; the counters see the pairs.
#[test]
fn blending_transformer_seeds_go_through_pcgrad() {
    use kasmina::host::{TransformerHost, TransformerHostConfig};
    use tolaria::engine::model_step::{ModelStep, ModelStepConfig};
    use tolaria::engine::{Batch, EpochAccumulator, Step};
    use tolaria::grad_agg::AggPath;

    tch::manual_seed(3);
    let config = TransformerHostConfig::tiny();
    let host = TransformerHost::new(config.clone(), Device::Cpu).expect("host");
    let mut model = MorphogeneticModel::with_slot_names(
        host,
        &["r0c0", "r0c1"],
        SlotConfig::default(),
        Telemetry::disabled(),
    )
    .expect("model");
    let slots = [SlotId::new(0, 0), SlotId::new(0, 1)];
    for (slot, name) in slots.iter().zip(["a", "b"]) {
        let mut options = GerminationOptions::new(name);
        options.tempo_epochs = 1;
        options.alpha_target = 0.5;
        model
            .germinate(*slot, "mlp_small", options)
            .expect("germinate");
        let _ = model
            .advance_stage(*slot, Some(SeedStage::Training))
            .expect("training");
    }
    // Feed the lifecycle what G2 reads until both seeds may blend.
    for _ in 0..20 {
        if slots
            .iter()
            .all(|slot| model.slot(*slot).expect("slot").stage() == Some(SeedStage::Blending))
        {
            break;
        }
        for slot in slots {
            let seed = model.slot_mut(slot).expect("slot");
            seed.record_gradient_norms(1.0, 1.0, 1000).expect("norms");
        }
        model.record_accuracy(50.0, 50.0).expect("accuracy");
        model.step_epoch().expect("tick");
        for slot in slots {
            let _ = model.advance_stage(slot, Some(SeedStage::Blending));
        }
    }
    for slot in slots {
        let state = model.slot(slot).expect("slot").state().expect("state");
        assert_eq!(state.stage(), SeedStage::Blending);
        assert!(
            !state.isolate_gradients(),
            "transformer seeds co-adapt once blending"
        );
    }
    let mut step = ModelStep::new(model, ModelStepConfig::default()).expect("step");
    let key = step.prepare().expect("prepare");
    assert!(key.0.contains("taps2"), "{key:?}");
    let inputs = tch::Tensor::randint(config.vocab_size, [4, 12], (tch::Kind::Int64, Device::Cpu));
    let labels = tch::Tensor::randint(config.vocab_size, [4, 12], (tch::Kind::Int64, Device::Cpu));
    let accumulator = EpochAccumulator::new(Device::Cpu).expect("acc");
    let before = step.model().host_parameters()[0].1.copy();
    for index in 0..3 {
        step.run(
            &Batch {
                inputs: &inputs,
                labels: &labels,
                index,
            },
            &accumulator,
        )
        .expect("step");
    }
    assert_eq!(step.last_aggregation_path(), Some(AggPath::PcGrad));
    let metrics = step.take_grad_agg_metrics().expect("metrics");
    assert_eq!(metrics.pcgrad_steps, 3, "{metrics:?}");
    assert_eq!(
        metrics.seed_pairs, 3,
        "one pair of seeds per step: {metrics:?}"
    );
    assert!(metrics.teacher_share > 0.0 && metrics.teacher_share <= 1.0);
    let after = &step.model().host_parameters()[0].1;
    assert!(!before.equal(after), "the host trained");
}

#[test]
fn pinned_host_staging_trains_exactly_like_resident_data() {
    use tolaria::DataPlacement;
    let (train, test) = fmnist(640, 100);
    let mut finals = Vec::new();
    for placement in [DataPlacement::Device, DataPlacement::PinnedHost] {
        let model = cnn_model(Telemetry::disabled());
        let config = ModelTrainerConfig {
            data_placement: placement,
            drop_last: false,
            ..cpu_config()
        };
        let mut trainer =
            ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled())
                .expect("trainer");
        for _ in 0..2 {
            let report = trainer.train_epoch().expect("epoch");
            assert_eq!(
                report.train.samples, 640,
                "the last, smaller batch is staged too"
            );
        }
        finals.push(
            trainer
                .model()
                .parameters()
                .iter()
                .map(|p| Vec::<f32>::try_from(p.tensor.flatten(0, -1)).expect("vec"))
                .collect::<Vec<_>>(),
        );
    }
    assert!(
        finals[0] == finals[1],
        "pinned staging changed the training"
    );
    // Graph modes need device-resident data; the error says so.
    let model = cnn_model(Telemetry::disabled());
    let config = ModelTrainerConfig {
        data_placement: DataPlacement::PinnedHost,
        mode: ExecutionMode::GraphStep,
        ..cpu_config()
    };
    assert!(ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled()).is_err());
}

#[test]
fn a_trainer_resumed_at_an_epoch_shuffles_and_names_seeds_as_that_epoch() {
    let (train, test) = fmnist(256, 100);
    let mut trainer = ModelTrainer::new(
        cnn_model(Telemetry::disabled()),
        &train,
        Some(&test),
        cpu_config(),
        Telemetry::disabled(),
    )
    .expect("trainer");
    trainer.resume_at(3, 2);
    assert_eq!(trainer.epoch(), 3);
    assert_eq!(trainer.germinations(), 2);
    assert_eq!(trainer.train_data().epoch(), 3, "the shuffle of epoch 3");
    assert!(trainer.governor_mut().is_some());
    let _ = trainer
        .apply_decision(&Decision::germinate(
            SlotId::new(0, 1),
            leyline::BlueprintAction::ConvLight,
        ))
        .expect("germinate");
    let seed_id = trainer
        .model()
        .slot(SlotId::new(0, 1))
        .expect("slot")
        .state()
        .expect("state")
        .seed_id()
        .to_owned();
    assert_eq!(seed_id, "seed-2", "named after the germinations so far");
    assert_eq!(trainer.germinations(), 3);
    let report = trainer.train_epoch().expect("epoch");
    assert_eq!(report.epoch, 3);
    assert_eq!(trainer.epoch(), 4);
    assert_eq!(trainer.train_data().epoch(), 4);
}

#[test]
fn a_batch_size_that_leaves_no_batch_is_refused_when_the_trainer_is_built() {
    let (train, test) = fmnist(256, 100);
    for (batch_size, drop_last) in [(0, false), (0, true), (257, true), (usize::MAX, true)] {
        let config = ModelTrainerConfig {
            batch_size,
            drop_last,
            ..cpu_config()
        };
        let error = ModelTrainer::new(
            cnn_model(Telemetry::disabled()),
            &train,
            Some(&test),
            config,
            Telemetry::disabled(),
        )
        .expect_err("no batch");
        assert!(
            matches!(
                error,
                tolaria::Error::InvalidConfig {
                    field: "batch_size",
                    ..
                }
            ),
            "{batch_size} {drop_last}: {error:?}"
        );
    }
    // Without drop_last a batch larger than the data is one short batch.
    let config = ModelTrainerConfig {
        batch_size: 257,
        drop_last: false,
        ..cpu_config()
    };
    assert!(
        ModelTrainer::new(
            cnn_model(Telemetry::disabled()),
            &train,
            Some(&test),
            config,
            Telemetry::disabled(),
        )
        .is_ok()
    );
}

#[test]
fn refused_contributions_record_none_of_the_batch() {
    let (train, test) = fmnist(256, 100);
    let mut trainer = ModelTrainer::new(
        cnn_model(Telemetry::disabled()),
        &train,
        Some(&test),
        cpu_config(),
        Telemetry::disabled(),
    )
    .expect("trainer");
    let slot = SlotId::new(0, 1);
    let _ = trainer
        .apply_decision(&Decision::germinate(
            slot,
            leyline::BlueprintAction::ConvLight,
        ))
        .expect("germinate");
    let recorded = |trainer: &ModelTrainer| {
        trainer
            .model()
            .slot(slot)
            .expect("slot")
            .state()
            .expect("state")
            .metrics()
            .counterfactual_contribution
    };
    // The first pair is fine; a later one is not: nothing is recorded.
    for bad in [
        vec![(slot, 1.5), (slot, f64::NAN)],
        vec![(slot, 1.5), (slot, f64::INFINITY)],
        vec![(slot, 1.5), (slot, 1e9)],
        vec![(slot, 1.5), (SlotId::new(9, 9), 1.0)],
    ] {
        let error = trainer.set_contributions(&bad).expect_err("refused");
        assert!(
            matches!(error, tolaria::Error::Lifecycle { .. }),
            "{bad:?}: {error:?}"
        );
        assert_eq!(recorded(&trainer), None, "{bad:?} recorded nothing");
    }
    trainer
        .set_contributions(&[(slot, 1.5)])
        .expect("a valid contribution");
    assert_eq!(recorded(&trainer), Some(1.5));
}

#[test]
fn the_blueprint_prewarm_does_nothing_on_the_cpu_and_refuses_bad_batch_sizes() {
    use tolaria::engine::prewarm::{MAX_PREWARM_BATCH, prewarm_blueprints};
    let model = cnn_model(Telemetry::disabled());
    let done = prewarm_blueprints(&model, Precision::Fp32, true, &[64, 17]).expect("prewarm");
    assert_eq!(done.runs, 0, "nothing runs on the CPU");
    for bad in [0, -1, MAX_PREWARM_BATCH + 1] {
        let error = prewarm_blueprints(&model, Precision::Fp32, true, &[64, bad])
            .expect_err("a bad batch size is refused");
        assert!(
            matches!(error, tolaria::Error::InvalidConfig { .. }),
            "{bad}: {error}"
        );
    }
}

#[test]
fn the_batch_sizes_of_an_epoch_follow_its_plan() {
    use tolaria::engine::batches::batch_sizes;
    assert_eq!(batch_sizes(15_000, 512, true).expect("sizes"), vec![512]);
    assert_eq!(
        batch_sizes(15_000, 512, false).expect("sizes"),
        vec![512, 152]
    );
    assert_eq!(batch_sizes(1_024, 512, false).expect("sizes"), vec![512]);
    assert_eq!(batch_sizes(100, 512, false).expect("sizes"), vec![100]);
    for (len, batch, drop_last) in [(100, 512, true), (100, 0, false), (100, -3, true)] {
        assert!(
            matches!(
                batch_sizes(len, batch, drop_last),
                Err(tolaria::Error::InvalidConfig { .. })
            ),
            "{len} {batch} {drop_last}"
        );
    }
}

#[test]
fn a_trainer_config_written_before_the_epoch_graph_size_existed_takes_its_default() {
    let mut json = serde_json::to_value(ModelTrainerConfig::default()).expect("to json");
    let fields = json.as_object_mut().expect("an object");
    assert_eq!(
        fields.remove("epoch_graph_steps"),
        Some(serde_json::json!(
            tolaria::engine::DEFAULT_EPOCH_GRAPH_STEPS
        ))
    );
    let config: ModelTrainerConfig = serde_json::from_value(json).expect("from json");
    assert_eq!(config, ModelTrainerConfig::default());
}
