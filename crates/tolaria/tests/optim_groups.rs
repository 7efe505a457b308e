//! The trainer's group optimizers (CPU): state follows Kasmina's group
//! events (germinate adds, prune drops, fossilize keeps), steps run on the
//! fused kernels with the learning rate and step count on the device, and a
//! rollback zeroes the state in one place. Also the optimizer configuration's
//! checks, which moved here with the seed learning rate (hostile values
//! refused, naming the field).

use kasmina::groups::{GroupEvent, GroupKey};
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::{GerminationOptions, PruneInitiator, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::SeedStage;
use leyline::testing::extreme_f64;
use proptest::prelude::*;
use tch::{Device, Kind, Tensor};
use tolaria::Error;
use tolaria::optim::{
    AdamWConfig, GroupOptimizer, GroupOptimizerConfig, GroupOptimizers, OptimizerConfig, SgdConfig,
    StateReset,
};

const SLOT: SlotId = SlotId { row: 0, col: 0 };

fn model() -> MorphogeneticModel {
    tch::set_num_threads(1);
    tch::manual_seed(3);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    MorphogeneticModel::new(host, &[SLOT], SlotConfig::default(), Default::default())
        .expect("model")
}

fn germinate_training(model: &mut MorphogeneticModel, id: &str) {
    model
        .germinate(SLOT, "conv_light", GerminationOptions::new(id))
        .expect("germinate");
    assert!(
        model
            .advance_stage(SLOT, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
}

/// Forward and backward on a fixed batch (gradients accumulate).
fn backward(model: &MorphogeneticModel) {
    tch::manual_seed(4);
    let images = Tensor::randn([4, 1, 28, 28], (Kind::Float, Device::Cpu));
    let labels = Tensor::from_slice(&[0i64, 3, 5, 9]);
    model
        .forward(&images, true)
        .expect("forward")
        .cross_entropy_for_logits(&labels)
        .backward();
}

fn copies(tensors: &[Tensor]) -> Vec<Tensor> {
    tensors.iter().map(Tensor::copy).collect()
}

fn all_zero(tensors: &[Tensor]) -> bool {
    tensors
        .iter()
        .all(|tensor| tensor.abs().max().double_value(&[]) == 0.0)
}

#[test]
fn germinate_builds_state_step_trains_the_seed_prune_drops_it() {
    let mut model = model();
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    assert_eq!(optimizers.keys(), [GroupKey::Host]);
    germinate_training(&mut model, "a");
    let events = optimizers.sync(&mut model).expect("sync");
    assert_eq!(events, [GroupEvent::Added(GroupKey::Seed(SLOT))]);
    assert_eq!(optimizers.keys(), [GroupKey::Host, GroupKey::Seed(SLOT)]);
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("seed state");
    assert_eq!(
        seed.parameters().len(),
        model.slot(SLOT).expect("slot").parameters().len()
    );
    assert!(all_zero(&seed.state_tensors()), "fresh momentum is zero");
    let before = copies(seed.parameters());
    backward(&model);
    optimizers.step().expect("step");
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("seed state");
    assert!(
        before
            .iter()
            .zip(seed.parameters())
            .any(|(a, b)| !a.equal(b)),
        "the seed's parameters moved"
    );
    assert_eq!(seed.step_count_tensor().double_value(&[]), 1.0);
    assert!(!all_zero(&seed.state_tensors()), "momentum was written");
    optimizers.zero_grad().expect("zero grads");
    for parameter in seed.parameters() {
        let grad = parameter.grad();
        assert!(!grad.defined() || grad.abs().max().double_value(&[]) == 0.0);
    }
    model
        .prune(SLOT, "test", PruneInitiator::Policy)
        .expect("prune");
    let events = optimizers.sync(&mut model).expect("sync");
    assert_eq!(events, [GroupEvent::Removed(GroupKey::Seed(SLOT))]);
    assert!(optimizers.group(GroupKey::Seed(SLOT)).is_none(), "dropped");
    assert_eq!(optimizers.keys(), [GroupKey::Host]);
    // The cooldown frees nothing more; re-germination gets fresh state.
    for _ in 0..7 {
        model.step_epoch().expect("tick");
    }
    assert!(optimizers.sync(&mut model).expect("sync").is_empty());
    germinate_training(&mut model, "b");
    optimizers.sync(&mut model).expect("sync");
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("fresh state");
    assert_eq!(seed.step_count_tensor().double_value(&[]), 0.0);
    assert!(all_zero(&seed.state_tensors()));
}

#[test]
fn added_then_removed_in_one_drain_leaves_no_state() {
    let mut model = model();
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    germinate_training(&mut model, "short-lived");
    model
        .prune(SLOT, "test", PruneInitiator::Governor)
        .expect("prune");
    let events = optimizers.sync(&mut model).expect("sync");
    assert_eq!(
        events,
        [
            GroupEvent::Added(GroupKey::Seed(SLOT)),
            GroupEvent::Removed(GroupKey::Seed(SLOT))
        ]
    );
    assert_eq!(optimizers.keys(), [GroupKey::Host]);
}

#[test]
fn a_fossilized_seed_keeps_its_state_and_keeps_training() {
    let mut model = model();
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    germinate_training(&mut model, "fossil");
    let slot = model.slot_mut(SLOT).expect("slot");
    for _ in 0..10 {
        slot.step_epoch().expect("tick");
    }
    slot.record_gradient_norms(1.0, 1.0, 100).expect("grads");
    assert!(slot.advance_stage(None).expect("g2").passed);
    while !slot.state().expect("state").alpha_controller().is_settled() {
        slot.step_epoch().expect("tick");
    }
    assert!(slot.advance_stage(None).expect("g3").passed);
    slot.set_counterfactual_contribution(2.0).expect("cf");
    optimizers.sync(&mut model).expect("sync");
    backward(&model);
    optimizers.step().expect("step before fossilizing");
    assert!(model.fossilize(SLOT).expect("g5").passed);
    assert!(optimizers.sync(&mut model).expect("sync").is_empty());
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("kept");
    assert_eq!(seed.step_count_tensor().double_value(&[]), 1.0);
    let before = copies(seed.parameters());
    optimizers.zero_grad().expect("zero");
    backward(&model);
    optimizers.step().expect("step as a fossil");
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("kept");
    assert!(
        before
            .iter()
            .zip(seed.parameters())
            .any(|(a, b)| !a.equal(b)),
        "a fossil keeps training"
    );
}

/// A single parameter with a fixed gradient, and SGD state over it.
fn lone_parameter(config: GroupOptimizerConfig) -> (Tensor, GroupOptimizer) {
    let parameter = Tensor::from_slice(&[1.0f32, -2.0, 0.5]).set_requires_grad(true);
    let grad = Tensor::from_slice(&[0.5f32, 1.0, -1.0]);
    // d/dp sum(p * grad) = grad; it stays as long as nothing zeroes it.
    (&parameter * &grad).sum(Kind::Float).backward();
    let group = GroupOptimizer::new(
        GroupKey::Host,
        config,
        vec![parameter.shallow_clone()],
        Device::Cpu,
    )
    .expect("group");
    (parameter, group)
}

fn values(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&tensor.detach()).expect("values")
}

fn assert_close(got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= 1e-6, "{got:?} vs {expected:?}");
    }
}

