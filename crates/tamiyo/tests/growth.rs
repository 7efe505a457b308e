//! The scripted controllers. No growth waits every epoch and still refuses a
//! broken observation; germinate-once germinates one seed, moves it on and
//! never germinates again, even after its seed is gone. The max-growth
//! controller: its decisions on hand-built observations (it
//! germinates where the masks allow, D3 included, advances the earliest
//! stage first, fossilizes, never prunes), and a 25-epoch episode of a small
//! CNN with three slots trained by Tolaria under it, where the masks and
//! gates space germinations at least 11 epochs apart and the mean number of
//! active seeds stays below two.

mod common;

use common::{R0C0, R0C1, R0C2, observation, seed};
use leyline::{BlueprintAction, LifecycleOp, SeedStage, Telemetry};
use tamiyo::growth::{GerminateOnceController, MaxGrowthController, NoGrowthController};
use tamiyo::masks::MaskConfig;
use tolaria::amp::Precision;
use tolaria::controller::{Applied, Controller, Decision};
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

const SLOTS: [kasmina::host::SlotId; 3] = [R0C0, R0C1, R0C2];

fn controller() -> MaxGrowthController {
    MaxGrowthController::new(MaskConfig {
        max_seeds: 3,
        ..MaskConfig::default()
    })
}

fn decide(seeds: Vec<leyline::proto::SeedState>) -> Decision {
    controller()
        .decide(&observation(9, 1.0, 50.0, seeds, &SLOTS))
        .expect("decision")
}

#[test]
fn it_germinates_conv_light_in_the_first_free_slot() {
    let decision = decide(Vec::new());
    assert_eq!(decision.op, LifecycleOp::Germinate);
    assert_eq!(decision.slot, Some(R0C0));
    assert_eq!(decision.blueprint, Some(BlueprintAction::ConvLight));
    // A blending seed does not block germination (D3 blocks only developing
    // and cooling-down seeds).
    let decision = decide(vec![seed("a", R0C0, "conv_light", SeedStage::Blending)]);
    assert_eq!(decision.op, LifecycleOp::Germinate);
    assert_eq!(decision.slot, Some(R0C1));
    let decision = MaxGrowthController::new(MaskConfig {
        max_seeds: 3,
        ..MaskConfig::default()
    })
    .with_blueprint(BlueprintAction::Attention)
    .decide(&observation(9, 1.0, 50.0, Vec::new(), &SLOTS))
    .expect("decision");
    assert_eq!(decision.blueprint, Some(BlueprintAction::Attention));
}

#[test]
fn on_a_transformer_the_scripted_controllers_grow_mlp_small_and_the_heuristic_rotates_its_blueprints()
 {
    use kasmina::host::Topology;
    let masks = MaskConfig {
        max_seeds: 3,
        topology: Topology::Transformer,
        ..MaskConfig::default()
    };
    let empty = observation(9, 1.0, 50.0, Vec::new(), &SLOTS);
    let grown = MaxGrowthController::new(masks)
        .decide(&empty)
        .expect("decision");
    assert_eq!(grown.op, LifecycleOp::Germinate);
    assert_eq!(grown.blueprint, Some(BlueprintAction::MlpSmall));
    let once = GerminateOnceController::new(masks)
        .decide(&empty)
        .expect("decision");
    assert_eq!(once.blueprint, Some(BlueprintAction::MlpSmall));
    assert_eq!(
        tamiyo::growth::scripted_blueprint(Topology::Cnn),
        BlueprintAction::ConvLight
    );
    assert_eq!(
        tamiyo::heuristic::rotation_for(Topology::Transformer),
        &tamiyo::heuristic::TRANSFORMER_ROTATION
    );
    assert_eq!(
        tamiyo::heuristic::rotation_for(Topology::Cnn),
        &tamiyo::heuristic::BLUEPRINT_ROTATION
    );
}

#[test]
fn d3_blocks_germination_while_a_seed_trains_so_it_advances_that_seed() {
    let decision = decide(vec![
        seed("a", R0C0, "conv_light", SeedStage::Blending),
        seed("b", R0C1, "conv_light", SeedStage::Training),
    ]);
    assert_eq!(decision.op, LifecycleOp::Advance);
    assert_eq!(decision.slot, Some(R0C1), "the earliest stage first");
    let decision = decide(vec![seed("a", R0C2, "conv_light", SeedStage::Pruned)]);
    assert_eq!(decision.op, LifecycleOp::Wait, "a pruned slot blocks (D3)");
}

#[test]
fn it_fossilizes_holding_seeds_and_never_prunes() {
    let full = vec![
        seed("a", R0C0, "conv_light", SeedStage::Holding),
        seed("b", R0C1, "conv_light", SeedStage::Fossilized),
        seed("c", R0C2, "conv_light", SeedStage::Fossilized),
    ];
    let decision = decide(full);
    assert_eq!(decision.op, LifecycleOp::Fossilize);
    assert_eq!(decision.slot, Some(R0C0));
    let done = vec![
        seed("a", R0C0, "conv_light", SeedStage::Fossilized),
        seed("b", R0C1, "conv_light", SeedStage::Fossilized),
        seed("c", R0C2, "conv_light", SeedStage::Fossilized),
    ];
    assert!(decide(done).is_wait());
}

