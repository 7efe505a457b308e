//! `esper train`: one training run, from the command line to the run
//! directory.
//!
//! 1. resolve the configuration ([`config`]: defaults, `--config` file,
//!    flags; or, for `--resume RUN_DIR`, the configuration of the newest
//!    checkpoint that verifies, [`checkpoint`]); `--controller ppo` runs
//!    Simic's vectorized PPO instead of the steps below ([`ppo`]);
//! 2. load the task's data ([`task`]; a missing data set stops the run
//!    before its directory exists);
//! 3. create the run directory, write `config.toml`, start the telemetry hub
//!    (`nissa::Hub` with a JSONL sink into `RUN_DIR/telemetry/`) and build
//!    the task's host with the seed slots ([`task`]);
//! 4. train epoch by epoch through `tolaria::engine::trainer::ModelTrainer`,
//!    with the heuristic controller behind a decision deadline and the
//!    `--max-seeds` limit ([`seed_budget`]), printing progress
//!    ([`progress`]) and appending each epoch to `epochs.jsonl`
//!    ([`epoch_log`]), with libtorch's generator seeded per epoch
//!    ([`checkpoint::epoch_seed`]) and a checkpoint every
//!    `checkpoint_every` epochs ([`checkpoint`]);
//! 5. at the end, or at the first epoch boundary after Ctrl-C
//!    ([`interrupt`]), write a checkpoint, flush the telemetry and draw the
//!    run picture ([`crate::plot`]).
//!
//! A resumed run restores the host, the seeds, the optimizers, the
//! governor, the controller and the counters from the checkpoint, cuts `epochs.jsonl` and
//! the telemetry files back to where they were at the checkpoint, and goes
//! on writing telemetry into files named `events-resumed-<epoch>-*.jsonl`.
//!
//! The training itself lives in tolaria; this module only wires the pieces
//! together and writes files.

pub(crate) mod args;
pub(crate) mod checkpoint;
pub(crate) mod config;
pub(crate) mod epoch_log;
pub(crate) mod interrupt;
pub(crate) mod ppo;
pub(crate) mod ppo_checkpoint;
pub(crate) mod progress;
pub(crate) mod ranks;
pub(crate) mod seed_budget;
pub(crate) mod task;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nissa::{Hub, JsonlConfig};
use tamiyo::heuristic::HeuristicController;
use tolaria::amp::Precision;
use tolaria::config::ExecutionMode;
use tolaria::controller::{Controller, Decision, EpochObservation};
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use tolaria::optim::{GroupOptimizerConfig, OptimizerConfig};

use self::args::{ControllerKind, ModeChoice, PrecisionChoice, TrainArgs};
use self::checkpoint::Loaded;
use self::config::RunConfig;
use self::epoch_log::{EpochLog, EpochRecord};
use self::interrupt::Interrupt;
use self::progress::Progress;
use self::seed_budget::SeedBudget;

/// How long the trainer waits for the controller's decision at an epoch
/// boundary before it applies WAIT (the heuristic answers in microseconds).
pub(crate) const DECISION_DEADLINE: Duration = Duration::from_secs(1);

/// The telemetry folder inside the run directory.
pub(crate) const TELEMETRY_DIR: &str = "telemetry";

/// The configuration file name inside the run directory.
pub(crate) const CONFIG_NAME: &str = "config.toml";

/// SGD momentum of the host and the seeds (the reference's).
const MOMENTUM: f64 = 0.9;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    /// Every epoch ran.
    Completed,
    /// Ctrl-C stopped it at an epoch boundary.
    Interrupted,
}

