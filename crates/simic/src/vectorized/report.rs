//! What a round reports ([`RoundReport`]) and how long its parts took
//! ([`RoundTimings`]).

use super::outcome::{ActionDistribution, EpisodeOutcome, RewardHackingSuspicion};
use crate::ppo::PpoStats;

/// Timings of a round, milliseconds of wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoundTimings {
    /// Building the environments (hosts, trainers, staging).
    pub setup_ms: f64,
    /// Queuing every environment's epoch (host time of the launches).
    pub launch_ms: f64,
    /// Training epochs, launch to readback, all environments (each
    /// environment's counterfactual pass is queued as its epoch is read).
    pub train_ms: f64,
    /// The rest of the fused validation + counterfactual passes (their
    /// readbacks) and the governor.
    pub counterfactual_ms: f64,
    /// Observations and masks built on the host (every environment).
    pub observe_ms: f64,
    /// The batched policy step: upload, normalisation, forward, sampling
    /// and the one action readback.
    pub policy_ms: f64,
    /// Carrying actions out, rewards, lifecycle ticks.
    pub boundary_ms: f64,
    /// GAE and the PPO update.
    pub update_ms: f64,
    /// Of `update_ms`, in a data-parallel group of two or more ranks: the
    /// wait at a barrier before the update, until every rank has finished
    /// its rollout (0 otherwise). What a rank loses to the slowest one.
    pub update_wait_ms: f64,
    /// Of `update_ms`, in a data-parallel group: the host time inside the
    /// group's collective calls after the wait (pooled statistics, the
    /// gradient all-reduce, the KL decision, the parameter check, the
    /// generator gather), including the device work each readback waits
    /// for ([`crate::distributed::DataParallel::take_collective_ms`]); 0
    /// alone.
    pub update_collective_ms: f64,
    /// The training steps' graph captures (part of `launch_ms`): their
    /// summed time, all environments.
    pub capture_ms: f64,
    /// The whole round.
    pub total_ms: f64,
}

/// The parts of a policy step's host time ([`RoundReport::policy_parts_ms`]).
pub const POLICY_PARTS: [&str; 5] = ["stage", "keep_raw", "step", "record", "readback"];

