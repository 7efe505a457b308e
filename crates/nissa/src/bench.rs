//! The `nissa-emit` benchmark (DESIGN.md §6): hot-path emit latency and
//! offered rate with a deliberately slow sink, and the exact drop accounting.
//!
//! [`run_emit`] measures and returns the figures as
//! [`leyline::baseline::Measurements`]; it probes no machine and writes no
//! record. `esper bench nissa-emit` is the program that does both.
//!
//! Per producer count ([`PRODUCERS`]) one hub with two sinks (a
//! [`SlowSink`] and a fast one that only counts) takes
//! `events_per_producer` packets from each producer thread, `repeats` times;
//! every packet is built before its timed emit. Figures: events per second
//! offered (all producers' events over the longest producer's time inside its
//! emit loops), the same including packet building, emit latency percentiles
//! (one `Instant::now()` pair per emit), per-sink delivered / dropped /
//! failed, queue drops, flush time, and whether the accounting was exact
//! (`emitted == delivered + dropped + failed` for every sink, and the sinks'
//! own counts agree). An inexact accounting is recorded as the entry's
//! `error`.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leyline::TelemetryLevel;
use leyline::baseline::{Measurements, ResultEntry, percentile};
use leyline::proto::{TelemetryMetric, TelemetryPacket};

use crate::error::{Error, Result};
use crate::{Hub, HubConfig, Sink, SlowSink};

/// Workload name in records.
pub const WORKLOAD: &str = "nissa-emit";

/// Producer thread counts, one result entry (`<n>-producer`) each.
pub const PRODUCERS: [usize; 2] = [1, 2];

/// Largest `events_per_producer` (latency samples are kept in memory).
pub const MAX_EVENTS_PER_PRODUCER: usize = 10_000_000;

/// Largest `repeats`.
pub const MAX_REPEATS: usize = 100;

/// Largest `events_per_producer * repeats`: each producer's latency samples
/// of one mode, 8 bytes each.
pub const MAX_EMITS_PER_PRODUCER: usize = 20_000_000;

/// Longest `slow_sink_delay` (per packet; the final flush waits 60 s).
pub const MAX_SLOW_SINK_DELAY: Duration = Duration::from_secs(1);

/// Packets are built in chunks of this many, outside the timed emit loop.
const CHUNK: usize = 16_384;

/// How long the warm-up flush and the final flush may take.
const WARMUP_FLUSH: Duration = Duration::from_secs(30);
const FINAL_FLUSH: Duration = Duration::from_secs(60);

/// The workload's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmitParams {
    /// Packets each producer emits per repeat (one metric each).
    pub events_per_producer: usize,
    /// The hub's shared queue capacity ([`HubConfig::queue_capacity`]).
    pub queue_capacity: usize,
    /// Each sink's queue capacity ([`HubConfig::sink_queue_capacity`]).
    pub sink_queue_capacity: usize,
    /// Time the slow sink spends on each packet.
    pub slow_sink_delay: Duration,
    /// Measured rounds per producer count.
    pub repeats: usize,
}

impl EmitParams {
    /// The committed settings (2,000,000 events per producer, 3 repeats), or
    /// a smoke run (200,000 events, 1 repeat).
    pub fn new(quick: bool) -> EmitParams {
        EmitParams {
            events_per_producer: if quick { 200_000 } else { 2_000_000 },
            queue_capacity: 8192,
            sink_queue_capacity: 4096,
            slow_sink_delay: Duration::from_micros(20),
            repeats: if quick { 1 } else { 3 },
        }
    }

    /// Checks the counts against their bounds (at least one event and one
    /// repeat, so no figure comes from an empty sample). The queue capacities
    /// are checked when the hub is built.
    ///
    /// # Errors
    /// [`Error::Bench`] naming the parameter and its value.
    pub fn validate(&self) -> Result<()> {
        let out_of_range = |what, value: usize, max: usize| Error::Bench {
            what,
            reason: format!("{value} is outside [1, {max}]"),
        };
        if !(1..=MAX_EVENTS_PER_PRODUCER).contains(&self.events_per_producer) {
            return Err(out_of_range(
                "events_per_producer",
                self.events_per_producer,
                MAX_EVENTS_PER_PRODUCER,
            ));
        }
        if !(1..=MAX_REPEATS).contains(&self.repeats) {
            return Err(out_of_range("repeats", self.repeats, MAX_REPEATS));
        }
        let emits = self.events_per_producer.saturating_mul(self.repeats);
        if emits > MAX_EMITS_PER_PRODUCER {
            return Err(Error::Bench {
                what: "events_per_producer * repeats",
                reason: format!(
                    "{} * {} = {emits} is above {MAX_EMITS_PER_PRODUCER}",
                    self.events_per_producer, self.repeats
                ),
            });
        }
        if self.slow_sink_delay > MAX_SLOW_SINK_DELAY {
            return Err(Error::Bench {
                what: "slow_sink_delay",
                reason: format!(
                    "{:?} is above {MAX_SLOW_SINK_DELAY:?}",
                    self.slow_sink_delay
                ),
            });
        }
        Ok(())
    }

