//! Tasks: a data set wired to the host that matches it. The one place that
//! pairs `tolaria::data` with `kasmina::host`, used by `esper train`, the
//! simic workloads and any library user.
//!
//! | task | data | host |
//! |---|---|---|
//! | `fmnist` | Fashion-MNIST; the test set validates | CNN 8/16/32 (`CnnHostConfig::fashion_mnist`) |
//! | `fmnist-impaired` | as `fmnist` | CNN 4/8/16: fewer channels, room for seeds |
//! | `cifar10` | CIFAR-10 binary files; the test batch validates | the reference `cifar_baseline` CNN, 8/16/32 |
//! | `cifar10-impaired` | as `cifar10` | CNN 4/8/16: `cifar_baseline` with half the channels, room for seeds |
//! | `synthetic` | seeded Fashion-MNIST-shaped images, no files | CNN 8/16/32 |
//!
//! [`load`] returns the data on the CPU (a seeded subset of the training set
//! when asked); [`Task::host_config`] the host; [`build_model`] the host with
//! the run's slots enabled, its weights drawn from the seed.

use std::path::PathBuf;

use kasmina::host::{CnnHost, CnnHostConfig};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use tch::Device;

use crate::data::cifar10::{self, Cifar10Options};
use crate::data::fashion_mnist::{self, FashionMnistOptions};
use crate::data::synthetic::{self, ImageTaskOptions};
use crate::data::{Dataset, SplitSize};
use crate::error::{Error, Result};

/// Validation samples the synthetic task generates beside its training
/// samples.
pub const SYNTHETIC_VALIDATION_SAMPLES: usize = 1024;
/// Training samples of the synthetic task when none are asked for.
pub const DEFAULT_SYNTHETIC_TRAIN_SAMPLES: usize = 4096;

/// A task (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    /// Fashion-MNIST on the 8/16/32 CNN.
    Fmnist,
    /// Fashion-MNIST on a 4/8/16 CNN.
    FmnistImpaired,
    /// CIFAR-10 on the reference `cifar_baseline` CNN.
    Cifar10,
    /// CIFAR-10 on a 4/8/16 CNN.
    Cifar10Impaired,
    /// Seeded synthetic images on the 8/16/32 CNN.
    Synthetic,
}

impl Task {
    /// Every task, in the order of the module docs.
    pub const ALL: [Task; 5] = [
        Task::Fmnist,
        Task::FmnistImpaired,
        Task::Cifar10,
        Task::Cifar10Impaired,
        Task::Synthetic,
    ];

