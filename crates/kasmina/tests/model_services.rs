//! The morphogenetic model's services: forward routing, attribute_batch,
//! counterfactual contribution, export_seed_states, seed masks, parameter
//! groups and their events, and the lifecycle telemetry arriving through a
//! `leyline::Telemetry` handle (the hub's delivery is nissa's own test).

mod common;

use common::sgd::GroupSgd;
use common::slot_config;
use kasmina::Error;
use kasmina::attribution::{attribute_batch, counterfactual_contribution};
use kasmina::export::export_seed_states;
use kasmina::gate::GateMode;
use kasmina::groups::{GroupEvent, GroupKey};
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::{GerminationOptions, PruneInitiator};
use kasmina::model::MorphogeneticModel;
use leyline::codec::Contract;
use leyline::proto::SeedState as SeedStateMessage;
use leyline::{AlphaAlgorithm, SeedStage};
use leyline::{Collector, Telemetry};
use tch::{Device, Kind, Tensor};

const R0C0: SlotId = SlotId { row: 0, col: 0 };
const R1C0: SlotId = SlotId { row: 1, col: 0 };
const R0C1: SlotId = SlotId { row: 0, col: 1 };

fn tiny_model(telemetry: Telemetry) -> MorphogeneticModel {
    tch::manual_seed(11);
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
        &[R0C1, R0C0, R1C0],
        slot_config(GateMode::Permissive),
        telemetry,
    )
    .expect("model")
}

fn images() -> Tensor {
    tch::manual_seed(12);
    Tensor::randn([5, 1, 28, 28], (Kind::Float, Device::Cpu))
}

fn to_training(model: &mut MorphogeneticModel, slot: SlotId, blueprint: &str, id: &str) {
    model
        .germinate(slot, blueprint, GerminationOptions::new(id))
        .expect("germinate");
    assert!(
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
}

#[test]
fn slots_run_in_execution_order_and_inactive_slots_are_identities() {
    let mut model = tiny_model(Telemetry::disabled());
    assert_eq!(model.slot_ids(), vec![R0C0, R1C0, R0C1]);
    let x = images();
    let plain = model.host().forward(&x, false).expect("host");
    assert!(model.forward(&x, false).expect("model").equal(&plain));
    model
        .germinate(R0C1, "conv_light", GerminationOptions::new("a"))
        .expect("germinate");
    assert!(
        model.forward(&x, false).expect("germinated").equal(&plain),
        "GERMINATED is off-path"
    );
    model.advance_stage(R0C1, None).expect("g1");
    assert!(
        model.forward(&x, false).expect("training").equal(&plain),
        "incubator is identity"
    );
    model
        .slot_mut(R0C1)
        .expect("slot")
        .set_alpha(1.0)
        .expect("alpha");
    assert!(!model.forward(&x, false).expect("blended").equal(&plain));
    let error = model.slot(SlotId::new(1, 2)).expect_err("not enabled");
    assert!(matches!(error, Error::UnknownSlot { .. }), "{error}");
    let host = CnnHost::new(CnnHostConfig::fashion_mnist(), Device::Cpu).expect("host");
    assert!(
        MorphogeneticModel::new(
            host,
            &[SlotId::new(5, 5)],
            slot_config(GateMode::Permissive),
            Telemetry::disabled()
        )
        .is_err()
    );
}

#[test]
fn attribute_batch_measures_each_seeds_influence_per_sample() {
    let mut model = tiny_model(Telemetry::disabled());
    let x = images();
    let empty = attribute_batch(&model, &x).expect("no seeds");
    assert_eq!(empty.influence.size(), vec![5, 0]);
    assert!(empty.slots.is_empty());
    let plain = tch::no_grad(|| model.forward(&x, false)).expect("forward");
    assert!(empty.output.equal(&plain));
    to_training(&mut model, R0C0, "conv_light", "incubating");
    to_training(&mut model, R0C1, "conv_heavy", "blended");
    model
        .slot_mut(R0C1)
        .expect("slot")
        .set_alpha(0.6)
        .expect("alpha");
    let x = images();
    let attribution = attribute_batch(&model, &x).expect("attribution");
    assert_eq!(attribution.slots, vec![R0C0, R0C1]);
    assert_eq!(attribution.seed_ids, vec!["incubating", "blended"]);
    assert_eq!(attribution.influence.size(), vec![5, 2]);
    let full = tch::no_grad(|| model.forward(&x, false)).expect("forward");
    assert!((&attribution.output - &full).abs().max().double_value(&[]) < 1e-5);

    // The incubating seed (alpha 0) cannot influence anything.
    assert_eq!(
        attribution
            .influence
            .select(1, 0)
            .abs()
            .max()
            .double_value(&[]),
        0.0
    );
    // The blended seed's influence is the L2 move of the logits without it.
    let off = Tensor::zeros([5, 1, 1, 1], (Kind::Float, Device::Cpu));
    let without = tch::no_grad(|| model.forward_with_alpha(&x, &[None, None, Some(&off)], false))
        .expect("counterfactual");
    let expected = (&full - &without)
        .square()
        .sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
        .sqrt();
    let measured = attribution.influence.select(1, 1);
    assert!((&measured - &expected).abs().max().double_value(&[]) < 1e-5);
    assert!(measured.min().double_value(&[]) > 0.0);
    // Shares: 0 for the incubating seed, 1 for the only influential one.
    let share = &attribution.share;
    assert_eq!(share.select(1, 0).abs().max().double_value(&[]), 0.0);
    assert!((share.select(1, 1) - 1.0).abs().max().double_value(&[]) < 1e-6);

    let labels = Tensor::from_slice(&[0i64, 1, 2, 3, 4]);
    let contribution = counterfactual_contribution(&model, R0C1, &x, &labels).expect("cf");
    let accuracy = |logits: &Tensor| {
        logits
            .argmax(1, false)
            .eq_tensor(&labels)
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[])
            * 100.0
    };
    assert!((contribution - (accuracy(&full) - accuracy(&without))).abs() < 1e-9);
    assert_eq!(
        counterfactual_contribution(&model, R1C0, &x, &labels).expect("empty"),
        0.0
    );
}

