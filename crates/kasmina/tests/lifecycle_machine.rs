//! Property tests of the lifecycle state machine alone, without a tensor:
//! random operation sequences, fed hostile numbers from `leyline::testing`
//! mixed with sane ones, on a `kasmina::lifecycle::Lifecycle`.
//!
//! - Every stage sequence observed is a path in leyline's transition table:
//!   within each operation the stage-changed events chain from the stage
//!   before to the stage after through table moves only, and the state's
//!   history is a chain of table moves ending at the current stage.
//! - No non-finite input ever causes a transition: an operation carrying a
//!   NaN or an infinity is refused and leaves the state exactly as it was.
//! - FOSSILIZED is terminal; a held state is never UNKNOWN or DORMANT; alpha
//!   stays in `[0, 1]`; every stored metric is finite.

use std::collections::HashSet;

use kasmina::Error;
use kasmina::blueprint::Blueprint;
use kasmina::gate::{GateMode, GateThresholds, QualityGates};
use kasmina::host::{SlotId, Topology};
use kasmina::lifecycle::{GerminationOptions, Lifecycle, PruneInitiator, SlotConfig};
use leyline::testing::{extreme_f64, extreme_i64};
use leyline::{AlphaAlgorithm, AlphaCurve, SeedStage};
use leyline::{Collector, Telemetry};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{TestCaseError, TestRunner};

#[derive(Debug, Clone)]
enum Op {
    Germinate {
        blueprint: Blueprint,
        algorithm: AlphaAlgorithm,
        alpha_target: f64,
        steepness: f64,
        params: i64,
    },
    Advance(Option<SeedStage>),
    Step,
    Prune,
    SchedulePrune(u32, f64),
    SetAlpha(f64),
    Retarget(f64, u32, f64),
    Accuracy(f64, f64),
    Gradients(f64, f64, i64),
    Counterfactual(f64),
    Healthy(bool),
}

impl Op {
    /// The numbers this operation carries.
    fn numbers(&self) -> Vec<f64> {
        match self {
            Op::Germinate {
                alpha_target,
                steepness,
                ..
            } => vec![*alpha_target, *steepness],
            Op::SchedulePrune(_, steepness) => vec![*steepness],
            Op::SetAlpha(alpha) => vec![*alpha],
            Op::Retarget(target, _, steepness) => vec![*target, *steepness],
            Op::Accuracy(train, val) => vec![*train, *val],
            Op::Gradients(seed, host, _) => vec![*seed, *host],
            Op::Counterfactual(value) => vec![*value],
            Op::Advance(_) | Op::Step | Op::Prune | Op::Healthy(_) => Vec::new(),
        }
    }
}

/// Mostly sane values in `range`, sometimes anything (NaN, infinities,
/// extremes).
fn number(low: f64, high: f64) -> impl Strategy<Value = f64> {
    prop_oneof![4 => low..=high, 1 => extreme_f64()]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (
            prop::sample::select(Blueprint::CNN.to_vec()),
            prop::sample::select(AlphaAlgorithm::ALL.to_vec()),
            prop_oneof![4 => Just(1.0), 1 => number(0.0, 1.0)],
            prop_oneof![4 => Just(12.0), 1 => number(0.1, 60.0)],
            prop_oneof![4 => 0i64..100_000, 1 => extreme_i64()],
        )
            .prop_map(|(blueprint, algorithm, alpha_target, steepness, params)| Op::Germinate {
                blueprint,
                algorithm,
                alpha_target,
                steepness,
                params,
            }),
        5 => Just(Op::Advance(None)),
        1 => prop::sample::select(SeedStage::ALL.to_vec()).prop_map(|stage| Op::Advance(Some(stage))),
        7 => Just(Op::Step),
        1 => Just(Op::Prune),
        1 => ((0u32..4), number(0.1, 30.0)).prop_map(|(steps, steepness)| Op::SchedulePrune(steps, steepness)),
        1 => number(0.0, 1.0).prop_map(Op::SetAlpha),
        1 => (number(0.0, 1.0), 0u32..4, number(0.1, 30.0))
            .prop_map(|(target, steps, steepness)| Op::Retarget(target, steps, steepness)),
        2 => (number(0.0, 100.0), number(0.0, 100.0)).prop_map(|(train, val)| Op::Accuracy(train, val)),
        3 => (number(0.0, 10.0), number(0.0, 10.0), prop_oneof![4 => 0i64..1_000_000, 1 => extreme_i64()])
            .prop_map(|(seed, host, params)| Op::Gradients(seed, host, params)),
        2 => number(-5.0, 20.0).prop_map(Op::Counterfactual),
        1 => any::<bool>().prop_map(Op::Healthy),
    ]
}

