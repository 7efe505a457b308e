//! `esper bench simic-learning` with `--jobs N` or `--seed-index K`.
//!
//! The protocol's training seeds are independent, and one seed's
//! environments leave most of a GPU idle (small hosts, launch-bound). With
//! `--jobs N` this process runs the baselines first, alone on the device,
//! then starts copies of itself, one per training seed and at most N at a
//! time, each with `--seed-index K`: a child trains seed K on the same
//! device and writes its learning curve (`simic::bench::SeedOutcome`,
//! without evaluations) and its trainer (`simic::Simic::save_checkpoint`)
//! into `<out>.parts/`. When every child is done, this process restores
//! each trained policy and evaluates it (greedy and sampled), alone on the device, on
//! the shared evaluation environments, pools (`LearningSetup::report`) and
//! removes the parts. A run that stops (a time limit, a failed seed) keeps
//! what it finished there, and the same command run again takes it up:
//! the baselines, each trained seed and each evaluated seed are measured
//! once, and a seed stopped in training goes on from its last whole round
//! (a child saves its trainer and learning curve after every round, as
//! `seed-K-progress/`, and the resumed rounds follow the trajectory of a
//! run never stopped). With `--job-devices`, the children spread over the
//! devices listed; when they name several, the evaluations run in child
//! processes too (`--seed-index K --evaluate`), one at a time on each
//! device. So every figure the record compares is measured with
//! nothing else on the device: measured on the H200, the heuristic's and
//! max growth's episodes came out differently with training processes
//! beside them (max growth fossilized 3 seeds in 12 environments instead of
//! 36), while alone they repeat bit for bit. Training under contention is
//! not bit-identical to training alone. A child that fails stops the run:
//! the others are killed, the error names the seed, the parts stay.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use anyhow::{Context, Result, bail};
use simic::bench::{Baselines, LearningSetup, SeedOutcome, SimicBenchOptions, SimicBenchRun};

use crate::args::BenchArgs;

mod children;
#[cfg(test)]
use children::least_busy;
use children::run_children;

/// A child's setup, its seed index checked against the run's seeds, and
/// the parts folder (the folder `args.out` is in).
fn child_setup(
    args: &BenchArgs,
    options: &SimicBenchOptions,
    rounds: usize,
    seed_index: usize,
) -> Result<(LearningSetup, PathBuf)> {
    let setup = LearningSetup::new(options, rounds)?;
    if seed_index >= setup.seeds() {
        bail!(
            "--seed-index {seed_index} is not one of the run's {} training seeds",
            setup.seeds()
        );
    }
    let parent = match args.out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((setup, parent))
}

/// Trains training seed `seed_index` and writes its part: the learning
/// curve to `args.out`, the trainer beside it ([`policy_name`]).
pub(crate) fn run_seed(
    args: &BenchArgs,
    options: &SimicBenchOptions,
    rounds: usize,
    seed_index: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let (setup, parent) = child_setup(args, options, rounds, seed_index)?;
    let describe = setup.describe();
    let progress_dir = parent.join(progress_name(seed_index));
    let kept = read_progress(&progress_dir, seed_index, &describe, progress);
    if let Some((checkpoint, _)) = &kept {
        progress(&format!(
            "  seed {seed_index}: taken up after round {} from {}",
            checkpoint.round,
            progress_dir.display()
        ));
    }
    // The trainer and the curve after every round: a process stopped by a
    // time limit loses at most the round it was in.
    let mut save = |simic: &simic::vectorized::Simic,
                    curve: &[leyline::baseline::ResultEntry],
                    selected: Option<&simic::bench::Selected>| {
        let mut extra = serde_json::Map::new();
        extra.insert("setup".to_owned(), describe.clone().into());
        extra.insert("seed_index".to_owned(), seed_index.into());
        let curve = serde_json::to_value(curve).map_err(|error| simic::Error::Checkpoint {
            field: "learning_curve",
            reason: error.to_string(),
        })?;
        extra.insert("learning_curve".to_owned(), curve);
        let more = match selected {
            Some(selected) => selected.to_checkpoint(&mut extra)?,
            None => Vec::new(),
        };
        simic
            .save_checkpoint_with(&parent, &progress_name(seed_index), extra, &more)
            .map(|_| ())
    };
    let trained = setup.continue_policy(
        seed_index,
        kept.as_ref()
            .map(|(checkpoint, curve)| (checkpoint, curve.clone())),
        progress,
        &mut save,
    )?;
    // The trained policy, with the greedy curve's best point beside it.
    let mut extra = serde_json::Map::new();
    let more = match &trained.selected {
        Some(selected) => selected.to_checkpoint(&mut extra)?,
        None => Vec::new(),
    };
    trained
        .simic
        .save_checkpoint_with(&parent, &policy_name(seed_index), extra, &more)?;
    let part = SeedOutcome {
        seed_index,
        setup: setup.describe(),
        rounds: trained.curve,
        greedy: simic::bench::Evaluation::default(),
        sampled: simic::bench::Evaluation::default(),
        selected_round: None,
        selected: None,
    };
    let text = serde_json::to_vec_pretty(&part)?;
    durable::write_file(&args.out, &text)
        .with_context(|| format!("writing {}", args.out.display()))?;
    if progress_dir.exists() {
        std::fs::remove_dir_all(&progress_dir)
            .with_context(|| format!("removing {}", progress_dir.display()))?;
    }
    Ok(())
}

