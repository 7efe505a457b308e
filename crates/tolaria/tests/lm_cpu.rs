//! A causal language model through Tolaria's trainer on the CPU: the
//! transformer host with a slot after each segment, trained on the seeded
//! synthetic text ([`tolaria::data::text::synthetic`]) with both staging
//! paths; the validation loss (per token) falls and the perplexity with it,
//! both in the epoch telemetry.
//! Every transformer blueprint is germinated, trained, blended and
//! fossilized through the trainer's epochs.

use kasmina::blueprint::Blueprint;
use kasmina::host::{SlotId, Topology, TransformerHost, TransformerHostConfig};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::{SeedStage, Telemetry};
use tch::Device;
use tolaria::DataPlacement;
use tolaria::amp::Precision;
use tolaria::data::text::synthetic;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

const VOCABULARY: usize = 32;
const CONTEXT: usize = 16;

fn host_config() -> TransformerHostConfig {
    TransformerHostConfig {
        vocab_size: VOCABULARY as i64,
        block_size: CONTEXT as i64,
        ..TransformerHostConfig::tiny()
    }
}

fn model(seed: i64) -> MorphogeneticModel {
    tch::manual_seed(seed);
    let host = TransformerHost::new(host_config(), Device::Cpu).expect("host");
    MorphogeneticModel::with_slot_names(
        host,
        &["r0c0", "r0c1", "r0c2"],
        SlotConfig::default(),
        Telemetry::disabled(),
    )
    .expect("model")
}

fn config(placement: DataPlacement) -> ModelTrainerConfig {
    ModelTrainerConfig {
        batch_size: 32,
        validation_batch_size: 64,
        precision: Some(Precision::Fp32),
        data_placement: placement,
        ..ModelTrainerConfig::default()
    }
}

#[test]
fn a_short_run_lowers_the_validation_loss_on_synthetic_text() {
    let train = synthetic(256, CONTEXT, VOCABULARY, 1).expect("train");
    let validation = synthetic(64, CONTEXT, VOCABULARY, 1).expect("validation");
    for placement in [DataPlacement::Device, DataPlacement::PinnedHost] {
        let collector = leyline::Collector::new();
        let mut trainer = ModelTrainer::new(
            model(5),
            &train,
            Some(&validation),
            config(placement),
            Telemetry::new(collector.clone()),
        )
        .expect("trainer");
        let mut losses = Vec::new();
        for _ in 0..6 {
            let report = trainer.train_epoch().expect("epoch");
            let validation = report.validation.expect("validation");
            assert!(validation.loss.is_finite());
            assert!((0.0..=100.0).contains(&validation.accuracy));
            losses.push(validation.loss);
        }
        let (first, last) = (losses[0], *losses.last().expect("losses"));
        // Uniform guessing is ln(32) = 3.47 nats a token; the text's own
        // entropy is far lower.
        assert!(
            last < first - 0.3 && last < 3.0,
            "{placement:?}: validation loss {losses:?} did not fall"
        );
        // The telemetry carries the loss and the perplexity of every epoch.
        let perplexity = collector.metric_values(leyline::telemetry::TOLARIA_VALIDATION_PERPLEXITY);
        let loss = collector.metric_values(leyline::telemetry::TOLARIA_VALIDATION_LOSS);
        assert_eq!(perplexity.len(), losses.len());
        for ((ppl, telemetry_loss), loss) in perplexity.iter().zip(&loss).zip(&losses) {
            assert!((telemetry_loss - loss).abs() < 1e-9);
            assert!((ppl - loss.exp()).abs() < 1e-9 * ppl);
        }
    }
}

#[test]
fn every_transformer_blueprint_grows_through_the_trainer_to_fossilized() {
    let train = synthetic(64, CONTEXT, VOCABULARY, 2).expect("train");
    let validation = synthetic(16, CONTEXT, VOCABULARY, 2).expect("validation");
    let slot = SlotId::new(0, 1);
    for blueprint in Blueprint::for_topology(Topology::Transformer) {
        let blueprint = blueprint.name();
        let mut trainer = ModelTrainer::new(
            model(7),
            &train,
            Some(&validation),
            config(DataPlacement::Device),
            Telemetry::disabled(),
        )
        .expect("trainer");
        let mut options = GerminationOptions::new(format!("seed-{blueprint}"));
        options.tempo_epochs = 1;
        trainer
            .model_mut()
            .germinate(slot, blueprint, options)
            .unwrap_or_else(|error| panic!("{blueprint}: germinate: {error}"));
        let mut stages = Vec::new();
        for _ in 0..40 {
            trainer
                .train_epoch()
                .unwrap_or_else(|error| panic!("{blueprint}: epoch: {error}"));
            let model = trainer.model_mut();
            let stage = model.slot(slot).expect("slot").stage();
            stages.push(stage);
            match stage {
                Some(SeedStage::Germinated) => {
                    let _ = model.advance_stage(slot, Some(SeedStage::Training));
                }
                Some(SeedStage::Training) => {
                    let _ = model.advance_stage(slot, Some(SeedStage::Blending));
                }
                Some(SeedStage::Blending) => {
                    let _ = model.advance_stage(slot, Some(SeedStage::Holding));
                }
                Some(SeedStage::Holding) => {
                    let _ = model.fossilize(slot);
                }
                _ => break,
            }
        }
        assert_eq!(
            trainer.model().slot(slot).expect("slot").stage(),
            Some(SeedStage::Fossilized),
            "{blueprint}: stages {stages:?}"
        );
    }
}
