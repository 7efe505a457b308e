//! Same seed, same results: a CNN host with two seeds (conv_light at r0c1,
//! attention at r0c2) trained through germinate -> TRAINING -> BLENDING ->
//! HOLDING -> FOSSILIZED twice from the same `tch::manual_seed` ends with
//! bitwise-identical parameters and buffers on CPU. Host and seeds train
//! with the test-local group SGD (`common::sgd`), which follows the model's
//! parameter-group events.

mod common;

use common::sgd::GroupSgd;
use common::{TEST_STAGE_EPOCHS, slot_config};
use kasmina::attribution::counterfactual_contribution;
use kasmina::gate::GateMode;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId};
use kasmina::lifecycle::GerminationOptions;
use kasmina::model::MorphogeneticModel;
use leyline::SeedStage;
use leyline::Telemetry;
use tch::{Device, Kind, Tensor};

const STEPS_PER_EPOCH: usize = 2;
const MAX_EPOCHS: usize = 16;

struct RunResult {
    stages: Vec<Option<SeedStage>>,
    state: Vec<(String, Tensor)>,
    initial: Vec<(String, Tensor)>,
}

/// Every variable (parameters and buffers) of host and seeds, by name.
fn snapshot(model: &MorphogeneticModel) -> Vec<(String, Tensor)> {
    let mut state: Vec<(String, Tensor)> = model
        .host()
        .var_store()
        .variables()
        .into_iter()
        .map(|(name, tensor)| (format!("host.{name}"), tensor.detach().copy()))
        .collect();
    for slot in model.slots() {
        if let Some(module) = slot.seed_module() {
            for (name, tensor) in module.var_store().variables() {
                state.push((format!("{}.{name}", slot.id()), tensor.detach().copy()));
            }
        }
    }
    state.sort_by(|a, b| a.0.cmp(&b.0));
    state
}

fn run(seed: i64) -> RunResult {
    // One intra-op thread: tiny tensors gain nothing from more, and OpenMP
    // start-up and spinning cost seconds on a 2-core machine.
    tch::set_num_threads(1);
    tch::manual_seed(seed);
    let config = CnnHostConfig {
        base_channels: 4,
        ..CnnHostConfig::fashion_mnist()
    };
    let host = CnnHost::new(config, Device::Cpu).expect("host");
    let slots = [SlotId::new(0, 1), SlotId::new(0, 2)];
    let mut model = MorphogeneticModel::new(
        host,
        &slots,
        slot_config(GateMode::Permissive),
        Telemetry::disabled(),
    )
    .expect("model");
    let images = Tensor::randn([16, 1, 28, 28], (Kind::Float, Device::Cpu));
    let labels = Tensor::randint(10, [16], (Kind::Int64, Device::Cpu));
    model
        .germinate(
            slots[0],
            "conv_light",
            GerminationOptions::new("seed-light"),
        )
        .expect("germinate conv_light");
    model
        .germinate(
            slots[1],
            "attention",
            GerminationOptions::new("seed-attention"),
        )
        .expect("germinate attention");
    let initial = snapshot(&model);
    let mut optimizer = GroupSgd::new(0.01, 0.9);

    for _ in 0..MAX_EPOCHS {
        for step in 0..STEPS_PER_EPOCH {
            let batch = images.narrow(0, (step * 8) as i64, 8);
            let batch_labels = labels.narrow(0, (step * 8) as i64, 8);
            optimizer.zero_grad(&mut model);
            let logits = model.forward(&batch, true).expect("forward");
            logits.cross_entropy_for_logits(&batch_labels).backward();
            model.measure_gradients().expect("measure");
            optimizer.step(&mut model);
        }
        let accuracy = tch::no_grad(|| {
            let logits = model.forward(&images, false).expect("eval");
            logits
                .argmax(1, false)
                .eq_tensor(&labels)
                .to_kind(Kind::Double)
                .mean(Kind::Double)
                .double_value(&[])
                * 100.0
        });
        model.record_accuracy(accuracy, accuracy).expect("accuracy");
        for slot in slots {
            let seed_slot = model.slot(slot).expect("slot");
            let stage = seed_slot.stage().expect("seed present");
            let state = seed_slot.state().expect("state");
            let ready = match stage {
                SeedStage::Germinated => true,
                SeedStage::Training => state.metrics().epochs_in_stage >= TEST_STAGE_EPOCHS,
                SeedStage::Blending => state.alpha_controller().is_settled(),
                SeedStage::Holding => true,
                _ => false,
            };
            if !ready {
                continue;
            }
            if stage == SeedStage::Holding {
                let contribution =
                    counterfactual_contribution(&model, slot, &images, &labels).expect("cf");
                model
                    .slot_mut(slot)
                    .expect("slot")
                    .set_counterfactual_contribution(contribution)
                    .expect("set cf");
            }
            let outcome = model.advance_stage(slot, None).expect("advance");
            assert!(outcome.passed, "{slot} {stage}: {}", outcome.message);
        }
        model.step_epoch().expect("step epoch");
    }
    RunResult {
        stages: model.slots().iter().map(|slot| slot.stage()).collect(),
        state: snapshot(&model),
        initial,
    }
}

#[test]
fn two_runs_with_the_same_seed_are_bitwise_identical() {
    let first = run(1234);
    let second = run(1234);
    assert_eq!(first.stages, vec![Some(SeedStage::Fossilized); 2]);
    assert_eq!(first.stages, second.stages);
    assert_eq!(first.state.len(), second.state.len());
    for ((name_a, a), (name_b, b)) in first.state.iter().zip(&second.state) {
        assert_eq!(name_a, name_b);
        assert!(a.equal(b), "{name_a} differs between runs");
    }
    // The runs really trained: parameters moved away from their initial values.
    let moved = first
        .initial
        .iter()
        .zip(&first.state)
        .filter(|((_, before), (_, after))| !before.equal(after))
        .count();
    assert!(
        moved > first.state.len() / 2,
        "only {moved} tensors changed"
    );
    // And another seed gives another result.
    let other = run(99);
    assert!(
        first
            .state
            .iter()
            .zip(&other.state)
            .any(|((_, a), (_, b))| !a.equal(b))
    );
}
