//! Decision analytics of a round: how each environment's episode ended
//! ([`EpisodeOutcome`], reference §6.3's `EPISODE_OUTCOME`), what the
//! controller chose over all of them ([`ActionDistribution`], the
//! `ANALYTICS_SNAPSHOT` of kind `action_distribution`), and the steps whose
//! reward matched an anti-gaming pattern ([`RewardHackingSuspicion`],
//! `REWARD_HACKING_SUSPECTED`).
//!
//! Everything here is counted on the host from what the round already
//! holds at its boundaries (the one action readback per step, the lifecycle
//! results Kasmina returns): no extra readback.

use std::collections::BTreeMap;

use leyline::{EPISODE_SUCCESS_ACCURACY, LifecycleOp};

/// Lifecycle ops, for the per-op count arrays (indexed by the op's contract
/// value).
pub const NUM_OPS: usize = LifecycleOp::ALL.len();

/// How an environment's episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// It ran to its last epoch with a final accuracy at or above
    /// [`EPISODE_SUCCESS_ACCURACY`].
    Success,
    /// It ran to its last epoch below that accuracy (the reference's name).
    Timeout,
    /// The governor rolled the model back and ended the episode early.
    Rollback,
}

impl OutcomeKind {
    /// The label in telemetry (`success`, `timeout`, `rollback`).
    pub fn name(self) -> &'static str {
        match self {
            OutcomeKind::Success => "success",
            OutcomeKind::Timeout => "timeout",
            OutcomeKind::Rollback => "rollback",
        }
    }

    /// The outcome of an episode that ended with `final_accuracy` percent,
    /// early by a rollback or not.
    pub fn of(final_accuracy: f64, rolled_back: bool) -> OutcomeKind {
        if rolled_back {
            OutcomeKind::Rollback
        } else if final_accuracy >= EPISODE_SUCCESS_ACCURACY {
            OutcomeKind::Success
        } else {
            OutcomeKind::Timeout
        }
    }
}

/// Per-op counts, indexed by [`LifecycleOp::value`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts(pub [u64; NUM_OPS]);

impl OpCounts {
    /// Counts one `op`.
    pub fn add(&mut self, op: LifecycleOp) {
        if let Some(count) = usize::try_from(op.value())
            .ok()
            .and_then(|index| self.0.get_mut(index))
        {
            *count = count.saturating_add(1);
        }
    }

    /// The count of `op`.
    pub fn get(&self, op: LifecycleOp) -> u64 {
        usize::try_from(op.value())
            .ok()
            .and_then(|index| self.0.get(index))
            .copied()
            .unwrap_or(0)
    }

    /// All ops counted.
    pub fn total(&self) -> u64 {
        self.0
            .iter()
            .fold(0_u64, |sum, &count| sum.saturating_add(count))
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &OpCounts) {
        for (count, &more) in self.0.iter_mut().zip(&other.0) {
            *count = count.saturating_add(more);
        }
    }