fn apply(lifecycle: &mut Lifecycle, op: &Op) -> kasmina::Result<()> {
    match op.clone() {
        Op::Germinate {
            blueprint,
            algorithm,
            alpha_target,
            steepness,
            params,
        } => {
            let mut options = GerminationOptions::new("seed").with_algorithm(algorithm);
            options.alpha_target = alpha_target;
            options.blend_steepness = steepness;
            lifecycle.germinate(blueprint, &options, params)
        }
        Op::Advance(target) => lifecycle.advance_stage(target).map(|_| ()),
        Op::Step => lifecycle.step_epoch(),
        Op::Prune => lifecycle
            .prune("property", PruneInitiator::Policy)
            .map(|_| ()),
        Op::SchedulePrune(steps, steepness) => lifecycle
            .schedule_prune(steps, AlphaCurve::Sigmoid, steepness)
            .map(|_| ()),
        Op::SetAlpha(alpha) => lifecycle.set_alpha(alpha),
        Op::Retarget(target, steps, steepness) => {
            lifecycle.retarget_alpha(target, steps, AlphaCurve::Linear, steepness)
        }
        Op::Accuracy(train, val) => lifecycle.record_accuracy(train, val),
        Op::Gradients(seed, host, params) => lifecycle.record_gradient_norms(seed, host, params),
        Op::Counterfactual(value) => lifecycle.set_counterfactual_contribution(value),
        Op::Healthy(healthy) => lifecycle.set_healthy(healthy),
    }
}

fn expected_error(error: &Error) -> bool {
    matches!(
        error,
        Error::IllegalTransition { .. }
            | Error::InvalidTarget { .. }
            | Error::SlotOccupied { .. }
            | Error::NoSeed { .. }
            | Error::AlphaNotHold { .. }
            | Error::OutOfRange { .. }
            | Error::NonFinite { .. }
            | Error::GerminationRefused { .. }
    )
}

/// Where a lifecycle stands: DORMANT stands for "no state" (the table's
/// RESETTING -> DORMANT and DORMANT -> GERMINATED moves are the slot
/// emptying and germinating).
fn position(lifecycle: &Lifecycle) -> SeedStage {
    lifecycle.stage().unwrap_or(SeedStage::Dormant)
}

