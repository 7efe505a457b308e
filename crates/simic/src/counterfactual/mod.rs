//! Counterfactual and Shapley attribution of the seeds (reference §4.5).
//!
//! Every epoch the validation set is run once per *configuration* (a
//! per-slot alpha override) in one fused pass, and the accuracies say what
//! each seed is worth:
//!
//! - [`configs`]: the players (active seeds), [`SlotAlphas`], and the
//!   deduplicated [`ConfigSet`] (main, solo-off, solo-on, all-off, pairs,
//!   committed; the Shapley coalitions on top);
//! - [`coalition`]: [`Coalition`] bit sets and their measured values;
//! - [`shapley`]: the factorial or sampled (antithetic permutation) plan and
//!   the Shapley estimate;
//! - [`estimate`]: marginals, pairwise interactions, the reward's inputs
//!   (`c` per seed and the clean total `T`) and the [`CounterfactualReport`];
//! - [`fused`]: the fused, no-grad, evaluation-mode validation pass over all
//!   configurations, read back once.

pub mod coalition;
pub mod configs;
pub mod estimate;
pub mod fused;
pub mod shapley;

pub use coalition::{Coalition, CoalitionValues};
pub use configs::{
    ConfigEntry, ConfigLabel, ConfigSet, OnAlpha, PlayerOptions, Players, SlotAlphas, SlotSnapshot,
};
pub use estimate::{CounterfactualReport, Interaction, RewardInputs, interactions, marginals};
pub use fused::{
    ConfigOutcome, FusedConfig, FusedValidation, PendingFused, fused_validation,
    fused_validation_staged, launch_fused_validation,
};
pub use shapley::{ShapleyConfig, ShapleyMethod, ShapleyPlan, ShapleyStrategy, ShapleyValue};