    /// `WAIT=3,GERMINATE=1,…` in contract order, every op named.
    pub fn to_attribute(&self) -> String {
        LifecycleOp::ALL
            .iter()
            .map(|&op| format!("{}={}", op.name(), self.get(op)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What one environment's episode did and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeOutcome {
    /// The environment's index in the round.
    pub env: usize,
    /// How the episode ended.
    pub kind: OutcomeKind,
    /// Final validation accuracy, percent.
    pub final_accuracy: f64,
    /// The episode's summed raw reward (before normalisation).
    pub episode_reward: f64,
    /// Steps with a transition (epochs the controller decided on).
    pub steps: u64,
    /// Steps where the masks left the op head one choice (forced WAIT).
    pub forced_steps: u64,
    /// The op the policy chose, per op.
    pub chosen: OpCounts,
    /// The op carried out and counted by the reward (a choice Kasmina
    /// refused counts as WAIT; a failed gate as its op), per op.
    pub executed: OpCounts,
    /// Blueprints germinated, by registry name.
    pub germinated: BTreeMap<&'static str, u64>,
    /// Seeds fossilized in the episode.
    pub fossilizations: u64,
    /// Seeds pruned in the episode.
    pub prunes: u64,
    /// Fossilized seeds in the model at the end.
    pub fossils: u32,
    /// (host parameters + fossilized seeds' parameters) / host parameters
    /// at the end (1 without fossils).
    pub param_ratio: f64,
    /// The episode epoch by epoch: metrics, every slot after the boundary,
    /// the op carried out (what `esper train --controller ppo` draws as
    /// the seeds' lifecycles of an episode).
    pub trace: Vec<TraceEpoch>,
}

/// One epoch of an episode's [`EpisodeOutcome::trace`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEpoch {
    /// Zero-based epoch.
    pub epoch: usize,
    /// Training loss and accuracy (percent) the controller saw.
    pub train: (f64, f64),
    /// Validation loss and accuracy (percent) the controller saw.
    pub validation: (f64, f64),
    /// Every enabled slot after the epoch's boundary, in execution order.
    pub slots: Vec<TraceSlot>,
    /// The op carried out (a choice Kasmina refused counts as WAIT).
    pub op: LifecycleOp,
    /// The slot the action targeted (`None` for WAIT).
    pub slot: Option<String>,
    /// The blueprint germinated, if the op germinated one.
    pub blueprint: Option<&'static str>,
    /// Whether the op succeeded (a gate passed, a prune removed the seed).
    pub succeeded: bool,
    /// Active seeds after the boundary.
    pub active_seeds: usize,
}

/// One slot of a [`TraceEpoch`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSlot {
    /// Slot id, e.g. `r0c1`.
    pub slot: String,
    /// The seed's stage (`DORMANT` for an empty slot).
    pub stage: leyline::SeedStage,
    /// Blend alpha in `[0, 1]`.
    pub alpha: f64,
    /// The seed's blueprint, if any.
    pub blueprint: Option<String>,
    /// The seed's id, if any.
    pub seed_id: Option<String>,
}

impl TraceSlot {
    /// Every enabled slot of `model`, in execution order.
    pub fn of(model: &kasmina::model::MorphogeneticModel) -> Vec<TraceSlot> {
        model
            .slots()
            .iter()
            .map(|slot| TraceSlot {
                slot: slot.id().to_string(),
                stage: slot.stage().unwrap_or(leyline::SeedStage::Dormant),
                alpha: slot.alpha(),
                blueprint: slot
                    .state()
                    .map(|state| state.blueprint().name().to_owned()),
                seed_id: slot.state().map(|state| state.seed_id().to_owned()),
            })
            .collect()
    }
}

impl EpisodeOutcome {
    /// An empty record for environment `env`.
    pub fn new(env: usize) -> EpisodeOutcome {
        EpisodeOutcome {
            env,
            kind: OutcomeKind::Timeout,
            final_accuracy: 0.0,
            episode_reward: 0.0,
            steps: 0,
            forced_steps: 0,
            chosen: OpCounts::default(),
            executed: OpCounts::default(),
            germinated: BTreeMap::new(),
            fossilizations: 0,
            prunes: 0,
            fossils: 0,
            param_ratio: 1.0,
            trace: Vec::new(),
        }
    }

    /// Notes one step: the op chosen, the op carried out (with the
    /// blueprint's registry name, when a germination was carried out) and
    /// whether the step was forced.
    pub fn record_step(
        &mut self,
        chosen: LifecycleOp,
        executed: LifecycleOp,
        blueprint: Option<&'static str>,
        forced: bool,
    ) {
        self.steps = self.steps.saturating_add(1);
        if forced {
            self.forced_steps = self.forced_steps.saturating_add(1);
        }
        self.chosen.add(chosen);
        self.executed.add(executed);
        if let Some(blueprint) = blueprint {
            let count = self.germinated.entry(blueprint).or_insert(0);
            *count = count.saturating_add(1);
        }
    }

    /// Closes the record: accuracy, reward, the model's fossils and
    /// parameter ratio, and the outcome.
    pub fn finish(
        &mut self,
        final_accuracy: f64,
        episode_reward: f64,
        rolled_back: bool,
        fossils: u32,
        host_params: u64,
        fossil_params: u64,
    ) {
        self.final_accuracy = final_accuracy;
        self.episode_reward = episode_reward;
        self.fossils = fossils;
        self.param_ratio = if host_params == 0 {
            1.0
        } else {
            host_params.saturating_add(fossil_params) as f64 / host_params as f64
        };
        self.kind = OutcomeKind::of(final_accuracy, rolled_back);
    }

