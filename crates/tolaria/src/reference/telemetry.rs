//! The special reference trainer's telemetry packets (the engine's
//! [`ModelTrainer`](crate::engine::trainer::ModelTrainer) builds its own).
//!
//! The trainer builds `leyline::proto::TelemetryPacket`s with names from
//! `leyline::telemetry` (metrics through [`leyline::metric`], events through
//! [`leyline::event`]) and hands them to the [`leyline::Telemetry`] handle it
//! was given: a Nissa hub's handle in production, a [`leyline::Collector`] in
//! tests and benchmarks, or the disabled handle. This module only builds
//! packets; the emitting trait is leyline's. Emission happens between epochs,
//! never inside the timed region.

use leyline::metric;
use leyline::proto::{TelemetryEvent, TelemetryPacket};
use leyline::telemetry::sources::TOLARIA;
use leyline::telemetry::{self as names, TelemetryLevel};

use super::EpochReport;

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
    let mut packet = TelemetryPacket::new(TOLARIA, level)
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
