//! The tracing bridge logs each event at its level with its fields.

use std::sync::{Arc, Mutex};

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use nissa::{Sink, TracingSink};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One captured `tracing` event: level, target and fields.
#[derive(Debug, Clone, PartialEq)]
struct Captured {
    level: tracing::Level,
    target: String,
    fields: Vec<(String, String)>,
}

#[derive(Default, Clone)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _context: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields: fields.0,
        });
    }
}

fn field<'a>(event: &'a Captured, name: &str) -> Option<&'a str> {
    event
        .fields
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

#[test]
fn events_are_logged_at_their_level_with_their_fields() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(capture.clone())
        .with(tracing_subscriber::filter::LevelFilter::TRACE);
    let mut fallback = TelemetryEvent::new(
        leyline::telemetry::TOLARIA_GRAPH_FALLBACK,
        TelemetryLevel::Warning,
        "capture failed",
    );
    fallback
        .attributes
        .insert("reason".to_owned(), "oom".to_owned());
    let packet = TelemetryPacket::new("tolaria", TelemetryLevel::Warning)
        .with_event(fallback)
        .with_event(TelemetryEvent::new(
            leyline::telemetry::TOLARIA_ROLLBACK_TRIGGERED,
            TelemetryLevel::Critical,
            "loss is NaN",
        ))
        .with_event(TelemetryEvent::new(
            leyline::telemetry::KASMINA_SEED_GATE_EVALUATED,
            TelemetryLevel::Debug,
            "G1 passed",
        ))
        .with_metric(TelemetryMetric::new(
            leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS,
            4.5,
            "ms",
        ));
    tracing::subscriber::with_default(subscriber, || {
        TracingSink::new().write(&packet).unwrap();
    });
    let events = capture.0.lock().unwrap().clone();
    assert_eq!(events.len(), 4, "{events:#?}");
    assert!(events.iter().all(|event| event.target == "nissa"));

    assert_eq!(events[0].level, tracing::Level::WARN);
    assert_eq!(field(&events[0], "source"), Some("tolaria"));
    assert_eq!(field(&events[0], "event"), Some("tolaria.graph_fallback"));
    assert_eq!(field(&events[0], "attributes"), Some("reason=oom"));
    assert_eq!(field(&events[0], "message"), Some("capture failed"));

    assert_eq!(events[1].level, tracing::Level::ERROR);
    assert_eq!(field(&events[1], "severity"), Some("CRITICAL"));
    assert_eq!(events[2].level, tracing::Level::DEBUG);

    assert_eq!(events[3].level, tracing::Level::TRACE);
    assert_eq!(
        field(&events[3], "metric"),
        Some("tolaria.training.latency_ms")
    );
    assert_eq!(field(&events[3], "value"), Some("4.5"));
}

#[test]
fn metrics_are_not_logged_unless_trace_is_enabled() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(capture.clone())
        .with(tracing_subscriber::filter::LevelFilter::INFO);
    let packet = TelemetryPacket::new("tolaria", TelemetryLevel::Info).with_metric(
        TelemetryMetric::new(leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS, 4.5, "ms"),
    );
    tracing::subscriber::with_default(subscriber, || {
        TracingSink::new().write(&packet).unwrap();
    });
    assert!(capture.0.lock().unwrap().is_empty());
}
