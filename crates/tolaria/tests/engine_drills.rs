//! The `tolaria-timeout` and `tolaria-rollback` drills on the CPU: they
//! complete, recover, and emit exactly the telemetry names the seeds list.

use leyline::telemetry as names;
use tolaria::DeviceChoice;
use tolaria::engine::bench::{run_rollback_drill, run_timeout_drill};

#[test]
fn the_timeout_drill_waits_and_emits_the_timeout_telemetry() {
    let run = run_timeout_drill(DeviceChoice::Cpu, true).expect("drill");
    let entry = &run.measurements.results[0];
    assert_eq!(
        entry.metrics["timeouts"], entry.metrics["epochs"],
        "{entry:?}"
    );
    for name in [
        names::TOLARIA_TIMEOUT_DECISION_MISSED,
        names::TOLARIA_TIMEOUT_DECISIONS_TOTAL,
        names::TOLARIA_TIMEOUT_DEADLINE_MS,
        names::TOLARIA_TIMEOUT_ELAPSED_MS,
        names::TOLARIA_TRAINING_LATENCY_MS,
    ] {
        assert!(
            run.measurements.telemetry_names.iter().any(|n| n == name),
            "{name} missing from {:?}",
            run.measurements.telemetry_names
        );
    }
}

#[test]
fn the_rollback_drill_recovers_and_emits_the_rollback_telemetry() {
    let run = run_rollback_drill(DeviceChoice::Cpu, true).expect("drill");
    let entry = &run.measurements.results[0];
    assert_eq!(entry.metrics["pruned_seeds"], 1.0, "{entry:?}");
    assert_eq!(entry.metrics["incident_loss_finite"], 0.0);
    assert!(entry.metrics["loss_after"].is_finite());
    assert!(entry.metrics["restored_tensors"] > 0.0);
    for name in [
        names::TOLARIA_ROLLBACK_TRIGGERED,
        names::TOLARIA_ROLLBACK_COMPLETED,
        names::TOLARIA_ROLLBACK_TOTAL,
        names::TOLARIA_ROLLBACK_RECOVERY_MS,
        names::TOLARIA_ROLLBACK_CONSECUTIVE_PANICS,
        names::KASMINA_SEED_PRUNED,
    ] {
        assert!(
            run.measurements.telemetry_names.iter().any(|n| n == name),
            "{name} missing from {:?}",
            run.measurements.telemetry_names
        );
    }
}
