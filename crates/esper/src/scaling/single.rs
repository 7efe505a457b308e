//! The scaling bench's single processes: the variant as the
//! single-process bench in a process of its own (`esper bench WORKLOAD
//! --variants V`, as a user types it), alone beside the one-GPU entry or
//! several at once beside a count above one, one per GPU with no group
//! ([`run_concurrent`], [`finish_concurrent`]).

use std::path::Path;

use anyhow::{Context, Result, bail};
use leyline::baseline::ResultEntry;
use simic::bench::scaling::{OneGpu, concurrent_entry, group_ratios};

use super::{Launcher, failed};
use crate::args::BenchArgs;

/// Runs `variant` as the single-process bench (`esper bench WORKLOAD
/// --variants VARIANT`, in a process of its own, as a user types it) for
/// `rounds` rounds and returns its entry of that variant.
pub(super) fn run_single_process(
    scratch: &Path,
    variant: &str,
    rounds: usize,
    device: &str,
    args: &BenchArgs,
) -> Result<ResultEntry> {
    let out = scratch.join(format!("single-process-{variant}.json"));
    let status = single_process_command(scratch, &out, variant, rounds, device, args)?
        .status()
        .context("starting the single-process bench")?;
    if !status.success() {
        bail!("the single-process bench of {variant} ended with {status}");
    }
    single_process_entry(&out, variant)
}

/// `esper bench WORKLOAD --variants VARIANT` writing its record to `out`.
fn single_process_command(
    scratch: &Path,
    out: &Path,
    variant: &str,
    rounds: usize,
    device: &str,
    args: &BenchArgs,
) -> Result<std::process::Command> {
    std::fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let exe = std::env::current_exe().context("locating the esper binary")?;
    let mut command = std::process::Command::new(exe);
    command
        .args(["bench", args.workload.name(), "--variants", variant])
        .args(["--rounds", &rounds.to_string(), "--device", device])
        .args(["--label", "single-process", "--out"])
        .arg(out);
    if args.quick {
        command.arg("--quick");
    }
    if let Some(episode) = args.episode {
        command.args(["--episode", &episode.to_string()]);
    }
    Ok(command)
}

/// The entry of `variant` in the single-process record at `out`.
fn single_process_entry(out: &Path, variant: &str) -> Result<ResultEntry> {
    let text =
        std::fs::read_to_string(out).with_context(|| format!("reading {}", out.display()))?;
    let record = leyline::baseline::BaselineRecord::from_json(&text)
        .with_context(|| format!("reading {}", out.display()))?;
    let entry = record
        .result("rust", variant)
        .with_context(|| format!("{} has no entry for {variant}", out.display()))?;
    if let Some(error) = &entry.error {
        bail!("the single-process bench of {variant} failed: {error}");
    }
    Ok(entry.clone())
}

/// Runs `processes` single-process benches of `variant` at once, the k-th
/// seeing only the k-th CUDA device (every one on the CPU with `device`
/// "cpu"), each with its output in a log of its own; returns their entries
/// once all have ended.
pub(super) fn run_concurrent(
    scratch: &Path,
    variant: &str,
    processes: usize,
    rounds: usize,
    device: &str,
    args: &BenchArgs,
) -> Result<Vec<ResultEntry>> {
    let mut children = Vec::with_capacity(processes);
    for k in 0..processes {
        let out = scratch.join(format!("concurrent{processes}-{variant}-{k}.json"));
        let log_path = scratch.join(format!("concurrent{processes}-{variant}-{k}.log"));
        let mut command = single_process_command(scratch, &out, variant, rounds, device, args)?;
        if device == "cuda" {
            // The k-th device this process sees is the only one the child
            // sees (its cuda:0), as the k-th rank takes cuda:k.
            command.env("CUDA_VISIBLE_DEVICES", visible_device(k)?);
        }
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        command
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // A process that could not start ends the ones already started.
        match command.spawn() {
            Ok(child) => children.push((child, out, log_path)),
            Err(error) => {
                for (child, _, _) in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(error).context("starting a concurrent single-process bench");
            }
        }
    }
    // Every process is waited for, even after one has failed.
    let ended: Vec<_> = children
        .into_iter()
        .map(|(mut child, out, log)| (child.wait(), out, log))
        .collect();
    ended
        .into_iter()
        .enumerate()
        .map(|(k, (status, out, log))| {
            let status = status.context("waiting for a concurrent single-process bench")?;
            if !status.success() {
                bail!(
                    "concurrent single-process bench {k} of {variant} ended with {status}: {}",
                    log_tail(&log)
                );
            }
            single_process_entry(&out, variant)
        })
        .collect()
}

/// The name of the k-th CUDA device this process sees: the k-th entry of
/// `CUDA_VISIBLE_DEVICES` where that is set, else `k`.
fn visible_device(k: usize) -> Result<String> {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(str::trim)
            .nth(k)
            .map(str::to_owned)
            .with_context(|| format!("CUDA_VISIBLE_DEVICES={list:?} names no device {k}")),
        _ => Ok(k.to_string()),
    }
}

/// The last lines of a child's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Replaces each concurrent run's placeholder in `results` (at its index)
/// with its entry, compared with the single process alone of the same
/// variant where that ran, and gives the `dpN` entries of `variant` their
/// `group_ratio` against it.
pub(super) fn finish_concurrent(
    results: &mut [ResultEntry],
    variant: &str,
    runs: Vec<(usize, usize, Result<Vec<ResultEntry>>)>,
) {
    let alone = results
        .iter()
        .find(|e| e.mode == format!("single-process-{variant}") && e.error.is_none())
        .and_then(OneGpu::of);
    for (index, gpus, run) in runs {
        let mode = format!("concurrent{gpus}-{variant}");
        let entry = run
            .and_then(|processes| Ok(concurrent_entry(variant, &processes, alone)?))
            .unwrap_or_else(|error| failed(mode.clone(), &error));
        if let Some(concurrent) = OneGpu::of(&entry) {
            let torchrun = format!("dp{gpus}-{variant}{}", Launcher::Torchrun.suffix());
            for group in results.iter_mut().filter(|e| {
                (e.mode == format!("dp{gpus}-{variant}") || e.mode == torchrun) && e.error.is_none()
            }) {
                if let Some(figures) = OneGpu::of(group) {
                    group.metrics.extend(group_ratios(figures, concurrent));
                }
            }
        }
        if let Some(slot) = results.get_mut(index) {
            *slot = ResultEntry { mode, ..entry };
        }
    }
}
