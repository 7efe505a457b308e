//! Write failures injected into the JSONL sink's files: what is counted
//! delivered is exactly what reads back, and every line in a file parses.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::codec::Contract;
use leyline::proto::{TelemetryMetric, TelemetryPacket};

use super::output::{LineFile, Opener};
use super::{JsonlConfig, JsonlSink};
use crate::Hub;

/// Shared switches of the faulty files: a byte budget for writes (pieces of
/// at most 5 bytes) and whether cutting a file back fails.
#[derive(Clone, Default)]
struct Faults {
    budget: Arc<AtomicUsize>,
    truncate_fails: Arc<AtomicBool>,
}

struct FaultyFile {
    file: std::fs::File,
    faults: Faults,
}

impl Write for FaultyFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let budget = self.faults.budget.load(Ordering::Acquire);
        if budget == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left (injected)",
            ));
        }
        let n = buf.len().min(budget).min(5);
        let n = self.file.write(&buf[..n])?;
        self.faults.budget.fetch_sub(n, Ordering::AcqRel);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl LineFile for FaultyFile {
    fn truncate_to(&mut self, len: u64) -> std::io::Result<()> {
        if self.faults.truncate_fails.load(Ordering::Acquire) {
            return Err(std::io::Error::other("truncate refused (injected)"));
        }
        self.file.truncate_to(len)
    }
}

fn opener(faults: &Faults) -> Opener {
    let faults = faults.clone();
    Box::new(move |path: &Path| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(FaultyFile {
            file,
            faults: faults.clone(),
        }) as Box<dyn LineFile>)
    })
}

fn packet(seq: i64) -> TelemetryPacket {
    let mut packet = TelemetryPacket::new("kasmina.r0c1", TelemetryLevel::Info).with_metric(
        TelemetryMetric::new(leyline::telemetry::KASMINA_SEED_ALPHA, 0.5, "ratio"),
    );
    packet.timestamp_unix_ns = seq;
    packet
}

/// `(parsed sequence numbers, unparseable lines)` over every file in `dir`.
fn read_back(dir: &Path) -> (Vec<i64>, usize, Vec<String>) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let mut seqs = Vec::new();
    let mut broken = 0;
    let mut texts = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            match TelemetryPacket::from_json(line) {
                Ok(packet) => seqs.push(packet.timestamp_unix_ns),
                Err(_) => broken += 1,
            }
        }
        texts.push(text);
    }
    (seqs, broken, texts)
}

