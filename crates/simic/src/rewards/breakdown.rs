//! [`RewardBreakdown`]: the reward of one step, component by component, so
//! telemetry and tests can see where it came from.

use serde::Serialize;

use super::config::RewardMode;

/// The reward of one step by component. `total` is the sum of the
/// components (the fields from `attribution` to `escrow_forfeit`); the
/// discounts, `clean_total` and ESCROW's credit explain them and are not
/// summed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RewardBreakdown {
    /// The mode that computed it.
    pub mode: RewardMode,
    /// The clean total `T` the rules used, `None` when unknown.
    pub clean_total: Option<f64>,
    /// The sigmoid discount of the attribution (1 unless `T < 0`).
    pub attribution_discount: f64,
    /// The early-germination discount of the attribution (1 from the
    /// warm-up on).
    pub timing_discount: f64,
    /// Contribution-based attribution (or its proxy), after the discounts
    /// and the PRUNE sign flip.
    pub attribution: f64,
    /// Anti-gaming penalty for a suspicious contribution/total ratio (≤ 0).
    pub ratio_penalty: f64,
    /// The attributions and ratio penalties of the other live seeds, summed
    /// (0 unless [`crate::rewards::RewardConfig::attribute_all_seeds`]).
    pub other_attribution: f64,
    /// BLENDING while the clean total is negative (≤ 0).
    pub blending_warning: f64,
    /// HOLDING indecision (≤ 0).
    pub holding_warning: f64,
    /// Potential-based shaping `w·(γφ′ − φ)` (germination's discounted by
    /// the timing discount).
    pub pbrs: f64,
    /// Scaffolding bonus from positive interactions (≥ 0).
    pub synergy: f64,
    /// Parameter rent (≤ 0).
    pub rent: f64,
    /// The growth ratio the rent was charged on (effective seed parameters
    /// over the floored host parameters).
    pub growth_ratio: f64,
    /// Alpha shock (≤ 0).
    pub alpha_shock: f64,
    /// Occupancy rent for occupied slots beyond the free ones (≤ 0).
    pub occupancy: f64,
    /// Maintenance of the fossils (≤ 0).
    pub fossil_maintenance: f64,
    /// The germination delay cost: GERMINATE was offered and not taken
    /// (≤ 0; not the reference's, 0 unless configured).
    pub germination_delay: f64,
    /// The accuracy-delta term: `w·(val_acc − previous val_acc)` (not the
    /// reference's, 0 unless configured).
    pub accuracy_delta: f64,
    /// The twin-delta term: `w·((val_acc − previous) − (twin − previous
    /// twin))` (not the reference's, 0 unless configured).
    pub twin_delta: f64,
    /// The op's intervention cost and lifecycle penalties (≤ 0).
    pub op_cost: f64,
    /// FOSSILIZE shaping (legitimacy-discounted bonus or penalties).
    pub fossilize_shaping: f64,
    /// The immediate bonus of a contributing fossil.
    pub fossilize_bonus: f64,
    /// FOSSILIZE matched the ransomware signature (a contribution above
    /// the threshold while the clean total is below it): its extra penalty
    /// is in `fossilize_shaping`. Not a component.
    pub ransomware_signature: bool,
    /// PRUNE shaping (MINIMAL: its early-prune penalty).
    pub prune_shaping: f64,
    /// Seeds the environment pruned on its own (≤ 0).
    pub auto_prune: f64,
    /// Terminal reward: `0.05·val_acc` in SHAPED, the whole sparse reward in
    /// SPARSE and MINIMAL.
    pub terminal: f64,
    /// ESCROW, at the last step: the credits of the seeds that are neither
    /// fossilized nor pruned, forfeited (≤ 0).
    pub escrow_forfeit: f64,
    /// ESCROW: the targeted slot's credit after this step (what the
    /// environment keeps for the next; its change is `attribution`). Not a
    /// component.
    pub escrow_credit: f64,
    /// ESCROW: the ratio penalty taken into the credit's target (≤ 0; under
    /// ESCROW `ratio_penalty` stays 0, since the penalty is paid through the
    /// credit). Not a component.
    pub escrow_ratio_penalty: f64,
    /// The reward: the sum of the components.
    pub total: f64,
}

impl RewardBreakdown {
    /// A breakdown with every component 0 and both discounts 1.
    pub fn zero(mode: RewardMode) -> RewardBreakdown {
        RewardBreakdown {
            mode,
            clean_total: None,
            attribution_discount: 1.0,
            timing_discount: 1.0,
            attribution: 0.0,
            ransomware_signature: false,
            ratio_penalty: 0.0,
            other_attribution: 0.0,
            blending_warning: 0.0,
            holding_warning: 0.0,
            pbrs: 0.0,
            synergy: 0.0,
            rent: 0.0,
            growth_ratio: 0.0,
            alpha_shock: 0.0,
            occupancy: 0.0,
            fossil_maintenance: 0.0,
            germination_delay: 0.0,
            accuracy_delta: 0.0,
            twin_delta: 0.0,
            op_cost: 0.0,
            fossilize_shaping: 0.0,
            fossilize_bonus: 0.0,
            prune_shaping: 0.0,
            auto_prune: 0.0,
            terminal: 0.0,
            escrow_forfeit: 0.0,
            escrow_credit: 0.0,
            escrow_ratio_penalty: 0.0,
            total: 0.0,
        }
    }

    /// The sum of the components (what `total` holds).
    pub fn component_sum(&self) -> f64 {
        [
            self.attribution,
            self.ratio_penalty,
            self.other_attribution,
            self.blending_warning,
            self.holding_warning,
            self.pbrs,
            self.synergy,
            self.rent,
            self.alpha_shock,
            self.occupancy,
            self.fossil_maintenance,
            self.germination_delay,
            self.accuracy_delta,
            self.twin_delta,
            self.op_cost,
            self.fossilize_shaping,
            self.fossilize_bonus,
            self.prune_shaping,
            self.auto_prune,
            self.terminal,
            self.escrow_forfeit,
        ]
        .iter()
        .sum()
    }
}
