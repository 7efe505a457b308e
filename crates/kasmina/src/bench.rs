//! The `kasmina-prefetch` benchmark (DESIGN.md §6) as a library function.
//!
//! 256 germination requests (32 in a smoke run) go through the async
//! [`Prefetcher`], cycling over the eight CNN blueprints and the
//! `cifar_baseline` slots r0c0/r0c1/r0c2 (8/16/32 channels), on the device
//! the caller chose. Latency is measured per request from the `request` call
//! to the module being in the caller's hands:
//!
//! - `sequential` (the headline figures): one request in flight at a time,
//!   the way a training loop asks for the next seed;
//! - `burst`: all requests queued at once and then collected, which adds
//!   queueing delay and shows throughput.
//!
//! [`run_prefetch`] returns the figures as
//! [`leyline::baseline::Measurements`]; it probes no machine and writes no
//! record. `esper bench kasmina-prefetch` is the program that does both.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leyline::baseline::{Measurements, ResultEntry, percentile};
use tch::Device;

use crate::blueprint::Blueprint;
use crate::host::SlotId;
use crate::prefetch::{MAX_QUEUE_CAPACITY, PrefetchConfig, Prefetcher};
use crate::validate::{finite, size_in};
use crate::{Error, Result};

/// Workload name in records.
pub const WORKLOAD: &str = "kasmina-prefetch";

/// Slot column and channel count of each slot the requests cycle over.
const SLOT_CHANNELS: [(u32, i64); 3] = [(0, 8), (1, 16), (2, 32)];

/// How long the prefetcher may take to shut down at the end.
const SHUTDOWN: Duration = Duration::from_secs(5);

/// The workload's parameters (checked by [`PrefetchParams::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchParams {
    /// Measured requests per mode, in `[1, MAX_QUEUE_CAPACITY]` (a burst
    /// queues them all at once).
    pub requests: usize,
    /// Unmeasured sequential requests first, in `[0, MAX_QUEUE_CAPACITY]`.
    pub warmup_requests: usize,
    /// Whether this is a smoke run (recorded in the params).
    pub quick: bool,
}

impl PrefetchParams {
    /// The committed settings (256 requests, 16 warm-up), or a smoke run (32).
    pub fn new(quick: bool) -> PrefetchParams {
        PrefetchParams {
            requests: if quick { 32 } else { 256 },
            warmup_requests: 16,
            quick,
        }
    }

    /// Checks the counts against their bounds.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        size_in(
            "PrefetchParams.requests",
            self.requests,
            1,
            MAX_QUEUE_CAPACITY,
        )?;
        size_in(
            "PrefetchParams.warmup_requests",
            self.warmup_requests,
            0,
            MAX_QUEUE_CAPACITY,
        )?;
        Ok(())
    }
}

/// Runs the benchmark on `device`; `progress` receives one line per stage.
/// Seeds tch's global generator with 0 first.
///
/// # Errors
/// [`PrefetchParams::validate`]'s errors, the prefetcher's errors (runtime,
/// a build that fails on `device`), and [`Error::NonFinite`] naming a figure
/// that came out NaN or infinite (a record refuses those).
pub fn run_prefetch(
    params: &PrefetchParams,
    device: Device,
    progress: &mut dyn FnMut(&str),
) -> Result<Measurements> {
    params.validate()?;
    tch::manual_seed(0);
    let config = PrefetchConfig {
        queue_capacity: params.requests,
        ..PrefetchConfig::default()
    };
    let prefetcher = Prefetcher::new(config)?;
    progress(&format!(
        "kasmina-prefetch: {} requests on {device:?}, warming up ({})",
        params.requests, params.warmup_requests
    ));
    let measured = measure(&prefetcher, params, device, progress);
    prefetcher.shutdown(SHUTDOWN);
    let ((sequential, sequential_wall), (burst, burst_wall)) = measured?;
    let results = vec![
        ResultEntry {
            amp: None,
            implementation: "rust".to_owned(),
            mode: "sequential".to_owned(),
            metrics: summarize(&sequential, sequential_wall)?,
            error: None,
        },
        ResultEntry {
            amp: None,
            implementation: "rust".to_owned(),
            mode: "burst".to_owned(),
            metrics: summarize(&burst, burst_wall)?,
            error: None,
        },
    ];
    let params = serde_json::json!({
        "requests": params.requests,
        "warmup_requests": params.warmup_requests,
        "blueprints": Blueprint::CNN.iter().map(|b| b.name()).collect::<Vec<_>>(),
        "slots": SLOT_CHANNELS.iter().map(|(col, channels)| {
            serde_json::json!({ "slot": SlotId::new(0, *col).to_string(), "channels": channels })
        }).collect::<Vec<_>>(),
        "device": format!("{device:?}"),
        "worker_threads": config.worker_threads,
        "queue_capacity": config.queue_capacity,
        "quick": params.quick,
    });
    Ok(Measurements {
        params,
        results,
        // The prefetcher emits no telemetry of its own.
        telemetry_names: Vec::new(),
    })
}

/// Latencies (ms) of one mode's requests and the mode's wall time.
type Timed = (Vec<f64>, Duration);

fn measure(
    prefetcher: &Prefetcher,
    params: &PrefetchParams,
    device: Device,
    progress: &mut dyn FnMut(&str),
) -> Result<(Timed, Timed)> {
    run_sequential(prefetcher, params.warmup_requests, device)?;
    progress("kasmina-prefetch: sequential");
    let sequential = run_sequential(prefetcher, params.requests, device)?;
    progress("kasmina-prefetch: burst");
    let burst = run_burst(prefetcher, params.requests, device)?;
    Ok((sequential, burst))
}

