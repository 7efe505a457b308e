//! Lifecycle telemetry: germinated, stage changed, gate evaluated,
//! fossilized, pruned.
//!
//! Slots emit one `leyline::proto::TelemetryPacket` per event, source
//! `kasmina.<slot>`, event names only from `leyline::telemetry`
//! (`KASMINA_SEED_*`), at the level leyline lists for the event. Attributes
//! carry `slot_id`, `seed_id`, `blueprint_id`, `alpha`, `epochs_in_stage` and
//! the event's own fields (`from`/`to`, `gate`/`passed`/`target_stage`/checks,
//! `reason`/`initiator`, `params`).
//!
//! Per-seed gauges (`kasmina.seed.*`, `kasmina.seeds.active`) are emitted on
//! demand by `MorphogeneticModel::emit_seed_metrics`, one packet per seed
//! with `slot_id` / `seed_id` attributes on every metric.
//!
//! Emission goes through [`LifecycleTelemetry`], a cheap clonable handle
//! around a [`TelemetryEmitter`]: a `nissa::Hub` (never blocks), a
//! [`MemoryCollector`] for tests, or nothing. As the reference requires,
//! telemetry can never fail a lifecycle operation: emission returns nothing
//! and a panicking emitter is contained.

use std::sync::{Arc, Mutex};

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};

/// Something that accepts telemetry packets without blocking.
pub trait TelemetryEmitter: Send + Sync {
    /// Hands one packet over.
    fn emit(&self, packet: TelemetryPacket);
}

impl TelemetryEmitter for nissa::Hub {
    fn emit(&self, packet: TelemetryPacket) {
        nissa::Hub::emit(self, packet);
    }
}

/// A clonable telemetry handle; the default one discards everything.
#[derive(Clone, Default)]
pub struct LifecycleTelemetry {
    emitter: Option<Arc<dyn TelemetryEmitter>>,
}

impl std::fmt::Debug for LifecycleTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.emitter.is_some() {
            "LifecycleTelemetry(enabled)"
        } else {
            "LifecycleTelemetry(disabled)"
        })
    }
}

impl LifecycleTelemetry {
    /// A handle that discards every event.
    pub fn disabled() -> LifecycleTelemetry {
        LifecycleTelemetry { emitter: None }
    }

    /// A handle emitting into `emitter`.
    pub fn new(emitter: impl TelemetryEmitter + 'static) -> LifecycleTelemetry {
        LifecycleTelemetry {
            emitter: Some(Arc::new(emitter)),
        }
    }

    /// A handle emitting into a Nissa hub.
    pub fn from_hub(hub: nissa::Hub) -> LifecycleTelemetry {
        if hub.is_disabled() {
            LifecycleTelemetry::disabled()
        } else {
            LifecycleTelemetry::new(hub)
        }
    }

    /// Whether events go anywhere.
    pub fn is_enabled(&self) -> bool {
        self.emitter.is_some()
    }

    /// Emits one event named `name` (a `leyline::telemetry` constant) from
    /// `source`, at leyline's level for that event.
    pub fn emit_event(
        &self,
        source: &str,
        name: &str,
        message: &str,
        attributes: Vec<(&'static str, String)>,
    ) {
        let Some(emitter) = &self.emitter else {
            return;
        };
        let level = leyline::telemetry::event_spec(name)
            .map(|spec| spec.level)
            .unwrap_or(TelemetryLevel::Info);
        let mut event = TelemetryEvent::new(name, level, message);
        event.attributes = attributes
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect();
        let packet = TelemetryPacket::new(source, level).with_event(event);
        let emitter = Arc::clone(emitter);
        // Telemetry must never abort a lifecycle operation.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            emitter.emit(packet);
        }));
    }
}

impl LifecycleTelemetry {
    /// Emits a ready-made packet (metrics, several events).
    pub fn emit_packet(&self, packet: TelemetryPacket) {
        let Some(emitter) = &self.emitter else {
            return;
        };
        let emitter = Arc::clone(emitter);
        // Telemetry must never abort a lifecycle operation.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            emitter.emit(packet);
        }));
    }
}

/// A metric named `name` (a `leyline::telemetry` constant) with leyline's
/// unit for it.
pub fn metric(name: &str, value: f64) -> TelemetryMetric {
    let unit = leyline::telemetry::metric_spec(name).map_or("", |spec| spec.unit);
    TelemetryMetric::new(name, value, unit)
}

/// An in-memory emitter for tests: keeps every packet.
#[derive(Debug, Clone, Default)]
pub struct MemoryCollector {
    packets: Arc<Mutex<Vec<TelemetryPacket>>>,
}

impl MemoryCollector {
    /// An empty collector.
    pub fn new() -> MemoryCollector {
        MemoryCollector::default()
    }

    /// Every packet so far.
    pub fn packets(&self) -> Vec<TelemetryPacket> {
        self.packets
            .lock()
            .map(|packets| packets.clone())
            .unwrap_or_default()
    }

    /// Every event so far, in emission order.
    pub fn events(&self) -> Vec<TelemetryEvent> {
        self.packets()
            .into_iter()
            .flat_map(|packet| packet.events)
            .collect()
    }

    /// Names of every event so far, in emission order.
    pub fn event_names(&self) -> Vec<String> {
        self.events().into_iter().map(|event| event.name).collect()
    }

    /// Forgets everything collected.
    pub fn clear(&self) {
        if let Ok(mut packets) = self.packets.lock() {
            packets.clear();
        }
    }
}

impl TelemetryEmitter for MemoryCollector {
    fn emit(&self, packet: TelemetryPacket) {
        if let Ok(mut packets) = self.packets.lock() {
            packets.push(packet);
        }
    }
}
