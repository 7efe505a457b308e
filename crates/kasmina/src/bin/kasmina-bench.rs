//! `kasmina-bench`: the `kasmina-prefetch` benchmark (DESIGN.md §6).
//!
//! 256 germination requests (32 with `--quick`) go through the async
//! [`kasmina::prefetch::Prefetcher`], cycling over the eight CNN blueprints
//! and the `cifar_baseline` slots r0c0/r0c1/r0c2 (8/16/32 channels), on the
//! GPU when there is one, else the CPU. Latency is measured per request from
//! the `request` call to the module being in the caller's hands:
//!
//! - `sequential` (the headline figures): one request in flight at a time,
//!   the way a training loop asks for the next seed;
//! - `burst`: all requests queued at once and then collected, which adds
//!   queueing delay and shows throughput.
//!
//! Usage: `kasmina-bench --out PATH.json --label LABEL [--quick]`. Progress
//! goes to stderr, a table to stdout, the `leyline::baseline::BaselineRecord`
//! to `--out`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use kasmina::blueprint::Blueprint;
use kasmina::host::SlotId;
use kasmina::prefetch::{PrefetchConfig, Prefetcher};
use leyline::baseline::{
    BASELINE_SCHEMA, BaselineRecord, BenchArgs, BenchCommand, Environment, ResultEntry, percentile,
};
use tch::Device;

const WORKLOAD: &str = "kasmina-prefetch";
const REQUESTS: usize = 256;
const QUICK_REQUESTS: usize = 32;
const WARMUP_REQUESTS: usize = 16;
const SLOT_CHANNELS: [(u32, i64); 3] = [(0, 8), (1, 16), (2, 32)];

/// The `index`-th request of the workload: blueprint, channels, slot.
fn request_spec(index: usize) -> (&'static str, i64, SlotId) {
    let blueprint = Blueprint::CNN[index % Blueprint::CNN.len()].name();
    let (col, channels) = SLOT_CHANNELS[(index / Blueprint::CNN.len()) % SLOT_CHANNELS.len()];
    (blueprint, channels, SlotId::new(0, col))
}

fn summarize(latencies_ms: &[f64], wall: Duration) -> BTreeMap<String, f64> {
    let p = |q| percentile(latencies_ms, q).unwrap_or(f64::NAN);
    BTreeMap::from([
        ("latency_ms_p50".to_owned(), p(50.0)),
        ("latency_ms_p95".to_owned(), p(95.0)),
        ("latency_ms_max".to_owned(), p(100.0)),
        ("requests".to_owned(), latencies_ms.len() as f64),
        (
            "requests_per_s".to_owned(),
            latencies_ms.len() as f64 / wall.as_secs_f64().max(f64::MIN_POSITIVE),
        ),
    ])
}