#[test]
fn sgd_steps_follow_torch_semantics() {
    let (parameter, mut group) = lone_parameter(GroupOptimizerConfig::sgd(0.1, 0.9));
    let g = [0.5f32, 1.0, -1.0];
    // Step 1: buf = g; p -= 0.1 g.
    group.step().expect("step 1");
    let p1: Vec<f32> = [1.0f32, -2.0, 0.5]
        .iter()
        .zip(g)
        .map(|(p, g)| p - 0.1 * g)
        .collect();
    assert_close(&values(&parameter), &p1);
    // Step 2: buf = 0.9 g + g; p -= 0.1 buf.
    group.step().expect("step 2");
    let p2: Vec<f32> = p1.iter().zip(g).map(|(p, g)| p - 0.1 * 1.9 * g).collect();
    assert_close(&values(&parameter), &p2);
    assert_eq!(group.step_count_tensor().double_value(&[]), 2.0);
    assert_close(&values(&group.state_tensors()[0]), &g.map(|g| 1.9 * g));
}

#[test]
fn the_learning_rate_lives_on_the_device_and_a_new_one_reaches_the_next_step() {
    let (parameter, mut group) = lone_parameter(GroupOptimizerConfig::sgd(0.1, 0.0));
    let lr = group.learning_rate_tensor();
    assert_eq!(lr.kind(), Kind::Float);
    assert_eq!(lr.dim(), 0);
    let address = lr.data_ptr();
    group.step().expect("step at 0.1");
    let p1 = values(&parameter);
    assert_close(&p1, &[1.0 - 0.05, -2.0 - 0.1, 0.5 + 0.1]);
    group.set_learning_rate(0.5).expect("new rate");
    assert_eq!(
        group.learning_rate_tensor().data_ptr(),
        address,
        "written in place: a captured step keeps reading the same memory"
    );
    assert_eq!(group.learning_rate_tensor().double_value(&[]), 0.5);
    group.step().expect("step at 0.5");
    let p2: Vec<f32> = p1
        .iter()
        .zip([0.5f32, 1.0, -1.0])
        .map(|(p, g)| p - 0.5 * g)
        .collect();
    assert_close(&values(&parameter), &p2);
    // A hostile rate is refused, naming the field, and changes nothing.
    for rate in [f64::NAN, f64::INFINITY, -0.5, 0.0, 1e6] {
        let error = group.set_learning_rate(rate).expect_err("refused");
        assert!(error.to_string().contains("learning_rate"), "{error}");
        assert_eq!(group.learning_rate_tensor().double_value(&[]), 0.5);
    }
}

