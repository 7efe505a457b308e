//! What the reward of one environment step reads: [`RewardInputs`], with the
//! targeted seed's facts ([`SeedFacts`]) and every slot's rent and shock
//! inputs ([`SlotFacts`]); plain numbers gathered at the epoch boundary.
//!
//! Timing, which the PBRS telescoping depends on: [`RewardInputs::seed`] is
//! the targeted slot as the policy observed it when it chose the op (before
//! the op ran), and [`RewardInputs::seed_after`] is that slot as the next
//! observation will show it (after the op and the epoch's lifecycle tick).
//! Taken this way, one step's `seed_after` is the next step's `seed` for the
//! same slot, which is what makes the shaping telescope. Every rule that
//! looks at "the seed's stage" reads the stage when the op was chosen.
//!
//! [`RewardInputs::validate`] refuses non-finite values and values out of
//! their contract range (accuracies in `[0, 100]` percent, differences in
//! `[-100, 100]` points, alphas in `[0, 1]`) with [`Error::InvalidInput`]
//! naming the field.

use leyline::codec::{MAX_ABS_PERCENTAGE_POINTS, MAX_ACCURACY_PERCENT};
use leyline::{LifecycleOp, SeedStage};

use super::pbrs::StagePoint;
use crate::{Error, Result};

/// The targeted slot's seed when the op was chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeedFacts {
    /// Its stage.
    pub stage: SeedStage,
    /// Epochs spent in that stage. In HOLDING, the epochs waited are
    /// `epochs_in_stage − 1` (the first HOLDING epoch is not waiting).
    pub epochs_in_stage: u32,
    /// Epochs since germination (Kasmina's `epochs_total`); the seed was
    /// germinated at epoch `epoch − age_epochs`.
    pub age_epochs: u32,
    /// Counterfactual contribution `c` = validation accuracy − accuracy with
    /// this slot's alpha forced to 0, in percentage points; `None` when not
    /// measured this epoch.
    pub contribution: Option<f64>,
    /// Progress since germination: validation accuracy now − at
    /// germination, in percentage points.
    pub progress: f64,
    /// Validation accuracy now − at the start of the current stage, in
    /// percentage points (the proxy when `c` is missing).
    pub stage_improvement: f64,
    /// Sum of the seed's pairwise interaction terms with the other seeds
    /// (counterfactual `I_ij`), in percentage points.
    pub interaction_sum: f64,
}

impl SeedFacts {
    /// Refuses non-finite values and differences outside `[-100, 100]`
    /// points, naming the field from `fields`.
    fn validate(&self, fields: &SeedFields) -> Result<()> {
        if let Some(contribution) = self.contribution {
            points(fields.contribution, contribution)?;
        }
        points(fields.progress, self.progress)?;
        points(fields.stage_improvement, self.stage_improvement)?;
        finite(fields.interaction_sum, self.interaction_sum)
    }

    /// The seed's lifecycle position, as the potential sees it.
    pub fn point(&self) -> StagePoint {
        StagePoint {
            stage: self.stage,
            epochs_in_stage: self.epochs_in_stage,
        }
    }
}

/// The field names a [`SeedFacts`] check reports.
struct SeedFields {
    contribution: &'static str,
    progress: &'static str,
    stage_improvement: &'static str,
    interaction_sum: &'static str,
}

/// [`RewardInputs::seed`]'s field names.
const TARGETED_SEED: SeedFields = SeedFields {
    contribution: "RewardInputs.seed.contribution",
    progress: "RewardInputs.seed.progress",
    stage_improvement: "RewardInputs.seed.stage_improvement",
    interaction_sum: "RewardInputs.seed.interaction_sum",
};

/// [`RewardInputs::other_seeds`]' field names.
const OTHER_SEEDS: SeedFields = SeedFields {
    contribution: "RewardInputs.other_seeds.contribution",
    progress: "RewardInputs.other_seeds.progress",
    stage_improvement: "RewardInputs.other_seeds.stage_improvement",
    interaction_sum: "RewardInputs.other_seeds.interaction_sum",
};

/// One slot's rent and alpha-shock inputs (every enabled slot, not only the
/// targeted one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotFacts {
    /// The stage of the seed in the slot after the op; `None` when empty.
    /// Rent is charged from BLENDING on (BLENDING, HOLDING, FOSSILIZED).
    pub stage: Option<SeedStage>,
    /// The slot's alpha after the op (0 when it holds no active seed).
    pub alpha: f64,
    /// The seed's trainable parameters, gate network included (0 when
    /// empty).
    pub params: u64,
    /// The slot's alpha at the previous step (0 when it held no active
    /// seed then).
    pub previous_alpha: f64,
    /// The seed's parameters at the previous step (0 when it held no active
    /// seed then); the alpha shock weighs the alpha change with these.
    pub previous_params: u64,
}