/// The `index`-th request of the workload: blueprint, channels, slot.
fn request_spec(index: usize) -> (&'static str, i64, SlotId) {
    let blueprints = Blueprint::CNN.len();
    let blueprint = index
        .checked_rem(blueprints)
        .and_then(|at| Blueprint::CNN.get(at))
        .map_or("", |blueprint| blueprint.name());
    let (col, channels) = index
        .checked_div(blueprints)
        .and_then(|round| round.checked_rem(SLOT_CHANNELS.len()))
        .and_then(|at| SLOT_CHANNELS.get(at).copied())
        .unwrap_or(SLOT_CHANNELS[0]);
    (blueprint, channels, SlotId::new(0, col))
}

/// Percentiles, count and rate of one mode's latencies (ms), which must not
/// be empty.
fn summarize(latencies_ms: &[f64], wall: Duration) -> Result<BTreeMap<String, f64>> {
    let count = latencies_ms.len() as f64;
    let mut metrics = BTreeMap::new();
    for (key, percent) in [
        ("latency_ms_p50", 50.0),
        ("latency_ms_p95", 95.0),
        ("latency_ms_max", 100.0),
    ] {
        let value = percentile(latencies_ms, percent).ok_or_else(|| Error::OutOfRange {
            field: "PrefetchParams.requests",
            value: "0 latency samples".to_owned(),
            allowed: "at least 1".to_owned(),
        })?;
        metrics.insert(key.to_owned(), finite(key, value)?);
    }
    metrics.insert("requests".to_owned(), count);
    metrics.insert(
        "requests_per_s".to_owned(),
        finite(
            "requests_per_s",
            count / wall.as_secs_f64().max(f64::MIN_POSITIVE),
        )?,
    );
    Ok(metrics)
}

fn run_sequential(prefetcher: &Prefetcher, requests: usize, device: Device) -> Result<Timed> {
    let mut latencies = Vec::with_capacity(requests);
    let start = Instant::now();
    for index in 0..requests {
        let (blueprint, channels, slot) = request_spec(index);
        let asked = Instant::now();
        let prepared = prefetcher
            .request(blueprint, channels, slot, device)?
            .wait()?;
        latencies.push(asked.elapsed().as_secs_f64() * 1e3);
        drop(prepared);
    }
    Ok((latencies, start.elapsed()))
}

fn run_burst(prefetcher: &Prefetcher, requests: usize, device: Device) -> Result<Timed> {
    let start = Instant::now();
    let mut tickets = Vec::with_capacity(requests);
    for index in 0..requests {
        let (blueprint, channels, slot) = request_spec(index);
        tickets.push(prefetcher.request(blueprint, channels, slot, device)?);
    }
    let mut latencies = Vec::with_capacity(requests);
    for ticket in tickets {
        let prepared = ticket.wait()?;
        // The worker stamps the latency when the build finished.
        latencies.push(prepared.latency.as_secs_f64() * 1e3);
    }
    Ok((latencies, start.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_cycle_over_blueprints_then_slots() {
        let blueprints = Blueprint::CNN.len();
        assert_eq!(request_spec(0).0, Blueprint::CNN[0].name());
        assert_eq!(request_spec(0).1, 8);
        assert_eq!(request_spec(blueprints).1, 16);
        assert_eq!(request_spec(2 * blueprints).2, SlotId::new(0, 2));
        assert_eq!(request_spec(3 * blueprints).1, 8);
        assert_eq!(
            request_spec(blueprints + 1).0,
            Blueprint::CNN[1].name(),
            "blueprints cycle within a slot"
        );
    }

    #[test]
    fn counts_out_of_range_are_refused_naming_the_field() {
        for (params, field) in [
            (
                PrefetchParams {
                    requests: 0,
                    ..PrefetchParams::new(true)
                },
                "PrefetchParams.requests",
            ),
            (
                PrefetchParams {
                    requests: MAX_QUEUE_CAPACITY + 1,
                    ..PrefetchParams::new(true)
                },
                "PrefetchParams.requests",
            ),
            (
                PrefetchParams {
                    warmup_requests: MAX_QUEUE_CAPACITY + 1,
                    ..PrefetchParams::new(true)
                },
                "PrefetchParams.warmup_requests",
            ),
        ] {
            match run_prefetch(&params, Device::Cpu, &mut |_| {}) {
                Err(Error::OutOfRange { field: refused, .. }) => assert_eq!(refused, field),
                other => panic!("{params:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn empty_or_non_finite_figures_are_errors_not_nan() {
        assert!(matches!(
            summarize(&[], Duration::from_millis(1)),
            Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(
            summarize(&[f64::NAN], Duration::from_millis(1)),
            Err(Error::NonFinite { .. })
        ));
        let metrics = summarize(&[1.0, 2.0, 3.0], Duration::from_secs(1)).expect("finite");
        assert_eq!(metrics["latency_ms_p50"], 2.0);
        assert_eq!(metrics["requests_per_s"], 3.0);
    }

    #[test]
    fn a_small_cpu_run_gives_both_modes_with_finite_figures() -> Result<()> {
        let params = PrefetchParams {
            requests: 4,
            warmup_requests: 1,
            quick: true,
        };
        let mut lines = Vec::new();
        let measured = run_prefetch(&params, Device::Cpu, &mut |line| {
            lines.push(line.to_owned());
        })?;
        let modes: Vec<&str> = measured.results.iter().map(|e| e.mode.as_str()).collect();
        assert_eq!(modes, ["sequential", "burst"]);
        for entry in &measured.results {
            assert_eq!(entry.metrics["requests"], 4.0);
            assert!(entry.metrics.values().all(|value| value.is_finite()));
        }
        assert_eq!(measured.params["device"], "Cpu");
        assert_eq!(lines.len(), 3);
        Ok(())
    }
}
