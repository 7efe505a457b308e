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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nissa::{Hub, JsonlConfig};
use tamiyo::growth::{GerminateOnceController, MaxGrowthController, NoGrowthController};
use tamiyo::heuristic::HeuristicController;
use tolaria::amp::Precision;
use tolaria::controller::{Controller, Decision, EpochObservation};
use tolaria::data::Dataset;
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig, epoch_seed};

use self::args::{ControllerKind, PrecisionChoice, TrainArgs};
use self::checkpoint::{ControllerState, Loaded, ScriptedState, TelemetryRewind};
use self::config::RunConfig;
use self::deferred::Deferred;
use self::epoch_log::{EpochLog, EpochRecord};
use self::interrupt::Interrupt;
use self::progress::Progress;
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

/// `esper train --resume RUN_DIR` of a heuristic run: the newest checkpoint
/// that verifies and restores (see the module docs).
fn resume(dir: &Path) -> Result<Finished> {
    let (candidates, mut warnings) = checkpoint::candidates(dir)?;
    // The configuration, device and data of the newest checkpoint that
    // verifies; older ones must have the same configuration.
    let mut setup: Option<(RunConfig, tch::Device, TaskData)> = None;
    let mut chosen = None;
    for (epoch, folder) in candidates {
        let loaded = match checkpoint::verify_epoch(epoch, &folder) {
            Ok(loaded) => loaded,
            Err(error) => {
                warnings.push(format!(
                    "checkpoint {} is damaged and was skipped, an earlier one is tried: {error:#}",
                    folder.display()
                ));
                continue;
            }
        };
        let mut config = loaded.run.config.clone();
        config.run_dir = dir.to_owned();
        if let Err(error) = config.validate().and_then(|()| {
            if config.controller != ControllerKind::Ppo {
                Ok(())
            } else {
                bail!(
                    "its configuration names controller {}",
                    config.controller.name()
                )
            }
        }) {
            warnings.push(format!(
                "checkpoint {} holds a configuration this program refuses and was skipped: \
                 {error:#}",
                folder.display()
            ));
            continue;
        }
        match &setup {
            Some((first, _, _)) if *first != config => {
                warnings.push(format!(
                    "checkpoint {} was written with another configuration than the newer ones \
                     and was skipped",
                    folder.display()
                ));
                continue;
            }
            Some(_) => {}
            None => {
                if loaded.epoch >= config.epochs {
                    print_warnings(&warnings);
                    println!(
                        "the run in {} is complete ({} of {} epochs); nothing to resume",
                        dir.display(),
                        loaded.epoch,
                        config.epochs
                    );
                    return Ok(Finished::Completed);
                }
                let device = select_device(&config)?;
                print_start(&config, device);
                let data = task::load_data(&config)?;
                check_batches(&config, &data.train)?;
                setup = Some((config.clone(), device, data));
            }
        }
        let Some((config, device, data)) = &setup else {
            bail!("resume: no configuration was set up");
        };
        let planned = epoch_log::Rewind::plan(dir, loaded.run.epoch_log_records).and_then(|log| {
            TelemetryRewind::plan(dir, &loaded.run.telemetry).map(|telemetry| (log, telemetry))
        });
        let (log, telemetry) = match planned {
            Ok(planned) => planned,
            Err(error) => {
                warnings.push(format!(
                    "checkpoint {} does not match the run's files and was skipped: {error:#}",
                    folder.display()
                ));
                continue;
            }
        };
        match build(config, *device, data, Some(&loaded)) {
            Ok(built) => {
                chosen = Some((
                    built,
                    Restored {
                        dir: folder,
                        epoch: loaded.epoch,
                        log,
                        telemetry,
                    },
                ));
                break;
            }
            Err(error) => warnings.push(format!(
                "checkpoint {} verifies but could not be restored and was skipped, an earlier \
                 one is tried: {error:#}",
                folder.display()
            )),
        }
    }
    print_warnings(&warnings);
    let (Some((config, _, data)), Some((built, restored))) = (setup, chosen) else {
        bail!(
            "no checkpoint in {} verifies and restores; nothing in {} was changed",
            dir.join(checkpoint::DIR).display(),
            dir.display()
        );
    };
    check_metrics_port(config.metrics_port)?;
    let interrupt = Interrupt::install()?;
    run_epochs(&config, &data, built, &interrupt, Some(restored))
}

