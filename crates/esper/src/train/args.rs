//! The `esper train` command line (clap): every key of the run
//! configuration as a flag, plus `--config FILE.toml` and `--resume`.
//!
//! Each flag is optional here: [`super::config::RunConfig::resolve`] lays the
//! flags over the configuration file and the file over the defaults, so a
//! flag given on the command line always wins.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

/// Who decides, once per epoch, which lifecycle operation to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ControllerKind {
    /// The reference's heuristic (`tamiyo::heuristic::HeuristicController`).
    Heuristic,
    /// Tamiyo's policy, trained with Simic's vectorized PPO: each round
    /// trains --envs hosts for --epochs epochs and makes one PPO update.
    Ppo,
    /// Baseline: WAIT every epoch, the host alone
    /// (`tamiyo::growth::NoGrowthController`).
    NoGrowth,
    /// Baseline, the ceiling: grows as fast as the masks and gates allow and
    /// never prunes (`tamiyo::growth::MaxGrowthController`).
    MaxGrowth,
    /// Baseline: germinates one seed, takes it to FOSSILIZED and holds
    /// (`tamiyo::growth::GerminateOnceController`).
    GerminateOnce,
}

impl ControllerKind {
    /// The command-line name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ControllerKind::Heuristic => "heuristic",
            ControllerKind::Ppo => "ppo",
            ControllerKind::NoGrowth => "no-growth",
            ControllerKind::MaxGrowth => "max-growth",
            ControllerKind::GerminateOnce => "germinate-once",
        }
    }
}

/// A named episode length (`simic::vectorized::Episode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum EpisodeChoice {
    /// 150 epochs, the reference HEAD's episode.
    Head,
    /// 50 epochs.
    Medium,
    /// 25 epochs, the older reference's.
    Short,
}

impl EpisodeChoice {
    /// Its epochs.
    pub(crate) fn epochs(self) -> usize {
        let preset = match self {
            EpisodeChoice::Head => simic::vectorized::Episode::Head,
            EpisodeChoice::Medium => simic::vectorized::Episode::Medium,
            EpisodeChoice::Short => simic::vectorized::Episode::Short,
        };
        preset.epochs() as usize
    }
}

/// What to train on, and the host that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum TaskKind {
    /// Fashion-MNIST with the CNN host of channels 8/16/32.
    Fmnist,
    /// Fashion-MNIST with an impaired CNN host (channels 4/8/16), so that
    /// seeds have something to add.
    FmnistImpaired,
    /// CIFAR-10 (binary format, from `--data-dir` or `ESPER_CIFAR10_DIR`)
    /// with the reference `cifar_baseline` host.
    Cifar10,
    /// CIFAR-10 with a capacity-starved host (`cifar_baseline` with channels
    /// 4/8/16), so that seeds have something to add.
    #[value(name = "cifar10-impaired")]
    #[serde(rename = "cifar10-impaired")]
    Cifar10Impaired,
    /// Seeded Fashion-MNIST-shaped images (no files; for smoke runs and
    /// tests).
    Synthetic,
    /// A causal language model on Debian's `fortunes` corpus (byte tokens,
    /// windows of 64) with the transformer host; the validation perplexity
    /// is in `epochs.jsonl`.
    LmFortunes,
    /// The same model on a seeded synthetic text (no files).
    LmSynthetic,
}

impl TaskKind {
    /// The command-line name (tolaria's).
    pub(crate) fn name(self) -> &'static str {
        self.task().name()
    }

    /// The task tolaria wires (data set and host).
    pub(crate) fn task(self) -> tolaria::task::Task {
        use tolaria::task::Task;
        match self {
            TaskKind::Fmnist => Task::Fmnist,
            TaskKind::FmnistImpaired => Task::FmnistImpaired,
            TaskKind::Cifar10 => Task::Cifar10,
            TaskKind::Cifar10Impaired => Task::Cifar10Impaired,
            TaskKind::Synthetic => Task::Synthetic,
            TaskKind::LmFortunes => Task::LmFortunes,
            TaskKind::LmSynthetic => Task::LmSynthetic,
        }
    }
}

