//! `esper bench <workload>`: runs one workload's measuring code (each in
//! its crate's `bench` module, returning figures only), probes the machine
//! ([`crate::probe`]), builds the `leyline::baseline::BaselineRecord`, writes
//! it ([`crate::record`]) and prints its table ([`crate::table`]).

use anyhow::{Context, Result, bail};
use leyline::baseline::{BaselineRecord, Environment};

use crate::args::{BenchArgs, Workload};
use crate::{probe, record, table};

/// Runs the workload `args` names and writes its record to `args.out`.
///
/// # Errors
/// Anything that stops the measurement or the writing; for `nissa-emit`
/// also an inexact drop accounting (after the record is written, so it can
/// be read).
pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    let mut progress = |line: &str| eprintln!("{line}");
    let record = match args.workload {
        Workload::TolariaReference => tolaria_reference(args, &mut progress)?,
        Workload::NissaEmit => nissa_emit(args, &mut progress)?,
        Workload::KasminaPrefetch => kasmina_prefetch(args, &mut progress)?,
        Workload::TolariaFmnist => tolaria_fmnist(args, &mut progress)?,
        Workload::TolariaLm => tolaria_lm(args, &mut progress)?,
        Workload::TolariaTimeout => {
            let run = tolaria::engine::bench::run_timeout_drill(args.device, args.quick)?;
            record_of(args, probe::with_torch(run.device)?, run.measurements)?
        }
        Workload::TolariaRollback => {
            let run = tolaria::engine::bench::run_rollback_drill(args.device, args.quick)?;
            record_of(args, probe::with_torch(run.device)?, run.measurements)?
        }
        Workload::SimicThroughput
        | Workload::SimicCifar
        | Workload::SimicLm
        | Workload::SimicGrowth => {
            let task = match args.workload {
                Workload::SimicCifar | Workload::SimicGrowth => {
                    simic::bench::ThroughputTask::Cifar10
                }
                Workload::SimicLm => simic::bench::ThroughputTask::LanguageModel,
                _ => simic::bench::ThroughputTask::FashionMnist,
            };
            if args.gpus.is_empty() {
                let mut options = simic::bench::SimicBenchOptions::new(args.device, args.quick);
                options.variants.clone_from(&args.simic_variants);
                options.episode_length = args.episode;
                if args.workload == Workload::SimicGrowth {
                    options.driver = match &args.policy {
                        Some(path) => {
                            let policy = crate::train::ppo_checkpoint::learned_policy(
                                path,
                                simic::bench::SLOTS.len(),
                                simic::vectorized::SimicConfig::reference(1).max_seeds,
                                &mut |line| eprintln!("warning: {line}"),
                            )
                            .with_context(|| format!("--policy {}", path.display()))?;
                            eprintln!("driver: {}", policy.describe());
                            simic::bench::Driver::Learned(std::rc::Rc::new(policy))
                        }
                        None => simic::bench::Driver::MaxGrowth,
                    };
                }
                if let Some(rounds) = args.rounds {
                    options.rounds = rounds;
                }
                // A record of the entries so far after each variant: a run
                // stopped by a time limit keeps what it measured. The
                // finished run's record replaces it.
                let device = torch_ext::device::select(args.device)?;
                let mut partial = |results: &[leyline::baseline::ResultEntry]| {
                    write_partial(args, device, results);
                };
                let run = simic::bench::run_throughput_reporting(
                    task,
                    &options,
                    &mut progress,
                    &mut partial,
                )?;
                simic_record(args, run)?
            } else {
                let device = torch_ext::device::select(args.device)?;
                let measurements = crate::scaling::measure(args, task, &mut progress)?;
                simic_record(
                    args,
                    simic::bench::SimicBenchRun {
                        device,
                        measurements,
                    },
                )?
            }
        }
        Workload::SimicLearning => {
            let mut options = simic::bench::SimicBenchOptions::new(args.device, args.quick);
            options.ppo_epochs = args.ppo_epochs;
            options.greedy_every = args.greedy_every;
            options.eval_environments = args.eval_environments;
            options.episode_length = args.episode;
            if let Some(seeds) = args.seeds {
                options.seeds = seeds;
            }
            if let Some(task) = args.task {
                options.learning_task = task;
            }
            let rounds = args.rounds.unwrap_or(if args.quick {
                2
            } else {
                simic::bench::LEARNING_ROUNDS
            });
            options.settings.clone_from(&args.settings);
            if args.blueprint_room {
                let setup = simic::bench::LearningSetup::new(&options, rounds)?;
                let run = setup.blueprint_room(&mut progress)?;
                let record = simic_record(args, run)?;
                record::write(&record, &args.out)?;
                println!("{}", table::render(args.workload, &record));
                eprintln!("wrote {}", args.out.display());
                return Ok(());
            }
            if let Some(seed_index) = args.seed_index {
                // A part of a `--jobs` run: no record, no picture.
                if args.evaluate {
                    return crate::learning_jobs::run_evaluation(
                        args,
                        &options,
                        rounds,
                        seed_index,
                        &mut progress,
                    );
                }
                return crate::learning_jobs::run_seed(
                    args,
                    &options,
                    rounds,
                    seed_index,
                    &mut progress,
                );
            }
            let run = match args.jobs {
                Some(jobs) if jobs > 1 || !args.only_seeds.is_empty() => {
                    use crate::learning_jobs::JobsOutcome;
                    match crate::learning_jobs::run_jobs(
                        args,
                        &options,
                        rounds,
                        jobs,
                        &mut progress,
                    )? {
                        JobsOutcome::Record(run) => run,
                        // --only-seeds left seeds unevaluated: the parts
                        // stay for a later run, and there is no record yet;
                        // the seeds evaluated so far are pooled beside them.
                        JobsOutcome::Partial(None) => return Ok(()),
                        JobsOutcome::Partial(Some((run, path))) => {
                            let record = simic_record(args, run)?;
                            record::write(&record, &path)?;
                            draw_learning_curves(&record, &path);
                            println!("{}", table::render(args.workload, &record));
                            eprintln!(
                                "wrote {} (the seeds evaluated so far; not the record)",
                                path.display()
                            );
                            return Ok(());
                        }
                    }
                }
                _ => simic::bench::run_learning(&options, rounds, &mut progress)?,
            };
            simic_record(args, run)?
        }
        Workload::PpoCartpole => {
            let options = simic::bench::SimicBenchOptions::new(args.device, args.quick);
            let run = simic::bench::run_cartpole(&options, &mut progress)?;
            simic_record(args, run)?
        }
    };
    record::write(&record, &args.out)?;
    if args.workload == Workload::SimicLearning {
        draw_learning_curves(&record, &args.out);
    }
    println!("{}", table::render(args.workload, &record));
    eprintln!("wrote {}", args.out.display());
    if args.workload == Workload::NissaEmit && record.results.iter().any(|e| e.error.is_some()) {
        bail!("drop accounting was not exact; see the record");
    }
    Ok(())
}