#[test]
fn export_seed_states_reports_every_held_state() {
    let mut model = tiny_model(Telemetry::disabled());
    assert!(export_seed_states(&model).expect("export").is_empty());
    to_training(&mut model, R0C0, "norm", "first");
    model
        .germinate(
            R0C1,
            "attention",
            GerminationOptions::new("second").with_algorithm(AlphaAlgorithm::Multiply),
        )
        .expect("germinate");
    model
        .slot_mut(R0C0)
        .expect("slot")
        .record_gradient_norms(0.2, 1.0, 400)
        .expect("grads");
    model.record_accuracy(40.0, 38.0).expect("accuracy");
    model.step_epoch().expect("tick");
    let messages = export_seed_states(&model).expect("export");
    assert_eq!(messages.len(), 2);
    let first = &messages[0];
    assert_eq!(first.slot_id, "r0c0");
    assert_eq!(first.seed_id, "first");
    assert_eq!(first.blueprint_id, "norm");
    assert_eq!(first.seed_stage().expect("stage"), SeedStage::Training);
    assert_eq!(
        first.previous_seed_stage().expect("stage"),
        SeedStage::Germinated
    );
    assert!(first.isolate_gradients);
    let metrics = first.metrics.as_ref().expect("metrics");
    assert_eq!(metrics.epochs_in_stage, 1);
    assert_eq!(metrics.val_accuracy, 38.0);
    assert_eq!(metrics.param_count, 2 * 2 + 1);
    let expected_ratio = 0.2 * (400.0f64 / 5.0).sqrt();
    assert!((metrics.gradient_ratio.expect("ratio") - expected_ratio).abs() < 1e-12);
    let second = &messages[1];
    assert_eq!(second.seed_stage().expect("stage"), SeedStage::Germinated);
    assert_eq!(
        second.alpha_algorithm_enum().expect("algorithm"),
        AlphaAlgorithm::Multiply
    );
    for message in &messages {
        let bytes = message.encode_protobuf().expect("encode");
        assert_eq!(
            &SeedStateMessage::decode_protobuf(&bytes).expect("decode"),
            message
        );
        let json = message.to_json().expect("json");
        assert_eq!(&SeedStateMessage::from_json(&json).expect("parse"), message);
    }
    model
        .prune(R0C0, "test", PruneInitiator::Governor)
        .expect("prune");
    let messages = export_seed_states(&model).expect("export");
    assert_eq!(messages[0].seed_stage().expect("stage"), SeedStage::Pruned);
    for _ in 0..7 {
        model.step_epoch().expect("tick");
    }
    let messages = export_seed_states(&model).expect("export");
    assert_eq!(messages.len(), 1, "the cleared slot exports nothing");
    assert_eq!(messages[0].slot_id, "r0c1");
}

