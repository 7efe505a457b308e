//! The JSONL sink: one packet per line, run directories, size-based rotation.

use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use nissa::{Hub, JsonlConfig, JsonlSink, Sink};

/// A packet stamped with `seq`; for `seq` of equal digit count the JSON lines
/// have equal length, which the rotation tests rely on.
fn numbered(seq: u64) -> TelemetryPacket {
    let mut event = TelemetryEvent::new(
        leyline::telemetry::KASMINA_SEED_STAGE_CHANGED,
        TelemetryLevel::Info,
        "seed moved on",
    );
    event
        .attributes
        .insert("from".to_owned(), "TRAINING".to_owned());
    event
        .attributes
        .insert("to".to_owned(), "BLENDING".to_owned());
    let mut packet = TelemetryPacket::new("kasmina.r0c1", TelemetryLevel::Info)
        .with_metric(TelemetryMetric::new(
            leyline::telemetry::KASMINA_SEED_ALPHA,
            0.5,
            "ratio",
        ))
        .with_event(event);
    packet.timestamp_unix_ns = seq as i64;
    packet
}

/// Every line of every `events-*.jsonl` file in `dir`, files in name order.
fn read_lines(dir: &std::path::Path) -> (Vec<(String, u64)>, Vec<TelemetryPacket>) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    let mut sizes = Vec::new();
    let mut packets = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        sizes.push((
            file.file_name().unwrap().to_string_lossy().into_owned(),
            text.len() as u64,
        ));
        for line in text.lines() {
            packets.push(serde_json::from_str::<TelemetryPacket>(line).unwrap());
        }
    }
    (sizes, packets)
}

#[test]
fn packets_round_trip_one_per_line_through_the_hub() {
    let root = tempfile::tempdir().unwrap();
    let config = JsonlConfig::new_run_dir(root.path()).unwrap();
    let run_dir = config.dir.clone();
    let name = run_dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("telemetry_20"), "{name}");
    // A second run directory in the same second gets a suffix.
    let second = JsonlConfig::new_run_dir(root.path()).unwrap();
    assert_ne!(second.dir, run_dir);

    let hub = Hub::builder().jsonl(config).build().unwrap();
    let sent: Vec<TelemetryPacket> = (0..200).map(numbered).collect();
    for packet in &sent {
        hub.emit(packet.clone());
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    hub.close();
    let (sizes, received) = read_lines(&run_dir);
    assert_eq!(sizes.len(), 1, "{sizes:?}");
    assert_eq!(sizes[0].0, "events-0000.jsonl");
    assert_eq!(received, sent);
}

#[test]
fn files_rotate_by_size_without_splitting_lines() {
    let dir = tempfile::tempdir().unwrap();
    let line_len = serde_json::to_string(&numbered(100)).unwrap().len() as u64 + 1;
    let max = line_len * 10 + line_len / 2;
    let mut sink = JsonlSink::create(JsonlConfig::new(dir.path()).max_file_bytes(max)).unwrap();
    let sent: Vec<TelemetryPacket> = (100..195).map(numbered).collect();
    for batch in sent.chunks(7) {
        for packet in batch {
            sink.write(packet).unwrap();
        }
        sink.flush().unwrap();
    }
    let (sizes, received) = read_lines(dir.path());
    assert_eq!(received, sent);
    // 95 lines of equal length, 10 per file.
    assert_eq!(sizes.len(), 10, "{sizes:?}");
    for (index, (name, size)) in sizes.iter().enumerate() {
        assert_eq!(name, &format!("events-{index:04}.jsonl"));
        assert!(*size <= max, "{name} has {size} bytes, over {max}");
    }
    assert_eq!(sizes[9].1, line_len * 5);
    assert_eq!(
        sink.current_path().unwrap(),
        dir.path().join("events-0009.jsonl")
    );
}

#[test]
fn old_files_are_removed_beyond_max_files() {
    let dir = tempfile::tempdir().unwrap();
    let line_len = serde_json::to_string(&numbered(100)).unwrap().len() as u64 + 1;
    let config = JsonlConfig::new(dir.path())
        .max_file_bytes(line_len * 2)
        .max_files(3);
    let mut sink = JsonlSink::create(config).unwrap();
    for seq in 100..120 {
        sink.write(&numbered(seq)).unwrap();
        sink.flush().unwrap();
    }
    let (sizes, received) = read_lines(dir.path());
    let names: Vec<_> = sizes.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "events-0007.jsonl",
            "events-0008.jsonl",
            "events-0009.jsonl"
        ]
    );
    let seqs: Vec<_> = received.iter().map(|p| p.timestamp_unix_ns).collect();
    assert_eq!(seqs, (114..120).collect::<Vec<_>>());
}

#[test]
fn an_existing_directory_is_appended_to_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("events-0000.jsonl"), "kept\n").unwrap();
    let mut sink = JsonlSink::create(JsonlConfig::new(dir.path())).unwrap();
    sink.write(&numbered(1)).unwrap();
    sink.flush().unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("events-0000.jsonl")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        sink.current_path().unwrap(),
        dir.path().join("events-0001.jsonl")
    );
}

#[test]
fn an_unwritable_directory_is_an_error_at_build_time() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let result = Hub::builder().jsonl(JsonlConfig::new(&file)).build();
    assert!(matches!(result, Err(nissa::Error::Io { .. })), "{result:?}");
}

#[test]
fn a_broken_pipe_fails_the_batch_and_the_next_batch_still_tries() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut sink = JsonlSink::to_writer("pipe", writer);
    sink.write(&numbered(1)).unwrap();
    let error = sink.flush().unwrap_err();
    assert!(error.to_string().contains("pipe"), "{error}");
    sink.write(&numbered(2)).unwrap();
    assert!(sink.flush().is_err());
}