/// Runs `esper train` (see the module docs).
pub(crate) fn run(args: &TrainArgs) -> Result<Finished> {
    // A PPO run resumes from its own kind of checkpoint.
    if let Some(dir) = &args.resume
        && let Some((loaded, warnings)) = ppo_checkpoint::latest(dir)?
    {
        let only_resume = TrainArgs {
            resume: args.resume.clone(),
            ..TrainArgs::default()
        };
        if *args != only_resume {
            bail!(
                "--resume continues a run with its own configuration ({}); give no other option",
                dir.join(CONFIG_NAME).display()
            );
        }
        for warning in &warnings {
            eprintln!("esper: warning: {warning}");
        }
        let mut config = loaded.manifest.config.clone();
        config.run_dir = dir.to_owned();
        config.validate()?;
        if usize::try_from(loaded.manifest.round).unwrap_or(usize::MAX) >= config.rounds {
            println!(
                "the run in {} is complete ({} of {} rounds); nothing to resume",
                dir.display(),
                loaded.manifest.round,
                config.rounds
            );
            return Ok(Finished::Completed);
        }
        return ppo::run(&config, Some(loaded));
    }
    let (config, resume) = match &args.resume {
        Some(dir) => {
            let (config, loaded) = resume_config(args, dir)?;
            (config, Some(loaded))
        }
        None => (RunConfig::resolve(args)?, None),
    };
    if args.nproc == Some(0) {
        bail!("--nproc must be at least 1");
    }
    if let Some(nproc) = args.nproc.filter(|n| *n > 1)
        && !ranks::is_rank()
    {
        return ranks::launch_ranks(args, &config, nproc);
    }
    if config.controller == ControllerKind::Ppo {
        if resume.is_some() {
            bail!(
                "{}: not a PPO checkpoint",
                args.resume.as_deref().unwrap_or(Path::new("")).display()
            );
        }
        return ppo::run(&config, None);
    }
    let device = torch_ext::device::select(config.device_choice()?)
        .with_context(|| format!("selecting device {}", config.device))?;
    println!(
        "esper train: task {}, controller {}, device {}, run directory {}",
        config.task.name(),
        config.controller.name(),
        torch_ext::DeviceChoice::of(device),
        config.run_dir.display()
    );
    // The data first: a missing data set leaves no half-made run directory.
    let data = task::load_data(&config)?;
    let mut jsonl = JsonlConfig::new(config.run_dir.join(TELEMETRY_DIR));
    let previous = match &resume {
        None => {
            create_run_dir(&config.run_dir)?;
            config.write(&config.run_dir.join(CONFIG_NAME))?;
            Vec::new()
        }
        Some(loaded) => {
            let epoch = loaded.manifest.epoch;
            println!(
                "resuming from {} (epoch {epoch} of {})",
                loaded.dir.display(),
                config.epochs
            );
            let records = epoch_log::rewind(&config.run_dir, loaded.manifest.epoch_log_records)?;
            println!(
                "{} cut back to the {} epochs of that checkpoint",
                epoch_log::FILE_NAME,
                records.len()
            );
            let _ = checkpoint::remove_partial(&config.run_dir)?;
            let removed = checkpoint::rewind_telemetry(&config.run_dir, loaded)?;
            if !removed.is_empty() {
                println!(
                    "removed telemetry written after that checkpoint: {}",
                    removed.join(", ")
                );
            }
            jsonl.file_stem = format!("events-resumed-{epoch}");
            records
        }
    };
    let interrupt = Interrupt::install()?;
    let mut hub = Hub::builder().jsonl(jsonl);
    if let Some(port) = config.metrics_port {
        hub = hub.prometheus_on_port(port);
    }
    let hub = hub.build().context("starting the telemetry hub")?;
    if let Some(addr) = hub.metrics_addr() {
        println!("telemetry: Prometheus metrics on http://{addr}/metrics");
    }
    let result = train(
        &config,
        device,
        &data,
        &hub,
        &interrupt,
        resume.as_ref(),
        previous,
    );
    let flushed = hub.flush(Duration::from_secs(10));
    hub.close();
    if !flushed.is_complete() {
        eprintln!(
            "esper: {} telemetry packets were still pending when the run ended",
            flushed.pending
        );
    }
    let (records, finished) = result?;
    let (png, svg) = crate::plot::draw_run(&config.run_dir, &records)?;
    print_summary(&config, &records, finished);
    println!("picture: {} and {}", png.display(), svg.display());
    Ok(finished)
}

/// The configuration of the run in `dir` and its newest checkpoint that
/// verifies (warning about every newer one passed over); refuses other
/// options.
fn resume_config(args: &TrainArgs, dir: &Path) -> Result<(RunConfig, Loaded)> {
    let only_resume = TrainArgs {
        resume: args.resume.clone(),
        ..TrainArgs::default()
    };
    if *args != only_resume {
        bail!(
            "--resume continues a run with its own configuration ({}); give no other option",
            dir.join(CONFIG_NAME).display()
        );
    }
    let (loaded, warnings) = checkpoint::latest(dir)?;
    for warning in &warnings {
        eprintln!("esper: warning: {warning}");
    }
    let mut config = loaded.manifest.config.clone();
    config.run_dir = dir.to_owned();
    config.validate()?;
    if loaded.manifest.epoch >= config.epochs {
        println!(
            "the run in {} is complete ({} of {} epochs); nothing to resume",
            dir.display(),
            loaded.manifest.epoch,
            config.epochs
        );
    }
    Ok((config, loaded))
}

