//! Simic's benchmark workloads (DESIGN.md §6), measured here and turned into
//! records by `esper bench`: figures only, no machine probing, no files
//! written.
//!
//! - `simic-throughput`: vectorized PPO on Fashion-MNIST, 4 environments ×
//!   3 slots (r0c0 r0c1 r0c2), max 3 seeds, episode length 150 (the
//!   reference's HEAD; `--episode short` or `medium` for 25 or 50), each
//!   environment-epoch on its quarter of the 60,000 training samples (batch
//!   512), validation with the counterfactual configurations on the 10,000
//!   test samples; the learned policy acting and learning.
//! - `simic-cifar`: the same on CIFAR-10 (the fake CIFAR-10 at real size on
//!   the GPU machine) with the reference `cifar_baseline` host.
//! - `simic-learning`: PPO rounds on Fashion-MNIST with an impaired host
//!   (channels 4/8/16), per round the mean episode reward and the final
//!   accuracies, beside the heuristic controller and the host grown by
//!   nobody on the same data and seeds.
//! - `ppo-cartpole`: the same PPO update on CartPole-v1, 500k steps.
//!
//! `simic-throughput` and `simic-cifar` end with a `max-growth-ceiling`
//! entry, and `simic-learning` compares against it too: the active seeds a
//! controller that grows as fast as the masks allow keeps
//! ([`tamiyo::growth::MaxGrowthController`]), the most any policy can.
//!
//! Every variant is one result entry; eps counts environment-epochs over
//! the whole run's wall time, PPO updates and the first round's captures
//! included (reference §4.8), and `eps_steady` the rounds after the first.
//! On CUDA one short unmeasured round first pays what a process pays once
//! (run-time kernel compiles, CUDA modules, library handles), so that it
//! falls on no variant in particular (`process_warmup_s` in the params);
//! the first variant also reports `eps_with_process_warmup`, its eps with
//! those seconds counted (the whole process, cold).

use std::path::PathBuf;

use leyline::baseline::Measurements;
use tch::Device;
use tolaria::ExecutionMode;
use tolaria::amp::Precision;
use tolaria::data::Dataset;
use tolaria::engine::trainer::ModelTrainerConfig;
use torch_ext::DeviceChoice;

use crate::vectorized::{Episode, SimicConfig};
use crate::{Error, Result};

mod baseline;
mod cartpole;
mod learned;
mod learning;
pub mod scaling;
pub mod stats;
mod throughput;

pub use cartpole::run_cartpole;
pub use learned::LearnedPolicy;
pub use learning::{
    AfterRound, Baselines, EVAL_ENV_SEED, EVAL_ROUNDS, Evaluation, GREEDY_CURVE_ENV_SEED,
    GREEDY_CURVE_ROUNDS, LEARNING_PPO_EPOCHS, LEARNING_ROUNDS, LEARNING_SEEDS, LearningSetup,
    SELECTED_PREFIX, SeedOutcome, Selected, Trained, room_blueprints, run_learning, training_seed,
};
pub use throughput::{run_throughput, run_throughput_reporting};

/// Workload names.
pub const THROUGHPUT_WORKLOAD: &str = "simic-throughput";
/// Workload names.
pub const CIFAR_WORKLOAD: &str = "simic-cifar";
/// Workload names.
pub const LM_WORKLOAD: &str = "simic-lm";
/// The `simic-growth` workload: the `simic-cifar` environments driven by
/// the max-growth controller ([`Driver::MaxGrowth`]), where seeds live.
pub const GROWTH_WORKLOAD: &str = "simic-growth";

