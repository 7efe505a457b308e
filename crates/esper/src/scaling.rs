//! `esper bench simic-throughput --gpus 1,2`: the workload at several GPU
//! counts in one run and one record, one process per GPU
//! ([`crate::launch`]); each rank is `esper bench-rank`, which measures its
//! share ([`simic::bench::scaling::run_rank`]) and writes it as JSON for the
//! parent to sum ([`simic::bench::scaling::scaling_entry`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use leyline::baseline::{Measurements, ResultEntry};
use serde_json::json;
use simic::bench::scaling::{RankFigures, run_rank, scaling_entry};
use simic::bench::{SimicBenchOptions, ThroughputTask};
use torch_ext::DeviceChoice;
use torch_ext::dist::{DistBackend, ProcessGroup};
use torch_ext::launcher::RankEnv;

use crate::args::BenchArgs;
use crate::launch;

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
}

fn task_of(name: &str) -> Result<ThroughputTask> {
    match name {
        "fmnist" => Ok(ThroughputTask::FashionMnist),
        "cifar10" => Ok(ThroughputTask::Cifar10),
        other => bail!("unknown task {other:?} (fmnist, cifar10)"),
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
    let rounds = if args.quick { 1 } else { 3 };
    let task_name = match task {
        ThroughputTask::FashionMnist => "fmnist",
        ThroughputTask::Cifar10 => "cifar10",
    };
    let scratch = scratch_dir(&args.out);
    let mut results = Vec::new();
    for variant in &variants {
        let mut eps_one = None;
        for &gpus in &args.gpus {
            progress(&format!(
                "{variant} on {gpus} {device_kind} rank(s): {rounds} rounds"
            ));
            let entry = if gpus > available {
                Err(anyhow::anyhow!(
                    "needs {gpus} GPUs; this machine has {available}"
                ))
            } else {
                run_count(
                    &scratch,
                    task_name,
                    variant,
                    gpus,
                    rounds,
                    device_kind,
                    args,
                )
                .and_then(|ranks| {
                    let entry = scaling_entry(variant, gpus, &ranks, eps_one)?;
                    if gpus == 1 {
                        eps_one = entry.metrics.get("eps").copied();
                    }
                    Ok(entry)
                })
            };
            results.push(entry.unwrap_or_else(|error| ResultEntry {
                implementation: "rust".to_owned(),
                mode: format!("dp{gpus}-{variant}"),
                metrics: std::collections::BTreeMap::new(),
                error: Some(format!("{error:#}")),
                amp: None,
            }));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(Measurements {
        params: json!({
            "quick": args.quick,
            "gpus": args.gpus,
            "envs_per_gpu": 4,
            "rounds": rounds,
            "episode_length": args.episode,
            "scaling": "one process per GPU, data-parallel PPO (gradients all-reduced with NCCL)",
        }),
        results,
        telemetry_names: Vec::new(),
    })
}

fn scratch_dir(out: &Path) -> PathBuf {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    parent.join(format!(".scaling-{}", std::process::id()))
}

fn run_count(
    scratch: &Path,
    task: &str,
    variant: &str,
    gpus: usize,
    rounds: usize,
    device: &str,
    args: &BenchArgs,
) -> Result<Vec<RankFigures>> {
    let dir = scratch.join(format!("{variant}-{gpus}"));
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
    launch::run_ranks(gpus, &child_args, launch::GRACE)?;
    (0..gpus)
        .map(|rank| {
            let path = dir.join(format!("rank{rank}.json"));
            let text =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok(serde_json::from_slice(&text)?)
        })
        .collect()
}
