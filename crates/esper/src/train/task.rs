//! The task of a run: its training and validation data (from
//! `tolaria::data`) and the host that matches them (from `kasmina::host`),
//! wrapped with the run's seed slots.
//!
//! | task | data | host |
//! |---|---|---|
//! | `fmnist` | Fashion-MNIST, a seeded subset of the train set; the test set validates | CNN 8/16/32 |
//! | `fmnist-impaired` | as `fmnist` | CNN 4/8/16 (fewer channels, room for seeds) |
//! | `cifar10` | CIFAR-10 binary files (`--data-dir` or `ESPER_CIFAR10_DIR`) | the reference `cifar_baseline` CNN |
//! | `synthetic` | seeded Fashion-MNIST-shaped images, no files | CNN 8/16/32 |
//!
//! A data set that is missing says how to get it: the data layer's error is
//! passed on whole, under a line naming the task and the flag that picks
//! the folder.

use anyhow::{Context, Result};
use kasmina::host::{CnnHost, CnnHostConfig};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use tch::Device;
use tolaria::data::cifar10::{self, Cifar10Options};
use tolaria::data::fashion_mnist::{self, FashionMnistOptions};
use tolaria::data::synthetic::{self, ImageTaskOptions};
use tolaria::data::{Dataset, SplitSize};

use super::args::TaskKind;
use super::config::RunConfig;

/// Validation samples the synthetic task generates beside its training
/// samples.
pub(crate) const SYNTHETIC_VALIDATION_SAMPLES: usize = 1024;

/// A task's data, on the CPU (the trainer stages it on the device).
#[derive(Debug)]
pub(crate) struct TaskData {
    /// Training samples.
    pub(crate) train: Dataset,
    /// Validation samples (the test set of the real data sets).
    pub(crate) validation: Dataset,
}

/// Loads the data of `config.task`: a seeded subset of `train_samples` of
/// the training set when that is not 0 (an error when it exceeds the set).
pub(crate) fn load_data(config: &RunConfig) -> Result<TaskData> {
    let (train, validation) = match config.task {
        TaskKind::Fmnist | TaskKind::FmnistImpaired => {
            let options = match &config.data_dir {
                Some(dir) => FashionMnistOptions::from_dir(dir),
                None => FashionMnistOptions::default(),
            };
            fashion_mnist::load(options).context(
                "cannot load Fashion-MNIST for this task (--data-dir DIR picks another folder; \
                 on Debian, `apt-get install dataset-fashion-mnist` installs the data set)",
            )?
        }
        TaskKind::Cifar10 => {
            let options = match &config.data_dir {
                Some(dir) => Cifar10Options::from_dir(dir),
                None => Cifar10Options::default(),
            };
            cifar10::load(options).context(
                "cannot load CIFAR-10 for --task cifar10 (--data-dir DIR names the folder of \
                 its binary files)",
            )?
        }
        TaskKind::Synthetic => {
            let train_len = match config.train_samples {
                0 => super::config::DEFAULT_SYNTHETIC_TRAIN_SAMPLES,
                samples => samples,
            };
            let total = train_len
                .checked_add(SYNTHETIC_VALIDATION_SAMPLES)
                .context("train_samples is too large")?;
            let all = synthetic::image_task(&ImageTaskOptions::fashion_like(total, config.seed))
                .context("generating the synthetic task")?;
            let (train, validation) = all
                .split(SplitSize::Count(train_len), None)
                .context("splitting the synthetic task")?;
            return Ok(TaskData { train, validation });
        }
    };
    let train = match config.train_samples {
        0 => train,
        samples if samples <= train.len() => train
            .shuffled(config.seed)
            .and_then(|shuffled| shuffled.slice(0, samples))
            .context("taking the training subset")?,
        samples => anyhow::bail!(
            "train_samples {samples} is more than the {} samples of {} (0 trains on all)",
            train.len(),
            train.name()
        ),
    };
    Ok(TaskData { train, validation })
}

/// The host configuration of `task`.
pub(crate) fn host_config(task: TaskKind) -> CnnHostConfig {
    match task {
        TaskKind::Fmnist | TaskKind::Synthetic => CnnHostConfig::fashion_mnist(),
        TaskKind::FmnistImpaired => CnnHostConfig {
            base_channels: 4,
            ..CnnHostConfig::fashion_mnist()
        },
        TaskKind::Cifar10 => CnnHostConfig::cifar_baseline(),
    }
}

/// The host of `config.task` on `device` (weights from `config.seed`) with
/// `config.slots` enabled.
pub(crate) fn build_model(
    config: &RunConfig,
    device: Device,
    telemetry: Telemetry,
) -> Result<MorphogeneticModel> {
    tch::manual_seed(i64::from_ne_bytes(config.seed.to_ne_bytes()));
    let host = CnnHost::new(host_config(config.task), device).context("building the host")?;
    let slots: Vec<&str> = config.slots.iter().map(String::as_str).collect();
    MorphogeneticModel::with_slot_names(host, &slots, SlotConfig::default(), telemetry)
        .context("enabling the seed slots")
}
