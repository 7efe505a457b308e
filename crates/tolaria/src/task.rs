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
//! | `lm-fortunes` | Debian's `fortunes` corpus as byte tokens, windows of 64 ([`crate::data::text`]); a tenth of the documents validates | GPT-style transformer ([`Task::lm_host_config`]), a slot after each of 3 segments |
//! | `lm-synthetic` | a seeded synthetic text of the same shape, no files | the same transformer |
//!
//! [`load`] returns the data on the CPU (a seeded subset of the training set
//! when asked); [`Task::host`] the host; [`build_model`] the host with
//! the run's slots enabled, its weights drawn from the seed. The language
//! model tasks train next-token prediction: loss and accuracy are per token,
//! and the perplexity is the exponential of the validation loss.

use std::path::PathBuf;

use kasmina::host::{CnnHost, CnnHostConfig, TransformerHost, TransformerHostConfig};
use kasmina::lifecycle::SlotConfig;
use kasmina::model::MorphogeneticModel;
use leyline::Telemetry;
use tch::Device;

use crate::data::cifar10::{self, Cifar10Options};
use crate::data::fashion_mnist::{self, FashionMnistOptions};
use crate::data::synthetic::{self, ImageTaskOptions};
use crate::data::text::{self, TextOptions};
use crate::data::{Dataset, SplitSize};
use crate::error::{Error, Result};
use crate::optim::{AdamWConfig, GroupOptimizerConfig, OptimizerConfig};

/// Validation samples the synthetic task generates beside its training
/// samples.
pub const SYNTHETIC_VALIDATION_SAMPLES: usize = 1024;
/// Training samples of the synthetic task when none are asked for.
pub const DEFAULT_SYNTHETIC_TRAIN_SAMPLES: usize = 4096;
/// Tokens per window of the language-model tasks (the host's block size).
pub const LM_CONTEXT: usize = 64;
/// Validation windows of `lm-synthetic`.
pub const LM_SYNTHETIC_VALIDATION_WINDOWS: usize = 256;
/// Training windows of `lm-synthetic` when none are asked for.
pub const DEFAULT_LM_SYNTHETIC_TRAIN_WINDOWS: usize = 2048;

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
    /// A causal language model on Debian's `fortunes` corpus (byte tokens)
    /// on the transformer host.
    LmFortunes,
    /// A causal language model on a seeded synthetic text on the
    /// transformer host.
    LmSynthetic,
}

/// The host a task trains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskHost {
    /// A CNN (the image tasks).
    Cnn(CnnHostConfig),
    /// A GPT-style transformer (the language-model tasks).
    Transformer(TransformerHostConfig),
}

/// Learning rate of the language-model tasks: AdamW's default.
pub const LM_LEARNING_RATE: f64 = 1e-3;

/// Training batch of the language-model tasks' benchmarks and PPO
/// environments, in windows of [`LM_CONTEXT`] tokens (8,192 tokens).
pub const LM_BATCH: usize = 128;

impl From<CnnHostConfig> for TaskHost {
    fn from(config: CnnHostConfig) -> TaskHost {
        TaskHost::Cnn(config)
    }
}

impl From<TransformerHostConfig> for TaskHost {
    fn from(config: TransformerHostConfig) -> TaskHost {
        TaskHost::Transformer(config)
    }
}

impl TaskHost {
    /// The host's topology (which blueprints its slots take).
    pub fn topology(&self) -> kasmina::host::Topology {
        match self {
            TaskHost::Cnn(_) => kasmina::host::Topology::Cnn,
            TaskHost::Transformer(_) => kasmina::host::Topology::Transformer,
        }
    }

    /// A fresh host of this shape on `device` (weights from tch's global
    /// generator) with the named `slots` enabled under `slot`'s lifecycle
    /// settings.
    ///
    /// # Errors
    /// [`Error::Lifecycle`] for a shape the host refuses or a slot it lacks.
    pub fn model(
        &self,
        slots: &[&str],
        slot: SlotConfig,
        device: Device,
        telemetry: Telemetry,
    ) -> Result<MorphogeneticModel> {
        let host_error = |source| Error::Lifecycle {
            op: "build the task's host",
            source,
        };
        let slots_error = |source| Error::Lifecycle {
            op: "enable the task's slots",
            source,
        };
        match self {
            TaskHost::Cnn(config) => {
                let host = CnnHost::new(config.clone(), device).map_err(host_error)?;
                MorphogeneticModel::with_slot_names(host, slots, slot, telemetry)
                    .map_err(slots_error)
            }
            TaskHost::Transformer(config) => {
                let host = TransformerHost::new(config.clone(), device).map_err(host_error)?;
                MorphogeneticModel::with_slot_names(host, slots, slot, telemetry)
                    .map_err(slots_error)
            }
        }
    }
}

impl Task {
    /// Every task, in the order of the module docs.
    pub const ALL: [Task; 7] = [
        Task::Fmnist,
        Task::FmnistImpaired,
        Task::Cifar10,
        Task::Cifar10Impaired,
        Task::Synthetic,
        Task::LmFortunes,
        Task::LmSynthetic,
    ];

    /// The name on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            Task::Fmnist => "fmnist",
            Task::FmnistImpaired => "fmnist-impaired",
            Task::Cifar10 => "cifar10",
            Task::Cifar10Impaired => "cifar10-impaired",
            Task::Synthetic => "synthetic",
            Task::LmFortunes => "lm-fortunes",
            Task::LmSynthetic => "lm-synthetic",
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

    /// Whether the task trains a language model (token windows with a
    /// target per position, the transformer host).
    pub fn is_language_model(self) -> bool {
        matches!(self, Task::LmFortunes | Task::LmSynthetic)
    }

