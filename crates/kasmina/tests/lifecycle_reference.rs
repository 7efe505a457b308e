//! The reference behaviours of ESPER_PYTHON_REFERENCE.md §9, items 1-8, one
//! test (or a few) per item, named after the item (items 9-11 and 15, the
//! prune pipeline, cooldown, fossils and isolation, are in
//! `lifecycle_reference_cooldown.rs`).

mod common;

use common::{bitwise_equal, features, lone_slot, slot_config, walk_to};
use kasmina::Error;
use kasmina::alpha::AlphaController;
use kasmina::blend::{BlendAlpha, blend_add, blend_gate, blend_multiply};
use kasmina::gate::{GateInputs, GateMode, QualityGates};
use kasmina::host::{CnnHost, CnnHostConfig, SlotId, Topology};
use kasmina::lifecycle::{GerminationOptions, SeedState};
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use leyline::gate::thresholds::MIN_PRUNE_AGE;
use leyline::{AlphaAlgorithm, AlphaCurve, AlphaMode, GateLevel, LifecycleOp, SeedStage};
use tch::{Device, Kind, Tensor};

fn options() -> GerminationOptions {
    GerminationOptions::new("seed-1")
}

/// Every stage reachable from DORMANT through legal moves, with a state in it.
fn reachable_states() -> Vec<SeedState> {
    let start = SeedState::new(kasmina::blueprint::Blueprint::Noop, &options(), 0).expect("state");
    let mut seen = vec![start.stage()];
    let mut frontier = vec![start.clone()];
    let mut states = vec![start];
    while let Some(state) = frontier.pop() {
        for &to in state.stage().successors() {
            if seen.contains(&to) {
                continue;
            }
            let mut next = state.clone();
            next.transition(to).expect("listed transition");
            seen.push(to);
            frontier.push(next.clone());
            states.push(next);
        }
    }
    states
}

#[test]
fn item_01_transitions_follow_valid_transitions_exactly() {
    let states = reachable_states();
    // Every stage but UNKNOWN (the state starts at DORMANT) is reachable.
    assert_eq!(states.len(), SeedStage::ALL.len() - 1);
    for state in &states {
        for &to in SeedStage::ALL {
            let mut attempt = state.clone();
            let allowed = leyline::stage::VALID_TRANSITIONS
                .iter()
                .any(|(from, tos)| *from == state.stage() && tos.contains(&to));
            let result = attempt.transition(to);
            assert_eq!(result.is_ok(), allowed, "{} -> {to}", state.stage());
            if allowed {
                assert_eq!(attempt.stage(), to);
                assert_eq!(attempt.previous_stage(), state.stage());
            } else {
                assert_eq!(&attempt, state, "a refused move changes nothing");
            }
        }
    }
    assert_eq!(SeedStage::Dormant.successors(), &[SeedStage::Germinated]);
    assert!(SeedStage::Fossilized.successors().is_empty());
}

#[test]
fn item_01_training_to_fossilized_is_refused_by_the_slot() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "norm", options(), SeedStage::Training);
    let error = slot
        .advance_stage(Some(SeedStage::Fossilized))
        .expect_err("TRAINING -> FOSSILIZED is illegal");
    assert!(matches!(error, Error::IllegalTransition { .. }), "{error}");
    assert_eq!(slot.stage(), Some(SeedStage::Training));
    let error = slot
        .advance_stage(Some(SeedStage::Pruned))
        .expect_err("failure stages are not advance targets");
    assert!(matches!(error, Error::InvalidTarget { .. }), "{error}");
}

/// The reference clamps `set_alpha` into `[0, 1]`; this crate keeps values
/// in `[0, 1]` but refuses the rest (a clamped NaN became 0, a prune), see
/// `tests/hardening_lifecycle.rs`.
#[test]
fn item_02_set_alpha_stays_in_the_unit_interval() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "norm", options(), SeedStage::Training);
    for value in [0.3, 0.0, 1.0, f64::MIN_POSITIVE] {
        slot.set_alpha(value).expect("set_alpha");
        assert_eq!(slot.alpha(), value, "set_alpha({value})");
        let mut controller = AlphaController::new(0.5).expect("controller");
        controller.set_alpha(value).expect("set_alpha");
        assert_eq!(controller.alpha(), value);
    }
    for value in [
        1e300,
        f64::INFINITY,
        -5.0,
        f64::NEG_INFINITY,
        f64::NAN,
        1.0 + 1e-12,
    ] {
        let before = slot.alpha();
        assert!(
            matches!(
                slot.set_alpha(value),
                Err(Error::OutOfRange { field: "alpha", .. }
                    | Error::NonFinite { field: "alpha", .. })
            ),
            "set_alpha({value})"
        );
        assert_eq!(slot.alpha(), before);
        assert!(AlphaController::new(value).is_err());
    }
}

