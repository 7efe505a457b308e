//! `tolaria::controller::apply` on a small Kasmina model: GERMINATE,
//! ADVANCE, PRUNE and WAIT carried out through Kasmina's lifecycle API, and
//! illegal or incomplete decisions refused with typed errors; through the
//! trainer, a refused decision is reported as such and the epoch goes on.

use kasmina::export::export_seed_states;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::{BlueprintAction, LifecycleOp, SeedStage, Telemetry};
use tch::Device;
use tolaria::Error;
use tolaria::controller::{Applied, Decision, EpochMetrics, EpochObservation, apply};

const R0C0: SlotId = SlotId { row: 0, col: 0 };
const R0C1: SlotId = SlotId { row: 0, col: 1 };

fn metrics(val_loss: f64, val_accuracy: f64) -> EpochMetrics {
    EpochMetrics {
        train_loss: val_loss,
        train_accuracy: val_accuracy,
        val_loss,
        val_accuracy,
    }
}

fn tiny_model() -> MorphogeneticModel {
    tch::manual_seed(3);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    MorphogeneticModel::new(
        host,
        &[R0C0, R0C1],
        SlotConfig::default(),
        Telemetry::disabled(),
    )
    .expect("model")
}

#[test]
fn apply_germinates_advances_prunes_and_refuses_illegal_decisions() {
    let mut model = tiny_model();
    let germinate = Decision::germinate(R0C0, BlueprintAction::ConvLight);
    assert_eq!(
        apply(&germinate, &mut model, "seed-1").expect("germinate"),
        Applied::Germinated {
            slot: R0C0,
            blueprint: "conv_light"
        }
    );
    let observation =
        EpochObservation::from_model(&model, 0, metrics(1.0, 50.0)).expect("observation");
    assert_eq!(observation.seeds.len(), 1);
    assert_eq!(observation.seeds[0].stage, SeedStage::Germinated.value());
    assert_eq!(observation.available_slots(), [R0C1]);

    // An occupied slot: Kasmina's typed refusal.
    let error = apply(&germinate, &mut model, "seed-2").expect_err("occupied");
    assert!(
        matches!(
            error,
            Error::Lifecycle {
                op: "germinate",
                source: kasmina::Error::SlotOccupied { .. }
            }
        ),
        "{error}"
    );
    // ADVANCE with no seed there.
    let error = apply(&Decision::advance(R0C1), &mut model, "x").expect_err("empty");
    assert!(
        matches!(error, Error::Lifecycle { op: "advance", .. }),
        "{error}"
    );
    // A decision missing its slot.
    let mut slotless = Decision::prune(R0C0);
    slotless.slot = None;
    let error = apply(&slotless, &mut model, "x").expect_err("no slot");
    assert!(
        matches!(
            error,
            Error::Controller {
                field: "decision.slot",
                ..
            }
        ),
        "{error}"
    );

    let advanced = apply(&Decision::advance(R0C0), &mut model, "x").expect("advance");
    assert!(
        matches!(
            advanced,
            Applied::GateEvaluated {
                passed: true,
                op: LifecycleOp::Advance,
                ..
            }
        ),
        "{advanced:?}"
    );
    let stage = export_seed_states(&model).expect("export")[0].stage;
    assert_eq!(stage, SeedStage::Training.value());

    assert_eq!(
        apply(&Decision::prune(R0C0), &mut model, "x").expect("prune"),
        Applied::Pruned {
            slot: R0C0,
            pruned: true
        }
    );
    let stage = export_seed_states(&model).expect("export")[0].stage;
    assert_eq!(stage, SeedStage::Pruned.value());
    assert_eq!(
        apply(&Decision::wait(), &mut model, "x").expect("wait"),
        Applied::Waited
    );
}

/// Asks to fossilize a slot that holds no seed, every epoch.
struct FossilizeNothing;

impl tolaria::controller::Controller for FossilizeNothing {
    fn decide(&mut self, _: &EpochObservation) -> tolaria::Result<Decision> {
        Ok(Decision {
            op: LifecycleOp::Fossilize,
            slot: Some(R0C1),
            ..Decision::wait()
        })
    }
}

#[test]
fn through_the_trainer_a_refused_decision_is_reported_with_its_reason_and_the_epoch_goes_on() {
    use tolaria::data::synthetic::{ImageTaskOptions, image_task};
    use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};
    let collector = leyline::Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    let data = image_task(&ImageTaskOptions::fashion_like(64, 5)).expect("data");
    let config = ModelTrainerConfig {
        batch_size: 32,
        precision: Some(tolaria::amp::Precision::Fp32),
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(tiny_model(), &data, Some(&data), config, telemetry)
        .expect("trainer")
        .with_controller(FossilizeNothing, std::time::Duration::from_secs(5))
        .expect("controller");
    let report = trainer
        .train_epoch()
        .expect("a refused decision does not end the epoch");
    let Some((_, Applied::Refused { op, reason })) = &report.decision else {
        panic!("expected a refused decision, got {:?}", report.decision);
    };
    assert_eq!(*op, LifecycleOp::Fossilize);
    assert!(reason.contains("fossilize"), "{reason}");
    let events = collector.events_named(leyline::telemetry::TOLARIA_DECISION_REFUSED);
    assert_eq!(events.len(), 1, "one event for the refused decision");
    assert!(trainer.model().slot(R0C1).expect("slot").state().is_none());
    assert_eq!(trainer.train_epoch().expect("next epoch").epoch, 1);
}
