//! The SHAPED reward (reference §4.4, CONTRIBUTION family), component by
//! component. `c` is the targeted seed's counterfactual contribution, `p`
//! its progress since germination and `T` the clean total
//! ([`RewardInputs::resolved_clean_total`]); "the seed" is the targeted
//! slot's seed when the op was chosen.
//!
//! - **Attribution** (a non-fossilised seed with `c` known): `c` when
//!   `c < 0`; otherwise 0 if `p ≤ 0`, the harmonic mean `2pc/(p+c)` if
//!   `c ≥ p`, else `c`, times the sigmoid discount `1/(1+e^(3|T|))` when
//!   `T < 0` and the timing discount of a germination before epoch 10
//!   (linear from 0.4 to 1). With `c` missing, a BLENDING or HOLDING seed
//!   gets the proxy `0.3·max(0, stage improvement)`. FOSSILIZE with `T < 0`
//!   pays no attribution; a PRUNE that happened flips its sign.
//! - **Other seeds' attribution** (not the reference's; only with
//!   [`RewardConfig::attribute_all_seeds`]): every other live seed's
//!   attribution and ratio penalty by the rules above, without the
//!   FOSSILIZE and PRUNE adjustments, which belong to the op's seed.
//! - **Ratio penalty** (after the flip, so always a penalty; only while the
//!   sigmoid discount is ≥ 0.5, i.e. `T ≥ 0`): for `c > 1`,
//!   `−min(0.3, 0.1·(c/T − 5)/5)` when `T > 0.1` and `c/T > 5`, and
//!   `−0.3·min(1, c/10)` when `T ≤ 0.1`.
//! - **Warnings**: BLENDING with `T < 0` costs `0.1 + min(0.05·epochs, 0.3)`;
//!   HOLDING from its 2nd epoch, with an op other than FOSSILIZE or PRUNE and
//!   positive attribution (penalty included), costs
//!   `min(0.1 + 0.05·(epochs − 2), 0.3)`.
//! - **PBRS**: [`pbrs_term`] from the seed to `seed_after`; a germination
//!   into an empty slot gets it times the timing discount of germinating
//!   now, and nothing at the terminal step.
//! - **Synergy**: `0.1·tanh(0.5·interaction_sum)` when the interaction sum
//!   is positive, the attribution (penalty included) is positive and the
//!   sigmoid discount is ≥ 0.5: the ransomware pattern (`T < 0`) gets none.
//! - **Rent**: `−min(0.5·ln(1 + g), 1.5)` with `g` the effective seed
//!   parameters over `max(host_params, 200)`; effective parameters are
//!   `Σ (0.0039·host_params + alpha·params)` over the slots in BLENDING,
//!   HOLDING or FOSSILIZED.
//! - **Alpha shock**: `max(−0.1958·Σ Δalpha²·previous_params/max(host, 200), −1)`.
//! - **Occupancy**: −0.01 per occupied slot beyond the first, −0.002 per
//!   fossil.
//! - **Germination delay** (not the reference's; 0 by default):
//!   `germination_delay_cost` at every step but the last at which GERMINATE
//!   was offered and the op carried out was another (a refused GERMINATE
//!   is carried out as WAIT, so it pays too).
//! - **Accuracy delta** (not the reference's; 0 by default):
//!   `accuracy_delta_weight·(val_acc − previous val_acc)` at every step but
//!   the first.
//! - **Twin delta** (not the reference's; 0 by default):
//!   `twin_delta_weight·((val_acc − previous) − (twin − previous twin))`,
//!   the twin being the environment's host trained beside it with no seed;
//!   an episode's sum is the weight times the final accuracy's gain over
//!   the seedless host's.
//! - **Per op**: GERMINATE −0.15 (−0.3 more into an occupied slot);
//!   FOSSILIZE −0.01 plus the fossilize shaping and bonus; PRUNE −0.005 plus
//!   the prune shaping; SET_ALPHA_TARGET −0.005; ADVANCE of a TRAINING seed
//!   −0.1.
//! - **Fossilize shaping**: a FOSSILIZE that is refused or targets no
//!   HOLDING seed costs 1.0. Otherwise `T < 0` costs
//!   `0.5 + min(0.2|T|, 1)` (0.3 more for the ransomware signature
//!   `c > 0.1`, `T < −0.2`); `c ≥ 1` earns `(0.5 + 0.1c)·legitimacy` and the
//!   immediate bonus `3·tanh(1/3)·legitimacy`, with
//!   `legitimacy = min(1, epochs in HOLDING/5)`; a smaller `c` costs 0.2.
//! - **Prune shaping**: an empty slot costs 0.2; a FOSSILIZED seed or a
//!   refused PRUNE 1.0; a seed younger than 5 epochs 0.3 per missing epoch;
//!   then `c < −0.5` earns 0.15 (costs 0.1 below age 3), `c < 0` earns 0.1,
//!   and a contributing seed costs `0.3 + 0.05c`, at most 0.9.
//! - **Terminal**: `0.05·val_acc` at the episode's last step.
//! - **Auto-prune**: −0.2 per seed the environment pruned on its own.
//!
//! **ESCROW** ([`RewardMode::Escrow`], the reference's escrow attribution)
//! replaces the attribution and ratio penalty of the targeted seed, and
//! keeps every other component:
//!
//! - the seed's credit moves towards a target, `max(0, w·a + ratio
//!   penalty)` with `a = √(p·c)` if `c ≥ p > 0`, `c` if `c < p`, 0 if
//!   `p ≤ 0`, where `p` is progress at the stable accuracy (the lowest of
//!   the last `escrow_stable_window` epochs); the step pays the change,
//!   clipped to `±escrow_delta_clip`. No sigmoid or timing discount; the
//!   ratio penalty applies whatever the sign of `T`;
//! - `c < 0` pays `w·c` and takes the credit back to 0; a PRUNE pays the
//!   credit back (`−credit`); a fossil keeps its credit and earns nothing;
//!   an unmeasured `c` leaves the credit as it is;
//! - at the last step, the credits of the seeds that are neither fossilized
//!   nor pruned are forfeited (`escrow_forfeit`).
//!
//! Over an episode a seed is paid its final credit, once, and only if it is
//! fossilized (or pruned with nothing owed), where SHAPED pays the
//! attribution at every step it is held
//! (`baselines/perf/simic-learning/NOTES.md`, the 100-round section).
//!
//! Where the reference's code differs from this: it adds the PRUNE
//! potential drop on top of the ordinary per-step PBRS term (here one term
//! goes from the seed's potential to the empty slot's 0); and it shapes a
//! FOSSILIZE or PRUNE by the seed's stage alone, where a refused one is
//! shaped as invalid here (a gate-refused FOSSILIZE earns no bonus).

