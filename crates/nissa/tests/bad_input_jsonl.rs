//! Hostile input against the JSONL sink: non-finite values, packets leyline
//! cannot read back, short writes, file stems that point elsewhere and
//! extreme rotation settings. What the sink counts as delivered is exactly
//! what a consumer can read back.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::codec::Contract;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use leyline::testing::{extreme_u64, extreme_usize, hostile_string};
use nissa::{Error, Hub, JsonlConfig, JsonlSink, Sink};
use proptest::prelude::*;

fn alpha(value: f64, seq: i64) -> TelemetryPacket {
    let mut packet = TelemetryPacket::new("kasmina.r0c1", TelemetryLevel::Info).with_metric(
        TelemetryMetric::new(leyline::telemetry::KASMINA_SEED_ALPHA, value, "ratio"),
    );
    packet.timestamp_unix_ns = seq;
    packet
}

/// Every line of every `.jsonl` file in `dir`, files in name order.
fn lines_in(dir: &std::path::Path) -> Vec<String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            assert!(
                text.is_empty() || text.ends_with('\n'),
                "{file:?} ends mid-line"
            );
            text.lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .collect()
}

fn scrape(hub: &Hub) -> String {
    let addr = hub.metrics_addr().expect("the hub serves metrics");
    let mut response = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .expect("scrape succeeds");
    response.body_mut().read_to_string().expect("body is text")
}

#[test]
fn non_finite_metrics_are_refused_and_counted_failed_by_every_sink() {
    let dir = tempfile::tempdir().unwrap();
    let hub = Hub::builder()
        .jsonl(JsonlConfig::new(dir.path()))
        .tracing()
        .prometheus_on_port(0)
        .build()
        .unwrap();
    let mut stray = TelemetryPacket::new("test", TelemetryLevel::Info)
        .with_metric(TelemetryMetric::new("not.in.the.catalogue", f64::NAN, ""));
    stray.timestamp_unix_ns = 100;
    let sent = [
        alpha(0.1, 0),
        alpha(f64::NAN, 1),
        alpha(0.2, 2),
        alpha(f64::INFINITY, 3),
        alpha(0.3, 4),
        alpha(f64::NEG_INFINITY, 5),
        alpha(-f64::NAN, 6),
        stray,
    ];
    for packet in &sent {
        hub.emit(packet.clone());
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let body = scrape(&hub);
    let alpha_lines: Vec<&str> = body
        .lines()
        .filter(|line| line.starts_with("kasmina_seed_alpha"))
        .collect();
    assert_eq!(
        alpha_lines,
        ["kasmina_seed_alpha{} 0.3"],
        "the last finite value is exposed:\n{body}"
    );
    for line in body.lines().filter(|line| !line.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap_or_default();
        assert!(
            value.parse::<f64>().is_ok_and(f64::is_finite),
            "non-finite sample {line:?}"
        );
    }
    let stats = hub.stats();
    for name in ["jsonl", "tracing", "prometheus"] {
        let sink = stats.sink(name).unwrap();
        assert_eq!(sink.delivered, 3, "{sink:?}");
        assert_eq!(sink.failed, 5, "{sink:?}");
    }
    hub.close();
    let lines = lines_in(dir.path());
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert!(!line.contains("null"), "{line}");
        let packet = TelemetryPacket::from_json(line).unwrap();
        assert!(packet.metrics.iter().all(|metric| metric.value.is_finite()));
    }
    let seqs: Vec<i64> = lines
        .iter()
        .map(|line| TelemetryPacket::from_json(line).unwrap().timestamp_unix_ns)
        .collect();
    assert_eq!(seqs, [0, 2, 4]);
}

#[test]
fn packets_leyline_cannot_read_back_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let hub = Hub::builder()
        .jsonl(JsonlConfig::new(dir.path()))
        .build()
        .unwrap();
    let mut old_schema = alpha(0.5, 1);
    old_schema.schema_version = 0;
    let mut bad_level = alpha(0.5, 2);
    bad_level.level = 42;
    let nameless = TelemetryPacket::new("test", TelemetryLevel::Info)
        .with_metric(TelemetryMetric::new("", 1.0, ""));
    let mut bad_event_level =
        TelemetryPacket::new("test", TelemetryLevel::Info).with_event(TelemetryEvent::new(
            leyline::telemetry::TOLARIA_GRAPH_FALLBACK,
            TelemetryLevel::Info,
            "x",
        ));
    bad_event_level.events[0].level = -3;
    for packet in [
        old_schema,
        alpha(0.5, 3),
        bad_level,
        nameless,
        bad_event_level,
    ] {
        hub.emit(packet);
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let sink = hub.stats().sink("jsonl").unwrap().clone();
    hub.close();
    assert_eq!((sink.delivered, sink.failed), (1, 4), "{sink:?}");
    let lines = lines_in(dir.path());
    assert_eq!(lines.len(), 1);
    assert_eq!(
        TelemetryPacket::from_json(&lines[0])
            .unwrap()
            .timestamp_unix_ns,
        3
    );
}

/// A writer that accepts `budget` more bytes (in pieces of at most 7, so that
/// a line is written in several calls) and then fails like a full disk.
#[derive(Clone, Default)]
struct ShortWriter {
    bytes: Arc<Mutex<Vec<u8>>>,
    budget: Arc<AtomicUsize>,
}

