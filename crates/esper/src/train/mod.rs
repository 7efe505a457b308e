//! `esper train`: one training run, from the command line to the run
//! directory.
//!
//! 1. resolve the configuration ([`config`]: defaults, `--config` file,
//!    flags, every value checked; or, for `--resume RUN_DIR`, the
//!    configuration of the newest checkpoint that verifies, [`checkpoint`]:
//!    the directory format; the trainer's state inside it is tolaria's);
//!    `--controller ppo` runs Simic's vectorized PPO instead of the steps
//!    below ([`ppo`]);
//! 2. load the task's data ([`task`]) and check that the batch size leaves
//!    a batch of it;
//! 3. build the task's host with the seed slots, the heuristic controller
//!    and the trainer (`tolaria::engine::trainer::ModelTrainer`, which
//!    refuses what the device cannot run: a precision or a graph mode the
//!    CPU lacks, a learning rate out of range), and for `--resume` restore
//!    the checkpoint into them; their telemetry is held ([`deferred`]);
//! 4. only then write: create the run directory and `config.toml` (or, for
//!    `--resume`, cut `epochs.jsonl` and the telemetry files back to the
//!    restored checkpoint), start the telemetry hub (`nissa::Hub` with a
//!    JSONL sink into `RUN_DIR/telemetry/`) and hand it the held packets;
//! 5. train epoch by epoch, with the heuristic behind a decision deadline
//!    and the `--max-seeds` limit ([`seed_budget`]), printing progress
//!    ([`progress`]) and appending each epoch to `epochs.jsonl`
//!    ([`epoch_log`]), with libtorch's generator seeded per epoch
//!    (`tolaria::engine::trainer::epoch_seed`) and a checkpoint every
//!    `checkpoint_every` epochs ([`checkpoint`]);
//! 6. at the end, or at the first epoch boundary after Ctrl-C
//!    ([`interrupt`]), write a checkpoint, flush the telemetry and draw the
//!    run picture ([`crate::plot`]).
//!
//! So a run that is refused (a bad value, a missing data set, a slot the
//! host lacks, a batch larger than the data, bf16 or a graph mode on the
//! CPU) leaves no run directory, and a resume that finds no checkpoint it
//! can restore leaves the run directory byte for byte as it was. A resume
//! takes the newest checkpoint that verifies *and* restores: a damaged one,
//! or one that verifies but cannot be put back into the model and trainer,
//! is passed over with a warning. A resumed run goes on writing telemetry
//! into files named `events-resumed-<epoch>-*.jsonl`.
//!
//! The training itself lives in tolaria; this module only wires the pieces
//! together and writes files.

pub(crate) mod args;
pub(crate) mod checkpoint;
pub(crate) mod config;
pub(crate) mod deferred;
pub(crate) mod epoch_log;
pub(crate) mod interrupt;
pub(crate) mod ppo;
pub(crate) mod ppo_checkpoint;
pub(crate) mod progress;
pub(crate) mod ranks;
pub(crate) mod seed_budget;
pub(crate) mod task;

mod controller;
mod epochs;
mod resume;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nissa::{Hub, JsonlConfig};
use tolaria::amp::Precision;
use tolaria::data::Dataset;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};