    /// The record's `params` object.
    fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "events_per_producer": self.events_per_producer,
            "repeats": self.repeats,
            "producers": PRODUCERS,
            "queue_capacity": self.queue_capacity,
            "sink_queue_capacity": self.sink_queue_capacity,
            "slow_sink_delay_us": u64::try_from(self.slow_sink_delay.as_micros()).unwrap_or(u64::MAX),
            "sinks": ["slow", "counting"],
            "latency_includes": "one Instant::now() pair per emit",
            "events_per_s": "all producers' events over the longest producer's time inside its emit loops (packets pre-built in chunks of 16384)",
            "events_per_s_with_build": "the same over wall time including building each packet (4 allocations)",
        })
    }
}

/// Runs the benchmark; `progress` receives one line per stage.
///
/// # Errors
/// [`EmitParams::validate`]'s errors, a hub that does not build
/// ([`Error::Config`]), and [`Error::Bench`] when a producer
/// thread panics, the warm-up flush does not finish, or a figure comes out
/// empty or not finite. An inexact accounting is not an error here: it is
/// the entry's `error` in the figures.
pub fn run_emit(params: &EmitParams, progress: &mut dyn FnMut(&str)) -> Result<Measurements> {
    params.validate()?;
    let mut results = Vec::with_capacity(PRODUCERS.len());
    for producers in PRODUCERS {
        progress(&format!("nissa-emit: {producers} producer(s)"));
        results.push(run_mode(producers, params, progress)?);
    }
    Ok(Measurements {
        params: params.to_json(),
        results,
        telemetry_names: vec![
            leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS.to_owned(),
            leyline::telemetry::NISSA_DROPPED_TOTAL.to_owned(),
            leyline::telemetry::NISSA_SINK_DROPPED_TOTAL.to_owned(),
        ],
    })
}

/// A fast sink that only counts, to show the slow one stalls nobody.
struct CountingSink {
    seen: Arc<AtomicU64>,
}

impl Sink for CountingSink {
    fn name(&self) -> &str {
        "counting"
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        let metrics = u64::try_from(packet.metrics.len()).unwrap_or(u64::MAX);
        self.seen.fetch_add(metrics, Ordering::Relaxed);
        Ok(())
    }
}

/// What one producer measured.
struct ProducerRun {
    latencies_ns: Vec<f64>,
    /// Time spent in the emit loops (packets pre-built).
    emitting: Duration,
    /// Wall time including building the packets.
    elapsed: Duration,
}

fn build_packet(source: &str, index: usize) -> TelemetryPacket {
    TelemetryPacket {
        schema_version: leyline::SCHEMA_VERSION,
        source: source.to_owned(),
        timestamp_unix_ns: i64::try_from(index).unwrap_or(i64::MAX),
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
    let mut chunk = Vec::with_capacity(CHUNK.min(events));
    let mut emitting = Duration::ZERO;
    let started = Instant::now();
    let mut next = 0;
    while next < events {
        // Building a packet is the caller's cost; it is timed in the
        // `_with_build` rate only.
        let end = next.saturating_add(CHUNK).min(events);
        chunk.extend((next..end).map(|index| build_packet(&source, index)));
        let loop_started = Instant::now();
        for packet in chunk.drain(..) {
            let before = Instant::now();
            hub.emit(packet);
            latencies_ns.push(before.elapsed().as_nanos() as f64);
        }
        emitting = emitting.saturating_add(loop_started.elapsed());
        next = end;
    }
    ProducerRun {
        latencies_ns,
        emitting,
        elapsed: started.elapsed(),
    }
}

/// `value` when finite, else [`Error::Bench`] naming the figure.
fn finite(what: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(Error::Bench {
            what,
            reason: format!("{value} is not finite"),
        })
    }
}

/// Nearest-rank percentile of a sample set that must not be empty.
fn nearest_rank(what: &'static str, samples: &[f64], percent: f64) -> Result<f64> {
    let value = percentile(samples, percent).ok_or_else(|| Error::Bench {
        what,
        reason: format!("no samples for percentile {percent}"),
    })?;
    finite(what, value)
}

