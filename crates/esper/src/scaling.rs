//! `esper bench simic-throughput --gpus 1,2` (and `simic-cifar`,
//! `simic-lm`, `simic-growth`): the workload at several GPU
//! counts in one run and one record, one process per GPU
//! ([`crate::launch`]); each rank is `esper bench-rank`, which measures its
//! share ([`simic::bench::scaling::run_rank`]) and writes it as JSON for the
//! parent to sum ([`simic::bench::scaling::scaling_entry`]). With
//! `--torchrun` every count is also started by torchrun (`--standalone
//! --no-python`), whose ranks read the same environment
//! ([`torch_ext::launcher::RankEnv`]); those entries are
//! `dpN-VARIANT-torchrun`, their efficiency against the launcher's 1-GPU
//! entry. Efficiencies are given over the whole run
//! (`scaling_efficiency`) and over the rounds after the first
//! (`scaling_efficiency_steady`); on a GPU machine one unrecorded round on
//! one rank runs first, so the 1-GPU entry they divide by is warm (the
//! record's `params.warmup` says what ran). Where the counts include 1,
//! each variant also runs as the single-process bench in its own process
//! right after its 1-GPU entry (`single-process-VARIANT`), and the 1-GPU
//! entry's `single_process_ratio` (and `_steady`) says what the group of
//! one costs against it. Unless `--no-concurrent`, each count N > 1 is
//! followed by N single-process benches of the variant at once, one per
//! GPU with no group between them (`concurrentN-VARIANT`): what sharing
//! the host costs (`host_sharing_ratio`, against the single process alone)
//! apart from what the group costs (the `dpN` entry's `group_ratio`,
//! against the N independent processes); see
//! [`simic::bench::scaling::concurrent_entry`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use simic::bench::scaling::{OneGpu, RankFigures, run_rank, scaling_entry, single_process_ratios};
use simic::bench::{Driver, SimicBenchOptions, ThroughputTask};
use torch_ext::DeviceChoice;
use torch_ext::dist::{DistBackend, ProcessGroup};
use torch_ext::launcher::RankEnv;

use crate::args::BenchArgs;
use crate::launch;

mod single;
use single::{finish_concurrent, run_concurrent, run_single_process};

/// The collective timeout of benchmark ranks.
const RANK_TIMEOUT: Duration = Duration::from_secs(120);

/// `esper bench-rank`: one rank of a scaling run (started by the launcher,
/// not by hand).
#[derive(Debug, Parser)]
pub(crate) struct RankArgs {
    /// `fmnist` or `cifar10`.
    task: String,
    /// The variant (`bf16-graph-step`, ...).
    #[arg(long)]
    variant: String,
    /// Rounds to run.
    #[arg(long)]
    rounds: usize,
    /// `cpu` or `cuda` (each rank takes `cuda:LOCAL_RANK`).
    #[arg(long, default_value = "cuda")]
    device: String,
    /// A short run.
    #[arg(long)]
    quick: bool,
    /// Epochs per episode (the workload's default when absent).
    #[arg(long)]
    episode: Option<u32>,
    /// Folder for the rank's `rank<R>.json`.
    #[arg(long)]
    out: PathBuf,
    /// Who takes the actions: `policy` (PPO learns, the default) or
    /// `max-growth` (`simic-growth`: nothing learns).
    #[arg(long, default_value = "policy")]
    driver: String,
}

fn task_of(name: &str) -> Result<ThroughputTask> {
    match name {
        "fmnist" => Ok(ThroughputTask::FashionMnist),
        "cifar10" => Ok(ThroughputTask::Cifar10),
        "lm-fortunes" => Ok(ThroughputTask::LanguageModel),
        other => bail!("unknown task {other:?} (fmnist, cifar10, lm-fortunes)"),
    }
}