/// The heuristic controller, shared with the epoch loop so that its state
/// can be checkpointed between epochs (the trainer asks it on the deadline's
/// worker thread; the loop only reads it at the boundary, when it is idle).
#[derive(Debug, Clone)]
struct SharedController(Arc<Mutex<HeuristicController>>);

impl SharedController {
    fn state(&self) -> tamiyo::heuristic::HeuristicState {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .export_state()
    }
}

impl Controller for SharedController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .decide(observation)
    }
}

/// Creates `dir`, refusing one that already holds files (a run directory is
/// never overwritten).
fn create_run_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir)
            .with_context(|| format!("reading the run directory {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "the run directory {} already holds files; choose another --run-dir",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the run directory {}", dir.display()))
}

/// The trainer's configuration for `config`.
fn trainer_config(config: &RunConfig) -> ModelTrainerConfig {
    let optimizer = OptimizerConfig {
        host: GroupOptimizerConfig::sgd(config.learning_rate, MOMENTUM),
        seed: GroupOptimizerConfig::sgd(config.learning_rate, MOMENTUM),
    };
    ModelTrainerConfig {
        seed: config.seed,
        batch_size: config.batch_size,
        mode: match config.mode {
            ModeChoice::Eager => ExecutionMode::Eager,
            ModeChoice::GraphStep => ExecutionMode::GraphStep,
            ModeChoice::GraphEpoch => ExecutionMode::GraphEpoch,
        },
        precision: match config.precision {
            PrecisionChoice::Auto => None,
            PrecisionChoice::Fp32 => Some(Precision::Fp32),
            PrecisionChoice::Bf16 => Some(Precision::Bf16),
            PrecisionChoice::Fp16 => Some(Precision::Fp16),
        },
        optimizer,
        max_seeds: config.max_seeds.max(1),
        ..ModelTrainerConfig::default()
    }
}

