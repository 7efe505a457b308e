//! The hub as the workspace's one emitting trait: `leyline::Emitter` for
//! `nissa::Hub`, and the `leyline::Telemetry` handle `Hub::telemetry` gives
//! producers (kasmina, tolaria).

use std::time::Duration;

use leyline::proto::TelemetryPacket;
use leyline::telemetry as names;
use leyline::{Emitter, Telemetry, TelemetryLevel, metric};

#[test]
fn a_hubs_telemetry_handle_delivers_to_its_sinks() -> nissa::Result<()> {
    let memory = nissa::MemorySink::new();
    let hub = nissa::Hub::builder().sink(memory.clone()).build()?;
    let telemetry = hub.telemetry();
    assert!(telemetry.is_enabled());
    telemetry.emit_event(
        "kasmina.r0c1",
        names::KASMINA_SEED_GERMINATED,
        "germinated",
        vec![("slot_id", "r0c1".to_owned())],
    );
    telemetry.emit_metrics(
        "tolaria",
        TelemetryLevel::Info,
        [metric(names::TOLARIA_TRAINING_LATENCY_MS, 3.5)],
    );
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let events = memory.events_named(names::KASMINA_SEED_GERMINATED);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].attributes["slot_id"], "r0c1");
    let latencies = memory.metrics_named(names::TOLARIA_TRAINING_LATENCY_MS);
    assert_eq!(latencies.len(), 1);
    assert_eq!(
        (latencies[0].value, latencies[0].unit.as_str()),
        (3.5, "ms")
    );
    assert_eq!(telemetry.contained_panics(), 0);
    hub.close();
    Ok(())
}

#[test]
fn the_hub_is_an_emitter_and_a_non_finite_packet_counts_failed() -> nissa::Result<()> {
    let hub = nissa::Hub::builder().tracing().build()?;
    let emitter: &dyn Emitter = &hub;
    emitter.emit(
        TelemetryPacket::new("test", TelemetryLevel::Info)
            .with_metric(metric(names::KASMINA_SEED_ALPHA, 0.5)),
    );
    // `metric` keeps a non-finite value; the packet is refused where a sink
    // takes it (leyline's `check_finite_packet`) and counted failed.
    hub.telemetry().emit_metrics(
        "test",
        TelemetryLevel::Info,
        [metric(names::KASMINA_SEED_GRADIENT_NORM, f64::NAN)],
    );
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let stats = hub.stats();
    let sink = stats.sink("tracing");
    assert_eq!(
        sink.map(|sink| (sink.emitted, sink.delivered, sink.failed)),
        Some((2, 1, 1)),
        "{stats:?}"
    );
    hub.close();
    Ok(())
}

#[test]
fn a_disabled_hub_gives_a_disabled_handle() {
    let telemetry: Telemetry = nissa::Hub::disabled().telemetry();
    assert!(!telemetry.is_enabled());
    telemetry.emit_event("test", names::KASMINA_SEED_PRUNED, "pruned", Vec::new());
    assert_eq!(telemetry.contained_panics(), 0);
}
