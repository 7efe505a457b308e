//! A telemetry hub as a training program sets one up: a JSON-lines sink into
//! a run folder, a Prometheus registry, an in-memory sink, and a sink that
//! always fails, behind one hub. Producers hold leyline's `Telemetry`
//! handle. After a flush the accounting says, per sink, what was delivered
//! and what failed: nothing is lost without being counted.
//!
//! ```sh
//! cargo run -p nissa --example telemetry_hub            # into a temporary folder, removed after
//! cargo run -p nissa --example telemetry_hub -- DIR     # keep the JSON lines in DIR
//! ```

use std::time::Duration;

use leyline::telemetry::{KASMINA_SEED_GERMINATED, TOLARIA_TRAINING_LATENCY_MS};
use leyline::{TelemetryLevel, metric};
use nissa::testing::{FailingSink, MemorySink};
use nissa::{Hub, JsonlConfig, PrometheusSink};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kept = std::env::args().nth(1).map(std::path::PathBuf::from);
    let dir = kept.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("nissa-example-{}", std::process::id()))
    });
    let memory = MemorySink::named("memory");
    let prometheus = PrometheusSink::new();
    let hub = Hub::builder()
        .jsonl(JsonlConfig::new(&dir))
        .sink(memory.clone())
        .sink(prometheus.clone())
        .sink(FailingSink::new())
        .build()?;

    // What a trainer and Kasmina emit, through the handle they hold.
    let telemetry = hub.telemetry();
    for epoch in 0..5 {
        telemetry.emit_metrics(
            "example.trainer",
            TelemetryLevel::Info,
            [metric(TOLARIA_TRAINING_LATENCY_MS, 40.0 + f64::from(epoch))],
        );
    }
    telemetry.emit_event(
        "example.kasmina",
        KASMINA_SEED_GERMINATED,
        "seed-1 germinated in r0c1",
        vec![("slot", "r0c1".to_owned())],
    );

    let flushed = hub.flush(Duration::from_secs(5));
    println!(
        "flush complete: {} (pending {})",
        flushed.is_complete(),
        flushed.pending
    );
    let stats = hub.stats();
    println!("emitted {} packets", stats.emitted);
    for sink in &stats.sinks {
        println!(
            "  sink {:<12} delivered {:>2}  failed {:>2}  dropped {:>2}",
            sink.name, sink.delivered, sink.failed, sink.dropped
        );
    }
    println!(
        "memory sink saw {} germination event(s)",
        memory.events_named(KASMINA_SEED_GERMINATED).len()
    );
    let exposition = prometheus.exposition();
    let latency: Vec<&str> = exposition
        .lines()
        .filter(|line| line.contains("training_latency_ms_count"))
        .collect();
    println!("prometheus: {latency:?}");
    hub.close();

    let files: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    for file in &files {
        let lines = std::fs::read_to_string(file)?.lines().count();
        println!("{}: {lines} JSON lines", file.display());
    }
    if kept.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