/// Mean of a sample set that must not be empty.
fn mean(what: &'static str, samples: &[f64]) -> Result<f64> {
    if samples.is_empty() {
        return Err(Error::Bench {
            what,
            reason: "no samples".to_owned(),
        });
    }
    finite(what, samples.iter().sum::<f64>() / samples.len() as f64)
}

/// Runs one producer count's repeats on `hub`, returning every emit latency
/// and each repeat's offered rate and rate including packet building.
fn measure(
    hub: &Hub,
    producers: usize,
    params: &EmitParams,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let samples = producers
        .saturating_mul(params.events_per_producer)
        .saturating_mul(params.repeats);
    let mut latencies = Vec::with_capacity(samples);
    let mut offered_rates = Vec::with_capacity(params.repeats);
    let mut build_rates = Vec::with_capacity(params.repeats);
    for repeat in 0..params.repeats {
        let runs: Vec<Option<ProducerRun>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..producers)
                .map(|producer| {
                    let hub = hub.clone();
                    scope.spawn(move || produce(&hub, params.events_per_producer, producer))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().ok())
                .collect()
        });
        let runs: Vec<ProducerRun> =
            runs.into_iter()
                .collect::<Option<_>>()
                .ok_or_else(|| Error::Bench {
                    what: "producer thread",
                    reason: format!("a producer of {producers} panicked"),
                })?;
        // Conservative: all events over the longest producer's emit time.
        let events = producers.saturating_mul(params.events_per_producer) as f64;
        let emitting = runs
            .iter()
            .map(|run| run.emitting)
            .max()
            .unwrap_or_default();
        let elapsed = runs.iter().map(|run| run.elapsed).max().unwrap_or_default();
        let offered = finite("events_per_s", events / emitting.as_secs_f64())?;
        let with_build = finite("events_per_s_with_build", events / elapsed.as_secs_f64())?;
        progress(&format!(
            "  {producers} producer(s), repeat {}: {:.2} M events/s offered \
             ({:.2} M/s including building the packets)",
            repeat.saturating_add(1),
            offered / 1e6,
            with_build / 1e6
        ));
        offered_rates.push(offered);
        build_rates.push(with_build);
        for run in runs {
            latencies.extend(run.latencies_ns);
        }
    }
    Ok((latencies, offered_rates, build_rates))
}