fn tolaria_reference(args: &BenchArgs, progress: &mut dyn FnMut(&str)) -> Result<BaselineRecord> {
    let mut options = tolaria::reference::bench::BenchOptions::new(args.device, args.quick);
    options.variants.clone_from(&args.variants);
    epoch_counts(
        args,
        &mut options.measured_epochs,
        &mut options.warmup_epochs,
    );
    let run = tolaria::reference::bench::run(&options, progress)?;
    let mut environment = probe::with_torch(run.device)?;
    environment.tf32 = run.tf32;
    environment.extra.insert(
        "torch_threads".to_owned(),
        serde_json::Value::from(tch::get_num_threads()),
    );
    record_of(args, environment, run.measurements)
}

fn tolaria_fmnist(args: &BenchArgs, progress: &mut dyn FnMut(&str)) -> Result<BaselineRecord> {
    let mut options = tolaria::engine::bench::FmnistOptions::new(args.device, args.quick);
    options.synthetic = args.synthetic;
    if let Some(steps) = args.epoch_graph_steps {
        options.epoch_graph_steps = steps;
    }
    epoch_counts(
        args,
        &mut options.measured_epochs,
        &mut options.warmup_epochs,
    );
    general_path_record(
        args,
        tolaria::engine::bench::run_fmnist(&options, progress)?,
    )
}

