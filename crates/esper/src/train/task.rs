//! The task of a run: tolaria's task (`tolaria::task`: the data set and the
//! host that matches it, the one place that pairs them) chosen by
//! `--task`, loaded with the run's data folder, subset and seed, and built
//! with the run's seed slots. The table of tasks is in `tolaria::task`'s
//! docs and the README.
//!
//! A data set that is missing says how to get it: the data layer's error is
//! passed on whole, under a line naming the task and the flag that picks
//! the folder.

use anyhow::{Context, Result};
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use tch::Device;
pub(crate) use tolaria::task::TaskData;
use tolaria::task::TaskOptions;

use super::args::TaskKind;
use super::config::RunConfig;

/// Loads the data of `config.task`: a seeded subset of `train_samples` of
/// the training set when that is not 0 (an error when it exceeds the set).
pub(crate) fn load_data(config: &RunConfig) -> Result<TaskData> {
    let task = config.task.task();
    let options = TaskOptions {
        data_dir: config.data_dir.clone(),
        train_samples: config.train_samples,
        seed: config.seed,
    };
    tolaria::task::load(task, &options).with_context(|| match config.task {
        TaskKind::Fmnist | TaskKind::FmnistImpaired => format!(
            "cannot load Fashion-MNIST for --task {task} (--data-dir DIR picks another folder; \
             on Debian, `apt-get install dataset-fashion-mnist` installs the data set)"
        ),
        TaskKind::Cifar10 | TaskKind::Cifar10Impaired => format!(
            "cannot load CIFAR-10 for --task {task} (--data-dir DIR names the folder of its \
             binary files)"
        ),
        TaskKind::Synthetic | TaskKind::LmSynthetic => {
            format!("cannot generate the data of --task {task}")
        }
        TaskKind::LmFortunes => format!(
            "cannot load the text corpus for --task {task} (--data-dir DIR picks another folder; \
             on Debian, `apt-get install fortunes` installs it)"
        ),
    })
}

/// The host of `config.task` on `device` (weights from `config.seed`) with
/// `config.slots` enabled.
pub(crate) fn build_model(
    config: &RunConfig,
    device: Device,
    telemetry: Telemetry,
) -> Result<MorphogeneticModel> {
    let slots: Vec<&str> = config.slots.iter().map(String::as_str).collect();
    tolaria::task::build_model(config.task.task(), &slots, config.seed, device, telemetry)
        .context("building the task's host with its seed slots")
}