#[test]
fn item_03_incubator_is_the_host_in_value_and_trains_the_seed() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "conv_light", options(), SeedStage::Training);
    assert_eq!(slot.alpha(), 0.0);
    let host_values = features(3);
    let weights = features(4);

    let host = host_values.detach().set_requires_grad(true);
    let output = slot.forward(&host, None).expect("forward");
    assert!(
        bitwise_equal(&output, &host),
        "incubator output equals the host"
    );
    (&output * &weights).sum(Kind::Float).backward();
    let seed_grad_norm = slot.seed_gradient_norm().expect("norm");
    assert!(seed_grad_norm > 0.0, "seed parameters get gradients");

    let bare = host_values.detach().set_requires_grad(true);
    (&bare * &weights).sum(Kind::Float).backward();
    assert!(
        bitwise_equal(&host.grad(), &bare.grad()),
        "host gradients are those of a run without seed"
    );
}

#[test]
fn item_04_add_blend_endpoints_gradients_and_shape() {
    let host = features(5).set_requires_grad(true);
    let seed = features(6).set_requires_grad(true);
    let at_zero = blend_add(&host, &seed, &BlendAlpha::Scalar(0.0)).expect("add");
    let at_one = blend_add(&host, &seed, &BlendAlpha::Scalar(1.0)).expect("add");
    assert!(bitwise_equal(&at_zero, &host));
    assert!(bitwise_equal(&at_one, &seed));
    for alpha in [0.1, 0.5, 0.9] {
        let host = features(5).set_requires_grad(true);
        let seed = features(6).set_requires_grad(true);
        blend_add(&host, &seed, &BlendAlpha::Scalar(alpha))
            .expect("add")
            .sum(Kind::Float)
            .backward();
        let host_grad = host.grad().abs().min().double_value(&[]);
        let seed_grad = seed.grad().abs().min().double_value(&[]);
        assert!(
            (host_grad - (1.0 - alpha)).abs() < 1e-6,
            "host side gets 1 - alpha"
        );
        assert!((seed_grad - alpha).abs() < 1e-6, "seed side gets alpha");
    }
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "conv_light", options(), SeedStage::Blending);
    slot.step_epoch().expect("tick");
    assert!(slot.alpha() > 0.0 && slot.alpha() < 1.0);
    let input = features(7);
    assert_eq!(
        slot.forward(&input, None).expect("forward").size(),
        input.size()
    );
}

#[test]
fn item_05_multiply_identity_bounds_and_gate_convexity() {
    let host = features(8);
    let seed = features(9) * 1e6;
    let seed_input = features(10);
    let identity =
        blend_multiply(&host, &seed, &seed_input, &BlendAlpha::Scalar(0.0)).expect("mul");
    assert!(bitwise_equal(&identity, &host), "identity at alpha 0");
    let same =
        blend_multiply(&host, &seed_input, &seed_input, &BlendAlpha::Scalar(0.8)).expect("mul");
    assert!(
        bitwise_equal(&same, &host),
        "identity when s equals its input"
    );
    for alpha in [0.25, 0.6, 1.0] {
        let output =
            blend_multiply(&host, &seed, &seed_input, &BlendAlpha::Scalar(alpha)).expect("mul");
        let multiplier = &output / &host;
        let low = multiplier.min().double_value(&[]);
        let high = multiplier.max().double_value(&[]);
        assert!(
            low >= 1.0 - alpha - 1e-5 && high <= 1.0 + alpha + 1e-5,
            "[{low}, {high}]"
        );
        assert_eq!(output.isnan().any().int64_value(&[]), 0);
    }
    // GATE: gate values outside [0, 1] and alpha overrides are clamped, so
    // the output is a convex mix of host and seed.
    let gate_values = Tensor::from_slice(&[3.0f32, -2.0]).reshape([2, 1, 1, 1]);
    let alpha = Tensor::from_slice(&[0.9f32, 0.9]).reshape([2, 1, 1, 1]);
    let mixed =
        blend_gate(&host, &seed, &gate_values, &BlendAlpha::PerSample(&alpha)).expect("gate");
    let low = host.minimum(&seed);
    let high = host.maximum(&seed);
    assert_eq!(mixed.lt_tensor(&low).any().int64_value(&[]), 0);
    assert_eq!(mixed.gt_tensor(&high).any().int64_value(&[]), 0);
    assert!(
        bitwise_equal(&mixed.get(0), &seed.get(0)),
        "effective alpha clamped to 1"
    );
    assert!(
        bitwise_equal(&mixed.get(1), &host.get(1)),
        "effective alpha clamped to 0"
    );
    assert_eq!(mixed.isnan().any().int64_value(&[]), 0);
}