/// The checkpoint directory of seed `seed_index`'s training so far, beside
/// its part, rewritten after every round and removed when the seed is done.
fn progress_name(seed_index: usize) -> String {
    format!("seed-{seed_index}-progress")
}

/// The training of seed `seed_index` kept in `dir` by an earlier process of
/// the same run: its checkpoint and learning curve. `None` (said, when
/// something was there) when there is none, or it is of another run or
/// seed, or it does not read back; the seed then trains from its start.
fn read_progress(
    dir: &Path,
    seed_index: usize,
    describe: &str,
    progress: &mut dyn FnMut(&str),
) -> Option<(
    simic::checkpoint::PpoCheckpoint,
    Vec<leyline::baseline::ResultEntry>,
)> {
    if !dir.exists() {
        return None;
    }
    let checked = simic::checkpoint::read_checkpoint(dir)
        .map_err(|error| error.to_string())
        .and_then(|checkpoint| {
            if checkpoint.extra.get("setup").and_then(|v| v.as_str()) != Some(describe) {
                return Err("it is of another run".to_owned());
            }
            if checkpoint
                .extra
                .get("seed_index")
                .and_then(serde_json::Value::as_u64)
                != Some(seed_index as u64)
            {
                return Err("it is of another seed".to_owned());
            }
            let curve = checkpoint
                .extra
                .get("learning_curve")
                .cloned()
                .ok_or_else(|| "it has no learning curve".to_owned())
                .and_then(|v| serde_json::from_value(v).map_err(|error| error.to_string()))?;
            Ok((checkpoint, curve))
        });
    match checked {
        Ok(kept) => Some(kept),
        Err(reason) => {
            progress(&format!(
                "  seed {seed_index}: {} not taken up ({reason}); training from the start",
                dir.display()
            ));
            None
        }
    }
}

/// The checkpoint directory of seed `seed_index`'s trained policy, beside
/// its part.
fn policy_name(seed_index: usize) -> String {
    format!("seed-{seed_index}-policy")
}

