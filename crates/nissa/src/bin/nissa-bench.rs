//! `nissa-emit` benchmark: hot-path emit latency and offered rate with a
//! deliberately slow sink, and the exact drop accounting.
//!
//! Usage: `nissa-bench --out PATH.json --label LABEL [--quick]`. Progress goes
//! to standard error, a result table to standard output, and a
//! `leyline::baseline::BaselineRecord` (workload `nissa-emit`) to `--out`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use leyline::TelemetryLevel;
use leyline::baseline::{
    BASELINE_SCHEMA, BaselineRecord, BenchArgs, BenchCommand, Environment, ResultEntry, percentile,
};
use leyline::proto::{TelemetryMetric, TelemetryPacket};
use nissa::{Hub, HubConfig, Sink, SlowSink};

/// A fast sink that only counts, to show the slow one stalls nobody.
struct CountingSink {
    seen: Arc<AtomicU64>,
}

impl Sink for CountingSink {
    fn name(&self) -> &str {
        "counting"
    }

    fn write(&mut self, packet: &TelemetryPacket) -> nissa::Result<()> {
        self.seen
            .fetch_add(packet.metrics.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// The workload's parameters.
#[derive(Clone, Copy)]
struct Params {
    events_per_producer: usize,
    queue_capacity: usize,
    sink_queue_capacity: usize,
    slow_sink_delay: Duration,
    repeats: usize,
}

/// What one producer measured.
struct ProducerRun {
    latencies_ns: Vec<f64>,
    /// Time spent in the emit loops (packets pre-built).
    emitting: Duration,
    /// Wall time including building the packets.
    elapsed: Duration,
}

/// Packets are built in chunks of this many, outside the timed emit loop.
const CHUNK: usize = 16_384;

fn build_packet(source: &str, index: usize) -> TelemetryPacket {
    TelemetryPacket {
        schema_version: leyline::SCHEMA_VERSION,
        source: source.to_owned(),
        timestamp_unix_ns: index as i64,
        level: TelemetryLevel::Info.value(),
        metrics: vec![TelemetryMetric::new(
            leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS,
            index as f64,
            "ms",
        )],
        events: Vec::new(),
    }
}

fn produce(hub: &Hub, events: usize, producer: usize) -> ProducerRun {
    let mut latencies_ns = Vec::with_capacity(events);
    let source = format!("bench.{producer}");
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut emitting = Duration::ZERO;
    let started = Instant::now();
    let mut next = 0;
    while next < events {
        // Building a packet is the caller's cost; it is timed in the
        // `_with_build` rate only.
        let end = (next + CHUNK).min(events);
        chunk.extend((next..end).map(|index| build_packet(&source, index)));
        let loop_started = Instant::now();
        for packet in chunk.drain(..) {
            let before = Instant::now();
            hub.emit(packet);
            latencies_ns.push(before.elapsed().as_nanos() as f64);
        }
        emitting += loop_started.elapsed();
        next = end;
    }
    ProducerRun {
        latencies_ns,
        emitting,
        elapsed: started.elapsed(),
    }
}

fn run_mode(producers: usize, params: Params) -> anyhow::Result<ResultEntry> {
    let seen = Arc::new(AtomicU64::new(0));
    let slow = SlowSink::new(params.slow_sink_delay);
    let hub = Hub::builder()
        .config(HubConfig {
            queue_capacity: params.queue_capacity,
            sink_queue_capacity: params.sink_queue_capacity,
            ..HubConfig::default()
        })
        .sink(slow.clone())
        .sink(CountingSink {
            seen: Arc::clone(&seen),
        })
        .build()?;
    // Warm-up: fault in the queues and the allocator.
    let _ = produce(&hub, params.events_per_producer / 10, 0);
    if !hub.flush(Duration::from_secs(30)).is_complete() {
        bail!("warm-up flush did not finish");
    }
    let before = hub.stats();

    let mut latencies = Vec::new();
    let mut offered_rates = Vec::new();
    let mut build_rates = Vec::new();
    for repeat in 0..params.repeats {
        let runs: Vec<ProducerRun> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..producers)
                .map(|producer| {
                    let hub = hub.clone();
                    scope.spawn(move || produce(&hub, params.events_per_producer, producer))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("producer thread panicked"))
                .collect()
        });
        // Conservative: all events over the longest producer's emit time.
        let events = (producers * params.events_per_producer) as f64;
        let emitting = runs
            .iter()
            .map(|run| run.emitting)
            .max()
            .unwrap_or_default();
        let elapsed = runs.iter().map(|run| run.elapsed).max().unwrap_or_default();
        let offered = events / emitting.as_secs_f64();
        let with_build = events / elapsed.as_secs_f64();
        eprintln!(
            "  {producers} producer(s), repeat {}: {:.2} M events/s offered \
             ({:.2} M/s including building the packets)",
            repeat + 1,
            offered / 1e6,
            with_build / 1e6
        );
        offered_rates.push(offered);
        build_rates.push(with_build);
        for run in runs {
            latencies.extend(run.latencies_ns);
        }
    }
    let flush_started = Instant::now();
    let flushed = hub.flush(Duration::from_secs(60));
    let flush_ms = flush_started.elapsed().as_secs_f64() * 1e3;
    let stats = hub.stats();
    hub.close();

    let expected = (producers * params.events_per_producer * params.repeats) as u64;
    let emitted = stats.emitted - before.emitted;
    let mut exact = flushed.is_complete() && emitted == expected;
    let mut metrics = BTreeMap::new();
    for sink in &stats.sinks {
        let earlier = before.sink(&sink.name).cloned().unwrap_or_default();
        let delivered = sink.delivered - earlier.delivered;
        let dropped = sink.dropped - earlier.dropped;
        let failed = sink.failed - earlier.failed;
        exact &= emitted == delivered + dropped + failed && sink.pending == 0;
        let prefix = if sink.name == "slow" { "" } else { "fast_" };
        metrics.insert(format!("{prefix}delivered"), delivered as f64);
        metrics.insert(format!("{prefix}dropped"), dropped as f64);
        metrics.insert(format!("{prefix}failed"), failed as f64);
    }
    exact &= seen.load(Ordering::Relaxed) == stats.sink("counting").map_or(0, |s| s.delivered);
    exact &= slow.written() == stats.sink("slow").map_or(0, |s| s.delivered);

    let p = |percent| percentile(&latencies, percent).unwrap_or(f64::NAN);
    let mean_offered = offered_rates.iter().sum::<f64>() / offered_rates.len() as f64;
    metrics.insert("events_per_s".to_owned(), mean_offered);
    metrics.insert(
        "events_per_s_min".to_owned(),
        offered_rates.iter().copied().fold(f64::INFINITY, f64::min),
    );
    metrics.insert(
        "events_per_s_with_build".to_owned(),
        build_rates.iter().sum::<f64>() / build_rates.len() as f64,
    );
    metrics.insert("emit_ns_p50".to_owned(), p(50.0));
    metrics.insert("emit_ns_p99".to_owned(), p(99.0));
    metrics.insert("emit_ns_p999".to_owned(), p(99.9));
    metrics.insert("emit_ns_max".to_owned(), p(100.0));
    metrics.insert("emitted".to_owned(), emitted as f64);
    metrics.insert(
        "queue_dropped".to_owned(),
        (stats.queue_dropped - before.queue_dropped) as f64,
    );
    metrics.insert("flush_ms".to_owned(), flush_ms);
    metrics.insert("accounting_exact".to_owned(), f64::from(u8::from(exact)));
    let error = (!exact)
        .then(|| format!("accounting mismatch: expected {expected} emitted, stats {stats:?}"));
    Ok(ResultEntry {
        implementation: "rust".to_owned(),
        mode: format!("{producers}-producer"),
        metrics,
        error,
    })
}

fn main() -> anyhow::Result<()> {
    let options = match BenchArgs::parse(std::env::args().skip(1))? {
        BenchCommand::Run(options) => options,
        BenchCommand::Help => {
            println!("usage: nissa-bench --out PATH.json --label LABEL [--quick]");
            return Ok(());
        }
    };
    // The hub reports its (deliberate) drops here once every ten seconds.
    nissa::init_subscriber("warn")?;
    let params = Params {
        events_per_producer: if options.quick { 200_000 } else { 2_000_000 },
        queue_capacity: 8192,
        sink_queue_capacity: 4096,
        slow_sink_delay: Duration::from_micros(20),
        repeats: if options.quick { 1 } else { 3 },
    };
    let mut results = Vec::new();
    for producers in [1, 2] {
        eprintln!("nissa-emit: {producers} producer(s)");
        results.push(run_mode(producers, params)?);
    }

    println!(
        "{:<12} {:>12} {:>9} {:>9} {:>9} {:>10} {:>12} {:>12} {:>12} {:>6}",
        "mode",
        "events/s",
        "p50 ns",
        "p99 ns",
        "max ns",
        "emitted",
        "slow deliv",
        "slow drop",
        "fast deliv",
        "exact"
    );
    for entry in &results {
        let m = |key: &str| entry.metrics.get(key).copied().unwrap_or(f64::NAN);
        println!(
            "{:<12} {:>12.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>12.0} {:>12.0} {:>12.0} {:>6}",
            entry.mode,
            m("events_per_s"),
            m("emit_ns_p50"),
            m("emit_ns_p99"),
            m("emit_ns_max"),
            m("emitted"),
            m("delivered"),
            m("dropped"),
            m("fast_delivered"),
            if m("accounting_exact") == 1.0 {
                "yes"
            } else {
                "NO"
            }
        );
    }

    let record = BaselineRecord {
        schema: BASELINE_SCHEMA,
        workload: "nissa-emit".to_owned(),
        label: options.label,
        environment: Environment::cpu_only(),
        params: serde_json::json!({
            "events_per_producer": params.events_per_producer,
            "repeats": params.repeats,
            "producers": [1, 2],
            "queue_capacity": params.queue_capacity,
            "sink_queue_capacity": params.sink_queue_capacity,
            "slow_sink_delay_us": params.slow_sink_delay.as_micros() as u64,
            "sinks": ["slow", "counting"],
            "latency_includes": "one Instant::now() pair per emit",
            "events_per_s": "all producers' events over the longest producer's time inside its emit loops (packets pre-built in chunks of 16384)",
            "events_per_s_with_build": "the same over wall time including building each packet (4 allocations)",
        }),
        results,
        telemetry_names: vec![
            leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS.to_owned(),
            leyline::telemetry::NISSA_DROPPED_TOTAL.to_owned(),
            leyline::telemetry::NISSA_SINK_DROPPED_TOTAL.to_owned(),
        ],
    };
    record
        .write_to(&options.out)
        .with_context(|| format!("writing {}", options.out.display()))?;
    eprintln!("wrote {}", options.out.display());
    if record.results.iter().any(|entry| entry.error.is_some()) {
        bail!("drop accounting was not exact; see the record");
    }
    Ok(())
}
