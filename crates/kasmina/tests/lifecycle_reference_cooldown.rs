//! The reference behaviours of ESPER_PYTHON_REFERENCE.md §9, items 9-11 and
//! 15 (items 1-8 are in `lifecycle_reference.rs`): the prune pipeline and
//! its cooldown, scheduled prunes and the blend-out freeze, fossils that
//! cannot be pruned, HOLDING without a timeout, and gradient isolation.

mod common;

use common::{bitwise_equal, features, lone_slot, slot_config, walk_to};
use kasmina::Error;
use kasmina::gate::GateMode;
use kasmina::groups::{GroupEvent, GroupKey};
use kasmina::host::{CnnHost, CnnHostConfig, InjectionSpec, SlotId, Surface, Topology};
use kasmina::lifecycle::{GerminationOptions, PruneInitiator, PruneSchedule};
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use leyline::{AlphaCurve, SeedStage};
use tch::{Device, Kind, Tensor};

fn options() -> GerminationOptions {
    GerminationOptions::new("seed-1")
}

#[test]
fn item_09_prune_pipeline_and_cooldown() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "conv_light", options(), SeedStage::Training);
    let input = features(12);
    assert!(
        slot.prune("policy_choice", PruneInitiator::Policy)
            .expect("prune")
    );
    assert!(slot.seed_module().is_none(), "module freed at once");
    assert_eq!(
        slot.drain_group_events().last(),
        Some(&GroupEvent::Removed(GroupKey::Seed(slot.id()))),
        "the trainer is told to drop the seed's optimizer state"
    );
    assert_eq!(slot.stage(), Some(SeedStage::Pruned), "state persists");
    let mut stages = Vec::new();
    for _ in 0..7 {
        assert!(bitwise_equal(
            &slot.forward(&input, None).expect("forward"),
            &input
        ));
        let error = slot
            .germinate("norm", options(), Device::Cpu)
            .expect_err("germination during cooldown");
        assert!(matches!(error, Error::SlotOccupied { .. }), "{error}");
        slot.step_epoch().expect("tick");
        stages.push(slot.stage());
    }
    let expected: Vec<Option<SeedStage>> = [
        Some(SeedStage::Embargoed),
        Some(SeedStage::Embargoed),
        Some(SeedStage::Embargoed),
        Some(SeedStage::Embargoed),
        Some(SeedStage::Embargoed),
        Some(SeedStage::Resetting),
        None,
    ]
    .to_vec();
    assert_eq!(stages, expected);
    assert!(slot.is_empty());
    slot.germinate("norm", options(), Device::Cpu)
        .expect("the slot is free after 7 ticks");
}

#[test]
fn item_10_scheduled_prune_waits_for_alpha_zero() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "conv_light", options(), SeedStage::Holding);
    assert_eq!(slot.alpha(), 1.0);
    let schedule = slot
        .schedule_prune(3, AlphaCurve::Linear, 12.0)
        .expect("schedule");
    assert_eq!(schedule, PruneSchedule::Scheduled);
    assert_eq!(slot.stage(), Some(SeedStage::Blending));
    assert!(slot.state().expect("state").blend_out_freeze());
    let mut previous = slot.alpha();
    for tick in 1..=3 {
        slot.step_epoch().expect("tick");
        if tick < 3 {
            assert_eq!(slot.stage(), Some(SeedStage::Blending), "tick {tick}");
            assert!(slot.alpha() < previous && slot.alpha() > 0.0);
            previous = slot.alpha();
        }
    }
    assert_eq!(slot.stage(), Some(SeedStage::Pruned));
    assert_eq!(slot.alpha(), 0.0);
    assert_eq!(
        slot.state().expect("state").prune_reason(),
        Some("scheduled_prune")
    );
}

#[test]
fn blend_out_freeze_follows_the_down_ramp() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "conv_light", options(), SeedStage::Holding);
    let requires_grad = |slot: &kasmina::slot::SeedSlot| {
        slot.parameters()
            .iter()
            .map(|(_, tensor)| tensor.requires_grad())
            .collect::<Vec<_>>()
    };
    assert!(requires_grad(&slot).iter().all(|&r| r));
    slot.retarget_alpha(0.5, 2, AlphaCurve::Linear, 12.0)
        .expect("partial retarget");
    assert_eq!(slot.stage(), Some(SeedStage::Blending));
    assert!(slot.state().expect("state").blend_out_freeze());
    assert!(
        requires_grad(&slot).iter().all(|&r| !r),
        "frozen while ramping down"
    );
    slot.step_epoch().expect("tick");
    slot.step_epoch().expect("tick");
    assert_eq!(slot.alpha(), 0.5);
    assert_eq!(
        slot.stage(),
        Some(SeedStage::Blending),
        "a partial target does not prune"
    );
    slot.step_epoch().expect("tick");
    assert!(!slot.state().expect("state").blend_out_freeze());
    assert!(
        requires_grad(&slot).iter().all(|&r| r),
        "trains again once held"
    );
}

