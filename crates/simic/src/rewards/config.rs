//! [`RewardConfig`]: every constant of the reward (reference §4.4) with the
//! reference's defaults, and [`RewardMode`], the reward variant.
//!
//! The defaults are the reference's CONTRIBUTION family at HEAD. Penalties
//! and costs are stored with their sign (a cost of −0.15 is written
//! `-0.15`), so a breakdown component is the field's value times whatever
//! the rule multiplies it by. [`RewardConfig::validate`] checks that every
//! value is finite and on the side of zero its rule assumes, and that the
//! stage potentials rise along the lifecycle (the PBRS properties of
//! reference §9 item 12 rest on that); the checks live in the private
//! `rewards::config_checks` module.

use leyline::gate::thresholds::{MIN_FOSSILIZE_CONTRIBUTION, MIN_PRUNE_AGE};
use serde::{Deserialize, Serialize};

/// The PPO discount the reward's potential-based shaping assumes (0.995).
/// PBRS keeps the optimal policy only when its γ equals the one the returns
/// are discounted with, so the PPO configuration must use the same value.
pub const DEFAULT_GAMMA: f64 = 0.995;

/// Which reward function runs (reference §4.4; the modes built here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    /// Dense shaping: attribution, warnings, PBRS, synergy, rent, alpha
    /// shock, occupancy, per-op shaping and the terminal bonus (default).
    #[default]
    Shaped,
    /// Terminal only: the committed accuracy less a parameter cost, clamped
    /// to `[-1, 1]` and scaled.
    Sparse,
    /// SPARSE plus a penalty for pruning a young seed.
    Minimal,
    /// SHAPED with the attribution in escrow (the reference's ESCROW mode):
    /// each step pays the *change* of the targeted seed's credit, clipped to
    /// `±escrow_delta_clip`, so what a seed earns over an episode is its
    /// final credit, not a sum over every epoch it is held; progress is
    /// taken from the stable accuracy (the lowest of the last
    /// `escrow_stable_window` epochs); a PRUNE claws the credit back, and at
    /// the last step the credit of every seed that is neither fossilized
    /// nor pruned is forfeited. Every other component is SHAPED's.
    Escrow,
}

/// Base potentials of the stages that carry one (reference §4.4). UNKNOWN,
/// DORMANT and the failure stages (PRUNED, EMBARGOED, RESETTING) have
/// potential 0 and are not configurable.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StagePotentials {
    /// GERMINATED (1.0).
    pub germinated: f64,
    /// TRAINING (2.0).
    pub training: f64,
    /// BLENDING (3.5).
    pub blending: f64,
    /// HOLDING (5.5).
    pub holding: f64,
    /// FOSSILIZED (6.0).
    pub fossilized: f64,
}

impl Default for StagePotentials {
    /// The reference's potentials: 1.0, 2.0, 3.5, 5.5, 6.0.
    fn default() -> Self {
        StagePotentials {
            germinated: 1.0,
            training: 2.0,
            blending: 3.5,
            holding: 5.5,
            fossilized: 6.0,
        }
    }
}

