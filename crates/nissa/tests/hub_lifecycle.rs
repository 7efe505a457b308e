//! Flush, close, failing sinks, the no-op hub and all-or-nothing building:
//! the guarantees callers rely on beyond the accounting identity.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::codec::Contract;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use nissa::{Error, FailingSink, Hub, HubConfig, JsonlConfig, JsonlSink, MemorySink, Sink};

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

/// Every path under `root` (relative) with its bytes (`None` for a
/// directory): equal snapshots mean the tree is byte-for-byte the same.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut tree = BTreeMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(root).unwrap().to_owned();
            if path.is_dir() {
                tree.insert(relative, None);
                pending.push(path);
            } else {
                tree.insert(relative, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    tree
}

/// A temporary directory holding someone else's files: `notes.txt` and an
/// earlier run's `old/events-0000.jsonl`.
fn populated_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not ours\n").unwrap();
    std::fs::create_dir(dir.path().join("old")).unwrap();
    std::fs::write(
        dir.path().join("old/events-0000.jsonl"),
        b"{\"an\":\"earlier run\"}\n",
    )
    .unwrap();
    dir
}

#[test]
fn a_taken_metrics_port_fails_the_build_before_any_file_is_created() {
    let occupant = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = occupant.local_addr().unwrap();

    // A fresh, empty directory: the JSONL sink would create a subdirectory.
    let fresh = tempfile::tempdir().unwrap();
    let before = snapshot(fresh.path());
    let built = Hub::builder()
        .jsonl(JsonlConfig::new(fresh.path().join("run/telemetry")))
        .prometheus(taken)
        .build();
    match built {
        Err(Error::Bind { addr, ref source }) => {
            assert_eq!(addr, taken);
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{source}");
            let message = built.as_ref().unwrap_err().to_string();
            assert!(
                message.contains("could not bind the metrics endpoint")
                    && message.contains(&taken.to_string()),
                "{message}"
            );
        }
        other => panic!("expected a bind error, got {other:?}"),
    }
    assert_eq!(snapshot(fresh.path()), before);
    assert_eq!(std::fs::read_dir(fresh.path()).unwrap().count(), 0);

    // A directory with files in it, the JSONL sink writing into the existing
    // `old` (it would create `events-0001.jsonl`) beside other sinks.
    let used = populated_dir();
    let before = snapshot(used.path());
    let built = Hub::builder()
        .prometheus(taken)
        .sink(MemorySink::new())
        .jsonl(JsonlConfig::new(used.path().join("old")))
        .tracing()
        .build();
    assert!(
        matches!(&built, Err(Error::Bind { addr, .. }) if *addr == taken),
        "{built:?}"
    );
    assert_eq!(snapshot(used.path()), before);
    drop(occupant);
}

#[test]
fn a_sink_that_cannot_open_leaves_nothing_behind_even_inside_async_code() {
    let root = populated_dir();
    let before = snapshot(root.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The endpoint binds and the hub's runtime starts; then the JSONL
    // directory cannot be created (its path runs through a plain file), and
    // the build takes everything back without panicking in async code.
    let built = runtime.block_on(async {
        Hub::builder()
            .prometheus_on_port(0)
            .jsonl(JsonlConfig::new(root.path().join("notes.txt/telemetry")))
            .build()
    });
    assert!(
        matches!(
            &built,
            Err(Error::Io {
                op: "create directory",
                ..
            })
        ),
        "{built:?}"
    );
    assert_eq!(snapshot(root.path()), before);
}

#[test]
fn a_successful_build_creates_the_jsonl_files() {
    let root = populated_dir();
    let before = snapshot(root.path());
    let dir = root.path().join("run/telemetry");
    let hub = Hub::builder()
        .jsonl(JsonlConfig::new(&dir))
        .prometheus_on_port(0)
        .build()
        .unwrap();
    assert!(hub.metrics_addr().is_some());
    let first = dir.join("events-0000.jsonl");
    assert!(first.is_file(), "{first:?}");
    hub.emit(numbered(7));
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    hub.close();
    let text = std::fs::read_to_string(&first).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        TelemetryPacket::from_json(text.trim_end()).is_ok(),
        "{text}"
    );

    // Everything that was there before is untouched; only the run's
    // directories and file are new.
    let after = snapshot(root.path());
    for (path, content) in &before {
        assert_eq!(after.get(path), Some(content), "{path:?}");
    }
    let new: Vec<&PathBuf> = after
        .keys()
        .filter(|path| !before.contains_key(*path))
        .collect();
    assert_eq!(
        new,
        [
            &PathBuf::from("run"),
            &PathBuf::from("run/telemetry"),
            &PathBuf::from("run/telemetry/events-0000.jsonl"),
        ]
    );
}