    /// The `simic.episode.outcome` event's attributes.
    pub fn attributes(&self, round: u64) -> Vec<(String, String)> {
        let mut attributes = vec![
            ("round".to_owned(), round.to_string()),
            ("env".to_owned(), self.env.to_string()),
            ("outcome".to_owned(), self.kind.name().to_owned()),
            ("final_accuracy".to_owned(), self.final_accuracy.to_string()),
            ("episode_reward".to_owned(), self.episode_reward.to_string()),
            ("steps".to_owned(), self.steps.to_string()),
            ("forced_steps".to_owned(), self.forced_steps.to_string()),
            ("fossilizations".to_owned(), self.fossilizations.to_string()),
            ("prunes".to_owned(), self.prunes.to_string()),
            ("fossils".to_owned(), self.fossils.to_string()),
            ("param_ratio".to_owned(), self.param_ratio.to_string()),
            ("chosen_ops".to_owned(), self.chosen.to_attribute()),
            ("executed_ops".to_owned(), self.executed.to_attribute()),
        ];
        attributes.push((
            "germinated".to_owned(),
            blueprint_attribute(&self.germinated),
        ));
        attributes
    }
}

/// `conv_light=2,norm=1` (names in order; empty when none).
fn blueprint_attribute(counts: &BTreeMap<&'static str, u64>) -> String {
    counts
        .iter()
        .map(|(name, count)| format!("{name}={count}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The round's decisions summed over its environments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionDistribution {
    /// Steps decided on.
    pub steps: u64,
    /// Steps with one op allowed.
    pub forced_steps: u64,
    /// Ops chosen by the policy.
    pub chosen: OpCounts,
    /// Ops carried out.
    pub executed: OpCounts,
    /// Blueprints germinated, by registry name.
    pub germinated: BTreeMap<&'static str, u64>,
    /// Episodes per outcome label.
    pub outcomes: BTreeMap<&'static str, u64>,
}

impl ActionDistribution {
    /// The sum of `outcomes`.
    pub fn of(outcomes: &[EpisodeOutcome]) -> ActionDistribution {
        let mut total = ActionDistribution::default();
        for outcome in outcomes {
            total.steps = total.steps.saturating_add(outcome.steps);
            total.forced_steps = total.forced_steps.saturating_add(outcome.forced_steps);
            total.chosen.merge(&outcome.chosen);
            total.executed.merge(&outcome.executed);
            for (&name, &count) in &outcome.germinated {
                let entry = total.germinated.entry(name).or_insert(0);
                *entry = entry.saturating_add(count);
            }
            let entry = total.outcomes.entry(outcome.kind.name()).or_insert(0);
            *entry = entry.saturating_add(1);
        }
        total
    }

    /// Fraction of the decided steps on which the policy chose `op` (0
    /// without steps).
    pub fn chosen_fraction(&self, op: LifecycleOp) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.chosen.get(op) as f64 / self.steps as f64
        }
    }

    /// The `simic.analytics.action_distribution` event's attributes.
    pub fn attributes(&self, round: u64) -> Vec<(String, String)> {
        let mut attributes = vec![
            ("round".to_owned(), round.to_string()),
            ("kind".to_owned(), "action_distribution".to_owned()),
            ("steps".to_owned(), self.steps.to_string()),
            ("forced_steps".to_owned(), self.forced_steps.to_string()),
            ("chosen_ops".to_owned(), self.chosen.to_attribute()),
            ("executed_ops".to_owned(), self.executed.to_attribute()),
            (
                "germinated".to_owned(),
                blueprint_attribute(&self.germinated),
            ),
        ];
        let outcomes = self
            .outcomes
            .iter()
            .map(|(name, count)| format!("{name}={count}"))
            .collect::<Vec<_>>()
            .join(",");
        attributes.push(("outcomes".to_owned(), outcomes));
        attributes
    }
}

/// A step whose reward matched one of the reward's anti-gaming patterns
/// (reference §4.4 and §6.3's `REWARD_HACKING_SUSPECTED`): the reward
/// already penalised it; this says that it happened, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardHackingSuspicion {
    /// The environment.
    pub env: usize,
    /// The step (epoch of the episode, from 0).
    pub step: usize,
    /// The targeted slot.
    pub slot: kasmina::host::SlotId,
    /// `attribution_ratio` (a contribution out of proportion to the clean
    /// total) or `ransomware_signature` (fossilizing a seed that
    /// contributes while the model without seeds would do better).
    pub pattern: &'static str,
    /// The targeted seed's counterfactual contribution, points.
    pub contribution: Option<f64>,
    /// The clean total `T` the reward used, points.
    pub clean_total: Option<f64>,
    /// The penalty the pattern cost (≤ 0).
    pub penalty: f64,
}

impl RewardHackingSuspicion {
    /// The patterns `breakdown` shows for this step (none, one or both).
    pub fn of(
        env: usize,
        step: usize,
        slot: kasmina::host::SlotId,
        contribution: Option<f64>,
        breakdown: &crate::rewards::RewardBreakdown,
    ) -> Vec<RewardHackingSuspicion> {
        let suspicion = |pattern, penalty| RewardHackingSuspicion {
            env,
            step,
            slot,
            pattern,
            contribution,
            clean_total: breakdown.clean_total,
            penalty,
        };
        let mut found = Vec::new();
        let ratio_penalty = breakdown.ratio_penalty + breakdown.escrow_ratio_penalty;
        if ratio_penalty < 0.0 {
            found.push(suspicion("attribution_ratio", ratio_penalty));
        }
        if breakdown.ransomware_signature {
            found.push(suspicion(
                "ransomware_signature",
                breakdown.fossilize_shaping,
            ));
        }
        found
    }