#[test]
fn item_05_gated_slot_blends_without_nans() {
    let mut slot = lone_slot(Topology::Cnn);
    let gated = options().with_algorithm(AlphaAlgorithm::Gate);
    walk_to(&mut slot, "conv_small", gated, SeedStage::Blending);
    slot.set_alpha(0.7).expect("alpha");
    let output = slot.forward(&(features(11) * 1e4), None).expect("forward");
    assert_eq!(output.isnan().any().int64_value(&[]), 0);
}

#[test]
fn item_06_alpha_controller_schedule_contract() {
    for curve in AlphaCurve::ALL {
        let mut controller = AlphaController::default();
        controller
            .retarget(1.0, 5, Some(*curve), None)
            .expect("retarget");
        let mut previous = controller.alpha();
        for tick in 1..=5 {
            let reached = controller.step();
            assert!(controller.alpha() >= previous, "{curve}: monotone");
            assert!(controller.alpha() <= 1.0, "{curve}: no overshoot");
            assert_eq!(reached, tick == 5);
            previous = controller.alpha();
        }
        assert_eq!(controller.alpha(), 1.0, "snaps on the last tick");
        assert_eq!(controller.mode(), AlphaMode::Hold);
    }
    let mut controller = AlphaController::new(0.2).expect("controller");
    controller
        .retarget(0.9, 4, Some(AlphaCurve::Sigmoid), Some(6.0))
        .expect("retarget");
    controller.step();
    let error = controller
        .retarget(0.0, 3, None, None)
        .expect_err("retarget outside HOLD");
    assert!(matches!(
        error,
        Error::AlphaNotHold {
            mode: AlphaMode::Up
        }
    ));
    let saved = serde_json::to_string(&controller).expect("serialise");
    let mut restored: AlphaController = serde_json::from_str(&saved).expect("deserialise");
    for _ in 0..4 {
        controller.step();
        restored.step();
        assert_eq!(
            controller, restored,
            "the round trip reproduces the trajectory"
        );
    }
}