/// Every constant of the reward, with the reference's defaults (see the
/// module docs for the sign convention).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// The reward variant.
    pub mode: RewardMode,
    /// Discount of the potential-based shaping; must equal the PPO γ
    /// ([`DEFAULT_GAMMA`]).
    pub gamma: f64,

    // --- PBRS ---
    /// Weight of the PBRS term `w·(γφ′ − φ)` (0.3).
    pub pbrs_weight: f64,
    /// Base potential per stage.
    pub stage_potentials: StagePotentials,
    /// Potential gained per epoch in the stage (0.3).
    pub epoch_progress_bonus: f64,
    /// Cap on the per-epoch potential gain (2.0).
    pub max_progress_bonus: f64,

    // --- attribution ---
    /// Weight of the contribution term (1.0).
    pub contribution_weight: f64,
    /// Not the reference's (off there and by default): pay the attribution
    /// of every live seed at every step, not only the targeted slot's. The
    /// reference pays the seed the slot head chose (for WAIT, the canonical
    /// slot), so a policy that keeps one seed the host leans on earns as
    /// much as one whose three seeds each add accuracy
    /// (`baselines/perf/simic-learning/NOTES.md`). With it on, each other
    /// live, unfossilised seed whose contribution was measured adds its own
    /// attribution and ratio penalty (the targeted seed's rules, without the
    /// op's FOSSILIZE and PRUNE adjustments) as
    /// [`crate::rewards::RewardBreakdown::other_attribution`].
    pub attribute_all_seeds: bool,
    /// ESCROW: accuracies over which the stable accuracy is the minimum
    /// (3, the reference's).
    pub escrow_stable_window: u32,
    /// ESCROW: the largest change of a seed's credit in one step, a
    /// magnitude (2.0, the reference's; 0 for no clip).
    pub escrow_delta_clip: f64,
    /// Weight of the stage-improvement proxy when no contribution was
    /// measured (0.3).
    pub proxy_weight: f64,
    /// Steepness of the sigmoid discount `1/(1+e^(k|T|))` when `T < 0` (3).
    pub attribution_sigmoid_steepness: f64,
    /// Germination before this epoch discounts attribution (10; 0 turns the
    /// timing discount off).
    pub germination_warmup_epochs: u32,
    /// Timing discount at epoch 0, rising linearly to 1 at the warm-up
    /// (0.4).
    pub germination_discount_floor: f64,

    // --- anti-gaming ratio penalty ---
    /// The ratio penalty looks at contributions above this (1.0 point).
    pub ratio_penalty_min_contribution: f64,
    /// A clean total at or below this makes any such contribution
    /// suspicious (0.1 point).
    pub improvement_safe_threshold: f64,
    /// Contribution/total ratio above which the penalty starts (5).
    pub hacking_ratio_threshold: f64,
    /// Slope of the ratio penalty per threshold-multiple of excess (0.1).
    pub ratio_penalty_slope: f64,
    /// Largest ratio penalty, a magnitude (0.3).
    pub ratio_penalty_cap: f64,
    /// With a clean total at or below the safe threshold, the penalty is
    /// `cap·min(1, c/this)` (10 points).
    pub suspicious_contribution_scale: f64,

    // --- warnings ---
    /// BLENDING with `T < 0`: base penalty (−0.1).
    pub blending_warning_base: f64,
    /// BLENDING with `T < 0`: extra penalty per epoch in stage (−0.05).
    pub blending_warning_per_epoch: f64,
    /// BLENDING with `T < 0`: cap on the extra penalty, a magnitude (0.3).
    pub blending_warning_escalation_cap: f64,
    /// HOLDING indecision: first epoch in stage that is penalised (2).
    pub holding_warning_start_epoch: u32,
    /// HOLDING indecision: base penalty (−0.1).
    pub holding_warning_base: f64,
    /// HOLDING indecision: extra penalty per further epoch waited (−0.05).
    pub holding_warning_per_epoch: f64,
    /// HOLDING indecision: cap on the whole penalty, a magnitude (0.3).
    pub holding_warning_cap: f64,

    // --- synergy ---
    /// Weight of `tanh(scale·interaction_sum)` (0.1).
    pub synergy_weight: f64,
    /// Scale inside the tanh (0.5).
    pub synergy_scale: f64,

    // --- rent and alpha shock ---
    /// Rent weight: `min(w·ln(1 + g), max_rent)` (0.5).
    pub rent_weight: f64,
    /// Rent cap, a magnitude (1.5).
    pub max_rent: f64,
    /// Floor of the host parameter count in rent and shock (200).
    pub rent_host_params_floor: u64,
    /// Parameters charged per slot from BLENDING on, as a fraction of the
    /// host's (0.0039).
    pub base_slot_rent_ratio: f64,
    /// Alpha-shock coefficient (0.1958).
    pub alpha_shock_coef: f64,
    /// Alpha-shock cap, a magnitude (1.0).
    pub alpha_shock_cap: f64,

    // --- occupancy ---
    /// Cost per occupied slot beyond the free ones (−0.01).
    pub seed_occupancy_cost: f64,
    /// Occupied slots that cost nothing (1).
    pub free_slots: u32,
    /// Cost per fossilised seed (−0.002).
    pub fossilized_maintenance_cost: f64,
    /// Not the reference's (0 there and by default): the cost of every
    /// step, the last excepted, at which GERMINATE was valid and another
    /// op was carried out. Waiting at an empty slot is otherwise free, so
    /// a policy can put germination off epoch after epoch and still fill
    /// its slots by sampling; this makes each epoch of delay cost
    /// something (`baselines/perf/simic-learning/NOTES.md`).
    pub germination_delay_cost: f64,
    /// Not the reference's (0 there and by default): the weight `w` of
    /// `w·(val_acc − previous val_acc)` paid at every step but the first,
    /// in reward units per accuracy point. Its sum over an episode
    /// telescopes to `w·(final − first accuracy)`, so it pays for the
    /// accuracy the episode gains, whatever gains it, where the attribution
    /// pays the targeted seed's counterfactual, which grows with the host's
    /// own progress since the germination and with how much the host has
    /// come to lean on the seed (`baselines/perf/simic-learning/NOTES.md`).
    pub accuracy_delta_weight: f64,
    /// Not the reference's (0 there and by default): the weight `w` of
    /// `w·((val_acc − previous) − (twin − previous twin))`, where the twin
    /// is the environment's host trained beside it with no seed (the same
    /// model seed, data shard and trainer settings), paid at every step
    /// but the first. Over an episode it telescopes to `w·(final accuracy −
    /// the twin's final accuracy)`: what the episode's growth gained over
    /// no growth on this environment, the protocol's own measure, where the
    /// accuracy-delta term also pays the host's own progress and the
    /// attribution pays what a host that leans on its seeds loses without
    /// them. With a weight above 0 every environment trains its twin (one
    /// more seedless epoch per epoch).
    pub twin_delta_weight: f64,

    // --- per-op costs ---
    /// GERMINATE (−0.15).
    pub germinate_cost: f64,
    /// GERMINATE into a slot that holds a seed (−0.3).
    pub germinate_occupied_penalty: f64,
    /// FOSSILIZE (−0.01).
    pub fossilize_cost: f64,
    /// PRUNE (−0.005).
    pub prune_cost: f64,
    /// SET_ALPHA_TARGET (−0.005).
    pub set_alpha_target_cost: f64,
    /// ADVANCE of a TRAINING seed (−0.1).
    pub advance_from_training_penalty: f64,

    // --- fossilize shaping ---
    /// FOSSILIZE of no HOLDING seed, or refused (−1.0).
    pub invalid_fossilize_penalty: f64,
    /// FOSSILIZE with `T < 0`: base penalty (−0.5).
    pub fossilize_regression_base: f64,
    /// FOSSILIZE with `T < 0`: damage penalty per point of `|T|` (0.2,
    /// a magnitude).
    pub fossilize_damage_scale: f64,
    /// FOSSILIZE with `T < 0`: cap on the damage penalty, a magnitude (1.0).
    pub fossilize_damage_cap: f64,
    /// Extra penalty for the ransomware signature (−0.3).
    pub ransomware_penalty: f64,
    /// Ransomware signature: contribution above this (0.1 point) ...
    pub ransomware_min_contribution: f64,
    /// ... with a clean total below this (−0.2 point).
    pub ransomware_max_total: f64,
    /// Contribution a fossil must have to earn the bonus (1.0 point, G5's
    /// strict threshold).
    pub min_fossilize_contribution: f64,
    /// Base of the contributing-fossil shaping (0.5).
    pub fossilize_base_bonus: f64,
    /// Contributing-fossil shaping per contribution point (0.1).
    pub fossilize_contribution_scale: f64,
    /// FOSSILIZE of a seed below the contribution threshold (−0.2).
    pub fossilize_noncontributing_penalty: f64,
    /// Epochs in HOLDING for full legitimacy: `min(1, epochs/this)` (5).
    pub min_holding_epochs: u32,
    /// Scale of the immediate fossil bonus `scale·tanh(1/ceiling)` (3.0).
    pub fossilize_bonus_scale: f64,
    /// Ceiling of that bonus (3.0).
    pub fossilize_quality_ceiling: f64,

    // --- prune shaping ---
    /// Seeds younger than this are pruned at a cost per missing epoch (5,
    /// `MIN_PRUNE_AGE`).
    pub min_prune_age: u32,
    /// Penalty per epoch missing to that age (−0.3).
    pub prune_young_penalty_per_epoch: f64,
    /// A contribution below this marks a hurting seed (−0.5 point).
    pub prune_hurting_threshold: f64,
    /// PRUNE of a hurting seed (+0.15).
    pub prune_hurting_bonus: f64,
    /// A hurting seed younger than this earns no bonus (3).
    pub min_prune_bonus_age: u32,
    /// PRUNE of a hurting seed that is too young for the bonus (−0.1).
    pub prune_young_hurting_penalty: f64,
    /// PRUNE of a slightly negative seed (+0.1).
    pub prune_acceptable_bonus: f64,
    /// PRUNE of a contributing seed: base penalty (−0.3).
    pub prune_good_seed_penalty: f64,
    /// ... plus this per contribution point (−0.05).
    pub prune_contribution_scale: f64,
    /// ... floored here (−0.9).
    pub prune_good_seed_floor: f64,
    /// PRUNE of a FOSSILIZED seed, or refused (−1.0).
    pub prune_invalid_penalty: f64,
    /// PRUNE of an empty slot (−0.2).
    pub prune_no_seed_penalty: f64,

    // --- terminal, episode level ---
    /// Terminal bonus per accuracy point (0.05).
    pub terminal_acc_weight: f64,
    /// Penalty per seed the environment pruned on its own (−0.2).
    pub auto_prune_penalty: f64,
    /// Reward of the last transition before a governor rollback, in
    /// normalised units (−10).
    pub rollback_death_penalty: f64,

    // --- SPARSE / MINIMAL ---
    /// Parameter budget of the sparse cost (500,000).
    pub param_budget: u64,
    /// Weight of the sparse parameter cost (0.1).
    pub param_penalty_weight: f64,
    /// Scale of the sparse reward (1.0).
    pub sparse_reward_scale: f64,
    /// MINIMAL: prunes of seeds younger than this are penalised (5).
    pub early_prune_threshold: u32,
    /// MINIMAL: that penalty (−0.1).
    pub early_prune_penalty: f64,
}