/// Runs `ops` on a fresh lifecycle, checking the invariants after each;
/// returns the stages visited.
fn run(ops: &[Op], config: SlotConfig) -> Result<HashSet<SeedStage>, TestCaseError> {
    let collector = Collector::new();
    let mut lifecycle = Lifecycle::new(
        SlotId::new(0, 0),
        Topology::Cnn,
        config,
        Telemetry::new(collector.clone()),
    )
    .expect("lifecycle");
    let mut visited = HashSet::new();
    for op in ops {
        let before_state = lifecycle.state().cloned();
        let before = position(&lifecycle);
        collector.clear();
        let result = apply(&mut lifecycle, op);
        let after = position(&lifecycle);
        if let Err(error) = &result {
            prop_assert!(
                expected_error(error),
                "{:?} failed unexpectedly: {}",
                op,
                error
            );
        }
        if op.numbers().iter().any(|value| !value.is_finite()) {
            prop_assert!(
                result.is_err(),
                "{:?} with a non-finite number was accepted",
                op
            );
            prop_assert_eq!(
                lifecycle.state().cloned(),
                before_state.clone(),
                "{:?} changed the state",
                op
            );
        }
        if result.is_err() {
            prop_assert_eq!(after, before, "a refused {:?} moved the stage", op);
        }
        // The stage changes of this op chain `before` to `after` through
        // table moves only.
        let mut at = before;
        for event in collector.events() {
            if event.name != leyline::telemetry::KASMINA_SEED_STAGE_CHANGED {
                continue;
            }
            let from = SeedStage::from_name(&event.attributes["from"]).expect("from");
            let to = SeedStage::from_name(&event.attributes["to"]).expect("to");
            prop_assert_eq!(from, at, "{:?}: a move not from the current stage", op);
            prop_assert!(from.can_transition_to(to), "{:?}: {} -> {}", op, from, to);
            at = to;
        }
        if before == SeedStage::Dormant && after == SeedStage::Germinated {
            // Germination: DORMANT -> GERMINATED is recorded in the history.
            at = SeedStage::Germinated;
        }
        prop_assert_eq!(
            at,
            after,
            "{:?}: the moves do not end where the state is",
            op
        );
        if before == SeedStage::Fossilized {
            prop_assert_eq!(after, SeedStage::Fossilized, "FOSSILIZED is terminal");
        }
        if let Some(state) = lifecycle.state() {
            let stage = state.stage();
            prop_assert!(stage != SeedStage::Unknown && stage != SeedStage::Dormant);
            prop_assert_eq!(lifecycle.holds_module(), !stage.is_failure());
            prop_assert!((0.0..=1.0).contains(&state.alpha()));
            let history: Vec<_> = state.history().iter().collect();
            for record in &history {
                prop_assert!(record.from.can_transition_to(record.to));
            }
            for pair in history.windows(2) {
                prop_assert_eq!(pair[0].to, pair[1].from, "history is a path");
            }
            prop_assert_eq!(history.last().map(|record| record.to), Some(stage));
            let metrics = state.metrics();
            let stored = [
                metrics.train_accuracy,
                metrics.val_accuracy,
                metrics.accuracy_at_stage_start,
                metrics.gradient_norm,
                metrics.gradient_ratio.unwrap_or(0.0),
                metrics.gradient_health.unwrap_or(0.0),
                metrics.counterfactual_contribution.unwrap_or(0.0),
            ];
            prop_assert!(
                stored.iter().all(|value| value.is_finite()),
                "{:?}",
                metrics
            );
            visited.insert(stage);
        } else {
            prop_assert!(!lifecycle.holds_module());
        }
    }
    Ok(visited)
}

fn config(mode: GateMode, auto: bool) -> SlotConfig {
    SlotConfig {
        gates: QualityGates {
            mode,
            thresholds: GateThresholds {
                min_stage_epochs: 2,
                ..GateThresholds::default()
            },
        },
        auto_forward_g1: auto,
        auto_forward_g2: auto,
        auto_forward_g3: auto,
        ..SlotConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lifecycle_sequences_walk_the_table_and_ignore_non_finite_input(
        ops in prop::collection::vec(op(), 1..64),
        strict in any::<bool>(),
        auto in any::<bool>(),
    ) {
        let mode = if strict { GateMode::Strict } else { GateMode::Permissive };
        run(&ops, config(mode, auto))?;
    }
}

/// Guards the property above against vacuity: the same generator, run
/// deterministically, reaches every stage a state can hold, and feeds
/// non-finite numbers.
#[test]
fn lifecycle_sequences_reach_every_stage() {
    let mut runner = TestRunner::deterministic();
    let strategy = prop::collection::vec(op(), 64..128);
    let mut visited = HashSet::new();
    let mut non_finite = 0usize;
    for round in 0..64 {
        let ops = strategy.new_tree(&mut runner).expect("tree").current();
        non_finite += ops
            .iter()
            .filter(|op| op.numbers().iter().any(|value| !value.is_finite()))
            .count();
        let config = config(GateMode::Permissive, round % 2 == 0);
        visited.extend(run(&ops, config).expect("invariants"));
    }
    for stage in SeedStage::ALL {
        if !matches!(stage, SeedStage::Unknown | SeedStage::Dormant) {
            assert!(visited.contains(stage), "{stage} never reached");
        }
    }
    assert!(
        non_finite > 100,
        "only {non_finite} operations carried a non-finite number"
    );
}