/// Who takes the environments' actions in a throughput workload.
#[derive(Debug, Clone, Default)]
pub enum Driver {
    /// The policy, learning every round (`simic-throughput`, `simic-cifar`,
    /// `simic-lm`).
    #[default]
    Policy,
    /// Tamiyo's max-growth controller in every environment
    /// ([`crate::vectorized::Simic::drive_round`]): seeds grow as fast as
    /// the masks and gates allow; the policy still steps every epoch, and
    /// nothing learns (`simic-growth`).
    MaxGrowth,
    /// A trained policy, acting greedily and learning nothing, on the
    /// environments max growth's rounds of the same run would use
    /// (`simic-growth --policy`; [`LearnedPolicy`]).
    Learned(std::rc::Rc<LearnedPolicy>),
}

impl Driver {
    /// Whether a scripted controller or a trained policy drives (the
    /// growth figures apply), rather than the policy learning every round.
    pub fn drives(&self) -> bool {
        !matches!(self, Driver::Policy)
    }

    /// The record's description of the driver.
    pub fn describe(&self) -> String {
        match self {
            Driver::Policy => "policy (learning every round)".to_owned(),
            Driver::MaxGrowth => "max-growth (every environment; the policy steps, nothing \
                                  learns: update_ms is the bootstrap alone)"
                .to_owned(),
            Driver::Learned(policy) => format!(
                "learned (a trained policy acting greedily in every environment on max \
                 growth's environments, nothing learns): {}",
                policy.describe()
            ),
        }
    }
}
/// Workload names.
pub const LEARNING_WORKLOAD: &str = "simic-learning";
/// Workload names.
pub const CARTPOLE_WORKLOAD: &str = "ppo-cartpole";

/// The slots of every simic workload.
pub const SLOTS: [&str; 3] = ["r0c0", "r0c1", "r0c2"];

/// Which data a throughput run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThroughputTask {
    /// Fashion-MNIST (`simic-throughput`).
    FashionMnist,
    /// CIFAR-10 binary files (`simic-cifar`).
    Cifar10,
    /// The language-model task on the fortunes corpus (`simic-lm`): the
    /// transformer host and its blueprints.
    LanguageModel,
}

impl ThroughputTask {
    /// Tolaria's task (data set and host) of the workload.
    pub fn task(self) -> tolaria::task::Task {
        match self {
            ThroughputTask::FashionMnist => tolaria::task::Task::Fmnist,
            ThroughputTask::Cifar10 => tolaria::task::Task::Cifar10,
            ThroughputTask::LanguageModel => tolaria::task::Task::LmFortunes,
        }
    }

    /// The record's workload name.
    pub fn workload(self) -> &'static str {
        match self {
            ThroughputTask::FashionMnist => THROUGHPUT_WORKLOAD,
            ThroughputTask::Cifar10 => CIFAR_WORKLOAD,
            ThroughputTask::LanguageModel => LM_WORKLOAD,
        }
    }
}

