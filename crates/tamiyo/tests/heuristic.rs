//! The heuristic controller (reference §3.5) on hand-built observations:
//! stabilisation, plateau germination, advancing, pruning, blending and
//! holding rules, the ransomware check, embargo and blueprint penalties,
//! and the one `tamiyo.initiated` event of stabilisation.

use kasmina::host::SlotId;
use leyline::proto::{SeedMetricSet, SeedState};
use leyline::{AlphaMode, BlueprintAction, LifecycleOp, SeedStage};
use tamiyo::heuristic::{BLUEPRINT_ROTATION, HeuristicController, HeuristicState, SignalTracker};
use tolaria::controller::{Controller, Decision, EpochMetrics, EpochObservation};

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

fn obs(epoch: u32, val_loss: f64, val_accuracy: f64, seeds: Vec<SeedState>) -> EpochObservation {
    EpochObservation::new(
        epoch,
        metrics(val_loss, val_accuracy),
        seeds,
        vec![R0C0, R0C1],
    )
    .expect("observation")
}

fn seed(id: &str, slot: SlotId, blueprint: &str, stage: SeedStage) -> SeedState {
    SeedState {
        schema_version: leyline::SCHEMA_VERSION,
        seed_id: id.to_owned(),
        slot_id: slot.to_string(),
        blueprint_id: blueprint.to_owned(),
        stage: stage.value(),
        alpha_target: 1.0,
        alpha_mode: AlphaMode::Hold.value(),
        is_healthy: true,
        metrics: Some(SeedMetricSet {
            schema_version: leyline::SCHEMA_VERSION,
            val_accuracy: 60.0,
            ..SeedMetricSet::default()
        }),
        ..SeedState::default()
    }
}

fn with_metrics(mut seed: SeedState, edit: impl FnOnce(&mut SeedMetricSet)) -> SeedState {
    edit(seed.metrics.as_mut().expect("metrics"));
    seed
}

/// A heuristic fed flat epochs 0..=4 (loss 1.0, accuracy 60): stabilised
/// (epoch 3), plateau 4, still too early to germinate.
fn warmed_up() -> HeuristicController {
    let mut controller = HeuristicController::new();
    for epoch in 0..5 {
        let decision = controller
            .decide(&obs(epoch, 1.0, 60.0, vec![]))
            .expect("decide");
        assert!(decision.is_wait(), "epoch {epoch}: {decision:?}");
    }
    controller
}

fn decide(controller: &mut HeuristicController, observation: &EpochObservation) -> Decision {
    controller.decide(observation).expect("decide")
}

#[test]
fn heuristic_waits_until_stabilised_then_until_epoch_five_then_germinates() {
    let mut controller = HeuristicController::new();
    let reasons: Vec<&str> = (0..5)
        .map(|epoch| decide(&mut controller, &obs(epoch, 1.0, 60.0, vec![])).reason)
        .collect();
    // Stable epochs 1, 2, 3 latch stabilisation at epoch 3.
    assert_eq!(
        reasons,
        [
            "not_stabilized",
            "not_stabilized",
            "not_stabilized",
            "too_early",
            "too_early"
        ]
    );
    assert!(controller.tracker().is_stabilized());
    let decision = decide(&mut controller, &obs(5, 1.0, 60.0, vec![]));
    assert_eq!(decision.op, LifecycleOp::Germinate);
    assert_eq!(decision.slot, Some(R0C0));
    assert_eq!(decision.blueprint, Some(BlueprintAction::ConvLight));
    // plateau 5 -> confidence min(1, 5/5).
    assert_eq!(decision.confidence, 1.0);
}

#[test]
fn heuristic_germinates_at_exactly_three_plateau_epochs() {
    let mut controller = HeuristicController::new();
    // +0.5 pp per epoch is exactly the threshold: not a plateau epoch.
    for epoch in 0..5u32 {
        let accuracy = 50.0 + 0.5 * f64::from(epoch);
        decide(&mut controller, &obs(epoch, 1.0, accuracy, vec![]));
        assert_eq!(controller.tracker().plateau_epochs(), 0, "epoch {epoch}");
    }
    assert!(controller.tracker().is_stabilized());
    for epoch in 5..7 {
        let decision = decide(&mut controller, &obs(epoch, 1.0, 52.0, vec![]));
        assert_eq!(decision.reason, "no_plateau", "epoch {epoch}");
    }
    let decision = decide(&mut controller, &obs(7, 1.0, 52.0, vec![]));
    assert_eq!(decision.op, LifecycleOp::Germinate);
    assert!((decision.confidence - 0.6).abs() < 1e-12, "{decision:?}");
}

