//! Flush, close, failing sinks and the no-op hub: the guarantees callers rely
//! on beyond the accounting identity.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use nissa::{FailingSink, Hub, HubConfig, JsonlSink, MemorySink, Sink};

fn numbered(seq: u64) -> TelemetryPacket {
    let mut packet =
        TelemetryPacket::new("test", TelemetryLevel::Info).with_metric(TelemetryMetric::new(
            leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS,
            seq as f64,
            "ms",
        ));
    packet.timestamp_unix_ns = seq as i64;
    packet
}

fn seqs(memory: &MemorySink) -> Vec<u64> {
    memory
        .packets()
        .iter()
        .map(|packet| packet.timestamp_unix_ns as u64)
        .collect()
}

#[test]
fn flush_delivers_everything_when_the_queues_had_room() {
    let memory = MemorySink::new();
    let hub = Hub::builder()
        .queue_capacity(1024)
        .sink_queue_capacity(1024)
        .sink(memory.clone())
        .build()
        .unwrap();
    for seq in 0..1000 {
        hub.emit(numbered(seq));
    }
    let outcome = hub.flush(Duration::from_secs(10));
    assert!(outcome.is_complete());
    assert_eq!(outcome.pending, 0);
    assert_eq!(seqs(&memory), (0..1000).collect::<Vec<_>>());
    let stats = hub.stats();
    assert_eq!(stats.emitted, 1000);
    assert_eq!(stats.queue_dropped, 0);
    assert_eq!(stats.sink("memory").unwrap().delivered, 1000);

    // A second round after the first flush is delivered by the next one.
    for seq in 1000..1500 {
        hub.emit(numbered(seq));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    assert_eq!(memory.len(), 1500);
    hub.close();
}

#[test]
fn a_failing_sink_affects_neither_emit_nor_other_sinks() {
    let memory = MemorySink::new();
    let failing = FailingSink::new();
    let hub = Hub::builder()
        .sink(failing.clone())
        .sink(memory.clone())
        .sink(PanickingSink)
        .build()
        .unwrap();
    for seq in 0..500 {
        hub.emit(numbered(seq));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let stats = hub.stats();
    assert_eq!(memory.len(), 500);
    assert_eq!(stats.sink("memory").unwrap().delivered, 500);
    let failed = stats.sink("failing").unwrap();
    assert_eq!((failed.delivered, failed.failed), (0, 500));
    assert_eq!(failing.attempts(), 500);
    // The panicking sink is counted and then written off; no panic escapes.
    let panicked = stats.sink("panicking").unwrap();
    assert_eq!((panicked.delivered, panicked.failed), (0, 500));
    hub.close();
}

#[test]
fn a_full_disk_is_counted_as_failed() {
    let Ok(device) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: /dev/full is not available on this system");
        return;
    };
    let memory = MemorySink::new();
    let hub = Hub::builder()
        .sink(JsonlSink::to_writer("disk-full", device))
        .sink(memory.clone())
        .build()
        .unwrap();
    for seq in 0..300 {
        hub.emit(numbered(seq));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let stats = hub.stats();
    let full = stats.sink("disk-full").unwrap();
    assert_eq!((full.delivered, full.failed), (0, 300));
    assert_eq!(stats.sink("memory").unwrap().delivered, 300);
    hub.close();
}

#[test]
fn close_is_idempotent_and_later_emits_are_counted() {
    let memory = MemorySink::new();
    let hub = Hub::builder().sink(memory.clone()).build().unwrap();
    for seq in 0..10 {
        hub.emit(numbered(seq));
    }
    // Close delivers what was emitted before it.
    hub.close();
    assert_eq!(memory.len(), 10);
    hub.close();
    let copy = hub.clone();
    copy.close();
    for seq in 10..13 {
        copy.emit(numbered(seq));
    }
    let stats = hub.stats();
    assert!(stats.closed);
    assert_eq!(stats.emitted, 10);
    assert_eq!(stats.after_close, 3);
    assert_eq!(memory.len(), 10);
    // Flushing a closed hub is immediate and complete.
    assert!(hub.flush(Duration::from_millis(1)).is_complete());
    assert!(hub.flush(Duration::ZERO).is_complete());
}

#[test]
fn flush_with_a_stuck_sink_times_out_and_reports_what_is_pending() {
    let hub = Hub::builder()
        .config(HubConfig {
            close_timeout: Duration::from_millis(100),
            // One packet in the sink's hands at a time; the rest wait in its queue.
            batch_max: 1,
            ..HubConfig::default()
        })
        .sink(StuckSink)
        .build()
        .unwrap();
    for seq in 0..20 {
        hub.emit(numbered(seq));
    }
    let outcome = hub.flush(Duration::from_millis(100));
    assert!(!outcome.is_complete());
    assert!(outcome.pending > 0, "{outcome:?}");
    // Close gives up after its timeout; queued packets become drops and the
    // one being written finishes on its own, so nothing is left unaccounted.
    hub.close();
    let stats = hub.stats();
    let stuck = stats.sink("stuck").unwrap();
    assert!(stuck.sink_queue_dropped > 0, "{stuck:?}");
    std::thread::sleep(Duration::from_millis(600));
    let stuck = hub.stats().sink("stuck").unwrap().clone();
    assert_eq!(stuck.pending, 0, "{stuck:?}");
    assert_eq!(stuck.delivered, 1, "{stuck:?}");
    assert_eq!(stuck.delivered + stuck.dropped + stuck.failed, 20);
}

#[test]
fn the_disabled_hub_does_nothing() {
    let hub = Hub::disabled();
    assert!(hub.is_disabled());
    hub.emit(numbered(0));
    assert!(hub.flush(Duration::ZERO).is_complete());
    hub.close();
    assert_eq!(hub.stats(), nissa::HubStats::default());
    assert_eq!(hub.metrics_addr(), None);
}

#[test]
fn invalid_configuration_is_an_error() {
    let zero_queue = Hub::builder().queue_capacity(0).build();
    assert!(matches!(zero_queue, Err(nissa::Error::Config { .. })));
    let zero_sink_queue = Hub::builder().sink_with_queue(MemorySink::new(), 0).build();
    assert!(matches!(zero_sink_queue, Err(nissa::Error::Config { .. })));
}

#[test]
fn a_hub_can_be_used_and_dropped_inside_an_async_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let memory = MemorySink::new();
    let delivered = runtime.block_on(async {
        let hub = Hub::builder().sink(memory.clone()).build().unwrap();
        hub.emit(numbered(1));
        hub.emit(
            TelemetryPacket::new("test", TelemetryLevel::Warning).with_event(TelemetryEvent::new(
                leyline::telemetry::TOLARIA_GRAPH_FALLBACK,
                TelemetryLevel::Warning,
                "capture failed",
            )),
        );
        // Dropping the last handle closes the hub, also from async code.
        drop(hub);
        memory.len()
    });
    assert_eq!(delivered, 2);
    assert_eq!(
        memory
            .events_named(leyline::telemetry::TOLARIA_GRAPH_FALLBACK)
            .len(),
        1
    );
}

#[test]
fn slow_sinks_do_not_hold_back_fast_ones() {
    let memory = MemorySink::new();
    let slow_written = Arc::new(AtomicU64::new(0));
    let hub = Hub::builder()
        .sink_with_queue(
            GateSink {
                written: Arc::clone(&slow_written),
            },
            4,
        )
        .sink_with_queue(memory.clone(), 4096)
        .build()
        .unwrap();
    for seq in 0..2000 {
        hub.emit(numbered(seq));
    }
    // The fast sink receives everything while the slow one is still stuck on
    // its first batch.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while memory.len() < 2000 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(memory.len(), 2000);
    assert!(slow_written.load(Ordering::Acquire) <= 4);
    let stats = hub.stats();
    let slow = stats.sink("gate").unwrap();
    assert!(slow.sink_queue_dropped >= 1996 - 4, "{slow:?}");
    hub.close();
}

/// Panics on every write.
struct PanickingSink;

impl Sink for PanickingSink {
    fn name(&self) -> &str {
        "panicking"
    }

    fn write(&mut self, _packet: &TelemetryPacket) -> nissa::Result<()> {
        panic!("sink bug (test)");
    }
}

/// Takes 400 ms per packet.
struct StuckSink;

impl Sink for StuckSink {
    fn name(&self) -> &str {
        "stuck"
    }

    fn write(&mut self, _packet: &TelemetryPacket) -> nissa::Result<()> {
        std::thread::sleep(Duration::from_millis(400));
        Ok(())
    }
}

/// Blocks for 300 ms on its first packet, then counts.
struct GateSink {
    written: Arc<AtomicU64>,
}

impl Sink for GateSink {
    fn name(&self) -> &str {
        "gate"
    }

    fn write(&mut self, _packet: &TelemetryPacket) -> nissa::Result<()> {
        if self.written.fetch_add(1, Ordering::AcqRel) == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(())
    }
}