#[test]
fn adamw_steps_on_device_step_counts() {
    let config = AdamWConfig {
        learning_rate: 0.01,
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    let (parameter, mut group) = lone_parameter(GroupOptimizerConfig::AdamW(config));
    group.step().expect("adamw step");
    // First step: m_hat = g, v_hat = g^2, so the update is lr g / (|g| + eps)
    // after the decoupled decay p (1 - lr wd).
    let expected: Vec<f32> = [1.0f32, -2.0, 0.5]
        .iter()
        .zip([0.5f32, 1.0, -1.0])
        .map(|(p, g)| p * (1.0 - 0.01 * 0.1) - 0.01 * g / (g.abs() + 1e-8))
        .collect();
    assert_close(&values(&parameter), &expected);
    let state = group.state_tensors();
    assert_eq!(state.len(), 3, "exp_avg, exp_avg_sq, step");
    assert_eq!(
        state[2].double_value(&[]),
        1.0,
        "per-parameter step on the device"
    );
    assert_eq!(group.step_count_tensor().double_value(&[]), 1.0);
}

#[test]
fn rollback_zeroes_every_groups_state_in_place() {
    let mut model = model();
    germinate_training(&mut model, "a");
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    for _ in 0..2 {
        optimizers.zero_grad().expect("zero");
        backward(&model);
        optimizers.step().expect("step");
    }
    let addresses: Vec<usize> = optimizers
        .keys()
        .iter()
        .flat_map(|key| optimizers.group(*key).expect("state").state_tensors())
        .map(|tensor| tensor.data_ptr() as usize)
        .collect();
    for key in optimizers.keys() {
        assert!(!all_zero(
            &optimizers.group(key).expect("state").state_tensors()
        ));
    }
    optimizers.rollback().expect("rollback");
    for key in optimizers.keys() {
        let group = optimizers.group(key).expect("state kept");
        assert!(all_zero(&group.state_tensors()), "{key}: momentum reset");
        assert_eq!(group.step_count_tensor().double_value(&[]), 0.0);
    }
    let after: Vec<usize> = optimizers
        .keys()
        .iter()
        .flat_map(|key| optimizers.group(*key).expect("state").state_tensors())
        .map(|tensor| tensor.data_ptr() as usize)
        .collect();
    assert_eq!(addresses, after, "zeroed in place, not reallocated");
    // The next step is a first step again: every parameter moves by lr * grad.
    optimizers.zero_grad().expect("zero");
    backward(&model);
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("seed");
    let before = copies(seed.parameters());
    let grads: Vec<Tensor> = seed.parameters().iter().map(|p| p.grad().copy()).collect();
    optimizers.step().expect("first step again");
    let seed = optimizers.group(GroupKey::Seed(SLOT)).expect("seed");
    for ((old, new), grad) in before.iter().zip(seed.parameters()).zip(&grads) {
        let moved = (old - new.detach()) - grad * 0.01;
        assert!(moved.abs().max().double_value(&[]) < 1e-6);
    }
    // Dropping is the other reset, in the same place.
    optimizers
        .reset(GroupKey::Seed(SLOT), StateReset::Drop)
        .expect("drop");
    assert_eq!(optimizers.keys(), [GroupKey::Host]);
    assert!(matches!(
        optimizers.set_learning_rate(GroupKey::Seed(SLOT), 0.1),
        Err(Error::InvalidConfig { .. })
    ));
}

// Moved from kasmina's hardening tests with the seed learning rate: the
// trainer's optimizer configuration refuses non-finite, negative, zero and
// huge learning rates, and out-of-range momentum, naming the field.
#[test]
fn non_finite_or_negative_seed_learning_rates_are_refused() {
    for rate in [f64::NAN, f64::INFINITY, -0.01, 0.0, 1e6] {
        for host in [false, true] {
            let mut config = OptimizerConfig::default();
            let setting = GroupOptimizerConfig::sgd(rate, 0.9);
            if host {
                config.host = setting;
            } else {
                config.seed = setting;
            }
            let error = config.validate().expect_err("bad learning rate");
            let field = if host {
                "OptimizerConfig.host.learning_rate"
            } else {
                "OptimizerConfig.seed.learning_rate"
            };
            assert!(
                error.to_string().contains(field),
                "names the field: {error}"
            );
            assert!(GroupOptimizers::new(config, Device::Cpu).is_err());
        }
    }
    for momentum in [f64::NAN, -0.5, 1.5, 1.0] {
        let config = OptimizerConfig {
            seed: GroupOptimizerConfig::sgd(0.01, momentum),
            ..OptimizerConfig::default()
        };
        let error = config.validate().expect_err("bad momentum");
        assert!(error.to_string().contains("seed.momentum"), "{error}");
    }
    let mut config = OptimizerConfig::default();
    for (bad, field) in [
        (
            AdamWConfig {
                beta1: 1.0,
                ..AdamWConfig::default()
            },
            "beta1",
        ),
        (
            AdamWConfig {
                beta2: f64::NAN,
                ..AdamWConfig::default()
            },
            "beta2",
        ),
        (
            AdamWConfig {
                eps: 0.0,
                ..AdamWConfig::default()
            },
            "eps",
        ),
        (
            AdamWConfig {
                weight_decay: -1.0,
                ..AdamWConfig::default()
            },
            "weight_decay",
        ),
        (
            AdamWConfig {
                learning_rate: f64::NEG_INFINITY,
                ..AdamWConfig::default()
            },
            "learning_rate",
        ),
    ] {
        config.host = GroupOptimizerConfig::AdamW(bad);
        let error = config.validate().expect_err("bad adamw");
        assert!(
            error.to_string().contains(&format!("host.{field}")),
            "{error}"
        );
    }
}

#[test]
fn the_optimizer_config_reads_back_and_refuses_unknown_keys() {
    let config = OptimizerConfig {
        host: GroupOptimizerConfig::AdamW(AdamWConfig::default()),
        seed: GroupOptimizerConfig::Sgd(SgdConfig {
            learning_rate: 0.02,
            momentum: 0.5,
        }),
    };
    let json = serde_json::to_string(&config).expect("json");
    let back: OptimizerConfig = serde_json::from_str(&json).expect("read back");
    assert_eq!(back, config);
    let misspelt = json.replace("momentum", "momentun");
    assert!(serde_json::from_str::<OptimizerConfig>(&misspelt).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    // Moved from kasmina's `configs_accept_exactly_their_ranges` with the
    // seed learning rate and momentum.
    #[test]
    fn optimizer_configs_accept_exactly_their_ranges(
        lr in extreme_f64(),
        momentum in extreme_f64(),
    ) {
        let config = OptimizerConfig {
            seed: GroupOptimizerConfig::sgd(lr, momentum),
            ..OptimizerConfig::default()
        };
        let valid = lr.is_finite() && lr > 0.0 && lr <= 100.0 && (lr as f32) > 0.0
            && (0.0..1.0).contains(&momentum);
        prop_assert_eq!(config.validate().is_ok(), valid, "{:?}", config);
        prop_assert_eq!(GroupOptimizers::new(config, Device::Cpu).is_ok(), valid);
    }
}

#[test]
fn the_groups_count_their_steps_together_and_a_group_with_nothing_to_update_does_not() {
    let mut model = model();
    let mut optimizers =
        GroupOptimizers::for_model(OptimizerConfig::default(), &mut model).expect("optimizers");
    germinate_training(&mut model, "a");
    optimizers.sync(&mut model).expect("sync");
    let count = |optimizers: &GroupOptimizers, key: GroupKey| {
        optimizers
            .group(key)
            .expect("state")
            .step_count_tensor()
            .double_value(&[])
    };
    backward(&model);
    optimizers.step().expect("step");
    assert_eq!(count(&optimizers, GroupKey::Host), 1.0);
    assert_eq!(count(&optimizers, GroupKey::Seed(SLOT)), 1.0);
    // The seed frozen: its group has nothing to update and does not count;
    // the host's does. Zeroing reaches every group's gradients.
    for parameter in optimizers
        .group(GroupKey::Seed(SLOT))
        .expect("seed")
        .parameters()
    {
        let _frozen = parameter.shallow_clone().set_requires_grad(false);
    }
    optimizers.step().expect("step");
    assert_eq!(count(&optimizers, GroupKey::Host), 2.0);
    assert_eq!(count(&optimizers, GroupKey::Seed(SLOT)), 1.0);
    optimizers.zero_grad().expect("zero");
    for key in [GroupKey::Host, GroupKey::Seed(SLOT)] {
        for parameter in optimizers.group(key).expect("state").parameters() {
            let grad = parameter.grad();
            assert!(!grad.defined() || all_zero(&[grad]), "{key:?}");
        }
    }
}