fn tolaria_lm(args: &BenchArgs, progress: &mut dyn FnMut(&str)) -> Result<BaselineRecord> {
    let mut options = tolaria::engine::bench::LmOptions::new(args.device, args.quick);
    options.synthetic = args.synthetic;
    if let Some(steps) = args.epoch_graph_steps {
        options.epoch_graph_steps = steps;
    }
    epoch_counts(
        args,
        &mut options.measured_epochs,
        &mut options.warmup_epochs,
    );
    general_path_record(args, tolaria::engine::bench::run_lm(&options, progress)?)
}

/// `--epochs` and `--warmup-epochs` over a workload's defaults.
fn epoch_counts(args: &BenchArgs, measured: &mut usize, warmup: &mut usize) {
    if let Some(epochs) = args.epochs {
        *measured = epochs;
    }
    if let Some(epochs) = args.warmup_epochs {
        *warmup = epochs;
    }
}

/// The record of a general-path benchmark (`tolaria-fmnist`,
/// `tolaria-lm`): TF32 on, AMP per mode.
fn general_path_record(
    args: &BenchArgs,
    run: tolaria::engine::bench::BenchRun,
) -> Result<BaselineRecord> {
    let mut environment = probe::with_torch(run.device)?;
    environment.tf32 = true;
    environment.amp = "bf16 and off (per mode)".to_owned();
    record_of(args, environment, run.measurements)
}

fn nissa_emit(args: &BenchArgs, progress: &mut dyn FnMut(&str)) -> Result<BaselineRecord> {
    // The hub reports its (deliberate) drops through tracing once every ten
    // seconds.
    nissa::init_subscriber("warn")?;
    let measurements =
        nissa::bench::run_emit(&nissa::bench::EmitParams::new(args.quick), progress)?;
    record_of(args, probe::host(), measurements)
}

fn kasmina_prefetch(args: &BenchArgs, progress: &mut dyn FnMut(&str)) -> Result<BaselineRecord> {
    let device = torch_ext::device::select(args.device)?;
    let params = kasmina::bench::PrefetchParams::new(args.quick);
    let measurements = kasmina::bench::run_prefetch(&params, device, progress)?;
    record_of(args, probe::with_torch(device)?, measurements)
}

/// Writes the record of a run still in progress: the entries so far, its
/// params saying so. A failure to write it is said, not fatal.
fn write_partial(
    args: &BenchArgs,
    device: tch::Device,
    results: &[leyline::baseline::ResultEntry],
) {
    let record = simic_record(
        args,
        simic::bench::SimicBenchRun {
            device,
            measurements: leyline::baseline::Measurements {
                params: serde_json::json!({
                    "partial": "written while the run was going on: the entries measured so far; \
                                the finished run's record replaces this one",
                    "quick": args.quick,
                }),
                results: results.to_vec(),
                telemetry_names: Vec::new(),
            },
        },
    )
    .and_then(|record| record::write(&record, &args.out));
    match record {
        Ok(()) => eprintln!("partial record: {}", args.out.display()),
        Err(error) => eprintln!("esper: the partial record was not written: {error:#}"),
    }
}

/// The learning curves beside a `simic-learning` record written to `out`;
/// a picture that cannot be drawn is said, the record stands.
fn draw_learning_curves(record: &BaselineRecord, out: &std::path::Path) {
    match crate::plot_learning::draw(record, out) {
        Ok((png, _)) => eprintln!("learning curves: {}", png.display()),
        Err(error) => eprintln!("esper: the learning curves were not drawn: {error:#}"),
    }
}

fn simic_record(args: &BenchArgs, run: simic::bench::SimicBenchRun) -> Result<BaselineRecord> {
    let mut environment = probe::with_torch(run.device)?;
    environment.tf32 = true;
    environment.amp = "per entry".to_owned();
    record_of(args, environment, run.measurements)
}

fn record_of(
    args: &BenchArgs,
    environment: Environment,
    measurements: leyline::baseline::Measurements,
) -> Result<BaselineRecord> {
    Ok(BaselineRecord::from_measurements(
        args.workload.name(),
        &args.label,
        environment,
        measurements,
    )?)
}