/// Everything the reward of one environment step reads (see the module
/// docs for when each value is taken).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardInputs {
    /// The op as executed: an op that was invalid for its slot when it ran
    /// is executed, and rewarded, as WAIT (reference §3.2).
    pub op: LifecycleOp,
    /// Whether Kasmina carried the op out (a gate may refuse ADVANCE or
    /// FOSSILIZE). A refused FOSSILIZE or PRUNE is shaped as invalid.
    pub op_succeeded: bool,
    /// The targeted slot's seed when the op was chosen; `None` for an empty
    /// slot.
    pub seed: Option<SeedFacts>,
    /// The targeted slot as the next observation shows it; `None` when
    /// empty.
    pub seed_after: Option<StagePoint>,
    /// The seeds of the other slots when the op was chosen (the live and
    /// fossilised ones; empty slots left out), in slot order. Only
    /// [`crate::rewards::RewardConfig::attribute_all_seeds`] reads them, and
    /// the environments fill them only while it is on.
    pub other_seeds: Vec<SeedFacts>,
    /// Validation accuracy of the epoch, percent.
    pub val_acc: f64,
    /// The validation accuracy of the episode's previous step, percent
    /// (`None` at its first step): what the accuracy-delta term pays
    /// against.
    pub previous_val_acc: Option<f64>,
    /// The twin's validation accuracy at this epoch and at the episode's
    /// previous step, percent (`None` without a twin, and the previous one
    /// at the first step): what the twin-delta term pays against
    /// ([`crate::rewards::RewardConfig::twin_delta_weight`]).
    pub twin_val_acc: Option<(f64, Option<f64>)>,
    /// Clean total `T` = validation accuracy − accuracy with every seed
    /// off, in percentage points; `None` when all-off was not measured.
    pub clean_total: Option<f64>,
    /// Accuracy with each active slot's alpha forced to 0 (one entry per
    /// solo-off configuration), percent. When `clean_total` is `None`,
    /// `T = val_acc − min(these)` stands in for it (reference §4.4); with
    /// neither, `T` is unknown and the rules that need it do not fire.
    pub solo_off_accuracies: Vec<f64>,
    /// The host's trainable parameters.
    pub host_params: u64,
    /// Every enabled slot's rent and shock inputs.
    pub slots: Vec<SlotFacts>,
    /// Slots holding a live or fossilised seed (the occupancy rent).
    pub occupied_slots: u32,
    /// Fossilised seeds (at most `occupied_slots`).
    pub fossil_count: u32,
    /// Accuracy with only the fossils on ("committed"), percent; SPARSE and
    /// MINIMAL need it at the terminal step.
    pub committed_val_acc: Option<f64>,
    /// Trainable parameters of the fossilised seeds (SPARSE's cost).
    pub fossil_params: u64,
    /// Seeds the environment pruned on its own this step (governor, auto
    /// prune); each costs [`crate::rewards::RewardConfig::auto_prune_penalty`].
    pub auto_prunes: u32,
    /// GERMINATE was valid when the op was chosen (an empty slot, under the
    /// seed limit, no seed developing); read by the germination delay cost.
    pub germination_offered: bool,
    /// The epoch of this step, `1..=max_epochs`.
    pub epoch: u32,
    /// The episode's length in epochs.
    pub max_epochs: u32,
    /// Whether this is the episode's last step (terminal bonus, SPARSE).
    pub terminal: bool,
    /// ESCROW's inputs (`None` under the other modes; ESCROW refuses
    /// `None`).
    pub escrow: Option<EscrowInputs>,
}

/// What ESCROW reads beside the SHAPED inputs: the environment keeps one
/// credit per slot (reset to 0 when the slot holds no live or fossilized
/// seed) and the episode's recent validation accuracies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EscrowInputs {
    /// The lowest validation accuracy of the last
    /// [`crate::rewards::RewardConfig::escrow_stable_window`] epochs, this
    /// one included, percent: the accuracy progress is measured at.
    pub stable_val_acc: f64,
    /// The targeted slot's credit before this step.
    pub credit: f64,
    /// The credits of the other slots whose seed is live and not
    /// fossilized after the op, summed: what the terminal step forfeits
    /// beside the targeted slot's own.
    pub others_at_risk: f64,
}