/// Mean active seeds (TRAINING to FOSSILIZED) over a `epochs`-epoch episode
/// of a small CNN with three slots, and the epochs of its germinations.
fn episode(epochs: usize) -> (f64, Vec<usize>) {
    let model = common::tiny_model(&SLOTS);
    let train = image_task(&ImageTaskOptions::fashion_like(256, 1)).expect("train");
    let test = image_task(&ImageTaskOptions::fashion_like(128, 2)).expect("test");
    let config = ModelTrainerConfig {
        batch_size: 64,
        validation_batch_size: 128,
        precision: Some(Precision::Fp32),
        gradient_telemetry_stride: 1,
        counterfactual_samples: 128,
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled())
        .expect("trainer")
        .with_controller(controller(), std::time::Duration::from_secs(30))
        .expect("controller");
    let mut active = 0usize;
    let mut germinations = Vec::new();
    for epoch in 0..epochs {
        let report = trainer.train_epoch().expect("epoch");
        if let Some((_, applied)) = &report.decision {
            match applied {
                Applied::Germinated { .. } => germinations.push(epoch),
                Applied::Pruned { .. } => panic!("epoch {epoch}: max growth pruned"),
                _ => {}
            }
        }
        let developing = trainer
            .model()
            .slot_ids()
            .iter()
            .filter(|&&slot| {
                trainer
                    .model()
                    .slot(slot)
                    .ok()
                    .and_then(|s| s.stage())
                    .is_some_and(|stage| {
                        matches!(stage, SeedStage::Germinated | SeedStage::Training)
                    })
            })
            .count();
        assert!(
            developing <= 1,
            "epoch {epoch}: {developing} seeds develop at once (D3)"
        );
        active += trainer.model().active_seed_count();
    }
    (active as f64 / epochs as f64, germinations)
}

#[test]
fn an_episode_of_25_epochs_holds_fewer_than_two_active_seeds_on_average() {
    let (mean_active, germinations) = episode(25);
    eprintln!(
        "max growth: {mean_active:.2} active seeds per epoch, germinations at {germinations:?}"
    );
    assert_eq!(germinations.first(), Some(&0), "germinates at once");
    assert!(germinations.len() >= 2, "a second seed: {germinations:?}");
    for pair in germinations.windows(2) {
        if let [a, b] = pair {
            // GERMINATED -> TRAINING takes an epoch, G2 needs ten in TRAINING.
            assert!(b - a >= 11, "germinations {a} and {b} too close");
        }
    }
    assert!(mean_active > 1.0, "{mean_active}");
    assert!(mean_active < 2.0, "{mean_active}");
}

fn once() -> GerminateOnceController {
    GerminateOnceController::new(MaskConfig {
        max_seeds: 3,
        ..MaskConfig::default()
    })
}

#[test]
fn no_growth_waits_and_refuses_a_broken_observation() {
    let mut controller = NoGrowthController;
    let decision = controller
        .decide(&observation(9, 1.0, 50.0, Vec::new(), &SLOTS))
        .expect("decision");
    assert!(decision.is_wait());
    assert_eq!(decision.reason, "no_growth");
    let mut broken = observation(9, 1.0, 50.0, Vec::new(), &SLOTS);
    broken.metrics.val_loss = f64::NAN;
    assert!(matches!(
        controller.decide(&broken),
        Err(tolaria::Error::Controller { .. })
    ));
}

#[test]
fn germinate_once_germinates_one_seed_moves_it_on_and_then_holds() {
    let mut controller = once();
    assert!(!controller.has_germinated());
    let first = controller
        .decide(&observation(0, 1.0, 50.0, Vec::new(), &SLOTS))
        .expect("decision");
    assert_eq!(first.op, LifecycleOp::Germinate);
    assert_eq!(first.slot, Some(R0C0));
    // The germination was refused: no seed seen, so it asks again.
    assert!(!controller.has_germinated());
    let again = controller
        .decide(&observation(1, 1.0, 50.0, Vec::new(), &SLOTS))
        .expect("decision");
    assert_eq!(again.op, LifecycleOp::Germinate);
    let training = vec![seed("a", R0C0, "conv_light", SeedStage::Training)];
    let step = controller
        .decide(&observation(2, 1.0, 50.0, training, &SLOTS))
        .expect("decision");
    assert_eq!(step.op, LifecycleOp::Advance);
    assert!(controller.has_germinated());
    let holding = vec![seed("a", R0C0, "conv_light", SeedStage::Holding)];
    let step = controller
        .decide(&observation(20, 1.0, 50.0, holding, &SLOTS))
        .expect("decision");
    assert_eq!(step.op, LifecycleOp::Fossilize);
    // Fossilized, two slots free: it holds, where max growth germinates.
    let done = vec![seed("a", R0C0, "conv_light", SeedStage::Fossilized)];
    let step = controller
        .decide(&observation(30, 1.0, 50.0, done.clone(), &SLOTS))
        .expect("decision");
    assert!(step.is_wait());
    assert_eq!(decide(done).op, LifecycleOp::Germinate);
    // Its seed gone (pruned by the governor): still no second germination.
    let step = controller
        .decide(&observation(40, 1.0, 50.0, Vec::new(), &SLOTS))
        .expect("decision");
    assert!(step.is_wait());
    // A restored controller that had germinated holds as well.
    let mut restored = once().with_germinated(true);
    assert!(
        restored
            .decide(&observation(0, 1.0, 50.0, Vec::new(), &SLOTS))
            .expect("decision")
            .is_wait()
    );
}