/// Options of the simic workloads.
#[derive(Debug, Clone)]
pub struct SimicBenchOptions {
    /// Device.
    pub device: DeviceChoice,
    /// A short run (CI, CPU): small data subsets, short episodes.
    pub quick: bool,
    /// Folder of the data set (`None`: the loaders' defaults).
    pub data_dir: Option<PathBuf>,
    /// Rounds per variant.
    pub rounds: usize,
    /// Variants to run by name (`{fp32,bf16,fp16}-graph-step`,
    /// `{fp32,bf16}-eager`, each optionally with,
    /// in this order, `-fp32-policy`: the policy in fp32; `-w<N>`: N
    /// eager warm-up steps before a capture instead of one (`-w0`: none); `-bench`: cuDNN times
    /// its algorithms per new shape; `-no-prewarm`: no blueprint warm-up
    /// before the first round); empty: the defaults for the device (fp32
    /// graph-step, bf16 graph-step with and without an fp32
    /// policy on CUDA; fp32 eager on the CPU).
    pub variants: Vec<String>,
    /// `simic-learning` only: passes over each round's rollout per PPO
    /// update (the reference's `recurrent_n_epochs`, whose default is 1;
    /// `None`: [`learning::LEARNING_PPO_EPOCHS`], 4). The KL early stop
    /// still ends an update early.
    pub ppo_epochs: Option<usize>,
    /// `simic-learning` only: every this many training rounds (and after
    /// the last), the policy is also evaluated greedily on
    /// [`learning::GREEDY_CURVE_ROUNDS`] rounds of environments of their own
    /// ([`learning::GREEDY_CURVE_ENV_SEED`]), and the round's entry of the
    /// learning curve gains the figures (`greedy_accuracy_pct`, ...): the
    /// greedy learning curve. The training trajectory is the same as
    /// without it. The state at the curve's best point
    /// ([`learning::Selected`]) is evaluated beside the final policy.
    /// `None`: no greedy curve.
    pub greedy_every: Option<usize>,
    /// `simic-learning` only: the shared evaluation environments the
    /// baselines and every learned policy are evaluated on, a multiple of
    /// 4 (one round of 4 environments each), at most
    /// [`MAX_EVAL_ENVIRONMENTS`]; `None`: 12 ([`learning::EVAL_ROUNDS`]
    /// rounds). More environments give the paired tests more pairs (with
    /// 12 the sign test needs 10 wins to reach p < 0.05).
    pub eval_environments: Option<usize>,
    /// Epochs per episode; `None`: [`Episode::Head`]'s 150 (5 in a quick
    /// run). [`Episode::parse_epochs`] reads the presets' names.
    pub episode_length: Option<u32>,
    /// `simic-learning` only: independent training seeds of the protocol
    /// ([`learning::LEARNING_SEEDS`], 1 when quick).
    pub seeds: usize,
    /// `simic-learning` only: the task (an impaired host, so seeds have
    /// room): `fmnist-impaired` (default) or `cifar10-impaired`.
    pub learning_task: tolaria::task::Task,
    /// `simic-learning` only: settings over the reference's defaults,
    /// `section.field=value`, applied in order
    /// ([`crate::vectorized::settings`]); empty: the defaults.
    pub settings: Vec<String>,
    /// The throughput workloads: who takes the actions ([`Driver`]).
    pub driver: Driver,
}

impl SimicBenchOptions {
    /// The episode length the workloads run: [`SimicBenchOptions::episode_length`],
    /// or 150 (5 when quick).
    pub fn episode(&self) -> u32 {
        self.episode_length.unwrap_or(if self.quick {
            5
        } else {
            Episode::Head.epochs()
        })
    }

    /// Defaults: 3 rounds (1 quick).
    pub fn new(device: DeviceChoice, quick: bool) -> SimicBenchOptions {
        SimicBenchOptions {
            device,
            quick,
            data_dir: None,
            rounds: if quick { 1 } else { 3 },
            variants: Vec::new(),
            ppo_epochs: None,
            greedy_every: None,
            eval_environments: None,
            episode_length: None,
            seeds: if quick { 1 } else { learning::LEARNING_SEEDS },
            learning_task: tolaria::task::Task::FmnistImpaired,
            settings: Vec::new(),
            driver: Driver::Policy,
        }
    }
}

/// Most training seeds of `simic-learning`.
pub const MAX_SEEDS: usize = 1_000;

/// Most rounds one variant of a workload runs.
pub const MAX_ROUNDS: usize = 100_000;

/// Most shared evaluation environments of `simic-learning`.
pub const MAX_EVAL_ENVIRONMENTS: usize = 400;

/// Checks a count of shared evaluation environments
/// ([`SimicBenchOptions::eval_environments`]): a multiple of 4 in
/// `[4, MAX_EVAL_ENVIRONMENTS]`; the error names the field.
pub fn check_eval_environments(environments: usize) -> Result<()> {
    if (4..=MAX_EVAL_ENVIRONMENTS).contains(&environments) && environments.is_multiple_of(4) {
        return Ok(());
    }
    Err(Error::InvalidConfig {
        field: "SimicBenchOptions.eval_environments",
        reason: format!(
            "{environments} is not a multiple of 4 in [4, {MAX_EVAL_ENVIRONMENTS}] (the \
             environments are evaluated 4 at a time)"
        ),
    })
}