    /// The name on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            Task::Fmnist => "fmnist",
            Task::FmnistImpaired => "fmnist-impaired",
            Task::Cifar10 => "cifar10",
            Task::Cifar10Impaired => "cifar10-impaired",
            Task::Synthetic => "synthetic",
        }
    }

    /// Parses [`Task::name`].
    pub fn from_name(name: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|task| task.name() == name)
    }

    /// Whether the task reads CIFAR-10's files.
    pub fn is_cifar10(self) -> bool {
        matches!(self, Task::Cifar10 | Task::Cifar10Impaired)
    }

    /// The host that matches the task's data.
    pub fn host_config(self) -> CnnHostConfig {
        match self {
            Task::Fmnist | Task::Synthetic => CnnHostConfig::fashion_mnist(),
            Task::FmnistImpaired => CnnHostConfig {
                base_channels: 4,
                ..CnnHostConfig::fashion_mnist()
            },
            Task::Cifar10 => CnnHostConfig::cifar_baseline(),
            Task::Cifar10Impaired => CnnHostConfig {
                base_channels: 4,
                ..CnnHostConfig::cifar_baseline()
            },
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a task's data is loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskOptions {
    /// The data set's folder; `None` takes the data layer's default (the
    /// Debian package's folder for Fashion-MNIST, `ESPER_CIFAR10_DIR` for
    /// CIFAR-10).
    pub data_dir: Option<PathBuf>,
    /// A seeded subset of this many training samples; 0 takes them all
    /// (for `synthetic`: [`DEFAULT_SYNTHETIC_TRAIN_SAMPLES`]).
    pub train_samples: usize,
    /// Seed of the subset and of the synthetic images.
    pub seed: u64,
}

/// A task's data, on the CPU (the trainer stages it on the device).
#[derive(Debug)]
pub struct TaskData {
    /// Training samples.
    pub train: Dataset,
    /// Validation samples (the test set of the real data sets).
    pub validation: Dataset,
}

/// Loads the data of `task` (see [`TaskOptions`]). A missing data set is the
/// data layer's error ([`Error::Data`]), which says how to get it; a subset
/// larger than the training set is [`Error::InvalidConfig`].
pub fn load(task: Task, options: &TaskOptions) -> Result<TaskData> {
    let (train, validation) = match task {
        Task::Fmnist | Task::FmnistImpaired => {
            let load = match &options.data_dir {
                Some(dir) => FashionMnistOptions::from_dir(dir),
                None => FashionMnistOptions::default(),
            };
            fashion_mnist::load(load)?
        }
        Task::Cifar10 | Task::Cifar10Impaired => {
            let load = match &options.data_dir {
                Some(dir) => Cifar10Options::from_dir(dir),
                None => Cifar10Options::default(),
            };
            cifar10::load(load)?
        }
        Task::Synthetic => {
            let train_len = match options.train_samples {
                0 => DEFAULT_SYNTHETIC_TRAIN_SAMPLES,
                samples => samples,
            };
            let total = train_len
                .checked_add(SYNTHETIC_VALIDATION_SAMPLES)
                .ok_or_else(|| Error::InvalidConfig {
                    field: "train_samples",
                    reason: format!("{train_len} is too large"),
                })?;
            let all = synthetic::image_task(&ImageTaskOptions::fashion_like(total, options.seed))?;
            let (train, validation) = all.split(SplitSize::Count(train_len), None)?;
            return Ok(TaskData { train, validation });
        }
    };
    let train = match options.train_samples {
        0 => train,
        samples if samples <= train.len() => train.shuffled(options.seed)?.slice(0, samples)?,
        samples => {
            return Err(Error::InvalidConfig {
                field: "train_samples",
                reason: format!(
                    "{samples} is more than the {} samples of {} (0 trains on all)",
                    train.len(),
                    train.name()
                ),
            });
        }
    };
    Ok(TaskData { train, validation })
}

/// The host of `task` on `device`, its weights drawn after seeding libtorch
/// with `seed`, with the slots `slots` enabled.
pub fn build_model(
    task: Task,
    slots: &[&str],
    seed: u64,
    device: Device,
    telemetry: Telemetry,
) -> Result<MorphogeneticModel> {
    tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
    let host = CnnHost::new(task.host_config(), device).map_err(|source| Error::Lifecycle {
        op: "build the task's host",
        source,
    })?;
    MorphogeneticModel::with_slot_names(host, slots, SlotConfig::default(), telemetry).map_err(
        |source| Error::Lifecycle {
            op: "enable the task's slots",
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_impaired_hosts_have_half_the_channels() {
        for task in Task::ALL {
            assert_eq!(Task::from_name(task.name()), Some(task));
        }
        assert_eq!(Task::from_name("mnist"), None);
        assert_eq!(Task::Cifar10Impaired.host_config().base_channels, 4);
        assert_eq!(Task::Cifar10.host_config().base_channels, 8);
        assert_eq!(Task::Cifar10Impaired.host_config().in_channels, 3);
        assert_eq!(Task::FmnistImpaired.host_config().in_channels, 1);
        let full = Task::Cifar10.host_config().validate().unwrap();
        let impaired = Task::Cifar10Impaired.host_config().validate().unwrap();
        assert!(impaired * 3 < full, "{impaired} vs {full} parameters");
    }

    #[test]
    fn the_synthetic_task_loads_seeded_and_refuses_an_oversized_subset() {
        let options = TaskOptions {
            train_samples: 64,
            seed: 3,
            ..TaskOptions::default()
        };
        let data = load(Task::Synthetic, &options).unwrap();
        assert_eq!(data.train.len(), 64);
        assert_eq!(data.validation.len(), SYNTHETIC_VALIDATION_SAMPLES);
        let again = load(Task::Synthetic, &options).unwrap();
        assert!(data.train.images().equal(again.train.images()));
        let missing = TaskOptions {
            data_dir: Some(PathBuf::from("/nonexistent/esper-task-test")),
            ..TaskOptions::default()
        };
        assert!(matches!(
            load(Task::Cifar10Impaired, &missing),
            Err(Error::Data(_))
        ));
    }
}