/// Emits 6 packets with `cut` bytes of room, then 4 with plenty, through a
/// hub; returns the sink's statistics and what reads back.
fn run(
    cut: usize,
    truncate_fails: bool,
    max_file_bytes: u64,
) -> (crate::SinkStats, Vec<i64>, usize, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::default();
    faults.budget.store(cut, Ordering::Release);
    faults
        .truncate_fails
        .store(truncate_fails, Ordering::Release);
    let config = JsonlConfig::new(dir.path()).max_file_bytes(max_file_bytes);
    let sink = JsonlSink::create_with(config, opener(&faults)).unwrap();
    let hub = Hub::builder().sink(sink).build().unwrap();
    for seq in 0..6 {
        hub.emit(packet(seq));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    faults.budget.store(usize::MAX, Ordering::Release);
    for seq in 6..10 {
        hub.emit(packet(seq));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let stats = hub.stats().sink("jsonl").unwrap().clone();
    hub.close();
    let (seqs, broken, texts) = read_back(dir.path());
    (stats, seqs, broken, texts)
}

#[test]
fn a_failed_write_is_cut_back_so_every_line_in_the_files_parses() {
    let line = serde_json::to_string(&packet(0)).unwrap().len() + 1;
    for max_file_bytes in [u64::MAX, (2 * line + 1) as u64, 1] {
        for cut in [0, 1, line - 1, line, line + 3, 3 * line + 2] {
            let (stats, seqs, broken, texts) = run(cut, false, max_file_bytes);
            let context = format!("cut {cut}, max {max_file_bytes}: {stats:?}\n{texts:?}");
            assert_eq!(broken, 0, "{context}");
            for text in &texts {
                assert!(text.is_empty() || text.ends_with('\n'), "{context}");
            }
            assert_eq!(stats.delivered, seqs.len() as u64, "{context}");
            assert_eq!(stats.delivered + stats.failed, 10, "{context}");
            // The whole lines before the cut, then everything after it.
            let before = (cut / line).min(6) as i64;
            let expected: Vec<i64> = (0..before).chain(6..10).collect();
            assert_eq!(seqs, expected, "{context}");
        }
    }
}

#[test]
fn a_file_that_cannot_be_cut_back_is_left_for_a_fresh_one() {
    let line = serde_json::to_string(&packet(0)).unwrap().len() + 1;
    for cut in [1, line - 1, line + 3, 2 * line - 1, 2 * line + line / 2] {
        let (stats, seqs, broken, texts) = run(cut, true, u64::MAX);
        let context = format!("cut {cut}: {stats:?}\n{texts:?}");
        // One fragment at most, alone at the end of an abandoned file (a
        // batch split by the worker may abandon an empty file too).
        assert!(broken <= 1, "{context}");
        assert!(texts.len() >= 2, "{context}");
        for text in &texts[..texts.len() - 1] {
            let last = text.lines().last().unwrap_or_default();
            for line in text.lines().filter(|line| *line != last) {
                assert!(TelemetryPacket::from_json(line).is_ok(), "{context}");
            }
        }
        assert!(texts.last().unwrap().ends_with('\n'), "{context}");
        assert_eq!(stats.delivered, seqs.len() as u64, "{context}");
        assert_eq!(stats.delivered + stats.failed, 10, "{context}");
        // A last line that lacks only its newline reads back whole.
        let expected: Vec<i64> = (0..((cut + 1) / line) as i64).chain(6..10).collect();
        assert_eq!(seqs, expected, "{context}");
    }
}

#[test]
fn a_first_file_that_cannot_be_created_takes_its_new_directories_back() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("theirs.txt"), b"keep").unwrap();
    let refusing: Opener = Box::new(|_: &Path| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "refused (injected)",
        ))
    });
    let config = JsonlConfig::new(root.path().join("run/telemetry"));
    let error = JsonlSink::create_with(config, refusing)
        .err()
        .expect("the opener refuses");
    assert!(
        matches!(&error, crate::Error::Io { op: "create", .. }),
        "{error:?}"
    );
    // `run` and `run/telemetry` were this call's and are gone; the rest stays.
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(left, ["theirs.txt"]);
    assert_eq!(
        std::fs::read(root.path().join("theirs.txt")).unwrap(),
        b"keep"
    );

    // Into a directory that already existed: the directory stays.
    let refusing: Opener = Box::new(|_: &Path| Err(std::io::Error::other("refused (injected)")));
    assert!(JsonlSink::create_with(JsonlConfig::new(root.path()), refusing).is_err());
    assert!(root.path().is_dir());
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
}

#[test]
fn a_created_sink_records_exactly_its_file_and_new_directories() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("run");
    // An earlier file is kept: the sink opens the next free index.
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("events-0000.jsonl"), b"earlier\n").unwrap();
    let (sink, made) = JsonlSink::create_recorded(JsonlConfig::new(dir.join("deeper"))).unwrap();
    assert_eq!(made.dirs, [dir.join("deeper")]);
    assert_eq!(made.file, Some(dir.join("deeper/events-0000.jsonl")));
    drop(sink);
    made.undo();
    let (sink, made) = JsonlSink::create_recorded(JsonlConfig::new(&dir)).unwrap();
    assert!(made.dirs.is_empty());
    assert_eq!(made.file, Some(dir.join("events-0001.jsonl")));
    drop(sink);
    made.undo();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(left, ["events-0000.jsonl"]);
    assert_eq!(
        std::fs::read(dir.join("events-0000.jsonl")).unwrap(),
        b"earlier\n"
    );
}
