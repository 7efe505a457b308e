//! Bad input never decides a lifecycle (issue 9): non-finite and
//! out-of-range numbers entering slots, gates, the alpha controller and the
//! blend are refused with a typed error, and the seed's state is unchanged.

mod common;

use common::{features, lone_slot, slot_config, walk_to};
use kasmina::alpha::AlphaController;
use kasmina::blend::{BlendAlpha, blend_add, blend_gate, blend_multiply};
use kasmina::gate::{GateInputs, GateMode, QualityGates};
use kasmina::host::Topology;
use kasmina::lifecycle::GerminationOptions;
use kasmina::slot::SeedSlot;
use leyline::Telemetry;
use leyline::{AlphaCurve, AlphaMode, GateLevel, SeedStage};
use tch::Device;

fn options() -> GerminationOptions {
    GerminationOptions::new("seed-1")
}

fn strict_slot() -> SeedSlot {
    SeedSlot::new(
        common::spec(4, 6),
        Topology::Cnn,
        slot_config(GateMode::Strict),
        Telemetry::disabled(),
    )
    .expect("slot")
}

/// A strict slot in TRAINING with enough epochs and improvement for G2,
/// lacking only a gradient measurement.
fn strict_training_slot() -> SeedSlot {
    let mut slot = strict_slot();
    slot.germinate("norm", options(), Device::Cpu)
        .expect("germinate");
    slot.record_accuracy(50.0, 50.0).expect("acc");
    slot.advance_stage(Some(SeedStage::Training)).expect("g1");
    for _ in 0..common::TEST_STAGE_EPOCHS {
        slot.step_epoch().expect("tick");
    }
    slot.record_accuracy(60.0, 60.0).expect("acc");
    slot
}

#[test]
fn nan_gradient_norm_is_refused_and_does_not_open_g2() {
    for (seed_norm, host_norm) in [
        (f64::NAN, 1.0),
        (1.0, f64::NAN),
        (f64::INFINITY, 1.0),
        (1.0, f64::INFINITY),
        (-1.0, 1.0),
        (1.0, -1.0),
    ] {
        let mut slot = strict_training_slot();
        let before = slot.state().expect("state").metrics().clone();
        let result = slot.record_gradient_norms(seed_norm, host_norm, 100);
        assert!(
            result.is_err(),
            "record_gradient_norms({seed_norm}, {host_norm}) must be refused"
        );
        assert_eq!(
            slot.state().expect("state").metrics(),
            &before,
            "a refused measurement changes nothing"
        );
        let outcome = slot.advance_stage(Some(SeedStage::Blending)).expect("g2");
        assert!(
            !outcome.passed,
            "G2 opened after ({seed_norm}, {host_norm})"
        );
        assert_eq!(slot.stage(), Some(SeedStage::Training));
    }
    let mut slot = strict_training_slot();
    assert!(
        slot.record_gradient_norms(1.0, 1.0, -5).is_err(),
        "negative host params"
    );
}

#[test]
fn nan_counterfactual_is_refused_and_cannot_fossilize() {
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e9, -1e9] {
        let mut slot = lone_slot(Topology::Cnn);
        walk_to(&mut slot, "norm", options(), SeedStage::Holding);
        assert!(
            slot.set_counterfactual_contribution(value).is_err(),
            "contribution {value} must be refused"
        );
        assert_eq!(
            slot.state()
                .expect("state")
                .metrics()
                .counterfactual_contribution,
            None
        );
        let outcome = slot.fossilize().expect("g5");
        assert!(!outcome.passed, "G5 passed on contribution {value}");
        assert_eq!(slot.stage(), Some(SeedStage::Holding));
    }
}

fn g5_inputs(counterfactual: Option<f64>) -> GateInputs<'static> {
    GateInputs {
        seed_id: "s",
        blueprint_id: "norm",
        stage: SeedStage::Holding,
        epochs_in_stage: 20,
        improvement: 3.0,
        gradient_ratio: Some(1.0),
        gradient_health: Some(1.0),
        gradients_exploding: false,
        alpha: 1.0,
        alpha_target: 1.0,
        alpha_mode: AlphaMode::Hold,
        counterfactual,
        is_healthy: true,
    }
}

#[test]
fn gates_fail_closed_on_non_finite_inputs() {
    for gates in [QualityGates::permissive(), QualityGates::strict()] {
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let outcome = gates.evaluate(GateLevel::G5, &g5_inputs(Some(value)));
            assert!(!outcome.passed, "{:?} G5 passed on {value}", gates.mode);
            assert!(outcome.score.is_finite() && (0.0..=1.0).contains(&outcome.score));

            let mut g2 = g5_inputs(None);
            g2.stage = SeedStage::Training;
            g2.gradient_ratio = Some(value);
            g2.gradient_health = Some(value);
            g2.improvement = value;
            let outcome = gates.evaluate(GateLevel::G2, &g2);
            assert!(!outcome.passed, "{:?} G2 passed on {value}", gates.mode);
            assert!(outcome.score.is_finite(), "G2 score {}", outcome.score);

            let mut g3 = g5_inputs(None);
            g3.alpha = value;
            g3.alpha_target = value;
            let outcome = gates.evaluate(GateLevel::G3, &g3);
            assert!(!outcome.passed, "{:?} G3 passed on {value}", gates.mode);
            assert!(outcome.score.is_finite(), "G3 score {}", outcome.score);
        }
    }
}