    /// The `simic.reward.hacking_suspected` event's attributes.
    pub fn attributes(&self, round: u64) -> Vec<(String, String)> {
        let optional =
            |value: Option<f64>| value.map_or_else(|| "none".to_owned(), |v| v.to_string());
        vec![
            ("round".to_owned(), round.to_string()),
            ("env".to_owned(), self.env.to_string()),
            ("step".to_owned(), self.step.to_string()),
            ("slot".to_owned(), self.slot.to_string()),
            ("pattern".to_owned(), self.pattern.to_owned()),
            ("contribution".to_owned(), optional(self.contribution)),
            ("clean_total".to_owned(), optional(self.clean_total)),
            ("penalty".to_owned(), self.penalty.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leyline::BlueprintAction;

    #[test]
    fn reward_hacking_patterns_come_from_the_breakdown() {
        use crate::rewards::{RewardBreakdown, RewardMode};
        let slot = kasmina::host::SlotId::parse("r0c1").expect("slot");
        let clean = RewardBreakdown::zero(RewardMode::Shaped);
        assert!(RewardHackingSuspicion::of(0, 3, slot, Some(1.0), &clean).is_empty());
        let gamed = RewardBreakdown {
            ratio_penalty: -0.2,
            ransomware_signature: true,
            fossilize_shaping: -1.2,
            clean_total: Some(-2.0),
            ..clean
        };
        let found = RewardHackingSuspicion::of(1, 7, slot, Some(5.0), &gamed);
        let patterns: Vec<&str> = found.iter().map(|s| s.pattern).collect();
        assert_eq!(patterns, ["attribution_ratio", "ransomware_signature"]);
        assert_eq!(found[0].penalty, -0.2);
        assert_eq!(found[1].penalty, -1.2);
        let attributes: BTreeMap<String, String> = found[1].attributes(2).into_iter().collect();
        assert_eq!(attributes["slot"], "r0c1");
        assert_eq!(attributes["clean_total"], "-2");
        assert_eq!(attributes["step"], "7");
    }

    #[test]
    fn outcome_labels_follow_the_success_threshold_and_rollbacks() {
        assert_eq!(OutcomeKind::of(80.0, false), OutcomeKind::Success);
        assert_eq!(OutcomeKind::of(79.99, false), OutcomeKind::Timeout);
        assert_eq!(OutcomeKind::of(95.0, true), OutcomeKind::Rollback);
    }

    #[test]
    fn steps_are_counted_per_op_and_summed_over_episodes() {
        let mut first = EpisodeOutcome::new(0);
        first.record_step(LifecycleOp::Wait, LifecycleOp::Wait, None, true);
        first.record_step(
            LifecycleOp::Germinate,
            LifecycleOp::Germinate,
            Some(BlueprintAction::ConvLight.blueprint_id()),
            false,
        );
        // A refused prune is carried out as WAIT.
        first.record_step(LifecycleOp::Prune, LifecycleOp::Wait, None, false);
        first.finish(81.5, 2.5, false, 1, 1_000, 250);
        assert_eq!(first.steps, 3);
        assert_eq!(first.forced_steps, 1);
        assert_eq!(first.chosen.get(LifecycleOp::Prune), 1);
        assert_eq!(first.executed.get(LifecycleOp::Prune), 0);
        assert_eq!(first.executed.get(LifecycleOp::Wait), 2);
        assert_eq!(first.kind, OutcomeKind::Success);
        assert!((first.param_ratio - 1.25).abs() < 1e-12);

        let mut second = EpisodeOutcome::new(1);
        second.record_step(
            LifecycleOp::Germinate,
            LifecycleOp::Germinate,
            Some(BlueprintAction::ConvLight.blueprint_id()),
            false,
        );
        second.finish(60.0, -10.0, true, 0, 1_000, 0);
        assert_eq!(second.kind, OutcomeKind::Rollback);
        assert_eq!(second.param_ratio, 1.0);

        let total = ActionDistribution::of(&[first.clone(), second]);
        assert_eq!(total.steps, 4);
        assert_eq!(total.chosen.get(LifecycleOp::Germinate), 2);
        assert_eq!(total.chosen.total(), 4);
        assert_eq!(total.germinated.get("conv_light"), Some(&2));
        assert_eq!(total.outcomes.get("success"), Some(&1));
        assert_eq!(total.outcomes.get("rollback"), Some(&1));
        assert!((total.chosen_fraction(LifecycleOp::Germinate) - 0.5).abs() < 1e-12);

        let attributes: BTreeMap<String, String> = first.attributes(7).into_iter().collect();
        assert_eq!(attributes["outcome"], "success");
        assert_eq!(
            attributes["chosen_ops"],
            "WAIT=1,GERMINATE=1,SET_ALPHA_TARGET=0,PRUNE=1,FOSSILIZE=0,ADVANCE=0"
        );
        assert_eq!(attributes["germinated"], "conv_light=1");
    }
}