impl SimicBenchOptions {
    /// Checks the counts before anything is loaded: `rounds` in
    /// `[1, MAX_ROUNDS]`, `ppo_epochs` (when set) in
    /// `[1, ppo::config::MAX_EPOCHS]`; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.episode_length == Some(0) {
            return Err(Error::InvalidConfig {
                field: "SimicBenchOptions.episode_length",
                reason: "0 epochs; an episode needs at least one".to_owned(),
            });
        }
        if !(1..=MAX_SEEDS).contains(&self.seeds) {
            return Err(Error::InvalidConfig {
                field: "SimicBenchOptions.seeds",
                reason: format!("{} is outside [1, {MAX_SEEDS}]", self.seeds),
            });
        }
        if !(1..=MAX_ROUNDS).contains(&self.rounds) {
            return Err(Error::InvalidConfig {
                field: "SimicBenchOptions.rounds",
                reason: format!("{} is outside [1, {MAX_ROUNDS}]", self.rounds),
            });
        }
        if let Some(every) = self.greedy_every
            && !(1..=MAX_ROUNDS).contains(&every)
        {
            return Err(Error::InvalidConfig {
                field: "SimicBenchOptions.greedy_every",
                reason: format!("{every} is outside [1, {MAX_ROUNDS}]"),
            });
        }
        if let Some(environments) = self.eval_environments {
            check_eval_environments(environments)?;
        }
        if let Driver::Learned(policy) = &self.driver
            && policy.episode_length() != self.episode()
        {
            return Err(Error::InvalidConfig {
                field: "SimicBenchOptions.episode_length",
                reason: format!(
                    "{} epochs, but the policy was trained on episodes of {}: drive it on \
                     episodes of its own length",
                    self.episode(),
                    policy.episode_length()
                ),
            });
        }
        if let Some(epochs) = self.ppo_epochs {
            let max = crate::ppo::config::MAX_EPOCHS;
            if !(1..=max).contains(&epochs) {
                return Err(Error::InvalidConfig {
                    field: "SimicBenchOptions.ppo_epochs",
                    reason: format!("{epochs} is outside [1, {max}]"),
                });
            }
        }
        Ok(())
    }
}

/// What a workload run measured.
#[derive(Debug)]
pub struct SimicBenchRun {
    /// The device it ran on.
    pub device: Device,
    /// The figures.
    pub measurements: Measurements,
}

/// The training and test data of `task` (tolaria's task loader), cut to
/// small subsets in a quick run.
pub(crate) fn load(
    task: tolaria::task::Task,
    options: &SimicBenchOptions,
) -> Result<(Dataset, Dataset)> {
    let tolaria::task::TaskData {
        train,
        validation: test,
    } = tolaria::task::load(
        task,
        &tolaria::task::TaskOptions {
            data_dir: options.data_dir.clone(),
            ..tolaria::task::TaskOptions::default()
        },
    )?;
    if options.quick {
        let take = |data: &Dataset, n: usize| {
            data.slice(0, n.min(data.len()))
                .map_err(|error| Error::InvalidConfig {
                    field: "bench data",
                    reason: error.to_string(),
                })
        };
        return Ok((take(&train, 2048)?, take(&test, 512)?));
    }
    Ok((train, test))
}

