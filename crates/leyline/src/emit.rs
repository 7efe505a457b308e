//! The one way telemetry leaves a crate: [`Emitter`], the [`Telemetry`]
//! handle, the [`metric`] and [`event`] constructors, and the [`Collector`]
//! that tests and benchmarks read back.
//!
//! Every producing crate (kasmina, tolaria, and what is built on them) holds a
//! [`Telemetry`] and builds `TelemetryPacket`s with names from
//! [`crate::telemetry`]. Where the packets go is the caller's choice: a
//! `nissa::Hub` (which implements [`Emitter`]), a [`Collector`], or nowhere
//! ([`Telemetry::disabled`], the default).
//!
//! It lives in leyline, beside the packet types, because every producing crate
//! already depends on leyline and the trait needs no runtime: a crate emits
//! without pulling in nissa's tokio and hyper, and nissa is one implementation
//! among others.
//!
//! ```
//! use leyline::telemetry::{KASMINA_SEED_ALPHA, KASMINA_SEED_GERMINATED};
//! use leyline::{Collector, Telemetry, TelemetryLevel, metric};
//!
//! let collector = Collector::new();
//! // A producer holds the handle; a binary would pass `hub.telemetry()`.
//! let telemetry = Telemetry::new(collector.clone());
//! telemetry.emit_event(
//!     "kasmina.r0c1",
//!     KASMINA_SEED_GERMINATED,
//!     "seed germinated",
//!     vec![("slot_id", "r0c1".to_owned())],
//! );
//! telemetry.emit_metrics(
//!     "kasmina.r0c1",
//!     TelemetryLevel::Debug,
//!     [metric(KASMINA_SEED_ALPHA, 0.5)],
//! );
//! assert_eq!(collector.event_names(), [KASMINA_SEED_GERMINATED]);
//! assert_eq!(collector.metric_values(KASMINA_SEED_ALPHA), [0.5]);
//! assert!(!Telemetry::disabled().is_enabled());
//! ```
//!
//! # Contract
//!
//! An emit never blocks and never fails the caller: [`Emitter::emit`] returns
//! nothing, and an implementation must hand the packet over in bounded time
//! (queue it, or drop and count it). [`Telemetry`] also contains an emitter
//! that panics: the panic is caught, counted ([`Telemetry::contained_panics`])
//! and otherwise ignored, so telemetry can never fail a lifecycle operation or
//! a training step. (The process's panic hook still runs, so the panic is
//! reported on stderr once per occurrence.)
//!
//! # Non-finite values
//!
//! [`metric`] keeps the value it is given, unchanged. A packet carrying a
//! non-finite metric value is invalid as a whole
//! ([`crate::codec::check_finite_packet`]): nissa's sinks refuse it and count
//! it failed, so the fault shows in the hub's accounting instead of being
//! hidden by a clamped or replaced value. Producers check their values where
//! they enter (kasmina refuses non-finite gradient norms and accuracies at the
//! recording call), so such a packet means a bug upstream. The [`Collector`]
//! keeps every packet as handed over, valid or not, so a test can see it.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::TelemetryLevel;
use crate::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};

/// Something that accepts telemetry packets.
///
/// The contract: `emit` never blocks (it queues the packet or drops it, in
/// bounded time) and never fails the caller. Implementations: `nissa::Hub`,
/// [`Collector`].
pub trait Emitter: Send + Sync {
    /// Hands one packet over.
    fn emit(&self, packet: TelemetryPacket);
}

/// The emitter of an enabled handle, with its count of contained panics.
struct Enabled {
    emitter: Box<dyn Emitter>,
    contained_panics: AtomicU64,
}

/// A cheap clonable telemetry handle; the default one discards everything.
///
/// Clones share the emitter and the count of contained panics. Sending a
/// packet through a handle never blocks beyond what its [`Emitter`] does and
/// never fails or panics (see the module docs).
#[derive(Clone, Default)]
pub struct Telemetry {
    enabled: Option<Arc<Enabled>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.enabled.is_some() {
            "Telemetry(enabled)"
        } else {
            "Telemetry(disabled)"
        })
    }
}