fn print_warnings(warnings: &[String]) {
    for warning in warnings {
        eprintln!("esper: warning: {warning}");
    }
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

/// Cuts the run's files back to `restored` (when resuming), starts the
/// hub, trains, and draws the picture.
fn run_epochs(
    config: &RunConfig,
    data: &TaskData,
    built: Built,
    interrupt: &Interrupt,
    restored: Option<Restored>,
) -> Result<Finished> {
    let (stem, previous) = match restored {
        None => (None, Vec::new()),
        Some(restored) => {
            let epoch = restored.epoch;
            println!(
                "resuming from {} (epoch {epoch} of {})",
                restored.dir.display(),
                config.epochs
            );
            let _ = checkpoint::remove_partial(&config.run_dir)?;
            let records = restored.log.apply(&config.run_dir)?;
            println!(
                "{} cut back to the {} epochs of that checkpoint",
                epoch_log::FILE_NAME,
                records.len()
            );
            let removed = restored.telemetry.apply()?;
            if !removed.is_empty() {
                println!(
                    "removed telemetry written after that checkpoint: {}",
                    removed.join(", ")
                );
            }
            (Some(format!("events-resumed-{epoch}")), records)
        }
    };
    let resumed = stem.is_some();
    let hub = start_hub(config, stem, &built.telemetry)?;
    let result = train(
        config,
        &hub,
        interrupt,
        built,
        previous,
        resumed,
        (data.train.len(), data.validation.len()),
    );
    close_hub(&hub);
    let (records, finished) = result?;
    let picture = crate::plot::draw_run(&config.run_dir, &records);
    print_summary(config, &records, finished);
    match picture {
        Ok((png, svg)) => println!("picture: {} and {}", png.display(), svg.display()),
        // The run itself succeeded; a picture that cannot be drawn is said,
        // not fatal.
        Err(error) => eprintln!("esper: the run picture was not drawn: {error:#}"),
    }
    Ok(finished)
}

/// The controller of a heuristic or baseline run (`--controller heuristic`,
/// `no-growth`, `max-growth`, `germinate-once`).
#[derive(Debug)]
enum RunController {
    /// The reference's heuristic.
    Heuristic(HeuristicController),
    /// WAIT every epoch.
    NoGrowth(NoGrowthController),
    /// The ceiling.
    MaxGrowth(MaxGrowthController),
    /// One seed, then hold.
    GerminateOnce(GerminateOnceController),
}

impl RunController {
    /// The controller `config` names, restored from `saved` when resuming
    /// (refused when the state is another controller's).
    fn build(
        config: &RunConfig,
        saved: Option<&ControllerState>,
        telemetry: leyline::Telemetry,
    ) -> Result<RunController> {
        let topology = config.task.task().host().topology();
        let masks = tamiyo::masks::MaskConfig {
            max_seeds: config.max_seeds,
            topology,
            ..tamiyo::masks::MaskConfig::default()
        };
        let scripted = |name: &str| -> Result<bool> {
            match saved {
                None => Ok(false),
                Some(ControllerState::Scripted(state)) if state.scripted == name => {
                    Ok(state.germinated)
                }
                Some(_) => bail!("resume: the checkpoint's controller state is not {name}'s"),
            }
        };
        Ok(match config.controller {
            ControllerKind::Heuristic => RunController::Heuristic(
                match saved {
                    None => HeuristicController::new(),
                    Some(ControllerState::Heuristic(state)) => {
                        HeuristicController::from_state(state)
                            .context("resume: the controller's state")?
                    }
                    Some(ControllerState::Scripted(state)) => bail!(
                        "resume: the checkpoint holds the state of {}, not the heuristic's",
                        state.scripted
                    ),
                }
                .with_rotation(tamiyo::heuristic::rotation_for(topology))
                .with_telemetry(telemetry),
            ),
            ControllerKind::NoGrowth => {
                scripted(ControllerKind::NoGrowth.name())?;
                RunController::NoGrowth(NoGrowthController)
            }
            ControllerKind::MaxGrowth => {
                scripted(ControllerKind::MaxGrowth.name())?;
                RunController::MaxGrowth(MaxGrowthController::new(masks))
            }
            ControllerKind::GerminateOnce => RunController::GerminateOnce(
                GerminateOnceController::new(masks)
                    .with_germinated(scripted(ControllerKind::GerminateOnce.name())?),
            ),
            ControllerKind::Ppo => bail!("a PPO run has no per-run controller"),
        })
    }

    /// Its state for a checkpoint.
    fn state(&self) -> ControllerState {
        let scripted = |kind: ControllerKind, germinated: bool| {
            ControllerState::Scripted(ScriptedState {
                scripted: kind.name().to_owned(),
                germinated,
            })
        };
        match self {
            RunController::Heuristic(heuristic) => {
                ControllerState::Heuristic(heuristic.export_state())
            }
            RunController::NoGrowth(_) => scripted(ControllerKind::NoGrowth, false),
            RunController::MaxGrowth(_) => scripted(ControllerKind::MaxGrowth, false),
            RunController::GerminateOnce(once) => {
                scripted(ControllerKind::GerminateOnce, once.has_germinated())
            }
        }
    }
}

impl Controller for RunController {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        match self {
            RunController::Heuristic(controller) => controller.decide(observation),
            RunController::NoGrowth(controller) => controller.decide(observation),
            RunController::MaxGrowth(controller) => controller.decide(observation),
            RunController::GerminateOnce(controller) => controller.decide(observation),
        }
    }
}