/// The protocol with its training seeds in up to `jobs` child processes.
/// Resumable: what an earlier run of the same command left in the parts
/// folder (the baselines, a seed's learning curve and trained policy, a
/// seed's evaluations) is taken as it is and not measured again. With
/// `--only-seeds`, only those seeds are trained and evaluated;
/// [`JobsOutcome::Partial`] when some seed is then still without its
/// evaluation (the parts stay, no record; the seeds evaluated so far are
/// pooled for `partial.json` in the parts folder). An evaluated seed needs only `baselines.json`,
/// `seed-K.json` and `seed-K-evaluated.json` of the parts folder, so a
/// protocol too long for one machine's time can be finished elsewhere
/// from those small files.
pub(crate) fn run_jobs(
    args: &BenchArgs,
    options: &SimicBenchOptions,
    rounds: usize,
    jobs: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<JobsOutcome> {
    // The devices the children take, checked before anything is written:
    // each new child on the device that runs the fewest (the first of
    // those); the run's own device by default.
    let devices = if args.job_devices.is_empty() {
        vec![args.device]
    } else {
        args.job_devices.clone()
    };
    for device in &devices {
        torch_ext::device::select(*device)
            .with_context(|| format!("--job-devices: {device} is not usable here"))?;
    }
    let setup = LearningSetup::new(options, rounds)?;
    if let Some(outside) = args.only_seeds.iter().find(|seed| **seed >= setup.seeds()) {
        bail!(
            "--only-seeds {outside} is not one of the run's {} training seeds",
            setup.seeds()
        );
    }
    let selected = |seed: usize| args.only_seeds.is_empty() || args.only_seeds.contains(&seed);
    let parts_dir = parts_dir(&args.out);
    std::fs::create_dir_all(&parts_dir)
        .with_context(|| format!("creating {}", parts_dir.display()))?;
    durable::remove_partial(&parts_dir)
        .with_context(|| format!("clearing {}", parts_dir.display()))?;
    let exe = std::env::current_exe().context("locating the esper binary")?;
    let part = |seed: usize| parts_dir.join(part_name(seed));
    let evaluated = |seed: usize| parts_dir.join(format!("seed-{seed}-evaluated.json"));
    let describe = setup.describe();

    // The baselines first, alone on the device, then the seeds: a
    // baseline's figures do not depend on what else the device runs.
    let baselines_path = parts_dir.join("baselines.json");
    let baselines = match read_part::<Baselines>(&baselines_path) {
        Some(kept) if setup.fits(&kept) => {
            progress(&format!(
                "the baselines kept in {}",
                baselines_path.display()
            ));
            kept
        }
        _ => {
            let measured = setup.baselines(progress)?;
            write_part(&baselines_path, &measured)?;
            measured
        }
    };

    // Which seeds are done: evaluated, or trained with a policy that
    // verifies.
    let is_evaluated = |seed: usize| {
        read_part::<SeedOutcome>(&evaluated(seed))
            .is_some_and(|o| o.seed_index == seed && o.setup == describe)
    };
    let is_trained = |seed: usize| {
        read_part::<SeedOutcome>(&part(seed))
            .is_some_and(|o| o.seed_index == seed && o.setup == describe)
            && simic::checkpoint::read_checkpoint(&parts_dir.join(policy_name(seed))).is_ok()
    };
    // Each seed's parts read once (a trained policy's checkpoint is verified
    // in full).
    let done: Vec<bool> = (0..setup.seeds())
        .map(|seed| is_evaluated(seed) || is_trained(seed))
        .collect();
    let pending: Vec<usize> = (0..setup.seeds())
        .rev()
        .filter(|seed| selected(*seed) && !done[*seed])
        .collect();
    for (seed, done) in done.iter().enumerate() {
        if *done {
            progress(&format!(
                "training seed {seed}: kept in {}",
                parts_dir.display()
            ));
        } else if !selected(seed) {
            progress(&format!(
                "training seed {seed}: not in --only-seeds, left for a later run"
            ));
        }
    }
    for seed in &pending {
        let stale = parts_dir.join(policy_name(*seed));
        if stale.exists() {
            std::fs::remove_dir_all(&stale)
                .with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    let spawn = |what: &str, seed: usize, device, evaluate: bool| -> Result<Child> {
        let out = if evaluate {
            evaluated(seed)
        } else {
            part(seed)
        };
        let child = Command::new(&exe)
            .args(child_args(args, device, rounds, seed, evaluate, &out))
            .spawn()
            .with_context(|| format!("starting {what} seed {seed}"))?;
        eprintln!("{what} seed {seed}: pid {} on {device}", child.id());
        Ok(child)
    };
    run_children(
        pending,
        jobs,
        usize::MAX,
        &devices,
        &parts_dir,
        &|seed, device| spawn("training", seed, device, false),
    )?;
    // With several devices, the evaluations in child processes too, one
    // at a time on each device: still alone on their device.
    let mut distinct: Vec<torch_ext::DeviceChoice> = Vec::new();
    for device in &devices {
        if !distinct.contains(device) {
            distinct.push(*device);
        }
    }
    if distinct.len() > 1 {
        let unevaluated: Vec<usize> = (0..setup.seeds())
            .rev()
            .filter(|seed| selected(*seed) && !is_evaluated(*seed))
            .collect();
        run_children(
            unevaluated,
            distinct.len(),
            1,
            &distinct,
            &parts_dir,
            &|seed, device| spawn("evaluating", seed, device, true),
        )?;
    }
    // Every trained policy evaluated here, alone on the device, each kept
    // as soon as it is done.
    let mut outcomes = Vec::with_capacity(setup.seeds());
    let mut missing = Vec::new();
    for seed in 0..setup.seeds() {
        if let Some(done) = read_part::<SeedOutcome>(&evaluated(seed))
            .filter(|o| o.seed_index == seed && o.setup == describe)
        {
            progress(&format!("seed {seed}'s evaluations: kept"));
            outcomes.push(done);
            continue;
        }
        if !selected(seed) {
            missing.push(seed);
            continue;
        }
        let outcome = evaluate_part(&setup, &parts_dir, seed, progress)?;
        write_part(&evaluated(seed), &outcome)?;
        outcomes.push(outcome);
    }
    if !missing.is_empty() {
        progress(&format!(
            "no record yet: seeds {missing:?} are not evaluated; the parts stay in {} (the \
             same command with --only-seeds naming them, or without it, goes on from them)",
            parts_dir.display()
        ));
        if outcomes.is_empty() {
            return Ok(JobsOutcome::Partial(None));
        }
        let evaluated: Vec<usize> = outcomes.iter().map(|o| o.seed_index).collect();
        progress(&format!(
            "the seeds evaluated so far, {evaluated:?} of {}, pooled (not the record):",
            setup.seeds()
        ));
        let run = setup.report_partial(&baselines, &outcomes, progress)?;
        return Ok(JobsOutcome::Partial(Some((
            run,
            parts_dir.join(PARTIAL_REPORT),
        ))));
    }
    let run = setup.report(&baselines, &outcomes, progress)?;
    std::fs::remove_dir_all(&parts_dir)
        .with_context(|| format!("removing {}", parts_dir.display()))?;
    Ok(JobsOutcome::Record(run))
}

/// The name of the pooled figures of a partial run in its parts folder
/// (rewritten by every run that ends with seeds still unevaluated; never
/// read back as a part).
const PARTIAL_REPORT: &str = "partial.json";

/// What [`run_jobs`] ends with.
pub(crate) enum JobsOutcome {
    /// Every seed evaluated: the protocol's record (the parts are removed).
    Record(SimicBenchRun),
    /// `--only-seeds` left seeds unevaluated: the parts stay, and the seeds
    /// evaluated so far, pooled by [`LearningSetup::report_partial`], with
    /// the path their record goes to in the parts folder (`None` when no
    /// seed is evaluated yet).
    Partial(Option<(SimicBenchRun, PathBuf)>),
}

/// Evaluates training seed `seed_index`'s trained policy, greedy and
/// sampled, on the shared evaluation environments, and writes the evaluated
/// part to `args.out`; the seed's part and trained policy are read from the
/// folder `args.out` is in (what `--jobs` starts with `--evaluate`).
pub(crate) fn run_evaluation(
    args: &BenchArgs,
    options: &SimicBenchOptions,
    rounds: usize,
    seed_index: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let (setup, parent) = child_setup(args, options, rounds, seed_index)?;
    let outcome = evaluate_part(&setup, &parent, seed_index, progress)?;
    write_part(&args.out, &outcome)
}

/// Seed `seed`'s trained policy, restored from `parts_dir`, evaluated.
fn evaluate_part(
    setup: &LearningSetup,
    parts_dir: &Path,
    seed: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<SeedOutcome> {
    let path = parts_dir.join(part_name(seed));
    let learned: SeedOutcome = read_part(&path)
        .filter(|o: &SeedOutcome| o.seed_index == seed && o.setup == setup.describe())
        .with_context(|| format!("{} is not seed {seed}'s part of this run", path.display()))?;
    let checkpoint = simic::checkpoint::read_checkpoint(&parts_dir.join(policy_name(seed)))
        .with_context(|| format!("reading seed {seed}'s trained policy"))?;
    let selected = simic::bench::Selected::from_checkpoint(&checkpoint)
        .with_context(|| format!("reading seed {seed}'s selected policy"))?;
    let mut trained = setup.restore_policy(seed, &checkpoint)?;
    Ok(setup.evaluate_policy(
        &mut trained,
        seed,
        learned.rounds,
        selected.as_ref(),
        progress,
    )?)
}

/// The part of seed `seed` (its learning curve) in the parts folder.
fn part_name(seed: usize) -> String {
    format!("seed-{seed}.json")
}

/// A part read back, or `None` when it is missing or does not parse (it is
/// then measured again).
fn read_part<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Writes a part atomically.
fn write_part<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_vec_pretty(value)?;
    durable::write_file(path, &text).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Where the parts of the record `out` go: `<out>.parts/` beside it.
fn parts_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".parts");
    out.with_file_name(name)
}

/// The child's command line: this run's options, `--seed-index seed`
/// (with `--evaluate` for an evaluation) and `--out part`.
fn child_args(
    args: &BenchArgs,
    device: torch_ext::DeviceChoice,
    rounds: usize,
    seed: usize,
    evaluate: bool,
    part: &Path,
) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = vec!["bench".into(), args.workload.name().into()];
    let mut push = |flag: &str, value: String| {
        out.push(flag.into());
        out.push(value.into());
    };
    push("--device", device.to_string());
    push("--rounds", rounds.to_string());
    if let Some(epochs) = args.ppo_epochs {
        push("--ppo-epochs", epochs.to_string());
    }
    if let Some(every) = args.greedy_every {
        push("--greedy-every", every.to_string());
    }
    if let Some(environments) = args.eval_environments {
        push("--eval-environments", environments.to_string());
    }
    if let Some(episode) = args.episode {
        push("--episode", episode.to_string());
    }
    if let Some(seeds) = args.seeds {
        push("--seeds", seeds.to_string());
    }
    if let Some(task) = args.task {
        push("--task", task.name().to_owned());
    }
    for setting in &args.settings {
        push("--set", setting.clone());
    }
    push("--seed-index", seed.to_string());
    if evaluate {
        out.push("--evaluate".into());
    }
    if args.quick {
        out.push("--quick".into());
    }
    out.push("--out".into());
    out.push(part.as_os_str().to_owned());
    out
}

#[cfg(test)]
mod tests;