#[test]
fn seed_masks_lay_out_host_then_seeds_in_slot_order() {
    let mut model = tiny_model(Telemetry::disabled());
    to_training(&mut model, R0C1, "conv_light", "late");
    to_training(&mut model, R0C0, "bottleneck", "early");
    let masks = model.seed_masks();
    let parameters = model.parameters();
    let total: usize = parameters.iter().map(|p| p.tensor.numel()).sum();
    assert_eq!(masks.total, total);
    assert_eq!(masks.host.span().start, 0);
    let host_numel: usize = model.host_parameters().iter().map(|(_, t)| t.numel()).sum();
    assert_eq!(masks.host.numel(), host_numel);
    let owners: Vec<&str> = masks.seeds.iter().map(|m| m.owner.as_str()).collect();
    assert_eq!(
        owners,
        ["r0c0", "r0c1"],
        "seeds follow the slot execution order"
    );
    assert_eq!(masks.seeds[0].span().start, masks.host.span().end);
    assert_eq!(masks.seeds[1].span().start, masks.seeds[0].span().end);
    assert_eq!(masks.seeds[1].span().end, masks.total);
    assert_eq!(
        masks.seeds[0].numel() as i64,
        kasmina::blueprint::Blueprint::Bottleneck
            .param_count(kasmina::host::Topology::Cnn, 2)
            .expect("cnn")
    );
    assert_eq!(
        masks.seed("r0c1").expect("seed").seed_id.as_deref(),
        Some("late")
    );
    // `parameters()` walks the same order as the ranges.
    let range_names: Vec<&str> = std::iter::once(&masks.host)
        .chain(&masks.seeds)
        .flat_map(|mask| mask.ranges.iter().map(|r| r.name.as_str()))
        .collect();
    let parameter_names: Vec<&str> = parameters.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(range_names, parameter_names);
    assert_eq!(parameters.last().expect("some").group, GroupKey::Seed(R0C1));
    let mask = masks.to_tensor(&masks.seeds[1], Device::Cpu).expect("mask");
    assert_eq!(mask.size(), vec![masks.total as i64]);
    assert_eq!(
        mask.to_kind(Kind::Int64).sum(Kind::Int64).int64_value(&[]),
        masks.seeds[1].numel() as i64
    );
    model
        .prune(R0C0, "test", PruneInitiator::Policy)
        .expect("prune");
    assert_eq!(
        model.seed_masks().seeds.len(),
        1,
        "a pruned seed owns no parameters"
    );
}