/// The child side: join the group from the environment, measure, write.
pub(crate) fn run_rank_command(args: &RankArgs) -> Result<()> {
    let task = task_of(&args.task)?;
    let env = RankEnv::from_env(RANK_TIMEOUT)?
        .context("bench-rank runs inside a group started by `esper bench ... --gpus`")?;
    let rendezvous = env.rendezvous;
    let cuda = match args.device.as_str() {
        "cpu" => false,
        "cuda" => true,
        other => bail!("--device {other:?}: cpu or cuda"),
    };
    let device = torch_ext::device::for_rank(cuda, env.local_rank, rendezvous.rank)?;
    let group = ProcessGroup::new(&rendezvous, DistBackend::for_device(device), device)
        .with_context(|| format!("rank {} joining its group", rendezvous.rank))?;
    let mut options = SimicBenchOptions::new(DeviceChoice::Cpu, args.quick);
    options.rounds = args.rounds;
    options.episode_length = args.episode;
    options.driver = match args.driver.as_str() {
        "policy" => Driver::Policy,
        "max-growth" => Driver::MaxGrowth,
        other => bail!("--driver {other:?}: policy or max-growth"),
    };
    let mut progress = |line: &str| eprintln!("{line}");
    let figures = run_rank(task, &options, &args.variant, Some(group), &mut progress)?;
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join(format!("rank{}.json", figures.rank));
    std::fs::write(&path, serde_json::to_vec_pretty(&figures)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The parent side: every GPU count of `args.gpus` for every variant, one
/// entry each, in one record's measurements.
pub(crate) fn measure(
    args: &BenchArgs,
    task: ThroughputTask,
    progress: &mut dyn FnMut(&str),
) -> Result<Measurements> {
    let device_kind = if torch_ext::device::select(args.device)?.is_cuda() {
        "cuda"
    } else {
        "cpu"
    };
    let available = if device_kind == "cuda" {
        torch_ext::cuda::device_count()
    } else {
        usize::MAX
    };
    let variants = if !args.simic_variants.is_empty() {
        args.simic_variants.clone()
    } else if device_kind == "cuda" {
        vec!["bf16-graph-step".to_owned()]
    } else {
        vec!["fp32-eager".to_owned()]
    };
    // `--rounds`, as every simic workload takes it; 3 (1 with --quick).
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    let growth = args.workload == crate::args::Workload::SimicGrowth;
    let task_name = task.task().name();
    let scratch = scratch_dir(&args.out);
    // The first process on a GPU machine pays for loading CUDA and the
    // kernels; a round of one rank, not recorded, pays it before the first
    // entry, so the one-GPU entry the efficiencies divide by is warm.
    let warmup = match variants.first() {
        Some(first) if device_kind == "cuda" => {
            progress(&format!(
                "warm-up: one round of {first} on 1 rank, not recorded"
            ));
            let count = Count {
                task: task_name,
                variant: first,
                gpus: 1,
                rounds: 1,
                device: device_kind,
                launcher: Launcher::Esper,
            };
            match run_count(&scratch, &count, args) {
                Ok(_) => {
                    format!("one round of {first} on 1 rank before the first entry, not recorded")
                }
                Err(error) => format!("the warm-up failed ({error:#}): the first entry ran cold"),
            }
        }
        _ => "none (on the CPU)".to_owned(),
    };
    let mut results = Vec::new();
    for variant in &variants {
        let mut eps_one = None;
        let mut concurrent = Vec::new();
        for &gpus in &args.gpus {
            progress(&format!(
                "{variant} on {gpus} {device_kind} rank(s): {rounds} rounds"
            ));
            let launchers: &[Launcher] = if args.torchrun {
                &[Launcher::Esper, Launcher::Torchrun]
            } else {
                &[Launcher::Esper]
            };
            for &launcher in launchers {
                let mode = format!("dp{gpus}-{variant}{}", launcher.suffix());
                let entry = if gpus > available {
                    Err(anyhow::anyhow!(
                        "needs {gpus} GPUs; this machine has {available}"
                    ))
                } else {
                    let count = Count {
                        task: task_name,
                        variant,
                        gpus,
                        rounds,
                        device: device_kind,
                        launcher,
                    };
                    run_count(&scratch, &count, args).and_then(|ranks| {
                        let mut entry = scaling_entry(variant, gpus, &ranks, eps_one)?;
                        if gpus == 1 && launcher == Launcher::Esper {
                            eps_one = OneGpu::of(&entry);
                        }
                        entry.mode.clone_from(&mode);
                        Ok(entry)
                    })
                };
                results.push(entry.unwrap_or_else(|error| failed(mode, &error)));
            }
            if gpus > 1 && args.concurrent {
                progress(&format!(
                    "{variant} as {gpus} single processes at once, one per {device_kind} device \
                     (no group): {rounds} rounds"
                ));
                let run = if gpus > available {
                    Err(anyhow::anyhow!(
                        "needs {gpus} GPUs; this machine has {available}"
                    ))
                } else {
                    run_concurrent(&scratch, variant, gpus, rounds, device_kind, args)
                };
                concurrent.push((results.len(), gpus, run));
                // Replaced below, once the process alone is known.
                results.push(failed(
                    format!("concurrent{gpus}-{variant}"),
                    &anyhow::anyhow!("not run"),
                ));
            }
            if gpus == 1 {
                // The same variant as the single-process bench, right after
                // the one-GPU entry: what the group of one costs.
                progress(&format!(
                    "{variant} as a single process (no group): {rounds} rounds"
                ));
                let mode = format!("single-process-{variant}");
                let single = run_single_process(&scratch, variant, rounds, device_kind, args);
                let entry = match single {
                    Ok(mut entry) => {
                        let one_gpu_entry = results.iter_mut().find(|entry| {
                            entry.mode == format!("dp1-{variant}") && entry.error.is_none()
                        });
                        if let (Some(one_gpu_entry), Some(one), Some(alone)) =
                            (one_gpu_entry, eps_one, OneGpu::of(&entry))
                        {
                            one_gpu_entry
                                .metrics
                                .extend(single_process_ratios(one, alone));
                        }
                        entry.mode = mode;
                        entry
                    }
                    Err(error) => failed(mode, &error),
                };
                results.push(entry);
            }
        }
        finish_concurrent(&mut results, variant, concurrent);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(Measurements {
        params: json!({
            "quick": args.quick,
            "gpus": args.gpus,
            "envs_per_gpu": 4,
            "rounds": rounds,
            "episode_length": args.episode,
            "scaling": if growth {
                "one process per GPU, each driving its own environments with the max-growth \
                 controller (nothing learns: no gradient all-reduce)"
            } else {
                "one process per GPU, data-parallel PPO (gradients all-reduced with NCCL)"
            },
            "launchers": if args.torchrun { json!(["esper", "torchrun"]) } else { json!(["esper"]) },
            "warmup": warmup,
            "single_process": "where the counts include 1, each variant also ran as the \
                               single-process bench (`esper bench` without --gpus, its own \
                               process) right after its one-GPU entry: entry \
                               single-process-VARIANT; the one-GPU entry's \
                               single_process_ratio(_steady) is its eps over that entry's",
            "concurrent": if args.concurrent {
                "after each count N > 1, N single-process benches of the variant at once, one \
                 per device, no group: entry concurrentN-VARIANT (host_sharing_ratio: their eps \
                 per GPU over the single process alone); the dpN entries' group_ratio(_steady) \
                 is their eps over those N processes'"
            } else {
                "not run (--no-concurrent)"
            },
        }),
        results,
        telemetry_names: Vec::new(),
    })
}

/// The entry of a count or run that failed: its mode and the error.
fn failed(mode: String, error: &anyhow::Error) -> ResultEntry {
    ResultEntry {
        implementation: "rust".to_owned(),
        mode,
        metrics: std::collections::BTreeMap::new(),
        error: Some(format!("{error:#}")),
        amp: None,
    }
}

fn scratch_dir(out: &Path) -> PathBuf {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    parent.join(format!(".scaling-{}", std::process::id()))
}

/// Who starts a count's ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launcher {
    /// esper's own launcher ([`launch::run_ranks`]).
    Esper,
    /// `torchrun --standalone --no-python` (`ESPER_TORCHRUN`, else
    /// `torchrun` on `PATH`).
    Torchrun,
}

impl Launcher {
    fn suffix(self) -> &'static str {
        match self {
            Launcher::Esper => "",
            Launcher::Torchrun => "-torchrun",
        }
    }
}

/// One GPU count of one variant.
struct Count<'a> {
    task: &'a str,
    variant: &'a str,
    gpus: usize,
    rounds: usize,
    device: &'a str,
    launcher: Launcher,
}