use self::args::{ControllerKind, PrecisionChoice, TrainArgs};
use self::checkpoint::{Loaded, TelemetryRewind};
use self::config::RunConfig;
use self::controller::{RunController, SharedController};
use self::deferred::Deferred;
use self::epochs::run_epochs;
use self::interrupt::Interrupt;
use self::resume::resume;
use self::seed_budget::SeedBudget;
use self::task::TaskData;

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
    if let Some(dir) = &args.resume {
        // `--nproc N` may come with `--resume`: the launcher restarts the
        // run's N ranks, each resuming (rank 0 alone rewrites the files).
        let bare = TrainArgs {
            nproc: None,
            ..args.clone()
        };
        only_resume(&bare, dir)?;
        match args.nproc {
            Some(0) => bail!("--nproc must be at least 1"),
            Some(nproc) if nproc > ranks::MAX_NPROC => bail!(
                "--nproc {nproc} is more than the {} processes a run may start",
                ranks::MAX_NPROC
            ),
            Some(nproc) if nproc > 1 && !ranks::is_rank() => {
                return ranks::launch_resume(dir, nproc);
            }
            _ => {}
        }
        // A PPO run resumes from its own kind of checkpoint.
        if let Some(candidates) = ppo_checkpoint::candidates(dir) {
            return ppo::resume(dir, &candidates);
        }
        return resume(dir);
    }
    let config = RunConfig::resolve(args)?;
    if args.nproc == Some(0) {
        bail!("--nproc must be at least 1");
    }
    if let Some(nproc) = args.nproc.filter(|n| *n > ranks::MAX_NPROC) {
        bail!(
            "--nproc {nproc} is more than the {} processes a run may start",
            ranks::MAX_NPROC
        );
    }
    if let Some(nproc) = args.nproc.filter(|n| *n > 1)
        && !ranks::is_rank()
    {
        return ranks::launch_ranks(args, &config, nproc);
    }
    if config.controller == ControllerKind::Ppo {
        return ppo::run(&config);
    }
    let device = select_device(&config)?;
    print_start(&config, device);
    let data = task::load_data(&config)?;
    check_batches(&config, &data.train)?;
    let built = build(&config, device, &data, None)?;
    check_metrics_port(config.metrics_port)?;
    let text = config.to_text(&config.run_dir.join(CONFIG_NAME))?;
    let interrupt = Interrupt::install()?;
    // Everything is built: from here on the run writes.
    create_run_dir(&config.run_dir)?;
    write_config(&config.run_dir, &text)?;
    run_epochs(&config, &data, built, &interrupt, None)
}

/// `--resume` takes no other option (but `--nproc`, checked by the
/// caller): the run goes on with its own configuration.
fn only_resume(args: &TrainArgs, dir: &Path) -> Result<()> {
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
    Ok(())
}

/// The device `config` names.
pub(crate) fn select_device(config: &RunConfig) -> Result<tch::Device> {
    torch_ext::device::select(config.device_choice()?)
        .with_context(|| format!("selecting device {}", config.device))
}

fn print_start(config: &RunConfig, device: tch::Device) {
    println!(
        "esper train: task {}, controller {}, device {}, run directory {}",
        config.task.name(),
        config.controller.name(),
        torch_ext::DeviceChoice::of(device),
        config.run_dir.display()
    );
}

/// Refuses a batch size that leaves no batch of `train` (the trainer would
/// refuse it at its first epoch, after the run directory was written).
pub(crate) fn check_batches(config: &RunConfig, train: &Dataset) -> Result<()> {
    let samples = i64::try_from(train.len()).context("the training set's length")?;
    let batch = i64::try_from(config.batch_size).context("batch_size does not fit i64")?;
    let drop_last = ModelTrainerConfig::default().drop_last;
    tolaria::engine::batches::batch_sizes(samples, batch, drop_last).with_context(|| {
        format!(
            "batch_size {} is more than the {} training samples (an epoch drops a last batch \
             that is not full); choose a smaller --batch-size or more --train-samples",
            config.batch_size,
            train.len()
        )
    })?;
    Ok(())
}

/// Refuses a `--metrics-port` that cannot be bound now (the hub binds it
/// after the run directory was written).
pub(crate) fn check_metrics_port(port: Option<u16>) -> Result<()> {
    if let Some(port) = port.filter(|port| *port != 0) {
        std::net::TcpListener::bind(("127.0.0.1", port))
            .with_context(|| format!("--metrics-port {port} cannot be bound on 127.0.0.1"))?;
    }
    Ok(())
}

