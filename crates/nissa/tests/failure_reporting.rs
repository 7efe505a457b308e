//! Sink failures, drops and late emits are reported through `tracing` once
//! (not once per packet). The hub logs from its own threads, so this test
//! binary installs a global subscriber; it holds this one test only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::TelemetryPacket;
use nissa::{FailingSink, Hub, HubConfig, MemorySink};
use tracing_subscriber::layer::{Context, SubscriberExt};

#[derive(Default, Clone)]
struct Capture(Arc<Mutex<Vec<(tracing::Level, String)>>>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _context: Context<'_, S>) {
        if event.metadata().target() != "nissa" {
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), message.0));
    }
}

fn count(capture: &Capture, level: tracing::Level, needle: &str) -> usize {
    capture
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(seen, message)| *seen == level && message.contains(needle))
        .count()
}

#[test]
fn failures_drops_and_late_emits_are_reported_once() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .unwrap();

    let memory = MemorySink::new();
    let hub = Hub::builder()
        .config(HubConfig {
            queue_capacity: 4,
            ..HubConfig::default()
        })
        .sink(FailingSink::new())
        .sink(memory.clone())
        .build()
        .unwrap();
    for _ in 0..2_000 {
        hub.emit(TelemetryPacket::new("test", TelemetryLevel::Info));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let stats = hub.stats();
    assert!(
        stats.queue_dropped > 0,
        "the tiny queue must overflow: {stats:?}"
    );
    assert!(stats.sink("failing").unwrap().failed > 1);
    hub.close();
    for _ in 0..5 {
        hub.emit(TelemetryPacket::new("test", TelemetryLevel::Info));
    }
    assert_eq!(hub.stats().after_close, 5);

    assert_eq!(count(&capture, tracing::Level::ERROR, "sink failed"), 1);
    assert_eq!(count(&capture, tracing::Level::WARN, "dropping packets"), 1);
    assert_eq!(
        count(&capture, tracing::Level::WARN, "after the hub closed"),
        1
    );
}