impl Telemetry {
    /// A handle emitting into `emitter`.
    pub fn new(emitter: impl Emitter + 'static) -> Telemetry {
        Telemetry {
            enabled: Some(Arc::new(Enabled {
                emitter: Box::new(emitter),
                contained_panics: AtomicU64::new(0),
            })),
        }
    }

    /// A handle that discards every packet (the default).
    pub fn disabled() -> Telemetry {
        Telemetry { enabled: None }
    }

    /// Whether packets go anywhere. Producers may skip building a packet when
    /// this is `false`.
    pub fn is_enabled(&self) -> bool {
        self.enabled.is_some()
    }

    /// Emits a ready-made packet (metrics, several events); a disabled handle
    /// drops it. A panic in the emitter is caught and counted.
    pub fn emit_packet(&self, packet: TelemetryPacket) {
        let Some(enabled) = &self.enabled else {
            return;
        };
        // Telemetry must never abort a lifecycle operation or a training step.
        let outcome = catch_unwind(AssertUnwindSafe(|| enabled.emitter.emit(packet)));
        if outcome.is_err() {
            enabled.contained_panics.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Emits one event named `name` (a [`crate::telemetry`] constant) from
    /// `source`, at leyline's level for that event ([`event`]), as a packet of
    /// that level.
    pub fn emit_event(
        &self,
        source: &str,
        name: &str,
        message: &str,
        attributes: Vec<(&'static str, String)>,
    ) {
        if !self.is_enabled() {
            return;
        }
        let event = event(name, message, attributes);
        let level = event.telemetry_level().unwrap_or(TelemetryLevel::Info);
        self.emit_packet(TelemetryPacket::new(source, level).with_event(event));
    }

    /// Emits `metrics` (built with [`metric`]) from `source` as one packet at
    /// `level`; nothing when `metrics` is empty.
    pub fn emit_metrics(
        &self,
        source: &str,
        level: TelemetryLevel,
        metrics: impl IntoIterator<Item = TelemetryMetric>,
    ) {
        if !self.is_enabled() {
            return;
        }
        let mut packet = TelemetryPacket::new(source, level);
        packet.metrics.extend(metrics);
        if !packet.metrics.is_empty() {
            self.emit_packet(packet);
        }
    }

    /// How many times the emitter panicked and the panic was contained
    /// (shared by clones; always 0 for a disabled handle).
    pub fn contained_panics(&self) -> u64 {
        self.enabled.as_ref().map_or(0, |enabled| {
            enabled.contained_panics.load(Ordering::Relaxed)
        })
    }
}

/// A metric named `name` (a [`crate::telemetry`] constant) with the unit
/// leyline declares for it (empty for a name leyline does not list). The value
/// is kept unchanged, even when it is not finite (see the module docs).
pub fn metric(name: &str, value: f64) -> TelemetryMetric {
    let unit = crate::telemetry::metric_spec(name).map_or("", |spec| spec.unit);
    TelemetryMetric::new(name, value, unit)
}

/// An event named `name` (a [`crate::telemetry`] constant) at the level
/// leyline declares for it (`Info` for a name leyline does not list), with
/// string attributes.
pub fn event<K: Into<String>>(
    name: &str,
    message: &str,
    attributes: impl IntoIterator<Item = (K, String)>,
) -> TelemetryEvent {
    let level = crate::telemetry::event_spec(name).map_or(TelemetryLevel::Info, |spec| spec.level);
    let mut event = TelemetryEvent::new(name, level, message);
    event.attributes.extend(
        attributes
            .into_iter()
            .map(|(key, value)| (key.into(), value)),
    );
    event
}

/// Keeps every packet in memory, for tests and benchmarks; thread-safe, and
/// cheap clones share the same store.
///
/// A packet is kept as handed over, valid or not. A panic elsewhere while
/// the store was locked does not lose what was collected.
#[derive(Debug, Clone, Default)]
pub struct Collector {
    packets: Arc<Mutex<Vec<TelemetryPacket>>>,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Collector {
        Collector::default()
    }

    fn store(&self) -> MutexGuard<'_, Vec<TelemetryPacket>> {
        self.packets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of every packet so far, in emission order.
    pub fn packets(&self) -> Vec<TelemetryPacket> {
        self.store().clone()
    }

    /// Every event so far, in emission order.
    pub fn events(&self) -> Vec<TelemetryEvent> {
        self.store()
            .iter()
            .flat_map(|packet| packet.events.iter().cloned())
            .collect()
    }

    /// The name of every event so far, in emission order.
    pub fn event_names(&self) -> Vec<String> {
        self.store()
            .iter()
            .flat_map(|packet| packet.events.iter().map(|event| event.name.clone()))
            .collect()
    }

    /// Every event named `name`, in emission order.
    pub fn events_named(&self, name: &str) -> Vec<TelemetryEvent> {
        self.store()
            .iter()
            .flat_map(|packet| packet.events.iter())
            .filter(|event| event.name == name)
            .cloned()
            .collect()
    }

    /// Every metric and event name seen so far, once each.
    pub fn names(&self) -> BTreeSet<String> {
        self.store()
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

    /// Every metric named `name` (with its unit and attributes), in emission
    /// order.
    pub fn metrics_named(&self, name: &str) -> Vec<TelemetryMetric> {
        self.store()
            .iter()
            .flat_map(|packet| packet.metrics.iter())
            .filter(|metric| metric.name == name)
            .cloned()
            .collect()
    }

    /// Every value of the metric `name`, in emission order.
    pub fn metric_values(&self, name: &str) -> Vec<f64> {
        self.store()
            .iter()
            .flat_map(|packet| packet.metrics.iter())
            .filter(|metric| metric.name == name)
            .map(|metric| metric.value)
            .collect()
    }

    /// Forgets every packet.
    pub fn clear(&self) {
        self.store().clear();
    }
}

impl Emitter for Collector {
    fn emit(&self, packet: TelemetryPacket) {
        self.store().push(packet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::check_finite_packet;
    use crate::telemetry as names;
    use proptest::prelude::*;

    struct Panicking;

    impl Emitter for Panicking {
        fn emit(&self, _packet: TelemetryPacket) {
            panic!("emitter failure (expected by the test)");
        }
    }

    #[test]
    fn a_disabled_handle_drops_everything() {
        let telemetry = Telemetry::default();
        assert!(!telemetry.is_enabled());
        assert_eq!(format!("{telemetry:?}"), "Telemetry(disabled)");
        telemetry.emit_packet(TelemetryPacket::new("test", TelemetryLevel::Info));
        telemetry.emit_event("test", names::KASMINA_SEED_PRUNED, "pruned", Vec::new());
        telemetry.emit_metrics(
            "test",
            TelemetryLevel::Info,
            [metric(names::KASMINA_SEED_ALPHA, 0.5)],
        );
        assert_eq!(telemetry.contained_panics(), 0);
    }

    #[test]
    fn clones_share_the_emitter() {
        let collector = Collector::new();
        let telemetry = Telemetry::new(collector.clone());
        assert!(telemetry.is_enabled());
        assert_eq!(format!("{telemetry:?}"), "Telemetry(enabled)");
        let clone = telemetry.clone();
        telemetry.emit_packet(TelemetryPacket::new("a", TelemetryLevel::Info));
        clone.emit_packet(TelemetryPacket::new("b", TelemetryLevel::Debug));
        let sources: Vec<String> = collector
            .packets()
            .into_iter()
            .map(|packet| packet.source)
            .collect();
        assert_eq!(sources, ["a", "b"]);
    }

    #[test]
    fn events_take_leylines_level_and_attributes() {
        let collector = Collector::new();
        let telemetry = Telemetry::new(collector.clone());
        telemetry.emit_event(
            "kasmina.r0c1",
            names::KASMINA_SEED_GATE_EVALUATED,
            "G1",
            vec![("gate", "G1".to_owned()), ("passed", "true".to_owned())],
        );
        telemetry.emit_event("kasmina.r0c1", "not.listed", "custom", Vec::new());
        let packets = collector.packets();
        assert_eq!(packets.len(), 2);
        let first = &packets[0];
        assert_eq!(first.source, "kasmina.r0c1");
        assert_eq!(first.level, TelemetryLevel::Debug.value());
        assert_eq!(first.events[0].level, TelemetryLevel::Debug.value());
        assert_eq!(first.events[0].message, "G1");
        assert_eq!(first.events[0].attributes["gate"], "G1");
        assert_eq!(first.events[0].attributes["passed"], "true");
        assert_eq!(packets[1].level, TelemetryLevel::Info.value());
        assert_eq!(
            collector.event_names(),
            [names::KASMINA_SEED_GATE_EVALUATED, "not.listed"]
        );
        let warning = event(
            names::TOLARIA_GRAPH_FALLBACK,
            "fell back",
            [("reason", "x".to_owned())],
        );
        assert_eq!(warning.level, TelemetryLevel::Warning.value());
    }

    #[test]
    fn metrics_take_leylines_unit_and_keep_their_value() {
        let alpha = metric(names::KASMINA_SEED_ALPHA, 0.25);
        assert_eq!((alpha.unit.as_str(), alpha.value), ("ratio", 0.25));
        assert_eq!(metric(names::TOLARIA_TRAINING_LATENCY_MS, 1.5).unit, "ms");
        assert_eq!(metric("not.listed", 1.0).unit, "");
        // A non-finite value is kept, and the packet carrying it is invalid
        // under leyline's one finiteness check (sinks count it failed).
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let bad = metric(names::KASMINA_SEED_GRADIENT_NORM, value);
            assert_eq!(bad.value.to_bits(), value.to_bits());
            let packet = TelemetryPacket::new("test", TelemetryLevel::Info).with_metric(bad);
            assert!(check_finite_packet(&packet).is_err(), "{value}");
        }
        let good = TelemetryPacket::new("test", TelemetryLevel::Info).with_metric(alpha);
        assert!(check_finite_packet(&good).is_ok());
    }

    #[test]
    fn emit_metrics_sends_one_packet_and_nothing_when_empty() {
        let collector = Collector::new();
        let telemetry = Telemetry::new(collector.clone());
        telemetry.emit_metrics(
            "tolaria",
            TelemetryLevel::Info,
            [
                metric(names::TOLARIA_TRAINING_LATENCY_MS, 2.0),
                metric(names::TOLARIA_H2D_COPY_MS, 0.5),
            ],
        );
        telemetry.emit_metrics("tolaria", TelemetryLevel::Info, []);
        let packets = collector.packets();
        assert_eq!(packets.len(), 1);
        assert_eq!(packets[0].metrics.len(), 2);
        assert_eq!(
            collector.metric_values(names::TOLARIA_TRAINING_LATENCY_MS),
            [2.0]
        );
    }

    #[test]
    fn a_panicking_emitter_is_contained_and_counted() {
        let telemetry = Telemetry::new(Panicking);
        let clone = telemetry.clone();
        telemetry.emit_packet(TelemetryPacket::new("test", TelemetryLevel::Info));
        clone.emit_event("test", names::KASMINA_SEED_PRUNED, "pruned", Vec::new());
        clone.emit_metrics(
            "test",
            TelemetryLevel::Info,
            [metric(names::KASMINA_SEED_ALPHA, 1.0)],
        );
        assert_eq!(telemetry.contained_panics(), 3);
        assert_eq!(clone.contained_panics(), 3);
    }

    #[test]
    fn the_collector_answers_every_query() {
        let collector = Collector::new();
        collector.emit(
            TelemetryPacket::new("a", TelemetryLevel::Info)
                .with_metric(metric(names::KASMINA_SEED_ALPHA, 0.1))
                .with_event(event(
                    names::KASMINA_SEED_GERMINATED,
                    "g",
                    Vec::<(&str, String)>::new(),
                )),
        );
        collector.emit(
            TelemetryPacket::new("b", TelemetryLevel::Info)
                .with_metric(metric(names::KASMINA_SEED_ALPHA, 0.2))
                .with_event(event(
                    names::KASMINA_SEED_PRUNED,
                    "p",
                    [("reason", "x".to_owned())],
                ))
                .with_event(event(
                    names::KASMINA_SEED_GERMINATED,
                    "g2",
                    Vec::<(String, String)>::new(),
                )),
        );
        assert_eq!(collector.packets().len(), 2);
        assert_eq!(collector.events().len(), 3);
        assert_eq!(
            collector.event_names(),
            [
                names::KASMINA_SEED_GERMINATED,
                names::KASMINA_SEED_PRUNED,
                names::KASMINA_SEED_GERMINATED
            ]
        );
        let germinated = collector.events_named(names::KASMINA_SEED_GERMINATED);
        let messages: Vec<&str> = germinated.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages, ["g", "g2"]);
        assert!(collector.events_named("not.there").is_empty());
        assert_eq!(
            collector.metric_values(names::KASMINA_SEED_ALPHA),
            [0.1, 0.2]
        );
        assert!(collector.metric_values("not.there").is_empty());
        let alphas = collector.metrics_named(names::KASMINA_SEED_ALPHA);
        assert_eq!(alphas.len(), 2);
        assert!(alphas.iter().all(|metric| metric.unit == "ratio"));
        assert!(collector.metrics_named("not.there").is_empty());
        let expected: BTreeSet<String> = [
            names::KASMINA_SEED_ALPHA,
            names::KASMINA_SEED_GERMINATED,
            names::KASMINA_SEED_PRUNED,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(collector.names(), expected);
        let clone = collector.clone();
        clone.clear();
        assert!(collector.packets().is_empty());
        assert!(collector.names().is_empty());
    }

    #[test]
    fn the_collector_survives_a_poisoned_lock() {
        let collector = Collector::new();
        collector.emit(TelemetryPacket::new("before", TelemetryLevel::Info));
        let poisoner = collector.clone();
        let joined = std::thread::spawn(move || {
            let _guard = poisoner.packets.lock();
            panic!("poisoning the collector's lock (expected by the test)");
        })
        .join();
        assert!(joined.is_err());
        collector.emit(TelemetryPacket::new("after", TelemetryLevel::Info));
        let sources: Vec<String> = collector.packets().into_iter().map(|p| p.source).collect();
        assert_eq!(sources, ["before", "after"]);
    }

    #[test]
    fn the_collector_takes_packets_from_many_threads() {
        let collector = Collector::new();
        let telemetry = Telemetry::new(collector.clone());
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let telemetry = telemetry.clone();
                scope.spawn(move || {
                    for step in 0..100 {
                        telemetry.emit_metrics(
                            "test",
                            TelemetryLevel::Debug,
                            [metric(
                                names::KASMINA_SEED_PARAMS,
                                f64::from(thread * 100 + step),
                            )],
                        );
                    }
                });
            }
        });
        let mut values = collector.metric_values(names::KASMINA_SEED_PARAMS);
        values.sort_by(f64::total_cmp);
        let expected: Vec<f64> = (0..400).map(f64::from).collect();
        assert_eq!(values, expected);
    }

    proptest! {
        /// Whatever is emitted through an enabled handle reaches the
        /// collector whole and in order, hostile values included.
        #[test]
        fn every_packet_arrives_unchanged(
            values in proptest::collection::vec(
                prop_oneof![
                    any::<f64>(),
                    Just(f64::NAN),
                    Just(f64::INFINITY),
                    Just(f64::NEG_INFINITY),
                    Just(f64::MAX),
                ],
                0..16,
            ),
        ) {
            let collector = Collector::new();
            let telemetry = Telemetry::new(collector.clone());
            for value in &values {
                telemetry.emit_metrics(
                    "test",
                    TelemetryLevel::Info,
                    [metric(names::KASMINA_SEED_ALPHA, *value)],
                );
            }
            let seen = collector.metric_values(names::KASMINA_SEED_ALPHA);
            prop_assert_eq!(seen.len(), values.len());
            for (seen, value) in seen.iter().zip(&values) {
                prop_assert_eq!(seen.to_bits(), value.to_bits());
            }
        }
    }
}