impl Default for RewardInputs {
    /// WAIT on an empty slot at epoch 0 of 1 with nothing measured: a base
    /// for struct-update syntax.
    fn default() -> Self {
        RewardInputs {
            op: LifecycleOp::Wait,
            op_succeeded: true,
            seed: None,
            seed_after: None,
            other_seeds: Vec::new(),
            val_acc: 0.0,
            previous_val_acc: None,
            twin_val_acc: None,
            clean_total: None,
            solo_off_accuracies: Vec::new(),
            host_params: 0,
            slots: Vec::new(),
            occupied_slots: 0,
            fossil_count: 0,
            committed_val_acc: None,
            fossil_params: 0,
            auto_prunes: 0,
            germination_offered: false,
            epoch: 0,
            max_epochs: 1,
            terminal: false,
            escrow: None,
        }
    }
}

fn in_range(field: &'static str, value: f64, low: f64, high: f64) -> Result<()> {
    if value.is_finite() && (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidInput {
            field,
            reason: format!("{value} is not a finite number in [{low}, {high}]"),
        })
    }
}

fn accuracy(field: &'static str, value: f64) -> Result<()> {
    in_range(field, value, 0.0, MAX_ACCURACY_PERCENT)
}

fn points(field: &'static str, value: f64) -> Result<()> {
    in_range(
        field,
        value,
        -MAX_ABS_PERCENTAGE_POINTS,
        MAX_ABS_PERCENTAGE_POINTS,
    )
}

fn finite(field: &'static str, value: f64) -> Result<()> {
    in_range(field, value, f64::MIN, f64::MAX)
}

impl RewardInputs {
    /// Checks the inputs (see the module docs): finite values in their
    /// ranges, `1 <= max_epochs`, `epoch <= max_epochs`,
    /// `fossil_count <= occupied_slots`.
    pub fn validate(&self) -> Result<()> {
        accuracy("RewardInputs.val_acc", self.val_acc)?;
        if let Some(total) = self.clean_total {
            points("RewardInputs.clean_total", total)?;
        }
        for &solo_off in &self.solo_off_accuracies {
            accuracy("RewardInputs.solo_off_accuracies", solo_off)?;
        }
        if let Some(previous) = self.previous_val_acc {
            accuracy("RewardInputs.previous_val_acc", previous)?;
        }
        if let Some((twin, previous)) = self.twin_val_acc {
            accuracy("RewardInputs.twin_val_acc", twin)?;
            if let Some(previous) = previous {
                accuracy("RewardInputs.twin_val_acc", previous)?;
            }
        }
        if let Some(committed) = self.committed_val_acc {
            accuracy("RewardInputs.committed_val_acc", committed)?;
        }
        if let Some(seed) = &self.seed {
            seed.validate(&TARGETED_SEED)?;
        }
        for seed in &self.other_seeds {
            seed.validate(&OTHER_SEEDS)?;
        }
        for slot in &self.slots {
            in_range("RewardInputs.slots.alpha", slot.alpha, 0.0, 1.0)?;
            in_range(
                "RewardInputs.slots.previous_alpha",
                slot.previous_alpha,
                0.0,
                1.0,
            )?;
        }
        if self.max_epochs == 0 {
            return Err(Error::InvalidInput {
                field: "RewardInputs.max_epochs",
                reason: "must be at least 1".to_owned(),
            });
        }
        if self.epoch > self.max_epochs {
            return Err(Error::InvalidInput {
                field: "RewardInputs.epoch",
                reason: format!("{} is beyond max_epochs {}", self.epoch, self.max_epochs),
            });
        }
        if let Some(escrow) = &self.escrow {
            accuracy("RewardInputs.escrow.stable_val_acc", escrow.stable_val_acc)?;
            finite("RewardInputs.escrow.credit", escrow.credit)?;
            finite("RewardInputs.escrow.others_at_risk", escrow.others_at_risk)?;
        }
        if self.fossil_count > self.occupied_slots {
            return Err(Error::InvalidInput {
                field: "RewardInputs.fossil_count",
                reason: format!(
                    "{} fossils in {} occupied slots",
                    self.fossil_count, self.occupied_slots
                ),
            });
        }
        Ok(())
    }

    /// The clean total `T` the rules use: [`RewardInputs::clean_total`] when
    /// measured, else `val_acc − min(solo_off_accuracies)`, else `None`.
    pub fn resolved_clean_total(&self) -> Option<f64> {
        self.clean_total.or_else(|| {
            self.solo_off_accuracies
                .iter()
                .copied()
                .reduce(f64::min)
                .map(|lowest| self.val_acc - lowest)
        })
    }
}