#[test]
fn seed_groups_appear_with_the_seed_and_go_with_the_prune() {
    let mut model = tiny_model(Telemetry::disabled());
    assert_eq!(
        model.drain_group_events(),
        vec![GroupEvent::Added(GroupKey::Host)],
        "building the model adds the host's group"
    );
    assert!(
        model.drain_group_events().is_empty(),
        "drained events are gone"
    );
    to_training(&mut model, R0C0, "conv_light", "a");
    let mut optimizer = GroupSgd::new(0.01, 0.9);
    let x = images();
    let before: Vec<Tensor> = model
        .slot(R0C0)
        .expect("slot")
        .parameters()
        .iter()
        .map(|(_, t)| t.copy())
        .collect();
    model
        .forward(&x, true)
        .expect("forward")
        .sum(Kind::Float)
        .backward();
    optimizer.step(&mut model);
    assert_eq!(
        optimizer.events(),
        [GroupEvent::Added(GroupKey::Seed(R0C0))],
        "germination adds the seed's group (the host's was drained above)"
    );
    assert!(optimizer.has_group(GroupKey::Seed(R0C0)));
    let groups = model.parameter_groups();
    let keys: Vec<GroupKey> = groups.iter().map(|group| group.key).collect();
    assert_eq!(keys, [GroupKey::Host, GroupKey::Seed(R0C0)]);
    assert_eq!(groups[1].names.len(), groups[1].tensors.len());
    assert_eq!(
        groups[1].element_count(),
        model
            .slot(R0C0)
            .expect("slot")
            .state()
            .expect("state")
            .param_count()
    );
    let slot = model.slot(R0C0).expect("slot");
    let after: Vec<Tensor> = slot.parameters().iter().map(|(_, t)| t.copy()).collect();
    assert!(
        before.iter().zip(&after).any(|(a, b)| !a.equal(b)),
        "the seed trained"
    );
    model
        .prune(R0C0, "test", PruneInitiator::Policy)
        .expect("prune");
    assert_eq!(
        model.drain_group_events(),
        vec![GroupEvent::Removed(GroupKey::Seed(R0C0))]
    );
    assert!(model.parameter_group(GroupKey::Seed(R0C0)).is_none());
    // The cooldown (embargo, reset) frees nothing more: no further events.
    for _ in 0..7 {
        model.step_epoch().expect("tick");
    }
    assert!(model.slot(R0C0).expect("slot").is_empty());
    assert!(model.drain_group_events().is_empty());
    // Re-germinating the same slot adds a fresh group.
    to_training(&mut model, R0C0, "norm", "b");
    assert_eq!(
        model.drain_group_events(),
        vec![GroupEvent::Added(GroupKey::Seed(R0C0))]
    );
}

#[test]
fn a_fossilized_seed_keeps_its_group_and_keeps_training() {
    let mut model = tiny_model(Telemetry::disabled());
    to_training(&mut model, R0C1, "conv_light", "fossil");
    for _ in 0..common::TEST_STAGE_EPOCHS {
        model.step_epoch().expect("tick");
    }
    model
        .slot_mut(R0C1)
        .expect("slot")
        .record_gradient_norms(1.0, 1.0, 100)
        .expect("grads");
    assert!(model.advance_stage(R0C1, None).expect("g2").passed);
    while !model
        .slot(R0C1)
        .expect("slot")
        .state()
        .expect("state")
        .alpha_controller()
        .is_settled()
    {
        model.step_epoch().expect("tick");
    }
    assert!(model.advance_stage(R0C1, None).expect("g3").passed);
    model
        .slot_mut(R0C1)
        .expect("slot")
        .set_counterfactual_contribution(2.0)
        .expect("cf");
    let mut optimizer = GroupSgd::new(0.01, 0.9);
    optimizer.sync(&mut model);
    assert!(model.fossilize(R0C1).expect("g5").passed);
    assert_eq!(
        model.slot(R0C1).expect("slot").stage(),
        Some(SeedStage::Fossilized)
    );
    assert!(
        model.drain_group_events().is_empty(),
        "fossilizing neither adds nor removes a group"
    );
    assert!(model.parameter_group(GroupKey::Seed(R0C1)).is_some());
    let before: Vec<Tensor> = model
        .slot(R0C1)
        .expect("slot")
        .parameters()
        .iter()
        .map(|(_, t)| t.copy())
        .collect();
    let labels = Tensor::from_slice(&[0i64, 1, 2, 3, 4]);
    model
        .forward(&images(), true)
        .expect("forward")
        .cross_entropy_for_logits(&labels)
        .backward();
    optimizer.step(&mut model);
    let after: Vec<Tensor> = model
        .slot(R0C1)
        .expect("slot")
        .parameters()
        .iter()
        .map(|(_, t)| t.copy())
        .collect();
    assert!(
        before.iter().zip(&after).any(|(a, b)| !a.equal(b)),
        "a fossil keeps training (reference: seeds train through FOSSILIZED)"
    );
    assert!(
        !model
            .prune(R0C1, "test", PruneInitiator::Policy)
            .expect("prune")
    );
    assert!(model.drain_group_events().is_empty());
}