#[test]
fn item_11_fossilized_cannot_be_pruned_and_holding_never_times_out() {
    let mut slot = lone_slot(Topology::Cnn);
    walk_to(&mut slot, "norm", options(), SeedStage::Fossilized);
    assert!(
        !slot
            .prune("policy_choice", PruneInitiator::Policy)
            .expect("prune")
    );
    assert_eq!(
        slot.schedule_prune(3, AlphaCurve::Linear, 12.0)
            .expect("schedule"),
        PruneSchedule::Refused
    );
    assert_eq!(slot.stage(), Some(SeedStage::Fossilized));
    assert!(slot.seed_module().is_some());

    let mut holding = lone_slot(Topology::Cnn);
    walk_to(&mut holding, "norm", options(), SeedStage::Holding);
    holding.set_counterfactual_contribution(-25.0).expect("cf");
    for _ in 0..200 {
        holding.step_epoch().expect("tick");
    }
    assert_eq!(holding.stage(), Some(SeedStage::Holding));
    assert_eq!(holding.alpha(), 1.0);
}

/// Gradient of `sum(slot(h) * w)` with respect to a leaf `h`.
fn host_side_gradient(slot: &kasmina::slot::SeedSlot, host: &Tensor, weights: &Tensor) -> Tensor {
    let host = host.detach().set_requires_grad(true);
    (slot.forward(&host, None).expect("forward") * weights)
        .sum(Kind::Float)
        .backward();
    host.grad()
}

#[test]
fn item_15_cnn_keeps_isolation_transformer_drops_it() {
    let mut cnn = lone_slot(Topology::Cnn);
    walk_to(&mut cnn, "conv_light", options(), SeedStage::Blending);
    cnn.step_epoch().expect("tick");
    let alpha = cnn.alpha();
    assert!(alpha > 0.0 && alpha < 1.0);
    assert!(cnn.state().expect("state").isolate_gradients());
    // With isolation the host sees only the (1 - a) path of the lerp.
    let weights = features(14);
    let cnn_grad = host_side_gradient(&cnn, &features(13), &weights);
    assert!(
        (&cnn_grad - &weights * (1.0 - alpha))
            .abs()
            .max()
            .double_value(&[])
            < 1e-6,
        "no seed feedback into host gradients"
    );

    // A transformer slot (width 8, 6 tokens) with a LoRA seed.
    let mut transformer = kasmina::slot::SeedSlot::new(
        InjectionSpec {
            spatial: (6, 1),
            surface: Surface::BlockEnd,
            ..common::spec(8, 6)
        },
        Topology::Transformer,
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("slot");
    walk_to(&mut transformer, "lora", options(), SeedStage::Training);
    assert!(transformer.state().expect("state").isolate_gradients());
    walk_to_blending(&mut transformer);
    transformer.step_epoch().expect("tick");
    let alpha = transformer.alpha();
    assert!(alpha > 0.0 && alpha < 1.0);
    assert!(!transformer.state().expect("state").isolate_gradients());
    tch::manual_seed(15);
    let tokens = Tensor::randn([2, 6, 8], (Kind::Float, Device::Cpu));
    let weights = Tensor::randn([2, 6, 8], (Kind::Float, Device::Cpu));
    let transformer_grad = host_side_gradient(&transformer, &tokens, &weights);
    // The LoRA seed is the identity at birth, so the seed path hands the
    // host a further `a w`: the host gradient is `w`, not `(1 - a) w`.
    assert!(
        (&transformer_grad - &weights).abs().max().double_value(&[]) < 1e-5,
        "the transformer seed co-adapts with the host"
    );
}

/// TRAINING -> BLENDING through the real G2 gate.
fn walk_to_blending(slot: &mut kasmina::slot::SeedSlot) {
    for _ in 0..common::TEST_STAGE_EPOCHS {
        slot.step_epoch().expect("tick");
    }
    slot.record_gradient_norms(1.0, 1.0, 100).expect("grads");
    assert!(
        slot.advance_stage(Some(SeedStage::Blending))
            .expect("g2")
            .passed
    );
}

#[test]
fn item_15_cnn_host_upstream_of_a_full_alpha_seed_gets_no_gradient_through_it() {
    tch::manual_seed(21);
    let config = CnnHostConfig {
        base_channels: 2,
        ..CnnHostConfig::fashion_mnist()
    };
    let host = CnnHost::new(config, Device::Cpu).expect("host");
    let slot = SlotId::new(0, 2);
    let mut model = MorphogeneticModel::new(
        host,
        &[slot],
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("model");
    model
        .germinate(slot, "conv_light", options())
        .expect("germinate");
    let seed_slot = model.slot_mut(slot).expect("slot");
    seed_slot
        .advance_stage(Some(SeedStage::Training))
        .expect("g1");
    seed_slot.set_alpha(1.0).expect("alpha");
    // TRAINING at alpha 1 is an ADD blend at full amplitude.
    let input = Tensor::randn([3, 1, 28, 28], (Kind::Float, Device::Cpu));
    model
        .forward(&input, true)
        .expect("forward")
        .sum(Kind::Float)
        .backward();
    for (name, parameter) in model.host_parameters() {
        let grad_norm = parameter.grad().norm().double_value(&[]);
        if name.starts_with("classifier") {
            assert!(grad_norm > 0.0, "{name} is downstream and learns");
        } else {
            assert_eq!(grad_norm, 0.0, "{name} is upstream of the seed");
        }
    }
}