/// Autocast precision of training and validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PrecisionChoice {
    /// bf16 on GPUs that support it, fp32 on the CPU.
    Auto,
    /// No autocast.
    Fp32,
    /// bf16 autocast (CUDA only).
    Bf16,
    /// fp16 autocast with the gradient scaler (CUDA only).
    Fp16,
}

/// The PPO policy's forward precision (`--controller ppo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PolicyPrecisionChoice {
    /// The reference's rule: bf16 autocast exactly when the environments
    /// train in bf16.
    Auto,
    /// fp32 (for a few environments the faster policy step).
    Fp32,
    /// bf16 autocast, fp32 outputs.
    Bf16,
}

/// The PPO reward (`--controller ppo`; simic's `RewardMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RewardChoice {
    /// Dense shaping: attribution, PBRS, rent, warnings, per-op shaping and
    /// the terminal bonus (the reference's default).
    Shaped,
    /// Terminal only: the committed accuracy less a parameter cost.
    Sparse,
    /// Sparse plus a penalty for pruning a young seed.
    Minimal,
    /// Shaped with the attribution in escrow: each step pays the change of
    /// the seed's credit, forfeited at the end unless fossilized.
    Escrow,
}

/// How each training step runs (tolaria's `ExecutionMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ModeChoice {
    /// The fastest mode that applies: graph-step on CUDA, eager on the CPU.
    Auto,
    /// Every op launched from the host (the fallback; the only mode on the
    /// CPU).
    Eager,
    /// One CUDA graph per step shape (CUDA only; a capture that fails runs
    /// that step eagerly).
    GraphStep,
    /// One CUDA graph per epoch (CUDA only).
    GraphEpoch,
}

impl ModeChoice {
    /// The execution mode on `device`: `Auto` is graph-step on CUDA (the
    /// fastest mode the general trainer has there; tolaria falls back to
    /// eager for a step whose capture fails) and eager on the CPU, where the
    /// graph modes do not apply.
    pub(crate) fn resolve(self, device: tch::Device) -> tolaria::ExecutionMode {
        use tolaria::ExecutionMode;
        match self {
            ModeChoice::Auto if device.is_cuda() => ExecutionMode::GraphStep,
            ModeChoice::Auto | ModeChoice::Eager => ExecutionMode::Eager,
            ModeChoice::GraphStep => ExecutionMode::GraphStep,
            ModeChoice::GraphEpoch => ExecutionMode::GraphEpoch,
        }
    }
}