#[test]
fn lifecycle_events_and_seed_gauges_arrive_through_the_telemetry_handle() {
    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    let mut model = tiny_model(telemetry.clone());
    to_training(&mut model, R0C0, "norm", "doomed");
    model
        .prune(R0C0, "policy_choice", PruneInitiator::Policy)
        .expect("prune");
    let slot = model.slot_mut(R0C1).expect("slot");
    common::walk_to(
        slot,
        "norm",
        GerminationOptions::new("keeper"),
        SeedStage::Fossilized,
    );
    use leyline::telemetry::{
        KASMINA_SEED_FOSSILIZED, KASMINA_SEED_GATE_EVALUATED, KASMINA_SEED_GERMINATED,
        KASMINA_SEED_PRUNED, KASMINA_SEED_STAGE_CHANGED,
    };
    assert_eq!(collector.events_named(KASMINA_SEED_GERMINATED).len(), 2);
    // G0 twice, G1 twice, then G2, G3, G5 for the keeper.
    assert_eq!(collector.events_named(KASMINA_SEED_GATE_EVALUATED).len(), 7);
    let changes: Vec<(String, String)> = collector
        .events_named(KASMINA_SEED_STAGE_CHANGED)
        .iter()
        .map(|e| (e.attributes["from"].clone(), e.attributes["to"].clone()))
        .collect();
    let expected = [
        ("GERMINATED", "TRAINING"),
        ("TRAINING", "PRUNED"),
        ("GERMINATED", "TRAINING"),
        ("TRAINING", "BLENDING"),
        ("BLENDING", "HOLDING"),
        ("HOLDING", "FOSSILIZED"),
    ]
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .to_vec();
    // Only the keeper's slot was stepped, so the pruned seed stays PRUNED and
    // the list is exactly the lifecycle moves made.
    assert_eq!(changes, expected);
    let pruned = collector.events_named(KASMINA_SEED_PRUNED);
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0].attributes["reason"], "policy_choice");
    assert_eq!(pruned[0].attributes["initiator"], "policy");
    assert_eq!(pruned[0].attributes["slot_id"], "r0c0");
    let fossilized = collector.events_named(KASMINA_SEED_FOSSILIZED);
    assert_eq!(fossilized.len(), 1);
    assert_eq!(fossilized[0].attributes["seed_id"], "keeper");
    for packet in collector.packets() {
        assert!(packet.source.starts_with("kasmina.r"), "{}", packet.source);
    }
    collector.clear();
    model.emit_seed_metrics();
    use leyline::telemetry::{KASMINA_SEED_ALPHA, KASMINA_SEED_STAGE, KASMINA_SEEDS_ACTIVE};
    let alphas = collector.metrics_named(KASMINA_SEED_ALPHA);
    assert_eq!(alphas.len(), 2, "the pruned and the fossilized seed");
    let fossil = alphas
        .iter()
        .find(|m| m.attributes["slot_id"] == "r0c1")
        .expect("keeper");
    assert_eq!(fossil.value, 1.0);
    assert_eq!(fossil.unit, "ratio");
    let stages: Vec<f64> = collector
        .metrics_named(KASMINA_SEED_STAGE)
        .iter()
        .map(|m| m.value)
        .collect();
    assert!(stages.contains(&f64::from(SeedStage::Pruned.value())));
    assert!(stages.contains(&f64::from(SeedStage::Fossilized.value())));
    let active = collector.metrics_named(KASMINA_SEEDS_ACTIVE);
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].value, 1.0);
    assert_eq!(telemetry.contained_panics(), 0);
}