#[test]
fn stabilisation_emits_tamiyo_initiated_once() {
    let collector = leyline::Collector::new();
    let mut controller =
        HeuristicController::new().with_telemetry(leyline::Telemetry::new(collector.clone()));
    for epoch in 0..8 {
        decide(&mut controller, &obs(epoch, 1.0, 60.0, vec![]));
    }
    let events = collector.events_named(leyline::telemetry::TAMIYO_INITIATED);
    assert_eq!(events.len(), 1, "one event for the one-way latch");
    // Stable epochs 1, 2, 3 latch stabilisation at epoch 3.
    assert_eq!(
        events[0].attributes.get("epoch").map(String::as_str),
        Some("3")
    );
    // Restored already stabilised, it does not announce it again.
    let restored = collector.clone();
    let mut again = HeuristicController::from_state(&controller.export_state())
        .expect("state")
        .with_telemetry(leyline::Telemetry::new(restored));
    decide(&mut again, &obs(8, 1.0, 60.0, vec![]));
    assert_eq!(
        collector
            .events_named(leyline::telemetry::TAMIYO_INITIATED)
            .len(),
        1
    );
}

#[test]
fn tracker_stabilisation_needs_three_consecutive_stable_epochs() {
    let mut tracker = SignalTracker::default();
    // Loss falling 10% per epoch is not stable.
    let mut loss = 2.0;
    for _ in 0..6 {
        tracker.update(loss, 50.0).expect("finite");
        loss *= 0.9;
    }
    assert!(!tracker.is_stabilized());
    // Two stable epochs (a 4% rise is inside (-5%, 3%)), then a 10% drop
    // resets the count; three more latch it.
    tracker.update(loss * 1.04, 50.0).expect("finite");
    tracker.update(loss * 1.04, 50.0).expect("finite");
    tracker.update(loss * 0.5, 50.0).expect("finite");
    assert!(!tracker.is_stabilized());
    tracker.update(loss * 0.5, 50.0).expect("finite");
    tracker.update(loss * 0.5, 50.0).expect("finite");
    assert!(!tracker.is_stabilized());
    tracker.update(loss * 0.5, 50.0).expect("finite");
    assert!(tracker.is_stabilized());
    // A one-way latch.
    tracker.update(loss * 100.0, 50.0).expect("finite");
    assert!(tracker.is_stabilized());
}

#[test]
fn heuristic_waits_without_an_available_slot() {
    let mut controller = warmed_up();
    let fossils = vec![
        seed("a", R0C0, "norm", SeedStage::Fossilized),
        seed("b", R0C1, "norm", SeedStage::Embargoed),
    ];
    let decision = decide(&mut controller, &obs(5, 1.0, 60.0, fossils));
    assert_eq!(decision.reason, "no_slot");
    // A fossil and a failed seed are not live: with r0c1 free, germinate there.
    let one = vec![seed("a", R0C0, "norm", SeedStage::Fossilized)];
    let decision = decide(&mut controller, &obs(6, 1.0, 60.0, one));
    assert_eq!(decision.op, LifecycleOp::Germinate);
    assert_eq!(decision.slot, Some(R0C1));
}

#[test]
fn heuristic_advances_germinated_and_training_seeds() {
    let mut controller = warmed_up();
    let germinated = seed("s", R0C0, "conv_light", SeedStage::Germinated);
    assert_eq!(
        decide(&mut controller, &obs(5, 1.0, 60.0, vec![germinated])),
        Decision::advance(R0C0).because("germinated", 1.0)
    );
    let training = seed("s", R0C0, "conv_light", SeedStage::Training);
    let decision = decide(&mut controller, &obs(6, 1.0, 60.0, vec![training]));
    assert_eq!(
        (decision.op, decision.slot),
        (LifecycleOp::Advance, Some(R0C0))
    );
}

#[test]
fn heuristic_prunes_failing_training_seeds_at_the_thresholds() {
    let cases = [
        (5, -2.0, LifecycleOp::Advance),  // improvement not below -2.0
        (5, -2.01, LifecycleOp::Prune),   // below -2.0 after 5 epochs
        (4, -50.0, LifecycleOp::Advance), // too few epochs in stage
        (9, -3.0, LifecycleOp::Prune),
    ];
    for (epochs, improvement, expected) in cases {
        let mut controller = warmed_up();
        let training = with_metrics(seed("s", R0C0, "conv_light", SeedStage::Training), |m| {
            m.epochs_in_stage = epochs;
            m.improvement_since_stage_start = improvement;
        });
        let decision = decide(&mut controller, &obs(5, 1.0, 60.0, vec![training]));
        assert_eq!(
            decision.op, expected,
            "epochs {epochs}, improvement {improvement}"
        );
    }
}