/// The run's controller, shared with the epoch loop so that its state can
/// be checkpointed between epochs (the trainer asks it on the deadline's
/// worker thread; the loop only reads it at the boundary, when it is idle).
#[derive(Debug, Clone)]
struct SharedController(Arc<Mutex<RunController>>);

impl SharedController {
    fn state(&self) -> ControllerState {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state()
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

/// Trains the built (and restored) trainer; returns the epochs written
/// (`previous` ones first) and how the run ended.
fn train(
    config: &RunConfig,
    hub: &Hub,
    interrupt: &Interrupt,
    built: Built,
    previous: Vec<EpochRecord>,
    resumed: bool,
    (train_samples, validation_samples): (usize, usize),
) -> Result<(Vec<EpochRecord>, Finished)> {
    let Built {
        mut trainer,
        shared,
        telemetry: _,
    } = built;
    println!(
        "{train_samples} training / {validation_samples} validation samples, {}, slots {}, at \
         most {} seeds, {} epochs of batch {}, lr {}, {} {}",
        trainer.model().host().name(),
        config.slots.join(","),
        config.max_seeds,
        config.epochs,
        config.batch_size,
        config.learning_rate,
        trainer.precision(),
        trainer.config().mode.name(),
    );
    let mut log = if resumed {
        EpochLog::append_to(&config.run_dir)?
    } else {
        EpochLog::create(&config.run_dir)?
    };
    let progress = Progress::new(config.epochs);
    if let Progress::Bar(bar) = &progress {
        bar.set_position(u64::try_from(trainer.epoch()).unwrap_or(u64::MAX));
    }
    let mut records = previous;
    records.reserve(config.epochs.saturating_sub(records.len()).min(1024));
    let mut finished = Finished::Completed;
    let mut newest_checkpoint = None;
    while trainer.epoch() < config.epochs {
        if interrupt.requested() {
            finished = Finished::Interrupted;
            break;
        }
        tch::manual_seed(epoch_seed(config.seed, trainer.epoch()));
        let started = Instant::now();
        let report = match trainer.train_epoch() {
            Ok(report) => report,
            Err(error) => {
                progress.finish();
                return Err(error).with_context(|| {
                    format!(
                        "epoch {} failed ({} earlier epochs are in {})",
                        trainer.epoch().saturating_add(1),
                        records.len(),
                        config.run_dir.join(epoch_log::FILE_NAME).display()
                    )
                });
            }
        };
        let epoch_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut record = EpochRecord::new(&report, trainer.model(), epoch_ms);
        if config.task.task().is_language_model() {
            record = record.with_perplexity();
        }
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
                record.epoch.saturating_add(1),
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