/// Writes `config.toml` (its text from [`RunConfig::to_text`]) into `dir`.
pub(crate) fn write_config(dir: &Path, text: &str) -> Result<()> {
    let path = dir.join(CONFIG_NAME);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Starts the telemetry hub of `config` (JSONL files named `stem` in
/// `RUN_DIR/telemetry/`, Prometheus when asked for) and hands it the
/// packets `held` kept until now.
pub(crate) fn start_hub(config: &RunConfig, stem: Option<String>, held: &Deferred) -> Result<Hub> {
    let mut jsonl = JsonlConfig::new(config.run_dir.join(TELEMETRY_DIR));
    if let Some(stem) = stem {
        jsonl.file_stem = stem;
    }
    let mut hub = Hub::builder().jsonl(jsonl);
    if let Some(port) = config.metrics_port {
        hub = hub.prometheus_on_port(port);
    }
    let hub = hub.build().context("starting the telemetry hub")?;
    if let Some(addr) = hub.metrics_addr() {
        println!("telemetry: Prometheus metrics on http://{addr}/metrics");
    }
    let dropped = held.attach(&hub);
    if dropped > 0 {
        eprintln!(
            "esper: warning: {dropped} telemetry packets emitted before the hub started were \
             dropped"
        );
    }
    Ok(hub)
}

/// Flushes and closes `hub`, saying how many packets were still pending.
pub(crate) fn close_hub(hub: &Hub) {
    let flushed = hub.flush(Duration::from_secs(10));
    hub.close();
    if !flushed.is_complete() {
        eprintln!(
            "esper: {} telemetry packets were still pending when the run ended",
            flushed.pending
        );
    }
}

/// A checkpoint restored into a fresh host and trainer, with what cutting
/// the run's files back to it will do (not done yet).
struct Restored {
    /// The checkpoint's folder.
    dir: PathBuf,
    /// Its epoch.
    epoch: usize,
    /// `epochs.jsonl` cut back to its records.
    log: epoch_log::Rewind,
    /// The telemetry files cut back to their lengths.
    telemetry: TelemetryRewind,
}

/// The host, the controller and the trainer of a run, built (and restored)
/// before anything is written; their telemetry is held until the hub
/// starts.
struct Built {
    trainer: ModelTrainer,
    shared: SharedController,
    telemetry: Deferred,
}

/// Builds the host with its slots, the controller and the trainer of
/// `config` on `device`, restoring `resume` into them when given.
fn build(
    config: &RunConfig,
    device: tch::Device,
    data: &TaskData,
    resume: Option<&Loaded>,
) -> Result<Built> {
    let held = Deferred::new();
    let telemetry = held.telemetry();
    let model = task::build_model(config, device, telemetry.clone())?;
    let run_controller = RunController::build(
        config,
        resume.map(|loaded| &loaded.run.controller),
        telemetry.clone(),
    )?;
    let shared = SharedController(Arc::new(Mutex::new(run_controller)));
    let controller = SeedBudget::new(shared.clone(), config.max_seeds);
    let trainer_config = trainer_config(config, device);
    let trainer = match resume {
        Some(loaded) => ModelTrainer::restore(
            model,
            &loaded.state,
            &data.train,
            Some(&data.validation),
            trainer_config,
            telemetry,
        )
        .context("resume: restoring the trainer")?,
        None => ModelTrainer::new(
            model,
            &data.train,
            Some(&data.validation),
            trainer_config,
            telemetry,
        )
        .context("setting up the trainer")?,
    }
    .with_controller(controller, DECISION_DEADLINE)
    .context("starting the controller")?;
    Ok(Built {
        trainer,
        shared,
        telemetry: held,
    })
}

/// Creates `dir`, refusing one that already holds files (a run directory is
/// never overwritten).
pub(crate) fn create_run_dir(dir: &Path) -> Result<()> {
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

/// The trainer's configuration for `config` on `device` (`--mode auto`
/// resolved there, [`args::ModeChoice::resolve`]).
pub(crate) fn trainer_config(config: &RunConfig, device: tch::Device) -> ModelTrainerConfig {
    let optimizer = config.task.task().optimizer(config.learning_rate, MOMENTUM);
    ModelTrainerConfig {
        seed: config.seed,
        batch_size: config.batch_size,
        mode: config.mode.resolve(device),
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