impl Write for ShortWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let budget = self.budget.load(Ordering::Acquire);
        if budget == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left (test)",
            ));
        }
        let n = buf.len().min(budget).min(7);
        self.bytes.lock().unwrap().extend_from_slice(&buf[..n]);
        self.budget.fetch_sub(n, Ordering::AcqRel);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_short_write_is_never_glued_to_the_next_line_and_counts_exactly() {
    let line_len = serde_json::to_string(&alpha(0.5, 10)).unwrap().len() + 1;
    for cut in [0, 1, line_len / 2, line_len - 1, line_len, 2 * line_len + 3] {
        let writer = ShortWriter::default();
        writer.budget.store(cut, Ordering::Release);
        let hub = Hub::builder()
            .sink(JsonlSink::to_writer("short", writer.clone()))
            .build()
            .unwrap();
        for seq in 10..15 {
            hub.emit(alpha(0.5, seq));
        }
        assert!(hub.flush(Duration::from_secs(10)).is_complete());
        writer.budget.store(usize::MAX, Ordering::Release);
        for seq in 15..18 {
            hub.emit(alpha(0.5, seq));
        }
        assert!(hub.flush(Duration::from_secs(10)).is_complete());
        let sink = hub.stats().sink("short").unwrap().clone();
        hub.close();
        let text = String::from_utf8(writer.bytes.lock().unwrap().clone()).unwrap();
        let mut readable = Vec::new();
        let mut fragments = 0;
        for line in text.lines() {
            match TelemetryPacket::from_json(line) {
                Ok(packet) => readable.push(packet.timestamp_unix_ns),
                Err(_) => fragments += 1,
            }
        }
        assert!(
            fragments <= 1,
            "cut {cut}: {fragments} broken lines:\n{text}"
        );
        assert_eq!(
            sink.delivered,
            readable.len() as u64,
            "cut {cut}: {sink:?}\n{text}"
        );
        assert_eq!(sink.delivered + sink.failed, 8, "cut {cut}: {sink:?}");
        // What came after the failure is whole.
        assert!(readable.ends_with(&[15, 16, 17]), "cut {cut}: {readable:?}");
        // Whole lines before the cut are read back, and so is a line that
        // lacks only its newline (it gets one before the next line).
        assert_eq!(readable.len(), (cut + 1) / line_len + 3, "cut {cut}");
    }
}

#[test]
fn file_stems_that_leave_the_run_directory_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("run");
    for stem in [
        "",
        ".",
        "..",
        "../escape",
        "/abs/path",
        "a/b",
        "a\\b",
        "nul\0byte",
        "new\nline",
        ".hidden",
        &"x".repeat(10_000),
    ] {
        let mut config = JsonlConfig::new(&dir);
        config.file_stem = stem.to_owned();
        let result = JsonlSink::create(config);
        assert!(
            matches!(
                result,
                Err(Error::Config {
                    field: "file_stem",
                    ..
                })
            ),
            "{stem:?} accepted"
        );
    }
    // Nothing was created anywhere.
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    let mut config = JsonlConfig::new(&dir);
    config.file_stem = "events_v2-a.b".to_owned();
    let sink = JsonlSink::create(config).unwrap();
    assert_eq!(
        sink.current_path().unwrap(),
        dir.join("events_v2-a.b-0000.jsonl")
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any stem either is refused with a typed error naming `file_stem`, or
    /// yields a file directly inside the run directory.
    #[test]
    fn any_accepted_stem_stays_inside_the_run_directory(stem in hostile_string()) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run");
        let mut config = JsonlConfig::new(&dir);
        config.file_stem = stem.clone();
        match JsonlSink::create(config) {
            Ok(sink) => {
                let path = sink.current_path().unwrap();
                prop_assert_eq!(path.parent(), Some(dir.as_path()), "{:?}", stem);
                prop_assert!(path.exists());
                let entries = std::fs::read_dir(root.path()).unwrap().count();
                prop_assert_eq!(entries, 1);
            }
            Err(Error::Config { field, .. }) => prop_assert_eq!(field, "file_stem"),
            Err(other) => prop_assert!(false, "{:?}: untyped refusal {:?}", stem, other),
        }
    }

    /// Rotation settings from hostile integers: refused with a typed error or
    /// honoured, never a panic; every line written reads back.
    #[test]
    fn extreme_rotation_settings_never_panic(
        max_file_bytes in extreme_u64(),
        max_files in proptest::option::of(extreme_usize()),
        packets in 1usize..12,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = JsonlConfig::new(dir.path()).max_file_bytes(max_file_bytes);
        config.max_files = max_files;
        let mut sink = match JsonlSink::create(config) {
            Ok(sink) => sink,
            Err(Error::Config { field, .. }) => {
                prop_assert!(field == "max_file_bytes" || field == "max_files");
                return Ok(());
            }
            Err(other) => {
                prop_assert!(false, "untyped refusal {:?}", other);
                return Ok(());
            }
        };
        for seq in 0..packets {
            sink.write(&alpha(0.5, seq as i64)).unwrap();
            sink.flush().unwrap();
        }
        let lines = lines_in(dir.path());
        prop_assert!(!lines.is_empty() && lines.len() <= packets);
        for line in &lines {
            prop_assert!(TelemetryPacket::from_json(line).is_ok());
        }
    }
}