#[test]
fn item_07_op_availability_masks() {
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    let enabled = [SlotId::new(0, 0), SlotId::new(0, 1)];
    let mut model = MorphogeneticModel::new(
        host,
        &enabled,
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("model");
    let availability = model.op_availability(1);
    assert_eq!(availability.ops.len(), LifecycleOp::ALL.len());
    assert_eq!(availability.germinate_slots.len(), enabled.len());
    assert!(availability.allows(LifecycleOp::Wait));
    assert!(availability.allows(LifecycleOp::Germinate));
    assert!(!availability.allows(LifecycleOp::Fossilize));
    assert!(!availability.allows(LifecycleOp::Prune));

    model
        .germinate(enabled[0], "norm", options())
        .expect("germinate");
    let availability = model.op_availability(1);
    assert!(availability.allows(LifecycleOp::Wait));
    assert!(
        !availability.allows(LifecycleOp::Germinate),
        "seed limit reached"
    );
    assert!(model.op_availability(2).germinate_slots == vec![false, true]);
    assert!(
        !availability.allows(LifecycleOp::Prune),
        "too young to prune"
    );
    for _ in 0..MIN_PRUNE_AGE {
        model.step_epoch().expect("tick");
    }
    assert!(model.op_availability(1).allows(LifecycleOp::Prune));
    assert!(!model.op_availability(1).allows(LifecycleOp::Fossilize));

    let slot = model.slot_mut(enabled[0]).expect("slot");
    slot.advance_stage(Some(SeedStage::Training)).expect("g1");
    for _ in 0..common::TEST_STAGE_EPOCHS {
        slot.step_epoch().expect("tick");
    }
    slot.record_gradient_norms(1.0, 1.0, 100).expect("grads");
    assert!(
        slot.advance_stage(Some(SeedStage::Blending))
            .expect("g2")
            .passed
    );
    while !slot.state().expect("state").alpha_controller().is_settled() {
        slot.step_epoch().expect("tick");
    }
    assert!(
        slot.advance_stage(Some(SeedStage::Holding))
            .expect("g3")
            .passed
    );
    let availability = model.op_availability(1);
    assert!(availability.allows(LifecycleOp::Fossilize));
    assert_eq!(availability.fossilize_slots, vec![true, false]);
}

fn g5_inputs(contribution: Option<f64>) -> GateInputs<'static> {
    GateInputs {
        seed_id: "seed",
        blueprint_id: "norm",
        stage: SeedStage::Holding,
        epochs_in_stage: 3,
        improvement: 0.0,
        gradient_ratio: Some(1.0),
        gradient_health: Some(1.0),
        gradients_exploding: false,
        alpha: 1.0,
        alpha_target: 1.0,
        alpha_mode: AlphaMode::Hold,
        counterfactual: contribution,
        is_healthy: true,
    }
}

#[test]
fn item_08_strict_g5_contribution_floor() {
    let strict = QualityGates::strict();
    for contribution in [0.999, 0.0, -3.0] {
        let outcome = strict.evaluate(GateLevel::G5, &g5_inputs(Some(contribution)));
        assert!(
            !outcome.passed,
            "contribution {contribution} must be rejected"
        );
    }
    assert!(strict.evaluate(GateLevel::G5, &g5_inputs(Some(1.0))).passed);
    let missing = strict.evaluate(GateLevel::G5, &g5_inputs(None));
    assert!(!missing.passed);
    assert!(
        missing
            .checks_failed
            .contains(&"counterfactual_not_available".to_owned())
    );
    assert!(
        QualityGates::permissive()
            .evaluate(GateLevel::G5, &g5_inputs(Some(0.0)))
            .passed,
        "permissive G5 has no contribution floor"
    );

    let mut slot = kasmina::slot::SeedSlot::new(
        common::spec(4, 6),
        Topology::Cnn,
        slot_config(GateMode::Strict),
        Telemetry::disabled(),
    )
    .expect("slot");
    slot.germinate("norm", options(), Device::Cpu)
        .expect("germinate");
    slot.record_accuracy(50.0, 50.0).expect("acc");
    slot.advance_stage(Some(SeedStage::Training)).expect("g1");
    // Strict G2 needs improvement since TRAINING began and a gradient ratio.
    for _ in 0..common::TEST_STAGE_EPOCHS {
        slot.step_epoch().expect("tick");
    }
    assert!(
        !slot
            .advance_stage(Some(SeedStage::Blending))
            .expect("g2")
            .passed
    );
    slot.record_accuracy(52.0, 52.0).expect("acc");
    slot.record_gradient_norms(1.0, 1.0, 100).expect("grads");
    assert!(
        slot.advance_stage(Some(SeedStage::Blending))
            .expect("g2")
            .passed
    );
    while slot.state().expect("state").metrics().epochs_in_stage < common::TEST_STAGE_EPOCHS
        || !slot.state().expect("state").alpha_controller().is_settled()
    {
        slot.step_epoch().expect("tick");
    }
    assert!(
        slot.advance_stage(Some(SeedStage::Holding))
            .expect("g3")
            .passed
    );
    slot.set_counterfactual_contribution(0.5).expect("cf");
    assert!(!slot.fossilize().expect("g5").passed);
    assert_eq!(slot.stage(), Some(SeedStage::Holding));
    slot.set_counterfactual_contribution(1.0).expect("cf");
    assert!(slot.fossilize().expect("g5").passed);
    assert_eq!(slot.stage(), Some(SeedStage::Fossilized));
}