fn variant(name: &str) -> Result<(Precision, ExecutionMode)> {
    Ok(match name {
        "bf16-graph-step" => (Precision::Bf16, ExecutionMode::GraphStep),
        "fp16-graph-step" => (Precision::Fp16, ExecutionMode::GraphStep),
        "fp32-graph-step" => (Precision::Fp32, ExecutionMode::GraphStep),
        "bf16-graph-epoch" | "fp32-graph-epoch" => {
            return Err(Error::InvalidConfig {
                field: "variants",
                reason: format!(
                    "`{name}` is not a simic variant: an environment's seeds change the step's \
                     shape every few epochs, so a whole-epoch graph is re-captured or falls \
                     back to eager steps (780 - 840 eager steps a round and half graph-step's \
                     eps when it was measured); use the graph-step variants"
                ),
            });
        }
        "bf16-eager" => (Precision::Bf16, ExecutionMode::Eager),
        "fp32-eager" => (Precision::Fp32, ExecutionMode::Eager),
        other => {
            return Err(Error::InvalidConfig {
                field: "variants",
                reason: format!(
                    "unknown variant `{other}` (bf16-graph-step, fp16-graph-step, \
                     fp32-graph-step, bf16-eager, fp32-eager)"
                ),
            });
        }
    })
}

/// The reference's configuration for `task` at `episode_length`, with
/// the environments' trainer in `precision` and `mode`: batch 512 (128
/// quick) on the image tasks; on the language-model tasks the task's
/// batch ([`tolaria::task::LM_BATCH`] windows, 32 quick) and optimizer
/// (AdamW).
pub(crate) fn simic_config(
    task: tolaria::task::Task,
    precision: Precision,
    mode: ExecutionMode,
    episode_length: u32,
    quick: bool,
) -> SimicConfig {
    let mut config = SimicConfig::reference(episode_length);
    config.trainer = ModelTrainerConfig {
        batch_size: if quick { 128 } else { 512 },
        mode,
        precision: Some(precision),
        ..config.trainer
    };
    if task.is_language_model() {
        config.trainer.batch_size = if quick { 32 } else { tolaria::task::LM_BATCH };
        config.trainer.optimizer = task.optimizer(tolaria::task::LM_LEARNING_RATE, 0.0);
    }
    config
}

pub(crate) fn amp_name(precision: Precision) -> &'static str {
    match precision {
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
        Precision::Fp32 => "off",
    }
}

pub(crate) fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0_usize), |(s, c), v| (s + v, c.saturating_add(1)));
    if count == 0 { 0.0 } else { sum / count as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_epoch_is_refused_as_a_simic_variant_with_the_reason() {
        for name in ["fp32-graph-epoch", "bf16-graph-epoch"] {
            let error = variant(name).expect_err(name).to_string();
            assert!(error.contains("change the step's shape"), "{error}");
        }
        assert!(variant("bf16-graph-step").is_ok());
        assert!(variant("fp32-eager").is_ok());
        let error = variant("int8-graph-step").expect_err("unknown").to_string();
        assert!(error.contains("unknown variant"), "{error}");
    }

    #[test]
    fn the_episode_defaults_to_the_reference_heads_150_and_5_when_quick() {
        let options = SimicBenchOptions::new(DeviceChoice::Cpu, false);
        assert_eq!(options.episode(), 150);
        assert_eq!(SimicBenchOptions::new(DeviceChoice::Cpu, true).episode(), 5);
        let short = SimicBenchOptions {
            episode_length: Some(25),
            ..options.clone()
        };
        assert_eq!(short.episode(), 25);
        let zero = SimicBenchOptions {
            episode_length: Some(0),
            ..options
        };
        assert!(zero.validate().is_err());
        // The evaluation environments come 4 at a time.
        for (environments, valid) in [(24, true), (4, true), (0, false), (10, false), (404, false)]
        {
            let options = SimicBenchOptions {
                eval_environments: Some(environments),
                ..short.clone()
            };
            assert_eq!(options.validate().is_ok(), valid, "{environments}");
        }
        assert_eq!(
            crate::vectorized::Episode::parse_epochs("medium").unwrap(),
            50
        );
        assert!(crate::vectorized::Episode::parse_epochs("0").is_err());
        assert!((crate::vectorized::Episode::active_seed_ceiling(150) - 2.74).abs() < 1e-12);
    }
}