#[test]
fn nan_alpha_target_is_refused_at_germination_and_never_prunes() {
    for target in [f64::NAN, f64::INFINITY, -0.5, 1.5] {
        let mut slot = lone_slot(Topology::Cnn);
        let mut options = options();
        options.alpha_target = target;
        assert!(
            slot.germinate("norm", options, Device::Cpu).is_err(),
            "alpha_target {target} must be refused"
        );
        assert!(slot.is_empty(), "nothing germinated");
    }
    let mut options = options();
    options.blend_steepness = f64::NAN;
    assert!(
        lone_slot(Topology::Cnn)
            .germinate("norm", options, Device::Cpu)
            .is_err(),
        "NaN steepness must be refused"
    );
}

#[test]
fn nan_alpha_and_retarget_are_refused_and_change_nothing() {
    for value in [
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.1,
        1.1,
    ] {
        let mut slot = lone_slot(Topology::Cnn);
        walk_to(&mut slot, "norm", options(), SeedStage::Holding);
        assert!(slot.set_alpha(value).is_err(), "set_alpha({value})");
        assert_eq!(slot.alpha(), 1.0);
        assert!(
            slot.retarget_alpha(value, 3, AlphaCurve::Linear, 12.0)
                .is_err(),
            "retarget_alpha({value})"
        );
        assert_eq!(
            slot.stage(),
            Some(SeedStage::Holding),
            "no HOLDING -> BLENDING"
        );
        assert_eq!(slot.alpha(), 1.0);
        for _ in 0..5 {
            slot.step_epoch().expect("tick");
        }
        assert_eq!(slot.stage(), Some(SeedStage::Holding), "never pruned");

        let mut controller = AlphaController::default();
        assert!(controller.set_alpha(value).is_err());
        assert!(controller.retarget(value, 2, None, None).is_err());
        assert_eq!(controller, AlphaController::default());
    }
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "norm", options(), SeedStage::Holding);
    for steepness in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(
            slot.retarget_alpha(0.5, 3, AlphaCurve::Sigmoid, steepness)
                .is_err()
        );
        assert!(
            slot.schedule_prune(3, AlphaCurve::Sigmoid, steepness)
                .is_err()
        );
        assert_eq!(slot.stage(), Some(SeedStage::Holding));
        assert_eq!(slot.alpha(), 1.0);
    }
}

#[test]
fn nan_and_out_of_range_accuracy_is_refused() {
    for (train, val) in [
        (f64::NAN, 50.0),
        (50.0, f64::NAN),
        (f64::INFINITY, 50.0),
        (50.0, -1.0),
        (100.5, 50.0),
    ] {
        let mut slot = lone_slot(Topology::Cnn);
        walk_to(&mut slot, "norm", options(), SeedStage::Training);
        slot.record_accuracy(40.0, 40.0).expect("valid accuracy");
        assert!(
            slot.record_accuracy(train, val).is_err(),
            "record_accuracy({train}, {val})"
        );
        let metrics = slot.state().expect("state").metrics();
        assert_eq!((metrics.train_accuracy, metrics.val_accuracy), (40.0, 40.0));
    }
}

#[test]
fn scalar_blend_alpha_refuses_non_finite() {
    let host = features(1);
    let seed = features(2);
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let alpha = BlendAlpha::Scalar(value);
        assert!(blend_add(&host, &seed, &alpha).is_err(), "add {value}");
        assert!(
            blend_multiply(&host, &seed, &host, &alpha).is_err(),
            "multiply {value}"
        );
        let gate = tch::Tensor::ones([2, 1, 1, 1], (tch::Kind::Float, Device::Cpu));
        assert!(
            blend_gate(&host, &seed, &gate, &alpha).is_err(),
            "gate {value}"
        );
    }
}

#[test]
fn deserialised_alpha_controllers_are_checked() {
    let valid = serde_json::to_value(AlphaController::default()).expect("encode");
    let decoded: AlphaController = serde_json::from_value(valid.clone()).expect("valid");
    assert_eq!(decoded, AlphaController::default());
    for (field, value) in [
        ("alpha", serde_json::json!(1.5)),
        ("alpha_start", serde_json::json!(-0.5)),
        ("alpha_target", serde_json::json!(2.0)),
        ("steepness", serde_json::json!(-1.0)),
        ("steps_done", serde_json::json!(3)),
    ] {
        let mut record = valid.clone();
        record[field] = value;
        assert!(
            serde_json::from_value::<AlphaController>(record).is_err(),
            "{field} out of range was accepted"
        );
    }
}
