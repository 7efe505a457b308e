//! The epoch-boundary controller: observations refuse impossible metrics,
//! and the decision deadline (timeout, stale answers, errors, panics); the
//! heuristic controller's rules are tested in tamiyo; `apply` is in
//! `controller_apply.rs`.

use std::time::Duration;

use kasmina::host::SlotId;
use leyline::proto::SeedState;
use leyline::telemetry as names;
use leyline::{BlueprintAction, Collector, LifecycleOp, Telemetry};
use tolaria::Error;
use tolaria::controller::{
    Controller, DeadlineOutcome, Decision, DecisionDeadline, EpochMetrics, EpochObservation,
};

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

#[test]
fn observation_rejects_impossible_metrics() {
    for bad in [
        metrics(f64::NAN, 50.0),
        metrics(1.0, 100.5),
        metrics(1.0, -0.1),
        metrics(f64::INFINITY, 50.0),
    ] {
        let error = EpochObservation::new(0, bad, vec![], vec![R0C0]).expect_err("refused");
        assert!(matches!(error, Error::Controller { .. }), "{error}");
    }
}

// ---- deadline ----

struct Fixed(Decision);

impl Controller for Fixed {
    fn decide(&mut self, _: &EpochObservation) -> tolaria::Result<Decision> {
        Ok(self.0.clone())
    }
}

/// Sleeps `sleep` on its first call and answers GERMINATE then; later calls
/// answer ADVANCE(epoch-specific slot) at once.
struct SlowFirst {
    sleep: Duration,
    calls: u32,
}

impl Controller for SlowFirst {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.calls += 1;
        if self.calls == 1 {
            std::thread::sleep(self.sleep);
            return Ok(Decision::germinate(R0C0, BlueprintAction::Norm));
        }
        let slot = if observation.epoch.is_multiple_of(2) {
            R0C0
        } else {
            R0C1
        };
        Ok(Decision::advance(slot))
    }
}

/// Panics (first call) or errors (second call), then answers FOSSILIZE.
struct Unreliable {
    calls: u32,
}

impl Controller for Unreliable {
    fn decide(&mut self, _: &EpochObservation) -> tolaria::Result<Decision> {
        self.calls += 1;
        match self.calls {
            1 => panic!("controller exploded"),
            2 => Err(Error::Controller {
                field: "test",
                reason: "refused to decide".to_owned(),
            }),
            _ => Ok(Decision::fossilize(R0C1)),
        }
    }
}

fn collector() -> (Collector, Telemetry) {
    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    (collector, telemetry)
}

#[test]
fn deadline_returns_a_fast_decision() {
    let (collector, telemetry) = collector();
    let answer = Decision::prune(R0C1);
    let mut runner =
        DecisionDeadline::new(Fixed(answer.clone()), Duration::from_millis(500), telemetry)
            .expect("runner");
    for epoch in 0..3 {
        let outcome = runner.decide(&obs(epoch, 1.0, 50.0, vec![]));
        assert_eq!(outcome, DeadlineOutcome::Decided(answer.clone()));
        assert_eq!(outcome.decision(), answer);
    }
    assert_eq!(runner.stats().decided, 3);
    assert_eq!(runner.stats().timeouts, 0);
    assert!(collector.packets().is_empty());
}

#[test]
fn deadline_timeout_gives_wait_and_telemetry_and_discards_the_late_answer() {
    let (collector, telemetry) = collector();
    let deadline = Duration::from_millis(30);
    let controller = SlowFirst {
        sleep: deadline * 10,
        calls: 0,
    };
    let mut runner = DecisionDeadline::new(controller, deadline, telemetry).expect("runner");
    let outcome = runner.decide(&obs(0, 1.0, 50.0, vec![]));
    let DeadlineOutcome::TimedOut { elapsed } = outcome else {
        panic!("expected a timeout, got {outcome:?}");
    };
    assert!(elapsed >= deadline, "{elapsed:?}");
    assert_eq!(outcome.decision().op, LifecycleOp::Wait);
    let events = collector.events_named(names::TOLARIA_TIMEOUT_DECISION_MISSED);
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].attributes.get("epoch").map(String::as_str),
        Some("0")
    );
    assert_eq!(
        collector.metric_values(names::TOLARIA_TIMEOUT_DECISIONS_TOTAL),
        [1.0]
    );
    assert_eq!(
        collector.metric_values(names::TOLARIA_TIMEOUT_DEADLINE_MS),
        [30.0]
    );
    let elapsed_ms = collector.metric_values(names::TOLARIA_TIMEOUT_ELAPSED_MS);
    assert!(
        elapsed_ms.len() == 1 && elapsed_ms[0] >= 30.0,
        "{elapsed_ms:?}"
    );

    // Let the late GERMINATE arrive; the next request gets its own answer.
    std::thread::sleep(deadline * 20);
    let outcome = runner.decide(&obs(1, 1.0, 50.0, vec![]));
    assert_eq!(outcome, DeadlineOutcome::Decided(Decision::advance(R0C1)));
    let outcome = runner.decide(&obs(2, 1.0, 50.0, vec![]));
    assert_eq!(outcome, DeadlineOutcome::Decided(Decision::advance(R0C0)));
    let stats = runner.stats();
    assert_eq!(
        (stats.timeouts, stats.stale_discarded, stats.decided),
        (1, 1, 2)
    );
    assert_eq!(
        collector
            .events_named(names::TOLARIA_TIMEOUT_DECISION_MISSED)
            .len(),
        1
    );
}

#[test]
fn deadline_survives_a_panicking_and_an_erroring_controller() {
    let (collector, telemetry) = collector();
    // Generous: a panic's backtrace is symbolised on the worker before the
    // failure is reported, which takes seconds on a loaded machine; this
    // test is about failures, not timing.
    let mut runner =
        DecisionDeadline::new(Unreliable { calls: 0 }, Duration::from_secs(20), telemetry)
            .expect("runner");
    let panicked = runner.decide(&obs(0, 1.0, 50.0, vec![]));
    let DeadlineOutcome::Failed { reason } = &panicked else {
        panic!("expected a failure, got {panicked:?}");
    };
    assert!(reason.contains("controller exploded"), "{reason}");
    assert_eq!(panicked.decision().op, LifecycleOp::Wait);
    let errored = runner.decide(&obs(1, 1.0, 50.0, vec![]));
    let DeadlineOutcome::Failed { reason } = &errored else {
        panic!("expected a failure, got {errored:?}");
    };
    assert!(reason.contains("refused to decide"), "{reason}");
    let events = collector.events_named(names::TOLARIA_CONTROLLER_FAILED);
    assert_eq!(events.len(), 2);
    assert_eq!(
        runner.decide(&obs(2, 1.0, 50.0, vec![])),
        DeadlineOutcome::Decided(Decision::fossilize(R0C1))
    );
    assert_eq!(runner.stats().failures, 2);
    assert!(
        collector
            .events_named(names::TOLARIA_TIMEOUT_DECISION_MISSED)
            .is_empty()
    );
}

#[test]
fn deadline_must_be_positive_and_bounded() {
    for bad in [Duration::ZERO, Duration::from_secs(3601)] {
        let error = DecisionDeadline::new(Fixed(Decision::wait()), bad, Telemetry::disabled())
            .expect_err("refused");
        assert!(
            matches!(
                error,
                Error::Controller {
                    field: "deadline",
                    ..
                }
            ),
            "{error}"
        );
    }
}