impl Default for RewardConfig {
    /// The reference's SHAPED reward with its HEAD constants.
    fn default() -> Self {
        RewardConfig {
            mode: RewardMode::Shaped,
            gamma: DEFAULT_GAMMA,
            pbrs_weight: 0.3,
            stage_potentials: StagePotentials::default(),
            epoch_progress_bonus: 0.3,
            max_progress_bonus: 2.0,
            contribution_weight: 1.0,
            attribute_all_seeds: false,
            escrow_stable_window: 3,
            escrow_delta_clip: 2.0,
            proxy_weight: 0.3,
            attribution_sigmoid_steepness: 3.0,
            germination_warmup_epochs: 10,
            germination_discount_floor: 0.4,
            ratio_penalty_min_contribution: 1.0,
            improvement_safe_threshold: 0.1,
            hacking_ratio_threshold: 5.0,
            ratio_penalty_slope: 0.1,
            ratio_penalty_cap: 0.3,
            suspicious_contribution_scale: 10.0,
            blending_warning_base: -0.1,
            blending_warning_per_epoch: -0.05,
            blending_warning_escalation_cap: 0.3,
            holding_warning_start_epoch: 2,
            holding_warning_base: -0.1,
            holding_warning_per_epoch: -0.05,
            holding_warning_cap: 0.3,
            synergy_weight: 0.1,
            synergy_scale: 0.5,
            rent_weight: 0.5,
            max_rent: 1.5,
            rent_host_params_floor: 200,
            base_slot_rent_ratio: 0.0039,
            alpha_shock_coef: 0.1958,
            alpha_shock_cap: 1.0,
            seed_occupancy_cost: -0.01,
            free_slots: 1,
            fossilized_maintenance_cost: -0.002,
            germination_delay_cost: 0.0,
            accuracy_delta_weight: 0.0,
            twin_delta_weight: 0.0,
            germinate_cost: -0.15,
            germinate_occupied_penalty: -0.3,
            fossilize_cost: -0.01,
            prune_cost: -0.005,
            set_alpha_target_cost: -0.005,
            advance_from_training_penalty: -0.1,
            invalid_fossilize_penalty: -1.0,
            fossilize_regression_base: -0.5,
            fossilize_damage_scale: 0.2,
            fossilize_damage_cap: 1.0,
            ransomware_penalty: -0.3,
            ransomware_min_contribution: 0.1,
            ransomware_max_total: -0.2,
            min_fossilize_contribution: MIN_FOSSILIZE_CONTRIBUTION,
            fossilize_base_bonus: 0.5,
            fossilize_contribution_scale: 0.1,
            fossilize_noncontributing_penalty: -0.2,
            min_holding_epochs: 5,
            fossilize_bonus_scale: 3.0,
            fossilize_quality_ceiling: 3.0,
            min_prune_age: MIN_PRUNE_AGE,
            prune_young_penalty_per_epoch: -0.3,
            prune_hurting_threshold: -0.5,
            prune_hurting_bonus: 0.15,
            min_prune_bonus_age: 3,
            prune_young_hurting_penalty: -0.1,
            prune_acceptable_bonus: 0.1,
            prune_good_seed_penalty: -0.3,
            prune_contribution_scale: -0.05,
            prune_good_seed_floor: -0.9,
            prune_invalid_penalty: -1.0,
            prune_no_seed_penalty: -0.2,
            terminal_acc_weight: 0.05,
            auto_prune_penalty: -0.2,
            rollback_death_penalty: -10.0,
            param_budget: 500_000,
            param_penalty_weight: 0.1,
            sparse_reward_scale: 1.0,
            early_prune_threshold: 5,
            early_prune_penalty: -0.1,
        }
    }
}