fn run_mode(
    producers: usize,
    params: &EmitParams,
    progress: &mut dyn FnMut(&str),
) -> Result<ResultEntry> {
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
    let _ = produce(
        &hub,
        params.events_per_producer.checked_div(10).unwrap_or(0),
        0,
    );
    if !hub.flush(WARMUP_FLUSH).is_complete() {
        return Err(Error::Bench {
            what: "warm-up flush",
            reason: format!("did not finish within {WARMUP_FLUSH:?}"),
        });
    }
    let before = hub.stats();

    let (latencies, offered_rates, build_rates) = measure(&hub, producers, params, progress)?;
    let flush_started = Instant::now();
    let flushed = hub.flush(FINAL_FLUSH);
    let flush_ms = flush_started.elapsed().as_secs_f64() * 1e3;
    let stats = hub.stats();
    hub.close();

    let expected = u64::try_from(
        producers
            .saturating_mul(params.events_per_producer)
            .saturating_mul(params.repeats),
    )
    .unwrap_or(u64::MAX);
    let emitted = stats.emitted.saturating_sub(before.emitted);
    let mut exact = flushed.is_complete() && emitted == expected;
    let mut metrics = BTreeMap::new();
    for sink in &stats.sinks {
        let earlier = before.sink(&sink.name).cloned().unwrap_or_default();
        let delivered = sink.delivered.saturating_sub(earlier.delivered);
        let dropped = sink.dropped.saturating_sub(earlier.dropped);
        let failed = sink.failed.saturating_sub(earlier.failed);
        let accounted = delivered
            .checked_add(dropped)
            .and_then(|sum| sum.checked_add(failed));
        exact &= accounted == Some(emitted) && sink.pending == 0;
        let prefix = if sink.name == "slow" { "" } else { "fast_" };
        metrics.insert(format!("{prefix}delivered"), delivered as f64);
        metrics.insert(format!("{prefix}dropped"), dropped as f64);
        metrics.insert(format!("{prefix}failed"), failed as f64);
    }
    exact &= seen.load(Ordering::Relaxed) == stats.sink("counting").map_or(0, |s| s.delivered);
    exact &= slow.written() == stats.sink("slow").map_or(0, |s| s.delivered);

    let min_offered = offered_rates.iter().copied().fold(f64::INFINITY, f64::min);
    metrics.insert(
        "events_per_s".to_owned(),
        mean("events_per_s", &offered_rates)?,
    );
    metrics.insert(
        "events_per_s_min".to_owned(),
        finite("events_per_s_min", min_offered)?,
    );
    metrics.insert(
        "events_per_s_with_build".to_owned(),
        mean("events_per_s_with_build", &build_rates)?,
    );
    for (key, percent) in [
        ("emit_ns_p50", 50.0),
        ("emit_ns_p99", 99.0),
        ("emit_ns_p999", 99.9),
        ("emit_ns_max", 100.0),
    ] {
        metrics.insert(key.to_owned(), nearest_rank(key, &latencies, percent)?);
    }
    metrics.insert("emitted".to_owned(), emitted as f64);
    metrics.insert(
        "queue_dropped".to_owned(),
        stats.queue_dropped.saturating_sub(before.queue_dropped) as f64,
    );
    metrics.insert("flush_ms".to_owned(), finite("flush_ms", flush_ms)?);
    metrics.insert("accounting_exact".to_owned(), f64::from(u8::from(exact)));
    let error = (!exact)
        .then(|| format!("accounting mismatch: expected {expected} emitted, stats {stats:?}"));
    Ok(ResultEntry {
        amp: None,
        implementation: "rust".to_owned(),
        mode: format!("{producers}-producer"),
        metrics,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> EmitParams {
        EmitParams {
            events_per_producer: 2_000,
            queue_capacity: 1024,
            sink_queue_capacity: 512,
            slow_sink_delay: Duration::from_micros(1),
            repeats: 1,
        }
    }

    #[test]
    fn params_out_of_range_are_refused_naming_the_parameter() {
        for (params, what) in [
            (
                EmitParams {
                    events_per_producer: 0,
                    ..tiny()
                },
                "events_per_producer",
            ),
            (
                EmitParams {
                    events_per_producer: MAX_EVENTS_PER_PRODUCER + 1,
                    ..tiny()
                },
                "events_per_producer",
            ),
            (
                EmitParams {
                    repeats: 0,
                    ..tiny()
                },
                "repeats",
            ),
            (
                EmitParams {
                    repeats: MAX_REPEATS + 1,
                    ..tiny()
                },
                "repeats",
            ),
            (
                EmitParams {
                    events_per_producer: MAX_EVENTS_PER_PRODUCER,
                    repeats: 3,
                    ..tiny()
                },
                "events_per_producer * repeats",
            ),
            (
                EmitParams {
                    slow_sink_delay: Duration::MAX,
                    ..tiny()
                },
                "slow_sink_delay",
            ),
        ] {
            match run_emit(&params, &mut |_| {}) {
                Err(Error::Bench { what: refused, .. }) => assert_eq!(refused, what),
                other => panic!("{params:?} gave {other:?}"),
            }
        }
        assert!(EmitParams::new(true).validate().is_ok());
        assert!(EmitParams::new(false).validate().is_ok());
    }

    #[test]
    fn a_bad_queue_capacity_is_the_hub_s_config_error() {
        let params = EmitParams {
            queue_capacity: 0,
            ..tiny()
        };
        assert!(matches!(
            run_emit(&params, &mut |_| {}),
            Err(Error::Config { .. })
        ));
    }

    #[test]
    fn empty_samples_are_an_error_not_nan() {
        assert!(matches!(
            nearest_rank("emit_ns_p50", &[], 50.0),
            Err(Error::Bench {
                what: "emit_ns_p50",
                ..
            })
        ));
        assert!(matches!(
            mean("events_per_s", &[]),
            Err(Error::Bench { .. })
        ));
        assert!(matches!(
            finite("events_per_s", f64::INFINITY),
            Err(Error::Bench {
                what: "events_per_s",
                ..
            })
        ));
        assert_eq!(mean("x", &[1.0, 3.0]).ok(), Some(2.0));
    }

    #[test]
    fn a_small_run_gives_finite_figures_and_exact_accounting() -> Result<()> {
        let mut lines = Vec::new();
        let measured = run_emit(&tiny(), &mut |line| lines.push(line.to_owned()))?;
        assert_eq!(measured.results.len(), PRODUCERS.len());
        for (entry, producers) in measured.results.iter().zip(PRODUCERS) {
            assert_eq!(entry.mode, format!("{producers}-producer"));
            assert_eq!(entry.error, None, "{entry:?}");
            assert_eq!(entry.metrics["accounting_exact"], 1.0);
            assert_eq!(entry.metrics["emitted"], (producers * 2_000) as f64);
            assert!(entry.metrics.values().all(|value| value.is_finite()));
            assert!(entry.metrics["emit_ns_p50"] <= entry.metrics["emit_ns_max"]);
        }
        assert_eq!(measured.params["events_per_producer"], 2_000);
        assert!(lines.iter().any(|line| line.contains("2 producer(s)")));
        Ok(())
    }
}