use leyline::{LifecycleOp, SeedStage};

use super::breakdown::RewardBreakdown;
use super::config::{RewardConfig, RewardMode};
use super::inputs::{EscrowInputs, RewardInputs, SeedFacts};
use super::pbrs::pbrs_term;

/// The sigmoid discount at `T = 0`: below it the clean total is negative,
/// and the ratio penalty and synergy do not apply.
const TRUSTED_DISCOUNT: f64 = 0.5;

/// Largest exponent fed to `exp` in the sigmoid discount (the discount is 0
/// to double precision long before).
const MAX_EXPONENT: f64 = 700.0;

/// The early-germination discount for a seed germinated at
/// `germination_epoch`: `floor + (1 − floor)·epoch/warmup` before the
/// warm-up, 1 from it on (and always 1 with a warm-up of 0).
pub fn timing_discount(config: &RewardConfig, germination_epoch: u32) -> f64 {
    let warmup = config.germination_warmup_epochs;
    if warmup == 0 || germination_epoch >= warmup {
        return 1.0;
    }
    let floor = config.germination_discount_floor;
    floor + (1.0 - floor) * f64::from(germination_epoch) / f64::from(warmup)
}

/// The sigmoid discount of the attribution: `1/(1 + e^(k|T|))` when the
/// clean total is known and negative, else 1.
pub fn attribution_discount(config: &RewardConfig, clean_total: Option<f64>) -> f64 {
    match clean_total {
        Some(total) if total < 0.0 => {
            let exponent = (config.attribution_sigmoid_steepness * total.abs()).min(MAX_EXPONENT);
            1.0 / (1.0 + exponent.exp())
        }
        _ => 1.0,
    }
}

