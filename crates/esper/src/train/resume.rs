//! `esper train --resume RUN_DIR` of a heuristic run ([`resume`]): the
//! newest checkpoint that verifies and restores, as the [`train`](super)
//! module docs describe.

use std::path::Path;

use anyhow::{Result, bail};

use super::args::ControllerKind;
use super::checkpoint::{self, TelemetryRewind};
use super::config::RunConfig;
use super::interrupt::Interrupt;
use super::task::{self, TaskData};
use super::{
    Finished, Restored, build, check_batches, check_metrics_port, epoch_log, print_start,
    run_epochs, select_device,
};

/// `esper train --resume RUN_DIR` of a heuristic run: the newest checkpoint
/// that verifies and restores (see the module docs).
pub(super) fn resume(dir: &Path) -> Result<Finished> {
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
