//! `--max-seeds`: a controller wrapper that turns a GERMINATE into WAIT
//! (reason `max_seeds`) once the model holds that many seeds alive or
//! fossilized. Pruned seeds (PRUNED, EMBARGOED, RESETTING) do not count:
//! their slots come back once the embargo ends.
//!
//! It wraps any [`Controller`], so the PPO controller will get the same
//! limit; the decision is taken on the deadline's worker thread like the
//! wrapped controller's.

use leyline::LifecycleOp;
use tolaria::controller::{Controller, Decision, EpochObservation, seed_stage};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SeedBudget<C> {
    inner: C,
    max_seeds: usize,
}

impl<C: Controller> SeedBudget<C> {
    /// `inner`, allowed at most `max_seeds` seeds alive or fossilized.
    pub(crate) fn new(inner: C, max_seeds: usize) -> SeedBudget<C> {
        SeedBudget { inner, max_seeds }
    }
}

/// Seeds in `observation` that are alive or fossilized.
pub(crate) fn counted_seeds(observation: &EpochObservation) -> usize {
    observation
        .seeds
        .iter()
        .filter(|seed| seed_stage(seed).is_some_and(|stage| !stage.is_failure()))
        .count()
}

impl<C: Controller> Controller for SeedBudget<C> {
    fn decide(&mut self, observation: &EpochObservation) -> tolaria::Result<Decision> {
        let decision = self.inner.decide(observation)?;
        if decision.op == LifecycleOp::Germinate && counted_seeds(observation) >= self.max_seeds {
            return Ok(Decision::wait().because("max_seeds", 1.0));
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kasmina::host::SlotId;
    use leyline::proto::SeedState;
    use leyline::{BlueprintAction, SeedStage};
    use tolaria::controller::EpochMetrics;

    /// Always asks to germinate in r0c1.
    struct Eager;

    impl Controller for Eager {
        fn decide(&mut self, _: &EpochObservation) -> tolaria::Result<Decision> {
            Ok(Decision::germinate(
                SlotId::new(0, 1),
                BlueprintAction::ConvLight,
            ))
        }
    }

    fn observation(stages: &[SeedStage]) -> EpochObservation {
        let metrics = EpochMetrics {
            train_loss: 1.0,
            train_accuracy: 50.0,
            val_loss: 1.0,
            val_accuracy: 50.0,
        };
        let seeds = stages
            .iter()
            .map(|stage| SeedState {
                stage: stage.value(),
                ..SeedState::default()
            })
            .collect();
        EpochObservation::new(9, metrics, seeds, vec![SlotId::new(0, 1)]).expect("observation")
    }

    #[test]
    fn germination_waits_once_the_budget_is_spent() {
        let mut budget = SeedBudget::new(Eager, 1);
        let free = budget.decide(&observation(&[])).expect("decision");
        assert_eq!(free.op, LifecycleOp::Germinate);
        let pruned = budget
            .decide(&observation(&[SeedStage::Embargoed]))
            .expect("decision");
        assert_eq!(
            pruned.op,
            LifecycleOp::Germinate,
            "a pruned seed does not count"
        );
        let full = budget
            .decide(&observation(&[SeedStage::Fossilized]))
            .expect("decision");
        assert!(full.is_wait());
        assert_eq!(full.reason, "max_seeds");
        let none = SeedBudget::new(Eager, 0)
            .decide(&observation(&[]))
            .expect("decision");
        assert!(none.is_wait(), "--max-seeds 0 never germinates");
    }
}