/// The anti-gaming ratio penalty (≤ 0) for contribution `c` (module docs).
/// SHAPED skips it while the sigmoid discount is below one half; ESCROW,
/// which has no sigmoid discount, never does (`escrow`).
fn ratio_penalty(
    config: &RewardConfig,
    contribution: f64,
    clean_total: Option<f64>,
    escrow: bool,
) -> f64 {
    let Some(total) = clean_total else {
        return 0.0;
    };
    if contribution <= config.ratio_penalty_min_contribution
        || (!escrow && attribution_discount(config, Some(total)) < TRUSTED_DISCOUNT)
    {
        return 0.0;
    }
    let cap = config.ratio_penalty_cap;
    if total > config.improvement_safe_threshold.max(f64::EPSILON) {
        let threshold = config.hacking_ratio_threshold;
        let ratio = contribution / total;
        if ratio > threshold {
            -(config.ratio_penalty_slope * (ratio - threshold) / threshold).min(cap)
        } else {
            0.0
        }
    } else {
        -cap * (contribution / config.suspicious_contribution_scale).min(1.0)
    }
}

/// One seed's attribution before the op's adjustments, with the discounts
/// and the ratio penalty it was computed with.
struct SeedAttribution {
    value: f64,
    discount: f64,
    timing: f64,
    ratio_penalty: f64,
}

/// The attribution of `seed` at `epoch` (module docs), before the
/// FOSSILIZE and PRUNE adjustments; `None` for a fossil.
fn seed_attribution(
    config: &RewardConfig,
    epoch: u32,
    seed: &SeedFacts,
    clean_total: Option<f64>,
) -> Option<SeedAttribution> {
    if seed.stage == SeedStage::Fossilized {
        return None;
    }
    let mut out = SeedAttribution {
        value: 0.0,
        discount: 1.0,
        timing: 1.0,
        ratio_penalty: 0.0,
    };
    out.value = match seed.contribution {
        Some(contribution) => {
            out.discount = attribution_discount(config, clean_total);
            out.ratio_penalty = ratio_penalty(config, contribution, clean_total, false);
            if contribution < 0.0 {
                config.contribution_weight * contribution
            } else {
                let progress = seed.progress;
                let attributed = if progress <= 0.0 {
                    0.0
                } else if contribution >= progress {
                    2.0 * progress * contribution / (progress + contribution)
                } else {
                    contribution
                };
                out.timing = timing_discount(config, epoch.saturating_sub(seed.age_epochs));
                config.contribution_weight * attributed * out.discount * out.timing
            }
        }
        None if matches!(seed.stage, SeedStage::Blending | SeedStage::Holding) => {
            config.proxy_weight * seed.stage_improvement.max(0.0)
        }
        None => 0.0,
    };
    Some(out)
}

/// Attribution, ratio penalty and the two discounts of the targeted seed.
fn attribution(
    config: &RewardConfig,
    inputs: &RewardInputs,
    seed: &SeedFacts,
    clean_total: Option<f64>,
    breakdown: &mut RewardBreakdown,
) {
    let Some(attributed) = seed_attribution(config, inputs.epoch, seed, clean_total) else {
        return;
    };
    breakdown.attribution_discount = attributed.discount;
    breakdown.timing_discount = attributed.timing;
    breakdown.ratio_penalty = attributed.ratio_penalty;
    let mut value = attributed.value;
    if inputs.op == LifecycleOp::Fossilize && clean_total.is_some_and(|total| total < 0.0) {
        value = 0.0;
    }
    if inputs.op == LifecycleOp::Prune && inputs.op_succeeded {
        value = -value;
    }
    breakdown.attribution = value;
}

