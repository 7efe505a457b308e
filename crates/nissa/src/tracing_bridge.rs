//! Bridge to `tracing`: a sink that logs events at their level, and the
//! subscriber set-up binaries call once at start.
//!
//! Events become `tracing` events with target `nissa` at the level of the
//! event (CRITICAL maps to ERROR, the highest `tracing` level); metrics are
//! logged at TRACE so they stay silent unless asked for. A packet with a
//! non-finite metric value is refused (counted failed), as in every built-in
//! sink.

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryEvent, TelemetryPacket};

use crate::sink::Sink;
use crate::{Error, Result};

/// Name of the tracing bridge in statistics and labels.
pub const TRACING_SINK_NAME: &str = "tracing";

/// Logs every event of every packet through `tracing`.
///
/// A packet with a non-finite metric value is refused whole (counted failed,
/// nothing of it logged), like in every built-in sink.
#[derive(Debug, Default, Clone)]
pub struct TracingSink {
    _private: (),
}

impl TracingSink {
    /// A tracing bridge.
    pub fn new() -> TracingSink {
        TracingSink::default()
    }
}

/// Attributes in a stable order, as `key=value` pairs.
fn sorted_attributes(attributes: &std::collections::BTreeMap<String, String>) -> String {
    attributes
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_event(source: &str, event: &TelemetryEvent) {
    let attributes = sorted_attributes(&event.attributes);
    let name = event.name.as_str();
    let message = event.message.as_str();
    // Unknown levels (a packet built by hand) are logged as warnings rather
    // than lost.
    match event.telemetry_level().unwrap_or(TelemetryLevel::Warning) {
        TelemetryLevel::Debug => {
            tracing::debug!(target: "nissa", source, event = name, attributes, "{message}");
        }
        TelemetryLevel::Info => {
            tracing::info!(target: "nissa", source, event = name, attributes, "{message}");
        }
        TelemetryLevel::Warning => {
            tracing::warn!(target: "nissa", source, event = name, attributes, "{message}");
        }
        TelemetryLevel::Error | TelemetryLevel::Critical => {
            let level =
                TelemetryLevel::from_value(event.level).map_or("ERROR", TelemetryLevel::name);
            tracing::error!(
                target: "nissa",
                source,
                event = name,
                severity = level,
                attributes,
                "{message}"
            );
        }
    }
}

impl Sink for TracingSink {
    fn name(&self) -> &str {
        TRACING_SINK_NAME
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        leyline::codec::check_finite_packet(packet)
            .map_err(|error| Error::sink(TRACING_SINK_NAME, error))?;
        for event in &packet.events {
            log_event(&packet.source, event);
        }
        if tracing::enabled!(target: "nissa", tracing::Level::TRACE) {
            for metric in &packet.metrics {
                tracing::trace!(
                    target: "nissa",
                    source = packet.source.as_str(),
                    metric = metric.name.as_str(),
                    value = metric.value,
                    unit = metric.unit.as_str(),
                    attributes = sorted_attributes(&metric.attributes),
                    "metric"
                );
            }
        }
        Ok(())
    }
}

/// Installs the global `tracing` subscriber for a binary: human-readable
/// lines on standard error, filtered by `RUST_LOG` when set, else by
/// `default_filter` (for example `"info"` or `"info,nissa=debug"`).
pub fn init_subscriber(default_filter: &str) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(from_env) if !from_env.trim().is_empty() => EnvFilter::try_new(from_env),
        _ => EnvFilter::try_new(default_filter),
    }
    .map_err(|error| Error::Subscriber(error.to_string()))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|error| Error::Subscriber(error.to_string()))
}
