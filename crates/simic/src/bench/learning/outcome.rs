//! One training seed's part of the protocol ([`SeedOutcome`]) and one
//! policy's evaluation figures ([`Evaluation`]), as JSON through serde.

use leyline::baseline::ResultEntry;

#[cfg(doc)]
use super::{LearningSetup, run_learning, training_seed};

/// One training seed's part of the protocol: its learning curve and its
/// greedy policy's figures on the shared evaluation environments. The
/// protocol runs the seeds one after another ([`run_learning`]) or, through
/// `esper bench simic-learning --jobs N`, trains each in its own process,
/// which writes its learning curve as this JSON (no evaluations yet) and
/// its trainer as a checkpoint; the parent evaluates every policy alone on
/// the device and pools ([`LearningSetup::report`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedOutcome {
    /// The training seed's index (its root seed is [`training_seed`]).
    pub seed_index: usize,
    /// What the run was, to refuse pooling parts of different runs: task,
    /// episode, rounds, PPO epochs and settings ([`LearningSetup::describe`]).
    pub setup: String,
    /// One entry per training round (`ppo-seed{i}-round-{r}`).
    pub rounds: Vec<ResultEntry>,
    /// The policy evaluated greedily (the most likely option of every
    /// head), without learning, on the shared evaluation environments.
    pub greedy: Evaluation,
    /// The policy evaluated as it acts while training (sampled, with the
    /// run's probability floors), without learning, on the same
    /// environments: a policy whose growth rests on sampling (it germinates
    /// with a probability below WAIT's) grows here and not greedily.
    pub sampled: Evaluation,
    /// With a greedy learning curve (`--greedy-every`): the training round
    /// of its best point, whose policy [`SeedOutcome::selected`] evaluates.
    #[serde(default)]
    pub selected_round: Option<usize>,
    /// With a greedy learning curve: the policy of its best point
    /// ([`super::Selected`]) evaluated greedily on the shared evaluation
    /// environments, beside the final policy's [`SeedOutcome::greedy`].
    #[serde(default)]
    pub selected: Option<Evaluation>,
}

/// One policy's figures on the shared evaluation environments.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evaluation {
    /// Final accuracy per evaluation environment, in evaluation order.
    pub accuracies: Vec<f64>,
    /// Mean active seeds per evaluation round.
    pub active_seeds: Vec<f64>,
    /// Seeds germinated over every evaluation environment, by blueprint
    /// (what the policy grows; none in parts written before it was kept).
    #[serde(default)]
    pub germinated: std::collections::BTreeMap<String, u64>,
    /// Seeds fossilized over every evaluation environment.
    #[serde(default)]
    pub fossilizations: u64,
    /// Seeds pruned over every evaluation environment.
    #[serde(default)]
    pub prunes: u64,
}