/// ESCROW's attribution of the targeted seed (module docs): the change of
/// its credit towards this step's target, and the credit after the step.
fn escrow_attribution(
    config: &RewardConfig,
    inputs: &RewardInputs,
    seed: &SeedFacts,
    clean_total: Option<f64>,
    escrow: &EscrowInputs,
    breakdown: &mut RewardBreakdown,
) {
    // `breakdown.escrow_credit` holds the credit before the step already.
    let credit = escrow.credit;
    if inputs.op == LifecycleOp::Prune && inputs.op_succeeded {
        // The credit is clawed back.
        breakdown.attribution = -credit;
        breakdown.escrow_credit = 0.0;
        return;
    }
    // A fossil keeps its credit and earns nothing more; an unmeasured
    // contribution leaves the credit where it is.
    let Some(contribution) = seed
        .contribution
        .filter(|_| seed.stage != SeedStage::Fossilized)
    else {
        return;
    };
    let (change, next) = if contribution < 0.0 {
        // Pays the harm and takes the credit back to 0.
        (config.contribution_weight * contribution - credit, 0.0)
    } else {
        let penalty = ratio_penalty(config, contribution, clean_total, true);
        breakdown.escrow_ratio_penalty = penalty;
        // Progress at the stable accuracy: `seed.progress` is measured at
        // this epoch's.
        let progress = seed.progress - (inputs.val_acc - escrow.stable_val_acc);
        let attributed = if progress <= 0.0 {
            0.0
        } else if contribution >= progress {
            (progress * contribution).sqrt()
        } else {
            contribution
        };
        let target = (config.contribution_weight * attributed + penalty).max(0.0);
        let mut change = target - credit;
        if config.escrow_delta_clip > 0.0 {
            change = change.clamp(-config.escrow_delta_clip, config.escrow_delta_clip);
        }
        (change, credit + change)
    };
    breakdown.escrow_credit = next;
    // As in SHAPED, a FOSSILIZE while the clean total is negative is paid
    // no attribution (the credit still moves).
    breakdown.attribution =
        if inputs.op == LifecycleOp::Fossilize && clean_total.is_some_and(|total| total < 0.0) {
            0.0
        } else {
            change
        };
}

/// ESCROW's forfeit at the last step: every credit still at risk (the
/// targeted slot's after the step, if its seed is live and not
/// fossilized, and the other slots').
fn escrow_forfeit(inputs: &RewardInputs, escrow: &EscrowInputs, credit_after: f64) -> f64 {
    let target_at_risk = inputs
        .seed_after
        .is_some_and(|after| !after.stage.is_failure() && after.stage != SeedStage::Fossilized);
    let own = if target_at_risk { credit_after } else { 0.0 };
    -(escrow.others_at_risk + own)
}

/// The attributions and ratio penalties of the other live seeds
/// ([`RewardConfig::attribute_all_seeds`]).
fn other_attribution(
    config: &RewardConfig,
    inputs: &RewardInputs,
    clean_total: Option<f64>,
) -> f64 {
    inputs
        .other_seeds
        .iter()
        .filter_map(|seed| seed_attribution(config, inputs.epoch, seed, clean_total))
        .map(|attributed| attributed.value + attributed.ratio_penalty)
        .sum()
}

/// The BLENDING and HOLDING warnings.
fn warnings(
    config: &RewardConfig,
    op: LifecycleOp,
    seed: &SeedFacts,
    clean_total: Option<f64>,
    breakdown: &mut RewardBreakdown,
) {
    let epochs = f64::from(seed.epochs_in_stage);
    if seed.stage == SeedStage::Blending && clean_total.is_some_and(|total| total < 0.0) {
        let escalation = (config.blending_warning_per_epoch * epochs)
            .max(-config.blending_warning_escalation_cap);
        breakdown.blending_warning = config.blending_warning_base + escalation;
    }
    let resolves = matches!(op, LifecycleOp::Fossilize | LifecycleOp::Prune);
    let start = config.holding_warning_start_epoch;
    if seed.stage == SeedStage::Holding
        && !resolves
        && seed.epochs_in_stage >= start
        && breakdown.attribution + breakdown.ratio_penalty > 0.0
    {
        let beyond_start = f64::from(seed.epochs_in_stage.saturating_sub(start));
        let penalty = config.holding_warning_base + config.holding_warning_per_epoch * beyond_start;
        breakdown.holding_warning = penalty.max(-config.holding_warning_cap);
    }
}

