//! `esper`: the Esper-rs command-line program (thin: argument parsing and
//! output; the work lives in the library crates).
//!
//! ```text
//! esper bench tolaria-reference --out PATH.json [--label LABEL] [--quick]
//!                               [--device auto|cpu|cuda|cuda:N] [--modes eager,graph-step,...]
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use tolaria::DeviceChoice;
use tolaria::bench::{BenchOptions, Variant};

const USAGE: &str = "\
usage: esper <command> [options]

commands:
  bench tolaria-reference   run the tolaria-reference benchmark and write a baseline record
      --out PATH            where to write the JSON record (required)
      --label LABEL         record label (default: the file stem of --out)
      --quick               5 warm-up + 30 measured epochs (smoke run, not for records)
      --device DEVICE       auto (default), cpu, cuda or cuda:N
      --modes LIST          comma-separated: eager, graph-step, graph-epoch, and the same
                            with -autograd (default: all fused modes plus eager-autograd and
                            graph-step-autograd on CUDA; eager ones on the CPU)
      --epochs N            measured epochs (default 300; at least 200 for records)
      --warmup-epochs N     unmeasured epochs first (default 20)
  help                      this text
";

fn main() {
    if let Err(error) = run() {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench(&args[1..]),
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

fn bench(args: &[String]) -> Result<()> {
    let Some(workload) = args.first() else {
        bail!("`esper bench` needs a workload name\n\n{USAGE}");
    };
    if workload != tolaria::bench::WORKLOAD {
        bail!(
            "unknown workload `{workload}` (esper runs `{}`)",
            tolaria::bench::WORKLOAD
        );
    }
    let mut out = None;
    let mut label = None;
    let mut quick = false;
    let mut device = DeviceChoice::Auto;
    let mut variants = Vec::new();
    let mut epochs = None;
    let mut warmup = None;
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        let mut value = |flag: &str| {
            rest.next()
                .cloned()
                .with_context(|| format!("{flag} needs a value"))
        };
        match arg.as_str() {
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--label" => label = Some(value("--label")?),
            "--quick" => quick = true,
            "--device" => device = parse_device(&value("--device")?)?,
            "--modes" => {
                for name in value("--modes")?.split(',').filter(|name| !name.is_empty()) {
                    variants.push(
                        Variant::from_name(name)
                            .with_context(|| format!("unknown mode `{name}`"))?,
                    );
                }
            }
            "--epochs" => epochs = Some(value("--epochs")?.parse::<usize>()?),
            "--warmup-epochs" => warmup = Some(value("--warmup-epochs")?.parse::<usize>()?),
            other => bail!("unknown option `{other}`\n\n{USAGE}"),
        }
    }
    let out = out.context("--out PATH is required")?;
    let label = label.unwrap_or_else(|| {
        out.file_stem().map_or_else(
            || "run".to_owned(),
            |stem| stem.to_string_lossy().into_owned(),
        )
    });
    let mut options = BenchOptions::new(&label, device, quick);
    options.variants = variants;
    if let Some(epochs) = epochs {
        options.measured_epochs = epochs;
    }
    if let Some(warmup) = warmup {
        options.warmup_epochs = warmup;
    }
    let record = tolaria::bench::run(&options, &mut |line| eprintln!("{line}"))?;
    if let Some(parent) = out.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&out, record.to_json_pretty()?)
        .with_context(|| format!("writing {}", out.display()))?;
    print_table(&record);
    eprintln!("wrote {}", out.display());
    Ok(())
}

fn parse_device(text: &str) -> Result<DeviceChoice> {
    Ok(match text {
        "auto" => DeviceChoice::Auto,
        "cpu" => DeviceChoice::Cpu,
        "cuda" => DeviceChoice::Cuda(0),
        other => match other.strip_prefix("cuda:") {
            Some(index) => DeviceChoice::Cuda(index.parse()?),
            None => bail!("unknown device `{other}` (auto, cpu, cuda, cuda:N)"),
        },
    })
}

fn print_table(record: &leyline::baseline::BaselineRecord) {
    println!(
        "{} on {} ({})",
        record.workload, record.environment.device, record.label
    );
    println!(
        "{:<8} {:<22} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>12}",
        "impl",
        "mode",
        "p50 ms",
        "p95 ms",
        "max ms",
        "replay us",
        "capture ms",
        "h2d ms",
        "peak bytes"
    );
    for entry in &record.results {
        let metric = |key: &str| {
            entry
                .metrics
                .get(key)
                .map_or_else(|| "-".to_owned(), |value| format!("{value:.4}"))
        };
        if let Some(error) = &entry.error {
            println!(
                "{:<8} {:<22} error: {error}",
                entry.implementation, entry.mode
            );
            continue;
        }
        println!(
            "{:<8} {:<22} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>12}",
            entry.implementation,
            entry.mode,
            metric("epoch_ms_p50"),
            metric("epoch_ms_p95"),
            metric("epoch_ms_max"),
            metric("replay_us_per_step"),
            metric("capture_ms"),
            metric("h2d_ms_p50"),
            entry
                .metrics
                .get("peak_device_memory_bytes")
                .map_or_else(|| "-".to_owned(), |value| format!("{value:.0}")),
        );
    }
}