/// Builds (restoring `resume` when given) and trains; returns the epochs
/// written (`previous` ones first) and how the run ended.
fn train(
    config: &RunConfig,
    device: tch::Device,
    data: &task::TaskData,
    hub: &Hub,
    interrupt: &Interrupt,
    resume: Option<&Loaded>,
    previous: Vec<EpochRecord>,
) -> Result<(Vec<EpochRecord>, Finished)> {
    let telemetry = hub.telemetry();
    let mut model = task::build_model(config, device, telemetry.clone())?;
    let heuristic = match resume {
        Some(loaded) => {
            checkpoint::restore_model(loaded, &mut model)?;
            HeuristicController::from_state(&loaded.manifest.controller)
                .context("resume: the controller's state")?
        }
        None => HeuristicController::new(),
    }
    .with_telemetry(telemetry.clone());
    let shared = SharedController(Arc::new(Mutex::new(heuristic)));
    let controller = SeedBudget::new(shared.clone(), config.max_seeds);
    let mut trainer = ModelTrainer::new(
        model,
        &data.train,
        Some(&data.validation),
        trainer_config(config),
        telemetry,
    )
    .context("setting up the trainer")?
    .with_controller(controller, DECISION_DEADLINE)
    .context("starting the controller")?;
    if let Some(loaded) = resume {
        checkpoint::restore_trainer(loaded, &mut trainer)?;
    }
    println!(
        "{} training / {} validation samples, {}, slots {}, at most {} seeds, {} epochs of \
         batch {}, lr {}, {} {}",
        data.train.len(),
        data.validation.len(),
        trainer.model().host().name(),
        config.slots.join(","),
        config.max_seeds,
        config.epochs,
        config.batch_size,
        config.learning_rate,
        trainer.precision(),
        trainer.config().mode.name(),
    );
    let mut log = match resume {
        Some(_) => EpochLog::append_to(&config.run_dir)?,
        None => EpochLog::create(&config.run_dir)?,
    };
    let progress = Progress::new(config.epochs);
    if let Progress::Bar(bar) = &progress {
        bar.set_position(u64::try_from(trainer.epoch()).unwrap_or(u64::MAX));
    }
    let mut records = previous;
    records.reserve(config.epochs.saturating_sub(records.len()));
    let mut finished = Finished::Completed;
    let mut newest_checkpoint = None;
    while trainer.epoch() < config.epochs {
        if interrupt.requested() {
            finished = Finished::Interrupted;
            break;
        }
        tch::manual_seed(checkpoint::epoch_seed(config.seed, trainer.epoch()));
        let started = Instant::now();
        let report = match trainer.train_epoch() {
            Ok(report) => report,
            Err(error) => {
                progress.finish();
                return Err(error).with_context(|| {
                    format!(
                        "epoch {} failed ({} earlier epochs are in {})",
                        trainer.epoch() + 1,
                        records.len(),
                        config.run_dir.join(epoch_log::FILE_NAME).display()
                    )
                });
            }
        };
        let epoch_ms = started.elapsed().as_secs_f64() * 1000.0;
        let record = EpochRecord::new(&report, trainer.model(), epoch_ms);
        log.append(&record)?;
        progress.epoch(&record);
        records.push(record);
        let done = trainer.epoch();
        let due = done.checked_rem(config.checkpoint_every) == Some(0);
        if due || done >= config.epochs || interrupt.requested() {
            // Every packet of the finished epochs reaches its file first, so
            // that the lengths the manifest records cover them.
            let flushed = hub.flush(Duration::from_secs(10));
            if !flushed.is_complete() {
                progress.note(&format!(
                    "esper: warning: {} telemetry packets were still pending at the checkpoint \
                     after epoch {done}; a resume from it may lose them",
                    flushed.pending
                ));
            }
            let dir = checkpoint::save(
                &config.run_dir,
                &trainer,
                checkpoint::Extras {
                    config,
                    controller: shared.state(),
                    epoch_log_records: records.len(),
                },
            )
            .with_context(|| format!("writing the checkpoint after epoch {done}"))?;
            newest_checkpoint = Some(dir);
        }
    }
    if interrupt.requested() {
        finished = Finished::Interrupted;
    }
    progress.finish();
    if finished == Finished::Interrupted {
        progress.note(&format!(
            "stopped by Ctrl-C after {} of {} epochs",
            records.len(),
            config.epochs
        ));
    }
    if let Some(dir) = newest_checkpoint {
        progress.note(&format!(
            "newest checkpoint: {} (esper train --resume {} continues the run)",
            dir.display(),
            config.run_dir.display()
        ));
    }
    Ok((records, finished))
}

/// The closing lines: accuracy from first to last epoch, and what became of
/// every seed.
fn print_summary(config: &RunConfig, records: &[EpochRecord], finished: Finished) {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        println!("no epoch finished");
        return;
    };
    let best = records
        .iter()
        .map(|record| record.val_accuracy)
        .fold(f64::MIN, f64::max);
    println!(
        "{} {} epochs in {:.1} s: validation accuracy {:.2}% -> {:.2}% (best {:.2}%)",
        if finished == Finished::Completed {
            "trained"
        } else {
            "stopped after"
        },
        records.len(),
        records.iter().map(|record| record.epoch_ms).sum::<f64>() / 1000.0,
        first.val_accuracy,
        last.val_accuracy,
        best
    );
    let mut events = Vec::new();
    for record in records {
        if let Some(decision) = record.acted() {
            events.push(format!(
                "epoch {}: {}",
                record.epoch + 1,
                progress::describe_decision(decision)
            ));
        }
    }
    if events.is_empty() {
        let reason = last
            .decision
            .as_ref()
            .map_or("no decision", |decision| decision.reason.as_str());
        println!("no seed was germinated (the controller's last reason: {reason})");
    } else {
        println!("lifecycle operations:\n  {}", events.join("\n  "));
    }
    let stages: Vec<String> = last
        .slots
        .iter()
        .map(|slot| match &slot.blueprint {
            Some(blueprint) => format!("{} {} ({blueprint})", slot.slot, slot.stage),
            None => format!("{} {}", slot.slot, slot.stage),
        })
        .collect();
    println!("slots at the end: {}", stages.join(", "));
    println!(
        "files: {} ({}, {}, {}/, {}/)",
        config.run_dir.display(),
        CONFIG_NAME,
        epoch_log::FILE_NAME,
        TELEMETRY_DIR,
        checkpoint::DIR
    );
}