/// Rent and alpha shock over every slot.
fn rent_and_shock(config: &RewardConfig, inputs: &RewardInputs, breakdown: &mut RewardBreakdown) {
    let host = inputs.host_params as f64;
    let floored_host = inputs.host_params.max(config.rent_host_params_floor) as f64;
    let mut effective = 0.0;
    let mut shock = 0.0;
    for slot in &inputs.slots {
        if matches!(
            slot.stage,
            Some(SeedStage::Blending | SeedStage::Holding | SeedStage::Fossilized)
        ) {
            effective += config.base_slot_rent_ratio * host + slot.alpha * slot.params as f64;
        }
        let change = slot.alpha - slot.previous_alpha;
        shock += change * change * slot.previous_params as f64 / floored_host;
    }
    if effective > 0.0 {
        let growth = effective / floored_host;
        breakdown.growth_ratio = growth;
        breakdown.rent = -(config.rent_weight * growth.ln_1p()).min(config.max_rent);
    }
    if shock > 0.0 {
        breakdown.alpha_shock = (-config.alpha_shock_coef * shock).max(-config.alpha_shock_cap);
    }
}

/// Fossilize shaping and the immediate fossil bonus.
fn fossilize_shaping(
    config: &RewardConfig,
    inputs: &RewardInputs,
    clean_total: Option<f64>,
    breakdown: &mut RewardBreakdown,
) {
    let seed = match &inputs.seed {
        Some(seed) if inputs.op_succeeded && seed.stage == SeedStage::Holding => seed,
        _ => {
            breakdown.fossilize_shaping = config.invalid_fossilize_penalty;
            return;
        }
    };
    if let Some(total) = clean_total.filter(|total| *total < 0.0) {
        let damage = (config.fossilize_damage_scale * total.abs()).min(config.fossilize_damage_cap);
        let ransomware = seed
            .contribution
            .is_some_and(|c| c > config.ransomware_min_contribution)
            && total < config.ransomware_max_total;
        breakdown.ransomware_signature = ransomware;
        let signature = if ransomware {
            config.ransomware_penalty
        } else {
            0.0
        };
        breakdown.fossilize_shaping = config.fossilize_regression_base - damage + signature;
        return;
    }
    let legitimacy =
        (f64::from(seed.epochs_in_stage) / f64::from(config.min_holding_epochs)).min(1.0);
    match seed.contribution {
        Some(c) if c >= config.min_fossilize_contribution => {
            breakdown.fossilize_shaping = (config.fossilize_base_bonus
                + config.fossilize_contribution_scale * c)
                * legitimacy;
            breakdown.fossilize_bonus = config.fossilize_bonus_scale
                * (1.0 / config.fossilize_quality_ceiling).tanh()
                * legitimacy;
        }
        _ => breakdown.fossilize_shaping = config.fossilize_noncontributing_penalty,
    }
}

/// Prune shaping.
fn prune_shaping(config: &RewardConfig, inputs: &RewardInputs) -> f64 {
    let Some(seed) = &inputs.seed else {
        return config.prune_no_seed_penalty;
    };
    if seed.stage == SeedStage::Fossilized || !inputs.op_succeeded {
        return config.prune_invalid_penalty;
    }
    if seed.age_epochs < config.min_prune_age {
        let missing = config.min_prune_age.saturating_sub(seed.age_epochs);
        return config.prune_young_penalty_per_epoch * f64::from(missing);
    }
    match seed.contribution {
        None => 0.0,
        Some(c) if c < config.prune_hurting_threshold => {
            if seed.age_epochs < config.min_prune_bonus_age {
                config.prune_young_hurting_penalty
            } else {
                config.prune_hurting_bonus
            }
        }
        Some(c) if c < 0.0 => config.prune_acceptable_bonus,
        Some(c) => (config.prune_good_seed_penalty + config.prune_contribution_scale * c)
            .max(config.prune_good_seed_floor),
    }
}