/// Starts `esper <child_args>` as `gpus` ranks under torchrun on this host
/// and waits for them; torchrun ends every rank when one fails.
fn run_under_torchrun(gpus: usize, child_args: &[std::ffi::OsString]) -> Result<()> {
    let torchrun = std::env::var_os("ESPER_TORCHRUN").unwrap_or_else(|| "torchrun".into());
    let exe = std::env::current_exe().context("locating the esper binary")?;
    let status = std::process::Command::new(&torchrun)
        .args(["--standalone", "--nnodes", "1", "--nproc-per-node"])
        .arg(gpus.to_string())
        .arg("--no-python")
        .arg(exe)
        .args(child_args)
        .envs(torch_ext::dist::MULTICAST_OFF)
        .status()
        .with_context(|| {
            format!(
                "starting {} (install torch's torchrun or set ESPER_TORCHRUN to its path)",
                Path::new(&torchrun).display()
            )
        })?;
    if !status.success() {
        bail!("torchrun with {gpus} ranks ended with {status}");
    }
    Ok(())
}

fn run_count(scratch: &Path, count: &Count<'_>, args: &BenchArgs) -> Result<Vec<RankFigures>> {
    let Count {
        task,
        variant,
        gpus,
        rounds,
        device,
        launcher,
    } = *count;
    let dir = scratch.join(format!("{variant}-{gpus}{}", launcher.suffix()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child_args: Vec<std::ffi::OsString> = vec![
        "bench-rank".into(),
        task.into(),
        "--variant".into(),
        variant.into(),
        "--rounds".into(),
        rounds.to_string().into(),
        "--device".into(),
        device.into(),
        "--out".into(),
        // The path as it is (it need not be UTF-8).
        dir.clone().into_os_string(),
    ];
    if args.quick {
        child_args.push("--quick".into());
    }
    if let Some(episode) = args.episode {
        child_args.push("--episode".into());
        child_args.push(episode.to_string().into());
    }
    if args.workload == crate::args::Workload::SimicGrowth {
        child_args.push("--driver".into());
        child_args.push("max-growth".into());
    }
    match launcher {
        Launcher::Esper => launch::run_ranks(gpus, &child_args, launch::GRACE)?,
        Launcher::Torchrun => run_under_torchrun(gpus, &child_args)?,
    }
    (0..gpus)
        .map(|rank| {
            let path = dir.join(format!("rank{rank}.json"));
            let text =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok(serde_json::from_slice(&text)?)
        })
        .collect()
}
