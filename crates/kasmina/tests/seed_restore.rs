//! Restoring a seed from its serialised lifecycle state (checkpoints): the
//! state round-trips through JSON unchanged, a restored seed with the
//! original's variables computes bitwise what the original computes and
//! holds the same state, the slot announces the seed's parameter group, a
//! seed in cooldown comes back without a module, an occupied slot refuses,
//! and an impossible state is refused when it is read.

use kasmina::Error;
use kasmina::groups::{GroupEvent, GroupKey};
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::{GerminationOptions, PruneInitiator, SeedState, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::SeedStage;
use tch::{Device, Kind, Tensor};

const A: SlotId = SlotId { row: 0, col: 1 };
const B: SlotId = SlotId { row: 0, col: 2 };

fn model() -> MorphogeneticModel {
    tch::manual_seed(11);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    MorphogeneticModel::new(host, &[A, B], SlotConfig::default(), Default::default())
        .expect("model")
}

fn state_json(model: &MorphogeneticModel, slot: SlotId) -> String {
    let state = model.slot(slot).expect("slot").state().expect("state");
    serde_json::to_string(state).expect("json")
}

#[test]
fn a_restored_seed_computes_and_decides_like_the_original() {
    let mut original = model();
    original
        .germinate(A, "conv_light", GerminationOptions::new("seed-0"))
        .expect("germinate");
    assert!(
        original
            .advance_stage(A, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
    original.record_accuracy(40.0, 38.5).expect("accuracy");
    {
        let seed = original.slot_mut(A).expect("slot");
        seed.record_gradient_norms(0.5, 2.0, 1000).expect("grads");
        seed.step_epoch().expect("tick");
    }
    original
        .germinate(B, "norm", GerminationOptions::new("seed-1"))
        .expect("germinate");
    assert!(
        original
            .prune(B, "test", PruneInitiator::Policy)
            .expect("prune")
    );
    let _ = original.drain_group_events();

    let mut restored = model();
    assert_eq!(
        restored.drain_group_events(),
        [GroupEvent::Added(GroupKey::Host)]
    );
    for slot in [A, B] {
        let json = state_json(&original, slot);
        let state: SeedState = serde_json::from_str(&json).expect("parse");
        assert_eq!(
            Some(&state),
            original.slot(slot).expect("slot").state(),
            "JSON round trip"
        );
        restored.restore_seed(slot, state).expect("restore");
    }
    assert_eq!(
        restored.drain_group_events(),
        [GroupEvent::Added(GroupKey::Seed(A))],
        "the live seed's group appears; the pruned one has no module"
    );
    assert_eq!(
        restored.slot(B).expect("slot").stage(),
        Some(SeedStage::Pruned)
    );
    assert!(restored.slot(B).expect("slot").seed_module().is_none());

    // The caller copies the variables; the forward pass is then the same.
    let from = original
        .slot(A)
        .expect("slot")
        .seed_module()
        .expect("module");
    let to = restored
        .slot(A)
        .expect("slot")
        .seed_module()
        .expect("module");
    // The host's variables too: tests share libtorch's generator across
    // threads, so the two hosts built from the same seed may differ.
    for (source, target) in [
        (from.var_store(), to.var_store()),
        (original.host().var_store(), restored.host().var_store()),
    ] {
        let source = source.variables();
        let target = target.variables();
        assert_eq!(source.len(), target.len());
        tch::no_grad(|| {
            for (name, tensor) in &target {
                tensor
                    .shallow_clone()
                    .copy_(source.get(name).expect("same variable names"));
            }
        });
    }
    let input = Tensor::randn([3, 1, 28, 28], (Kind::Float, Device::Cpu));
    let expected = original.forward(&input, false).expect("forward");
    let got = restored.forward(&input, false).expect("forward");
    assert!(got.equal(&expected), "bitwise the same output");
    for slot in [A, B] {
        assert_eq!(
            restored.slot(slot).expect("slot").state(),
            original.slot(slot).expect("slot").state()
        );
    }
    // The next lifecycle steps agree too.
    for model in [&mut original, &mut restored] {
        model.step_epoch().expect("tick");
    }
    assert_eq!(
        restored.slot(A).expect("slot").state(),
        original.slot(A).expect("slot").state()
    );

    // An occupied slot refuses, unchanged.
    let again: SeedState = serde_json::from_str(&state_json(&original, A)).expect("parse");
    let error = restored.restore_seed(A, again).expect_err("occupied");
    assert!(matches!(error, Error::SlotOccupied { .. }), "{error}");
}

#[test]
fn an_impossible_state_is_refused_when_read() {
    let mut model = model();
    model
        .germinate(A, "conv_light", GerminationOptions::new("seed-0"))
        .expect("germinate");
    let json = state_json(&model, A);
    let value: serde_json::Value = serde_json::from_str(&json).expect("json");
    let cases: [(&str, serde_json::Value, &str); 5] = [
        ("param_count", serde_json::json!(-1), "param_count"),
        (
            "blend_alpha_target",
            serde_json::json!(2.0),
            "blend_alpha_target",
        ),
        ("seed_id", serde_json::json!(""), "seed_id"),
        ("stage", serde_json::json!("NOT_A_STAGE"), "NOT_A_STAGE"),
        ("colour", serde_json::json!(1), "colour"),
    ];
    for (field, bad, needle) in cases {
        let mut edited = value.clone();
        edited[field] = bad;
        let error = serde_json::from_value::<SeedState>(edited).expect_err(field);
        assert!(error.to_string().contains(needle), "{field}: {error}");
    }
    let mut metrics = value.clone();
    metrics["metrics"]["val_accuracy"] = serde_json::json!(101.0);
    let error = serde_json::from_value::<SeedState>(metrics).expect_err("accuracy");
    assert!(error.to_string().contains("val_accuracy"), "{error}");
}
