//! `PolicyController` behind Tolaria's `Controller` trait: it drives
//! decisions from observations of a real Kasmina model that Tolaria's
//! `apply` carries out, keeps its LSTM state between calls, is greedy and
//! reproducible when asked, reads its last action's success off the next
//! observation, and refuses a policy of the wrong size.

mod common;

use common::{R0C0, R0C1, R0C2, metrics, observation, seed, tiny_model};
use kasmina::host::SlotId;
use leyline::{BlueprintAction, LifecycleOp, SeedStage};
use tamiyo::controller::{PolicyController, PolicyControllerConfig};
use tamiyo::features::{base, slot_extras};
use tamiyo::masks::{MaskConfig, observation_masks};
use tamiyo::policy::{Policy, PolicyConfig, SampleMode, SamplingConfig};
use tch::Device;
use tolaria::controller::{Controller, Decision, EpochObservation, apply};

fn policy(slots: usize, seed: i64) -> Policy {
    tch::manual_seed(seed);
    Policy::new(
        PolicyConfig {
            num_slots: slots,
            feature_dim: 32,
            hidden_dim: 32,
            lstm_layers: 1,
        },
        Device::Cpu,
    )
    .expect("policy")
}

fn sampled(seed: u64) -> PolicyControllerConfig {
    PolicyControllerConfig {
        max_epochs: 25,
        sampling: SamplingConfig {
            mode: SampleMode::Stochastic,
            floors: None,
        },
        seed,
        ..PolicyControllerConfig::default()
    }
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn the_controller_drives_a_kasmina_model_through_tolaria() {
    let slots = [R0C0, R0C1, R0C2];
    let mut model = tiny_model(&slots);
    let mut controller =
        PolicyController::new(policy(3, 1), &slots, sampled(5)).expect("controller");
    assert_send(&controller);
    let mut ops = Vec::new();
    for epoch in 0..25_u32 {
        let accuracy = 40.0 + f64::from(epoch);
        model.record_accuracy(accuracy, accuracy).expect("accuracy");
        let observation = EpochObservation::from_model(
            &model,
            epoch,
            metrics(2.0 - f64::from(epoch) * 0.05, accuracy),
        )
        .expect("observation");
        let masks = observation_masks(&observation, &controller.config().masks).expect("masks");
        let decision = controller.decide(&observation).expect("decide");
        assert!(
            masks.allows(decision.op),
            "epoch {epoch}: {decision:?} is masked"
        );
        if let Some(slot) = decision.slot {
            let index = slots.iter().position(|s| *s == slot).expect("known slot");
            assert!(
                masks.slots_for(decision.op)[index],
                "epoch {epoch}: {decision:?}"
            );
        }
        if decision.op == LifecycleOp::Germinate {
            let blueprint = decision.blueprint.expect("blueprint");
            assert_ne!(blueprint, BlueprintAction::Noop);
            assert!(BlueprintAction::CNN.contains(&blueprint));
        }
        assert!((0.0..=1.0).contains(&decision.confidence));
        assert_eq!(decision.reason, "policy");
        let action = controller.last_action().expect("action");
        assert_eq!(action.op, decision.op);
        // Tolaria carries every decision out (SET_ALPHA_TARGET is masked).
        apply(&decision, &mut model, &format!("seed-{epoch}")).expect("apply");
        model.step_epoch().expect("tick");
        ops.push(decision.op);
    }
    assert!(ops.iter().any(|op| *op != LifecycleOp::Wait), "{ops:?}");
    assert!(controller.last_value().is_some_and(f64::is_finite));
}

#[test]
fn the_lstm_state_is_kept_between_decisions_and_reset_per_episode() {
    let slots = [R0C0, R0C1];
    let mut controller =
        PolicyController::new(policy(2, 2), &slots, sampled(1)).expect("controller");
    let zeros = controller
        .hidden()
        .h
        .abs()
        .sum(tch::Kind::Float)
        .double_value(&[]);
    assert_eq!(zeros, 0.0);
    let observation = observation(0, 2.0, 30.0, vec![], &slots);
    controller.decide(&observation).expect("decide");
    let first = controller.hidden().h.copy();
    assert!(first.abs().sum(tch::Kind::Float).double_value(&[]) > 0.0);
    assert_eq!(first.size(), [1, 1, 32]);
    controller.decide(&observation).expect("decide");
    let second = controller.hidden().h.copy();
    assert!((&second - &first).abs().max().double_value(&[]) > 0.0);
    controller.reset().expect("reset");
    assert_eq!(
        controller
            .hidden()
            .h
            .abs()
            .sum(tch::Kind::Float)
            .double_value(&[]),
        0.0
    );
    assert!(controller.last_action().is_none());
}

#[test]
fn greedy_controllers_with_the_same_weights_agree() {
    let slots = [R0C0, R0C1];
    let source = policy(2, 3);
    let mut copy = policy(2, 99);
    copy.var_store_mut().copy(source.var_store()).expect("copy");
    let greedy = PolicyControllerConfig {
        max_epochs: 25,
        ..PolicyControllerConfig::default()
    };
    assert_eq!(greedy.sampling.mode, SampleMode::Greedy);
    let mut a = PolicyController::new(source, &slots, greedy).expect("a");
    let mut b = PolicyController::new(copy, &slots, greedy).expect("b");
    for epoch in 0..6 {
        let seeds = if epoch >= 3 {
            vec![seed("s", R0C1, "norm", SeedStage::Training)]
        } else {
            vec![]
        };
        let obs = observation(epoch, 2.0, 30.0 + f64::from(epoch), seeds, &slots);
        let (da, db): (Decision, Decision) =
            (a.decide(&obs).expect("a"), b.decide(&obs).expect("b"));
        assert_eq!(da, db, "epoch {epoch}");
        assert_eq!(a.last_action(), b.last_action());
    }
}

#[test]
fn the_last_action_and_its_success_are_read_off_the_next_observation() {
    // One slot, an empty model: the sampled policy chooses between WAIT and
    // GERMINATE. Drive it until it germinates and Tolaria applies it.
    let slots = [R0C0];
    let mut model = tiny_model(&slots);
    let mut controller =
        PolicyController::new(policy(1, 4), &slots, sampled(9)).expect("controller");
    let mut germinated = false;
    for epoch in 0..200_u32 {
        let observation =
            EpochObservation::from_model(&model, epoch, metrics(1.0, 50.0)).expect("observation");
        let decision = controller
            .decide_with(
                &observation,
                Some(&model.op_availability(3)),
                &slot_extras(&model),
            )
            .expect("decide");
        if germinated {
            let raw = controller.last_observation().expect("observation");
            assert!(raw.base.last_action_success, "the seed appeared");
            assert_eq!(raw.base.last_op, LifecycleOp::Germinate);
            break;
        }
        if decision.op == LifecycleOp::Germinate {
            apply(&decision, &mut model, "seed-1").expect("germinate");
            germinated = true;
        }
    }
    assert!(germinated, "a sampled policy germinates into an empty slot");

    // A GERMINATE the driver never carried out reads as a failure.
    let mut controller =
        PolicyController::new(policy(1, 4), &slots, sampled(9)).expect("controller");
    let empty = observation(0, 1.0, 50.0, vec![], &slots);
    let mut failed = false;
    for _ in 0..200 {
        let decision = controller.decide(&empty).expect("decide");
        if decision.op != LifecycleOp::Germinate {
            continue;
        }
        controller.decide(&empty).expect("decide");
        let raw = controller.last_observation().expect("observation");
        assert!(!raw.base.last_action_success, "nothing germinated");
        let mut row = vec![0.0_f32; 54];
        let mut blueprints = vec![0_i64; 1];
        raw.encode_into(&mut row, &mut blueprints).expect("encode");
        assert_eq!(row[base::LAST_ACTION_SUCCESS], 0.0);
        assert_eq!(row[base::LAST_OP + 1], 1.0, "GERMINATE");
        failed = true;
        break;
    }
    assert!(failed);

    // A driver that knows the outcome records it.
    controller.record_outcome(LifecycleOp::Prune, true);
    controller.decide(&empty).expect("decide");
    let raw = controller.last_observation().expect("observation");
    assert_eq!(raw.base.last_op, LifecycleOp::Prune);
    assert!(raw.base.last_action_success);
}

#[test]
fn a_policy_of_the_wrong_size_and_bad_observations_are_refused() {
    let slots: [SlotId; 2] = [R0C0, R0C1];
    assert!(
        PolicyController::new(policy(3, 5), &slots, PolicyControllerConfig::default()).is_err()
    );
    let mut controller =
        PolicyController::new(policy(2, 5), &slots, PolicyControllerConfig::default())
            .expect("controller");
    let wrong = observation(0, 1.0, 50.0, vec![], &[R0C0, R0C2]);
    let error = controller.decide(&wrong).expect_err("slot mismatch");
    assert!(
        matches!(
            error,
            tolaria::Error::Controller {
                field: "tamiyo.policy",
                ..
            }
        ),
        "{error}"
    );
    assert!(controller.last_action().is_none(), "nothing changed");
    // The default masks leave SET_ALPHA_TARGET out for Tolaria's apply.
    assert!(
        PolicyControllerConfig::default()
            .masks
            .disable_set_alpha_target
    );
    assert_eq!(MaskConfig::default().max_seeds, 0);
}

#[test]
fn a_decision_becomes_the_action_that_carries_it_out() {
    use tamiyo::controller::{to_action, to_decision};
    let slots = [R0C0, R0C1, R0C2];
    for decision in [
        Decision::wait(),
        Decision::germinate(R0C1, BlueprintAction::ConvLight),
        Decision::advance(R0C2),
        Decision::fossilize(R0C0),
        Decision::prune(R0C1),
    ] {
        let action = to_action(&decision, &slots).expect("an action");
        let back = to_decision(&action, &slots, 1.0).expect("a decision");
        assert_eq!(back.op, decision.op);
        assert_eq!(back.blueprint, decision.blueprint);
        if decision.op != LifecycleOp::Wait {
            assert_eq!(back.slot, decision.slot);
        }
    }
    let elsewhere = Decision::advance(SlotId::parse("r1c0").expect("slot"));
    assert!(to_action(&elsewhere, &slots).is_err(), "a slot not offered");
    let no_slot = Decision {
        op: LifecycleOp::Prune,
        ..Decision::wait()
    };
    assert!(to_action(&no_slot, &slots).is_err(), "an op without a slot");
}