/// What one round did.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    /// Zero-based round.
    pub round: u64,
    /// The seed each of the round's environments was built and trained
    /// with (`seed + ((round·world + rank)·n_envs + env)·env_seed_stride`):
    /// which environments a round (and a rank) trained on.
    pub env_seeds: Vec<u64>,
    /// Environment-epochs trained.
    pub env_epochs: u64,
    /// Mean over environments of the episode's summed raw reward.
    pub mean_episode_reward: f64,
    /// Each environment's final validation accuracy, percent.
    pub final_accuracies: Vec<f64>,
    /// Mean live seeds per environment per step.
    pub mean_active_seeds: f64,
    /// Environments whose episode the governor ended.
    pub rollbacks: usize,
    /// Germinations, fossilizations and prunes carried out.
    pub germinations: u64,
    /// Seeds fossilized.
    pub fossilizations: u64,
    /// Seeds pruned.
    pub prunes: u64,
    /// Mean policy-inference time per step (upload, forward and sampling
    /// for all environments, the one action readback), ms.
    pub inference_ms: f64,
    /// Policy-inference time of each step, ms.
    pub inference_samples: Vec<f64>,
    /// Device time of each replay of the captured policy step, ms (empty
    /// when the step runs eagerly).
    pub replay_samples: Vec<f64>,
    /// Where the policy step's host time goes, mean ms per step, in the
    /// order of [`POLICY_PARTS`]: the staging of its inputs (packed into
    /// page-locked memory; uploaded too when the step runs eagerly), the
    /// copy of the raw observations kept for the normaliser (when
    /// learning), the step (the upload, normalisation, network, sampling,
    /// the buffer's writes and the copy of the actions to the host: one
    /// replay, or eager), the host's bookkeeping of the record, the
    /// actions' readback (which waits for the device).
    pub policy_parts_ms: [f64; POLICY_PARTS.len()],
    /// The PPO update's figures (`None` when the round was not trained on).
    pub ppo: Option<PpoStats>,
    /// Per environment, the seeds' Shapley values at the episode's last
    /// epoch, by slot (empty where none was measured: no seed, an episode
    /// ended early, or `SimicConfig::shapley` off).
    pub shapley: Vec<Vec<(kasmina::host::SlotId, crate::counterfactual::ShapleyValue)>>,
    /// How each environment's episode ended, with its op counts.
    pub outcomes: Vec<EpisodeOutcome>,
    /// The round's decisions summed over the environments.
    pub actions: ActionDistribution,
    /// The policy's LSTM state at the end of the round's episodes.
    pub lstm: Option<tamiyo::policy::LstmHealth>,
    /// What looked wrong in the round's PPO update
    /// ([`super::Simic::set_anomaly_thresholds`]); empty without an update.
    pub anomalies: Vec<crate::ppo::PpoAnomaly>,
    /// Steps whose reward matched an anti-gaming pattern.
    pub reward_hacking: Vec<RewardHackingSuspicion>,
    /// After the update, the Q head's mean estimate per lifecycle op over
    /// the rollout's valid steps, in `LifecycleOp::ALL` order (`None`
    /// without an update or without auxiliary heads).
    pub q_per_op: Option<Vec<f64>>,
    /// Training-step graphs captured this round, all environments (a new
    /// batch shape or active-seed set meets its first capture).
    pub captures: usize,
    /// Training steps run eagerly this round (warm-up steps before a
    /// capture, fallbacks), all environments.
    pub eager_steps: usize,
    /// Timings.
    pub timings: RoundTimings,
    /// Every step of the round: its wall time and the environments' live
    /// seeds it trained with (what `simic-growth` reads eps by live seeds
    /// from).
    pub steps: Vec<StepFigures>,
    /// Configurations the fused validation + counterfactual passes measured,
    /// every environment and step (main, solo-off and the others, Shapley
    /// at an episode's end).
    pub counterfactual_configs: u64,
    /// Decisions a scripted controller refused in a driven round
    /// ([`super::Simic::drive_round`]), carried out as WAIT.
    pub refused_decisions: u64,
    /// In an imitation round ([`super::ImitationConfig`]), whom it followed
    /// and how many of its decisions the update imitated; `None` otherwise.
    pub imitation: Option<super::ImitationFigures>,
    /// In a PPO round with the anchor ([`super::ImitationConfig::anchor_weight`]),
    /// the demonstrator's labels of the policy's states: how many the
    /// policy's masks allow (the anchor's targets) and how many not;
    /// `None` otherwise.
    pub anchor: Option<super::ImitationFigures>,
    /// Steps profiled on the GPU, at most one for each number of live
    /// seeds (empty unless [`super::Simic::set_step_profiling`] is on and
    /// the device is CUDA).
    pub step_profiles: Vec<StepProfile>,
}

/// One step's GPU work from libtorch's kernel profiler
/// ([`super::Simic::set_step_profiling`]): every environment's epoch of
/// training, then its validation with the counterfactual passes (the
/// policy step, observation and update not included), in a step that
/// captured no graph and ran no eager warm-up step (a replayed step). The
/// two phases are profiled one after the other, the device synchronised in
/// between, so in a profiled step the environments' training no longer
/// overlaps their validation.
#[derive(Debug, Clone, PartialEq)]
pub struct StepProfile {
    /// Live seeds per environment at the step's start, the mean over the
    /// environments rounded (0 to 3).
    pub live_seeds: usize,
    /// Environments the step trained: each one an environment-epoch.
    pub envs: usize,
    /// The training phase's kernels, copies and memsets, with their device
    /// time.
    pub training: torch_ext::profile::KernelProfile,
    /// The validation phase's (validation and the counterfactual passes).
    pub validation: torch_ext::profile::KernelProfile,
}

impl StepProfile {
    /// Kernel launches of both phases (copies and memsets not counted).
    pub fn kernel_launches(&self) -> u64 {
        self.training
            .kernel_launches()
            .saturating_add(self.validation.kernel_launches())
    }

    /// Copies and memsets of both phases.
    pub fn copies(&self) -> u64 {
        self.training
            .copies()
            .saturating_add(self.validation.copies())
    }

    /// Device time of both phases, microseconds.
    pub fn busy_us(&self) -> f64 {
        self.training.busy_us() + self.validation.busy_us()
    }
}

/// One step of a round ([`RoundReport::steps`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFigures {
    /// Wall time of the step, every phase of every environment, ms.
    pub ms: f64,
    /// Kasmina's active seeds per environment at the step's start (what its
    /// epoch trains with), averaged over the round's environments.
    pub live_seeds: f64,
}