#[test]
fn heuristic_blending_rules() {
    let base = seed("s", R0C0, "norm", SeedStage::Blending);
    let held = SeedState {
        alpha: 1.0,
        ..base.clone()
    };
    let ramping = SeedState {
        alpha: 0.4,
        alpha_mode: AlphaMode::Up.value(),
        ..base.clone()
    };
    let partial = SeedState {
        alpha: 0.7,
        alpha_target: 0.7,
        ..base.clone()
    };
    let failing = with_metrics(held.clone(), |m| {
        m.epochs_in_stage = 5;
        m.improvement_since_stage_start = -2.5;
    });
    for (state, expected) in [
        (held, LifecycleOp::Advance),
        (ramping, LifecycleOp::Wait),
        (partial, LifecycleOp::Wait),
        (failing, LifecycleOp::Prune),
    ] {
        let mut controller = warmed_up();
        let decision = decide(&mut controller, &obs(5, 1.0, 60.0, vec![state.clone()]));
        assert_eq!(decision.op, expected, "{state:?}");
    }
}

#[test]
fn heuristic_holding_rules() {
    let holding = |contribution: Option<f64>| {
        with_metrics(seed("s", R0C0, "norm", SeedStage::Holding), |m| {
            m.counterfactual_contribution = contribution;
        })
    };
    for (contribution, expected, reason) in [
        (None, LifecycleOp::Wait, "no_counterfactual"),
        (Some(0.5), LifecycleOp::Prune, "no_contribution"), // not above 0.5
        (Some(0.51), LifecycleOp::Fossilize, "contributes"),
        (Some(-1.0), LifecycleOp::Prune, "no_contribution"),
    ] {
        let mut controller = warmed_up();
        let decision = decide(
            &mut controller,
            &obs(5, 1.0, 60.0, vec![holding(contribution)]),
        );
        assert_eq!(
            (decision.op, decision.reason),
            (expected, reason),
            "{contribution:?}"
        );
    }
}

#[test]
fn heuristic_ransomware_check_prunes_a_contributor_that_lost_accuracy() {
    let mut controller = warmed_up();
    // First sight at 60% (the seed's baseline), contributing: fossilize.
    let first = with_metrics(seed("s", R0C0, "norm", SeedStage::Holding), |m| {
        m.counterfactual_contribution = Some(0.8);
    });
    let decision = decide(&mut controller, &obs(5, 1.0, 60.0, vec![first.clone()]));
    assert_eq!(decision.op, LifecycleOp::Fossilize);
    // Later at 59%: total improvement -1 with contribution 0.8 > 0.1.
    let later = with_metrics(first, |m| m.val_accuracy = 59.0);
    let decision = decide(&mut controller, &obs(6, 1.0, 59.0, vec![later]));
    assert_eq!(
        (decision.op, decision.reason),
        (LifecycleOp::Prune, "ransomware")
    );
}

#[test]
fn heuristic_embargo_after_prune_and_blueprint_penalty() {
    let mut controller = warmed_up();
    let failing = with_metrics(seed("s", R0C0, "conv_light", SeedStage::Training), |m| {
        m.epochs_in_stage = 5;
        m.improvement_since_stage_start = -3.0;
    });
    let decision = decide(&mut controller, &obs(10, 1.0, 60.0, vec![failing]));
    assert_eq!(decision.op, LifecycleOp::Prune);
    assert_eq!(controller.penalty(BlueprintAction::ConvLight), 2.0);
    // The pruned seed sits in cooldown in r0c0; r0c1 is free.
    for epoch in 11..15 {
        let cooldown = vec![seed("s", R0C0, "conv_light", SeedStage::Embargoed)];
        let decision = decide(&mut controller, &obs(epoch, 1.0, 60.0, cooldown));
        assert_eq!(decision.reason, "embargo", "epoch {epoch}");
    }
    // Decayed x0.5 per epoch: 2 -> 1 -> 0.5 -> 0.25 -> 0.125.
    assert_eq!(controller.penalty(BlueprintAction::ConvLight), 0.125);
    let decision = decide(&mut controller, &obs(15, 1.0, 60.0, vec![]));
    assert_eq!(decision.op, LifecycleOp::Germinate);
    // 0.0625 < 0.1: deleted.
    assert_eq!(controller.penalty(BlueprintAction::ConvLight), 0.0);
}

