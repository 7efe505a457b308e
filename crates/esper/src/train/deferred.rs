//! Telemetry emitted before the run directory may be written.
//!
//! `esper train` builds the host, the trainer (and, for `--resume`, restores
//! the checkpoint into them) before it writes anything, so that a refused
//! configuration or a checkpoint that cannot be restored leaves the run
//! directory as it was. The telemetry hub's JSONL sink creates its files as
//! it starts, so it can only start once the run is known to go ahead; the
//! producers built before that hold a [`Deferred`] handle, which keeps their
//! packets in order (at most [`CAPACITY`], counting any beyond) until
//! [`Deferred::attach`] hands them to the hub and forwards every later
//! packet straight to it. A run that is refused drops the handle and its
//! packets with it, so nothing was written.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use leyline::proto::TelemetryPacket;
use leyline::{Emitter, Telemetry};
use nissa::Hub;

/// Packets kept before the hub starts (building a trainer emits a few
/// dozen); more are counted and dropped.
pub(crate) const CAPACITY: usize = 65_536;

/// The packets kept so far and how many did not fit.
#[derive(Debug, Default)]
struct Held {
    packets: Vec<TelemetryPacket>,
    dropped: u64,
}

#[derive(Debug, Default)]
struct Shared {
    /// Set once, while `held` is locked, so that a packet is either held
    /// (and handed over by `attach`) or forwarded, never lost between.
    hub: OnceLock<Hub>,
    held: Mutex<Held>,
}

/// An [`Emitter`] that holds packets until a hub is attached (see the
/// module docs). Clones share the packets and the hub.
#[derive(Debug, Clone, Default)]
pub(crate) struct Deferred {
    shared: Arc<Shared>,
}

impl Deferred {
    /// A handle holding every packet until [`Deferred::attach`].
    pub(crate) fn new() -> Deferred {
        Deferred::default()
    }

    /// The telemetry handle producers take.
    pub(crate) fn telemetry(&self) -> Telemetry {
        Telemetry::new(self.clone())
    }

    /// Hands the packets held so far to `hub`, in the order they came, and
    /// forwards every later one to it; returns how many did not fit before
    /// (0 unless more than [`CAPACITY`] came). A second call changes
    /// nothing and returns 0.
    pub(crate) fn attach(&self, hub: &Hub) -> u64 {
        let mut held = self
            .shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.shared.hub.set(hub.clone()).is_err() {
            return 0;
        }
        for packet in held.packets.drain(..) {
            hub.emit(packet);
        }
        held.packets.shrink_to_fit();
        std::mem::take(&mut held.dropped)
    }

    /// How many packets are held (not yet handed to a hub).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .packets
            .len()
    }
}

impl Emitter for Deferred {
    fn emit(&self, packet: TelemetryPacket) {
        if let Some(hub) = self.shared.hub.get() {
            hub.emit(packet);
            return;
        }
        let mut held = self
            .shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Attached while this thread waited for the lock.
        if let Some(hub) = self.shared.hub.get() {
            hub.emit(packet);
        } else if held.packets.len() < CAPACITY {
            held.packets.push(packet);
        } else {
            held.dropped = held.dropped.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leyline::telemetry::KASMINA_SEED_ALPHA;
    use leyline::{TelemetryLevel, metric};
    use nissa::MemorySink;

    use super::*;

    fn packet(value: f64) -> TelemetryPacket {
        let mut packet = TelemetryPacket::new("test", TelemetryLevel::Info);
        packet.metrics.push(metric(KASMINA_SEED_ALPHA, value));
        packet
    }

    #[test]
    fn packets_are_held_in_order_until_a_hub_is_attached_then_forwarded() {
        let deferred = Deferred::new();
        let telemetry = deferred.telemetry();
        for value in [0.1, 0.2] {
            telemetry.emit_packet(packet(value));
        }
        assert_eq!(deferred.held(), 2);
        let sink = MemorySink::new();
        let hub = Hub::builder()
            .sink(sink.clone())
            .build()
            .expect("a hub without files");
        assert_eq!(deferred.attach(&hub), 0, "nothing dropped");
        assert_eq!(deferred.held(), 0);
        telemetry.emit_packet(packet(0.3));
        assert_eq!(deferred.attach(&hub), 0, "a second attach changes nothing");
        assert!(hub.flush(Duration::from_secs(10)).is_complete());
        let values: Vec<f64> = sink
            .packets()
            .iter()
            .flat_map(|packet| packet.metrics.iter().map(|metric| metric.value))
            .collect();
        assert_eq!(values, [0.1, 0.2, 0.3], "every packet once, in order");
        hub.close();
    }

    #[test]
    fn packets_beyond_the_capacity_are_counted() {
        let deferred = Deferred::new();
        for _ in 0..CAPACITY + 3 {
            deferred.emit(packet(1.0));
        }
        assert_eq!(deferred.held(), CAPACITY);
        let hub = Hub::builder().sink(MemorySink::new()).build().expect("hub");
        assert_eq!(deferred.attach(&hub), 3);
        hub.close();
    }
}