/// The op's cost and its FOSSILIZE / PRUNE shaping.
fn op_shaping(
    config: &RewardConfig,
    inputs: &RewardInputs,
    clean_total: Option<f64>,
    breakdown: &mut RewardBreakdown,
) {
    match inputs.op {
        LifecycleOp::Wait => {}
        LifecycleOp::Germinate => {
            breakdown.op_cost = config.germinate_cost;
            if inputs.seed.is_some() {
                breakdown.op_cost += config.germinate_occupied_penalty;
            }
        }
        LifecycleOp::SetAlphaTarget => breakdown.op_cost = config.set_alpha_target_cost,
        LifecycleOp::Prune => {
            breakdown.op_cost = config.prune_cost;
            breakdown.prune_shaping = prune_shaping(config, inputs);
        }
        LifecycleOp::Fossilize => {
            breakdown.op_cost = config.fossilize_cost;
            fossilize_shaping(config, inputs, clean_total, breakdown);
        }
        LifecycleOp::Advance => {
            if inputs
                .seed
                .is_some_and(|seed| seed.stage == SeedStage::Training)
            {
                breakdown.op_cost = config.advance_from_training_penalty;
            }
        }
    }
}

/// The SHAPED reward of validated inputs under a validated config, and
/// ESCROW's (SHAPED with the attribution in escrow).
pub(super) fn shaped_reward(config: &RewardConfig, inputs: &RewardInputs) -> RewardBreakdown {
    let mut breakdown = RewardBreakdown::zero(config.mode);
    let clean_total = inputs.resolved_clean_total();
    breakdown.clean_total = clean_total;

    let escrow = inputs
        .escrow
        .as_ref()
        .filter(|_| config.mode == RewardMode::Escrow);
    if let Some(escrow) = escrow {
        // An empty slot's credit (0 once the environment reset it) stays.
        breakdown.escrow_credit = escrow.credit;
    }
    if let Some(seed) = &inputs.seed {
        match escrow {
            Some(escrow) => {
                escrow_attribution(config, inputs, seed, clean_total, escrow, &mut breakdown);
            }
            None => attribution(config, inputs, seed, clean_total, &mut breakdown),
        }
        warnings(config, inputs.op, seed, clean_total, &mut breakdown);
        if breakdown.attribution_discount >= TRUSTED_DISCOUNT
            && breakdown.attribution + breakdown.ratio_penalty > 0.0
            && seed.interaction_sum > 0.0
        {
            breakdown.synergy =
                config.synergy_weight * (config.synergy_scale * seed.interaction_sum).tanh();
        }
    }

    if config.attribute_all_seeds {
        breakdown.other_attribution = other_attribution(config, inputs, clean_total);
    }

    let before = inputs.seed.as_ref().map(SeedFacts::point);
    let mut pbrs = pbrs_term(config, before, inputs.seed_after);
    if inputs.op == LifecycleOp::Germinate && inputs.seed.is_none() {
        pbrs = if inputs.terminal {
            0.0
        } else {
            pbrs * timing_discount(config, inputs.epoch)
        };
    }
    breakdown.pbrs = pbrs;

    rent_and_shock(config, inputs, &mut breakdown);
    let excess = inputs.occupied_slots.saturating_sub(config.free_slots);
    breakdown.occupancy = config.seed_occupancy_cost * f64::from(excess);
    breakdown.fossil_maintenance =
        config.fossilized_maintenance_cost * f64::from(inputs.fossil_count);
    if inputs.germination_offered && inputs.op != LifecycleOp::Germinate && !inputs.terminal {
        breakdown.germination_delay = config.germination_delay_cost;
    }
    if let Some(previous) = inputs.previous_val_acc {
        breakdown.accuracy_delta = config.accuracy_delta_weight * (inputs.val_acc - previous);
        if let Some((twin, Some(previous_twin))) = inputs.twin_val_acc {
            breakdown.twin_delta =
                config.twin_delta_weight * ((inputs.val_acc - previous) - (twin - previous_twin));
        }
    }
    op_shaping(config, inputs, clean_total, &mut breakdown);
    breakdown.auto_prune = super::episode::auto_prune_penalty(config, inputs.auto_prunes);
    if inputs.terminal {
        breakdown.terminal = config.terminal_acc_weight * inputs.val_acc;
        if let Some(escrow) = escrow {
            breakdown.escrow_forfeit = escrow_forfeit(inputs, escrow, breakdown.escrow_credit);
        }
    }
    breakdown.total = breakdown.component_sum();
    breakdown
}