/// `esper train`: trains a host on a task while a controller grows it.
#[derive(Debug, Clone, Default, PartialEq, Parser)]
#[command(
    name = "esper train",
    about = "Train a host network on a task while a controller germinates, blends and \
             fossilizes seeds in its slots.",
    after_help = "Every option can also be given in a TOML file (--config), with the same \
                  names (dashes or underscores); options on the command line override it. \
                  The run directory receives config.toml (the resolved configuration), \
                  epochs.jsonl (one line per epoch), telemetry/ (JSON lines), \
                  run.png / run.svg (the run picture) and checkpoints/<epoch>/ (safetensors \
                  and a JSON manifest; --resume RUN_DIR continues from the newest one). \
                  --controller ppo writes rounds.jsonl (one line per round) and \
                  policy.safetensors instead of epochs.jsonl, and checkpoints/round-<R>/. \
                  Every option is checked, the data loaded and the trainer built (or, for \
                  --resume, the checkpoint restored) before anything is written: a \
                  refused run leaves no run directory, and a refused resume leaves the run \
                  directory as it was. Ctrl-C finishes the current epoch, writes a \
                  checkpoint and everything else, and exits with status 130."
)]
pub(crate) struct TrainArgs {
    /// A TOML file with any of the options below (flags override it).
    #[arg(long, value_name = "FILE.toml")]
    pub(crate) config: Option<PathBuf>,
    /// Who decides the lifecycle operations: the reference's heuristic, or
    /// Tamiyo's policy trained with PPO (the options marked PPO apply)
    /// [default: heuristic].
    #[arg(long, value_enum)]
    pub(crate) controller: Option<ControllerKind>,
    /// Task and host [default: fmnist].
    #[arg(long, value_enum)]
    pub(crate) task: Option<TaskKind>,
    /// Comma-separated seed slots, e.g. r0c0,r0c1 [default: r0c1,r0c2].
    #[arg(long, value_delimiter = ',', value_name = "SLOTS")]
    pub(crate) slots: Option<Vec<String>>,
    /// Most seeds alive or fossilized at once [default: number of slots].
    #[arg(long, value_name = "N")]
    pub(crate) max_seeds: Option<usize>,
    /// Epochs to train, 1 to 100000 (for PPO: each episode's) [default: 50;
    /// with --controller ppo 150, the episode of the reference's HEAD].
    #[arg(long, value_name = "N")]
    pub(crate) epochs: Option<usize>,
    /// A named episode length instead of --epochs: head (150, the reference
    /// HEAD's), medium (50) or short (25, the older reference's).
    #[arg(long, value_enum, conflicts_with = "epochs")]
    pub(crate) episode: Option<EpisodeChoice>,
    /// Samples per training batch [default: 128].
    #[arg(long, value_name = "N")]
    pub(crate) batch_size: Option<usize>,
    /// SGD learning rate (momentum 0.9) of the host and of every seed; on the
    /// language-model tasks, AdamW's; finite, above 0 and at most 100
    /// [default: 0.003; 0.001 on the language-model tasks].
    #[arg(long, value_name = "LR")]
    pub(crate) learning_rate: Option<f64>,
    /// auto, cpu, cuda or cuda:N [default: auto].
    #[arg(long, value_name = "DEVICE")]
    pub(crate) device: Option<String>,
    /// Autocast precision [default: auto].
    #[arg(long, value_enum)]
    pub(crate) precision: Option<PrecisionChoice>,
    /// Seed of the weights, the shuffle and the train subset [default: 0].
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,
    /// Where the run's files go (default: `runs/<UTC timestamp>`).
    #[arg(long, value_name = "DIR")]
    pub(crate) run_dir: Option<PathBuf>,
    /// Train on a seeded random subset of this many samples (0: all)
    /// [default: 12000 for the Fashion-MNIST tasks, all for cifar10, 4096
    /// generated for synthetic].
    #[arg(long, value_name = "N")]
    pub(crate) train_samples: Option<usize>,
    /// Execution mode; auto is graph-step on CUDA (the fastest; a step whose
    /// capture fails runs eagerly) and eager on the CPU (the graph modes
    /// need CUDA); eager is the fallback to pick by hand [default: auto].
    #[arg(long, value_enum)]
    pub(crate) mode: Option<ModeChoice>,
    /// Folder of the data set files (Fashion-MNIST: the four .gz files;
    /// CIFAR-10: the .bin files) [default: ESPER_FASHION_MNIST_DIR or
    /// /usr/share/datasets/fashion-mnist; ESPER_CIFAR10_DIR].
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Write a checkpoint (RUN_DIR/checkpoints/EPOCH/) every N epochs; 0
    /// writes one only at the end and at a Ctrl-C [default: 5].
    #[arg(long, value_name = "N")]
    pub(crate) checkpoint_every: Option<usize>,
    /// PPO (--controller ppo): environments per round, each a whole
    /// host-training run of --epochs epochs; 1 to 256, and envs x epochs at
    /// most 1000000 [default: 4].
    #[arg(long, value_name = "N")]
    pub(crate) envs: Option<usize>,
    /// PPO (--controller ppo): rounds, one PPO update each, 1 to 100000
    /// [default: 10].
    #[arg(long, value_name = "N")]
    pub(crate) rounds: Option<usize>,
    /// PPO (--controller ppo): the policy's precision; auto follows the
    /// reference (bf16 exactly when the environments train in bf16); fp32
    /// is the faster policy step for a few environments [default: auto].
    #[arg(long, value_enum)]
    pub(crate) policy_precision: Option<PolicyPrecisionChoice>,
    /// PPO (--controller ppo): passes over each round's rollout per update
    /// (the reference's recurrent_n_epochs); the KL early stop still ends
    /// an update early [default: 1].
    #[arg(long, value_name = "N")]
    pub(crate) ppo_epochs: Option<usize>,
    /// PPO (--controller ppo): the policy's Adam learning rate [default:
    /// 0.0003].
    #[arg(long, value_name = "LR")]
    pub(crate) ppo_learning_rate: Option<f64>,
    /// PPO (--controller ppo): the entropy bonus coefficient [default:
    /// 0.05].
    #[arg(long, value_name = "C")]
    pub(crate) entropy_coef: Option<f64>,
    /// PPO (--controller ppo): the reward the policy learns from
    /// [default: shaped].
    #[arg(long, value_enum)]
    pub(crate) reward_mode: Option<RewardChoice>,
    /// PPO (--controller ppo): run every blueprint at every slot once
    /// before the first round, so that a blueprint's first germination does
    /// not also pay its kernels' first use (CUDA only) [default: true].
    #[arg(long, value_name = "BOOL")]
    pub(crate) prewarm_blueprints: Option<bool>,
    /// PPO (--controller ppo): a named set of settings over the
    /// reference's defaults, applied before any --set: `growth` (no
    /// parameter rent, the op head's floor at 0.02, auto-forward, a cost for
    /// putting germination off; simic::vectorized::settings::GROWTH) or
    /// `growth-imitate` (`growth`, the ESCROW reward with its twin term at
    /// 20, and eight imitation updates of max growth; ...::IMITATE)
    /// [default: none].
    #[arg(long, value_name = "NAME")]
    pub(crate) preset: Option<String>,
    /// PPO (--controller ppo): one setting over the reference's defaults,
    /// SECTION.FIELD=VALUE with SECTION reward, ppo, floor, slot, blueprint,
    /// imitation or trainer (the environments' overlap_weight_grads,
    /// cudnn_benchmark or graph_warmup_steps), e.g. reward.rent_weight=0;
    /// repeatable, applied in order, after --preset [default: none].
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub(crate) settings: Vec<String>,
    /// Serve the run's telemetry as Prometheus metrics on this port
    /// (`http://HOST:PORT/metrics`; the alert rules and dashboard in
    /// docs/observability/ read it) [default: none].
    #[arg(long, value_name = "PORT")]
    pub(crate) metrics_port: Option<u16>,
    /// PPO (--controller ppo): spread the environments over these devices
    /// of this host in one process, round-robin (e.g. cuda:0,cuda:1); the
    /// policy stays on --device [default: all on --device].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub(crate) devices: Vec<String>,
    /// PPO (--controller ppo): train as N data-parallel processes, one GPU
    /// each (cuda:0..N-1, NCCL) or N CPU processes (Gloo); rank 0 writes
    /// the run directory [default: 1].
    #[arg(long, value_name = "N")]
    pub(crate) nproc: Option<usize>,
    /// Continue the run in RUN_DIR from its newest checkpoint that verifies
    /// and restores (a damaged newer one is skipped with a warning), with
    /// the run's own configuration (no other option may be given but
    /// `--nproc N`, which restarts a `--nproc N` run's ranks); on the
    /// CPU the result is bitwise the run that was never stopped. Only once
    /// the checkpoint is restored are the epochs and telemetry written
    /// after it discarded (and trained again); when none restores, nothing
    /// in RUN_DIR changes.
    #[arg(long, value_name = "RUN_DIR")]
    pub(crate) resume: Option<PathBuf>,
}
