//! Where the trainer's telemetry goes.
//!
//! The trainer builds `leyline::proto::TelemetryPacket`s with names from
//! `leyline::telemetry` and hands them to a [`TelemetryOut`]: a Nissa hub in
//! production, a [`CollectingSink`] in tests and benchmarks. Emission happens
//! between epochs, never inside the timed region.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use leyline::telemetry::{self as names, TelemetryLevel};

use crate::trainer::EpochReport;

/// Telemetry source name of the trainer's packets.
pub const SOURCE: &str = "tolaria";

/// Receives telemetry packets; must not block.
pub trait TelemetryOut: Send {
    /// Hands over one packet.
    fn emit(&self, packet: TelemetryPacket);
}

impl TelemetryOut for nissa::Hub {
    fn emit(&self, packet: TelemetryPacket) {
        nissa::Hub::emit(self, packet);
    }
}

/// Drops every packet.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl TelemetryOut for NullSink {
    fn emit(&self, _packet: TelemetryPacket) {}
}

/// Keeps every packet in memory (cheap clones share the same store).
#[derive(Debug, Clone, Default)]
pub struct CollectingSink {
    packets: Arc<Mutex<Vec<TelemetryPacket>>>,
}

impl CollectingSink {
    /// An empty sink.
    pub fn new() -> CollectingSink {
        CollectingSink::default()
    }

    /// A copy of every packet so far.
    pub fn packets(&self) -> Vec<TelemetryPacket> {
        self.packets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every metric and event name seen so far.
    pub fn names(&self) -> BTreeSet<String> {
        let packets = self.packets.lock().unwrap_or_else(PoisonError::into_inner);
        packets
            .iter()
            .flat_map(|packet| {
                packet
                    .metrics
                    .iter()
                    .map(|metric| metric.name.clone())
                    .chain(packet.events.iter().map(|event| event.name.clone()))
            })
            .collect()
    }

    /// Every event named `name`, in emission order.
    pub fn events(&self, name: &str) -> Vec<TelemetryEvent> {
        let packets = self.packets.lock().unwrap_or_else(PoisonError::into_inner);
        packets
            .iter()
            .flat_map(|packet| packet.events.iter())
            .filter(|event| event.name == name)
            .cloned()
            .collect()
    }

    /// Every value of the metric `name`, in emission order.
    pub fn metric_values(&self, name: &str) -> Vec<f64> {
        let packets = self.packets.lock().unwrap_or_else(PoisonError::into_inner);
        packets
            .iter()
            .flat_map(|packet| packet.metrics.iter())
            .filter(|metric| metric.name == name)
            .map(|metric| metric.value)
            .collect()
    }

    /// Forgets every packet.
    pub fn clear(&self) {
        self.packets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl TelemetryOut for CollectingSink {
    fn emit(&self, packet: TelemetryPacket) {
        self.packets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(packet);
    }
}

/// A metric with the unit leyline declares for it.
pub(crate) fn metric(name: &str, value: f64) -> TelemetryMetric {
    let unit = leyline::telemetry::METRICS
        .iter()
        .find(|spec| spec.name == name)
        .map_or("", |spec| spec.unit);
    TelemetryMetric::new(name, value, unit)
}

/// An event with string attributes.
pub(crate) fn event(
    name: &str,
    level: TelemetryLevel,
    message: &str,
    attributes: &[(&str, String)],
) -> TelemetryEvent {
    let mut event = TelemetryEvent::new(name, level, message);
    for (key, value) in attributes {
        event.attributes.insert((*key).to_owned(), value.clone());
    }
    event
}

/// The packet of one training epoch: latency, graph state, staging time,
/// warm-up left (graph modes: `warmup_remaining` is `Some`), capture time,
/// fallbacks, and the epoch's events; Warning level when a fallback happened.
pub(crate) fn epoch_packet(
    report: &EpochReport,
    warmup_remaining: Option<usize>,
    events: Vec<TelemetryEvent>,
) -> TelemetryPacket {
    let fallbacks = events
        .iter()
        .filter(|event| event.name == names::TOLARIA_GRAPH_FALLBACK)
        .count();
    let level = if fallbacks > 0 {
        TelemetryLevel::Warning
    } else {
        TelemetryLevel::Info
    };
    let mut packet = TelemetryPacket::new(SOURCE, level)
        .with_metric(metric(names::TOLARIA_TRAINING_LATENCY_MS, report.epoch_ms))
        .with_metric(metric(
            names::TOLARIA_TRAIN_GRAPH_ENABLED,
            f64::from(u8::from(report.graph_enabled())),
        ));
    if let Some(h2d_ms) = report.h2d_ms {
        packet = packet.with_metric(metric(names::TOLARIA_H2D_COPY_MS, h2d_ms));
    }
    if let Some(remaining) = warmup_remaining {
        packet = packet.with_metric(metric(
            names::TOLARIA_GRAPH_WARMUP_REMAINING,
            remaining as f64,
        ));
    }
    if let Some(capture_ms) = report.capture_ms {
        packet = packet.with_metric(metric(names::TOLARIA_GRAPH_CAPTURE_MS, capture_ms));
    }
    if fallbacks > 0 {
        packet = packet.with_metric(metric(
            names::TOLARIA_GRAPH_FALLBACK_TOTAL,
            fallbacks as f64,
        ));
    }
    for event in events {
        packet = packet.with_event(event);
    }
    packet
}
