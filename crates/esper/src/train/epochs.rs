//! The epochs of a heuristic or baseline run ([`run_epochs`]): the run's
//! files cut back when resuming, the hub, the epoch loop with its
//! checkpoints, and the closing summary.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nissa::Hub;
use tolaria::engine::trainer::epoch_seed;

use super::config::RunConfig;
use super::epoch_log::{EpochLog, EpochRecord};
use super::interrupt::Interrupt;
use super::progress::{self, Progress};
use super::task::TaskData;
use super::{
    Built, CONFIG_NAME, Finished, Restored, TELEMETRY_DIR, checkpoint, close_hub, epoch_log,
    start_hub,
};

/// Cuts the run's files back to `restored` (when resuming), starts the
/// hub, trains, and draws the picture.
pub(super) fn run_epochs(
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