fn run_sequential(
    prefetcher: &Prefetcher,
    requests: usize,
    device: Device,
) -> anyhow::Result<(Vec<f64>, Duration)> {
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

fn run_burst(
    prefetcher: &Prefetcher,
    requests: usize,
    device: Device,
) -> anyhow::Result<(Vec<f64>, Duration)> {
    let start = Instant::now();
    let mut tickets = Vec::with_capacity(requests);
    for index in 0..requests {
        let (blueprint, channels, slot) = request_spec(index);
        tickets.push((
            Instant::now(),
            prefetcher.request(blueprint, channels, slot, device)?,
        ));
    }
    let mut latencies = Vec::with_capacity(requests);
    for (_, ticket) in tickets {
        let prepared = ticket.wait()?;
        // The worker stamps the latency when the build finished.
        latencies.push(prepared.latency.as_secs_f64() * 1e3);
    }
    Ok((latencies, start.elapsed()))
}

fn torch_version() -> String {
    // libtorch does not report its version through tch; read it from the
    // `version.py` next to the loaded `libtorch_cpu.so`.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.ends_with("libtorch_cpu.so"))
        .and_then(|path| {
            let lib_dir = std::path::Path::new(path).parent()?;
            let text = std::fs::read_to_string(lib_dir.parent()?.join("version.py")).ok()?;
            let line = text.lines().find(|l| l.starts_with("__version__"))?;
            Some(line.split('\'').nth(1)?.to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn main() -> anyhow::Result<()> {
    let args = match BenchArgs::parse(std::env::args().skip(1))? {
        BenchCommand::Run(args) => args,
        BenchCommand::Help => {
            println!("usage: kasmina-bench --out PATH.json --label LABEL [--quick]");
            return Ok(());
        }
    };
    let requests = if args.quick { QUICK_REQUESTS } else { REQUESTS };
    let device = kasmina::device::cuda_if_available();
    tch::manual_seed(0);

    let mut environment = Environment::cpu_only();
    environment.torch = torch_version();
    if device.is_cuda() {
        environment.device =
            torch_ext::cuda::device_name(0).unwrap_or_else(|error| format!("cuda ({error})"));
        if let Ok((runtime, driver)) = torch_ext::cuda::runtime_versions() {
            environment.cuda = runtime;
            // The driver's CUDA API level (the driver build is not queried).
            environment.driver = format!("CUDA {driver}");
        }
    }

    let config = PrefetchConfig {
        queue_capacity: requests.max(1),
        ..PrefetchConfig::default()
    };
    let prefetcher = Prefetcher::new(config)?;
    eprintln!(
        "kasmina-prefetch: {requests} requests on {device:?}, warming up ({WARMUP_REQUESTS})"
    );
    run_sequential(&prefetcher, WARMUP_REQUESTS, device)?;

    eprintln!("kasmina-prefetch: sequential");
    let (sequential, sequential_wall) = run_sequential(&prefetcher, requests, device)?;
    eprintln!("kasmina-prefetch: burst");
    let (burst, burst_wall) = run_burst(&prefetcher, requests, device)?;
    prefetcher.shutdown(Duration::from_secs(5));

    let results = vec![
        ResultEntry {
            implementation: "rust".to_owned(),
            mode: "sequential".to_owned(),
            metrics: summarize(&sequential, sequential_wall),
            error: None,
        },
        ResultEntry {
            implementation: "rust".to_owned(),
            mode: "burst".to_owned(),
            metrics: summarize(&burst, burst_wall),
            error: None,
        },
    ];

    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>9} {:>12}",
        "mode", "p50 ms", "p95 ms", "max ms", "requests", "requests/s"
    );
    for entry in &results {
        let m = &entry.metrics;
        println!(
            "{:<12} {:>10.4} {:>10.4} {:>10.4} {:>9} {:>12.1}",
            entry.mode,
            m["latency_ms_p50"],
            m["latency_ms_p95"],
            m["latency_ms_max"],
            m["requests"],
            m["requests_per_s"]
        );
    }

    let record = BaselineRecord {
        schema: BASELINE_SCHEMA,
        workload: WORKLOAD.to_owned(),
        label: args.label,
        environment,
        params: serde_json::json!({
            "requests": requests,
            "warmup_requests": WARMUP_REQUESTS,
            "blueprints": Blueprint::CNN.iter().map(|b| b.name()).collect::<Vec<_>>(),
            "slots": SLOT_CHANNELS.iter().map(|(col, channels)| {
                serde_json::json!({ "slot": SlotId::new(0, *col).to_string(), "channels": channels })
            }).collect::<Vec<_>>(),
            "device": format!("{device:?}"),
            "worker_threads": config.worker_threads,
            "queue_capacity": config.queue_capacity,
            "quick": args.quick,
        }),
        results,
        // The prefetcher emits no telemetry of its own.
        telemetry_names: Vec::new(),
    };
    record
        .write_to(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("kasmina-prefetch: wrote {}", args.out.display());
    Ok(())
}