#[test]
fn heuristic_blueprint_rotation_skips_penalties_of_three() {
    let mut controller = warmed_up();
    let rotation: Vec<BlueprintAction> = (0..6).map(|_| controller.next_blueprint()).collect();
    assert_eq!(rotation[..5], BLUEPRINT_ROTATION);
    assert_eq!(rotation[5], BlueprintAction::ConvLight);

    let mut controller = warmed_up();
    let failing = |id: &str| {
        with_metrics(seed(id, R0C0, "conv_heavy", SeedStage::Training), |m| {
            m.epochs_in_stage = 5;
            m.improvement_since_stage_start = -3.0;
        })
    };
    decide(&mut controller, &obs(10, 1.0, 60.0, vec![failing("a")]));
    decide(&mut controller, &obs(11, 1.0, 60.0, vec![failing("b")]));
    // 2.0 * 0.5 + 2.0 = 3.0: at the threshold, skipped.
    assert_eq!(controller.penalty(BlueprintAction::ConvHeavy), 3.0);
    assert_eq!(controller.next_blueprint(), BlueprintAction::ConvLight);
    assert_eq!(controller.next_blueprint(), BlueprintAction::Attention);
}

#[test]
fn heuristic_with_several_live_seeds_takes_the_first_action() {
    let mut controller = warmed_up();
    let blending = SeedState {
        alpha: 0.4,
        alpha_mode: AlphaMode::Up.value(),
        ..seed("a", R0C0, "norm", SeedStage::Blending)
    };
    let germinated = seed("b", R0C1, "norm", SeedStage::Germinated);
    let decision = decide(
        &mut controller,
        &obs(5, 1.0, 60.0, vec![blending.clone(), germinated]),
    );
    assert_eq!(decision, Decision::advance(R0C1).because("germinated", 1.0));
    // Only waiting seeds: the first one's WAIT, and no germination.
    let decision = decide(&mut controller, &obs(6, 1.0, 60.0, vec![blending]));
    assert_eq!(
        (decision.op, decision.reason),
        (LifecycleOp::Wait, "blending")
    );
}

#[test]
fn exported_state_resumes_the_same_decisions_and_bad_state_is_refused() {
    // A controller with a prune behind it (penalty, embargo), a baseline and
    // a rotation position, exported through JSON as a checkpoint would.
    let mut original = warmed_up();
    let failing = with_metrics(seed("s", R0C0, "conv_light", SeedStage::Training), |m| {
        m.epochs_in_stage = 9;
        m.improvement_since_stage_start = -3.0;
    });
    let pruned = decide(&mut original, &obs(5, 1.0, 60.0, vec![failing]));
    assert_eq!(pruned.op, LifecycleOp::Prune);
    assert!(original.penalty(BlueprintAction::ConvLight) > 0.0);
    let json = serde_json::to_string(&original.export_state()).expect("json");
    let state: HeuristicState = serde_json::from_str(&json).expect("parse");
    assert_eq!(state, original.export_state());
    let mut restored = HeuristicController::from_state(&state).expect("restored");
    assert_eq!(restored.tracker(), original.tracker());
    for epoch in 6..16 {
        let observation = obs(epoch, 1.0, 60.0, vec![]);
        assert_eq!(
            decide(&mut restored, &observation),
            decide(&mut original, &observation),
            "epoch {epoch}"
        );
    }
    assert_eq!(restored.export_state(), original.export_state());

    let mut unknown = state.clone();
    unknown.penalties.insert("NOT_A_BLUEPRINT".to_owned(), 1.0);
    let mut negative = state.clone();
    negative.penalties.insert("CONV_HEAVY".to_owned(), -1.0);
    let mut rotation = state.clone();
    rotation.rotation = BLUEPRINT_ROTATION.len();
    let mut nan = state;
    nan.previous = Some((f64::NAN, 1.0));
    for (bad, field) in [
        (unknown, "penalties"),
        (negative, "penalties"),
        (rotation, "rotation"),
        (nan, "previous"),
    ] {
        let error = HeuristicController::from_state(&bad).expect_err("refused");
        assert!(error.to_string().contains(field), "{error}");
    }
}