    /// The transformer of the language-model tasks: byte tokens (256),
    /// width 128, 4 heads, 3 layers in 3 segments (a slot after each),
    /// block [`LM_CONTEXT`]; about 0.63 M parameters.
    pub fn lm_host_config() -> TransformerHostConfig {
        TransformerHostConfig {
            vocab_size: text::VOCABULARY as i64,
            n_embd: 128,
            n_head: 4,
            n_layer: 3,
            block_size: LM_CONTEXT as i64,
            num_segments: 3,
        }
    }

    /// The optimizer of the host's and every seed's group at
    /// `learning_rate`: AdamW (PyTorch's other defaults) on the
    /// language-model tasks, where a transformer learns far faster with it
    /// than with SGD; SGD with `momentum` on the image tasks.
    pub fn optimizer(self, learning_rate: f64, momentum: f64) -> OptimizerConfig {
        let group = if self.is_language_model() {
            GroupOptimizerConfig::AdamW(AdamWConfig {
                learning_rate,
                ..AdamWConfig::default()
            })
        } else {
            GroupOptimizerConfig::sgd(learning_rate, momentum)
        };
        OptimizerConfig {
            host: group,
            seed: group,
        }
    }

    /// The host that matches the task's data.
    pub fn host(self) -> TaskHost {
        match self.host_config() {
            Ok(cnn) => TaskHost::Cnn(cnn),
            Err(_) => TaskHost::Transformer(Task::lm_host_config()),
        }
    }

    /// The CNN host of an image task.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a language-model task, whose host is a
    /// transformer ([`Task::host`]).
    pub fn host_config(self) -> Result<CnnHostConfig> {
        Ok(match self {
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
            Task::LmFortunes | Task::LmSynthetic => {
                return Err(Error::InvalidConfig {
                    field: "task",
                    reason: format!(
                        "{} trains a transformer host, not a CNN (Task::host)",
                        self.name()
                    ),
                });
            }
        })
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
    /// Seed of the subset, of the synthetic images and text, and of the
    /// language-model tasks' document split.
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
            return generated(
                options.train_samples,
                (
                    DEFAULT_SYNTHETIC_TRAIN_SAMPLES,
                    SYNTHETIC_VALIDATION_SAMPLES,
                ),
                |total| synthetic::image_task(&ImageTaskOptions::fashion_like(total, options.seed)),
            );
        }
        Task::LmFortunes => text::load(&TextOptions {
            dir: options.data_dir.clone(),
            context: LM_CONTEXT,
            seed: options.seed,
            ..TextOptions::default()
        })?,
        Task::LmSynthetic => {
            return generated(
                options.train_samples,
                (
                    DEFAULT_LM_SYNTHETIC_TRAIN_WINDOWS,
                    LM_SYNTHETIC_VALIDATION_WINDOWS,
                ),
                |total| text::synthetic(total, LM_CONTEXT, text::VOCABULARY, options.seed),
            );
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

/// A generated task's data: `train_samples` (or `defaults.0` for 0)
/// training samples and `defaults.1` validation samples, from one call of
/// `generate` for their sum, split in that order.
fn generated(
    train_samples: usize,
    defaults: (usize, usize),
    generate: impl FnOnce(usize) -> crate::data::Result<Dataset>,
) -> Result<TaskData> {
    let train_len = match train_samples {
        0 => defaults.0,
        samples => samples,
    };
    let total = train_len
        .checked_add(defaults.1)
        .ok_or_else(|| Error::InvalidConfig {
            field: "train_samples",
            reason: format!("{train_len} is too large"),
        })?;
    let (train, validation) = generate(total)?.split(SplitSize::Count(train_len), None)?;
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
    task.host()
        .model(slots, SlotConfig::default(), device, telemetry)
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
        assert_eq!(
            Task::Cifar10Impaired.host_config().unwrap().base_channels,
            4
        );
        assert_eq!(Task::Cifar10.host_config().unwrap().base_channels, 8);
        assert_eq!(Task::Cifar10Impaired.host_config().unwrap().in_channels, 3);
        assert_eq!(Task::FmnistImpaired.host_config().unwrap().in_channels, 1);
        let full = Task::Cifar10.host_config().unwrap().validate().unwrap();
        let impaired = Task::Cifar10Impaired
            .host_config()
            .unwrap()
            .validate()
            .unwrap();
        assert!(impaired * 3 < full, "{impaired} vs {full} parameters");
        for task in Task::ALL {
            assert_eq!(
                task.is_language_model(),
                task.host_config().is_err(),
                "{task}"
            );
        }
        assert!(matches!(
            Task::LmFortunes.host(),
            TaskHost::Transformer(config) if config.vocab_size == 256
        ));
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
        assert!(matches!(
            load(Task::LmFortunes, &missing),
            Err(Error::Data(_))
        ));
    }

    #[test]
    fn the_synthetic_text_task_builds_a_transformer_that_reads_its_windows() {
        let options = TaskOptions {
            train_samples: 32,
            seed: 4,
            ..TaskOptions::default()
        };
        let data = load(Task::LmSynthetic, &options).unwrap();
        assert_eq!(data.train.images().size(), [32, LM_CONTEXT as i64]);
        assert_eq!(data.validation.len(), LM_SYNTHETIC_VALIDATION_WINDOWS);
        assert!(data.train.is_sequences());
        let model = build_model(
            Task::LmSynthetic,
            &["r0c1", "r0c2"],
            1,
            Device::Cpu,
            Telemetry::disabled(),
        )
        .unwrap();
        let logits = model
            .forward(&data.train.images().narrow(0, 0, 2), false)
            .unwrap();
        assert_eq!(logits.size(), [2, LM_CONTEXT as i64, 256]);
    }
}
