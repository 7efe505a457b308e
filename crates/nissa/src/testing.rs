//! Sinks for tests and benchmarks: one that keeps what it receives, one that
//! is deliberately slow, one that always fails.
//!
//! Other crates' tests build a hub with a [`MemorySink`] and assert on the
//! packets their code emitted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};

use crate::sink::Sink;
use crate::{Error, Result};

/// Keeps every packet it receives. Clones share the storage: give one clone
/// to the hub and read from another.
#[derive(Debug, Clone, Default)]
pub struct MemorySink {
    name: String,
    packets: Arc<Mutex<Vec<TelemetryPacket>>>,
}

impl MemorySink {
    /// An empty sink named `memory`.
    pub fn new() -> MemorySink {
        MemorySink::named("memory")
    }

    /// An empty sink with a name of its own (to tell several apart).
    pub fn named(name: &str) -> MemorySink {
        MemorySink {
            name: name.to_owned(),
            packets: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<TelemetryPacket>> {
        // A panic while holding the lock cannot leave the vector half-pushed.
        match self.packets.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// A copy of every packet received so far, in arrival order.
    pub fn packets(&self) -> Vec<TelemetryPacket> {
        self.lock().clone()
    }

    /// Number of packets received.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was received.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every event called `name`, across packets.
    pub fn events_named(&self, name: &str) -> Vec<TelemetryEvent> {
        self.lock()
            .iter()
            .flat_map(|packet| packet.events.iter())
            .filter(|event| event.name == name)
            .cloned()
            .collect()
    }

    /// Every metric called `name`, across packets.
    pub fn metrics_named(&self, name: &str) -> Vec<TelemetryMetric> {
        self.lock()
            .iter()
            .flat_map(|packet| packet.metrics.iter())
            .filter(|metric| metric.name == name)
            .cloned()
            .collect()
    }

    /// Forgets everything received.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

impl Sink for MemorySink {
    fn name(&self) -> &str {
        &self.name
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        self.lock().push(packet.clone());
        Ok(())
    }
}

/// Takes `delay` per packet (sleeping, so it costs no CPU) and counts what it
/// wrote; the benchmark's deliberately slow sink.
#[derive(Debug, Clone)]
pub struct SlowSink {
    name: String,
    delay: Duration,
    written: Arc<AtomicU64>,
}

impl SlowSink {
    /// A sink named `slow` taking `delay` per packet.
    pub fn new(delay: Duration) -> SlowSink {
        SlowSink {
            name: "slow".to_owned(),
            delay,
            written: Arc::default(),
        }
    }

    /// Packets written so far (shared between clones).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }
}

impl Sink for SlowSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn write(&mut self, _packet: &TelemetryPacket) -> Result<()> {
        // Sleep granularity is coarse; spin-free waiting to the deadline keeps
        // the per-packet cost close to `delay` without burning a core.
        // A delay beyond what `Instant` can hold is a plain (endless) sleep.
        let deadline = Instant::now().checked_add(self.delay);
        std::thread::sleep(self.delay);
        while deadline.is_some_and(|deadline| Instant::now() < deadline) {
            std::thread::yield_now();
        }
        self.written.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// Fails every write, like a full disk; counts the attempts.
#[derive(Debug, Clone)]
pub struct FailingSink {
    name: String,
    attempts: Arc<AtomicU64>,
}

impl FailingSink {
    /// A sink named `failing`.
    pub fn new() -> FailingSink {
        FailingSink {
            name: "failing".to_owned(),
            attempts: Arc::default(),
        }
    }

    /// Writes attempted so far (shared between clones).
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Acquire)
    }
}

impl Default for FailingSink {
    fn default() -> Self {
        FailingSink::new()
    }
}

impl Sink for FailingSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn write(&mut self, _packet: &TelemetryPacket) -> Result<()> {
        self.attempts.fetch_add(1, Ordering::AcqRel);
        Err(Error::sink(
            &self.name,
            "no space left on device (simulated)",
        ))
    }
}
