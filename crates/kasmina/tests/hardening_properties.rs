//! Hostile-input property tests (issue 9): the lifecycle driven by
//! sequences of operations whose numbers come from `leyline::testing`, and
//! a sweep of the other public entry points (configs, gates, the alpha
//! controller, blueprint and slot-id lookups, blends, masks, prefetch).
//!
//! The lifecycle invariant: a call that received a non-finite number returns
//! an error and leaves the slot exactly as it was, so no stage ever
//! advances, fossilizes or prunes because of one; and after every call the
//! seed's state exports as a valid leyline message (all numbers finite).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{features, spec};
use kasmina::alpha::{AlphaController, curve_progress};
use kasmina::blend::{BlendAlpha, blend_add};
use kasmina::blueprint::Blueprint;
use kasmina::export::seed_state_message;
use kasmina::gate::{GateInputs, GateMode, GateThresholds, QualityGates};
use kasmina::host::{CnnHostConfig, SlotId, Topology, TransformerHostConfig};
use kasmina::lifecycle::{GerminationOptions, PruneInitiator, SlotConfig};
use kasmina::masks::{OwnerMask, ParamRange};
use kasmina::prefetch::{PrefetchConfig, Prefetcher};
use kasmina::slot::SeedSlot;
use kasmina::validate::{MAX_CHANNELS, MAX_LAYERS};
use leyline::Telemetry;
use leyline::testing::{
    extreme_f64, extreme_i64, extreme_u32, extreme_usize, hostile_string, non_finite_f64,
};
use leyline::{AlphaAlgorithm, AlphaCurve, AlphaMode, GateLevel, SeedStage};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestCaseError;
use tch::{Device, Kind, Tensor};

/// Mostly valid numbers in `[low, high]`, often hostile ones.
fn number(low: f64, high: f64) -> impl Strategy<Value = f64> {
    prop_oneof![3 => low..=high, 2 => extreme_f64()]
}

/// Alpha values and targets: often exactly 1 (G3 needs a full target),
/// otherwise anything in `[0, 1]` or hostile.
fn alpha_value() -> impl Strategy<Value = f64> {
    prop_oneof![2 => Just(1.0), 3 => number(0.0, 1.0)]
}

/// Host parameter counts: mostly plausible, sometimes hostile.
fn host_params() -> impl Strategy<Value = i64> {
    prop_oneof![3 => 1i64..100_000, 1 => extreme_i64()]
}

fn curve() -> impl Strategy<Value = AlphaCurve> {
    prop::sample::select(AlphaCurve::ALL.to_vec())
}

#[derive(Debug, Clone)]
enum Op {
    Germinate {
        target: f64,
        steepness: f64,
        tempo: u32,
        algorithm: AlphaAlgorithm,
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
    /// Whether the op received a non-finite number.
    fn non_finite(&self) -> bool {
        let bad = |values: &[f64]| values.iter().any(|v| !v.is_finite());
        match *self {
            Op::Germinate {
                target, steepness, ..
            } => bad(&[target, steepness]),
            Op::SchedulePrune(_, steepness) => bad(&[steepness]),
            Op::SetAlpha(alpha) => bad(&[alpha]),
            Op::Retarget(target, _, steepness) => bad(&[target, steepness]),
            Op::Accuracy(train, val) => bad(&[train, val]),
            Op::Gradients(seed, host, _) => bad(&[seed, host]),
            Op::Counterfactual(value) => bad(&[value]),
            Op::Advance(_) | Op::Step | Op::Prune | Op::Healthy(_) => false,
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (alpha_value(), number(0.1, 30.0), 0u32..4, prop::sample::select(AlphaAlgorithm::ALL.to_vec()))
            .prop_map(|(target, steepness, tempo, algorithm)| Op::Germinate { target, steepness, tempo, algorithm }),
        4 => Just(Op::Advance(None)),
        1 => prop::sample::select(SeedStage::ALL.to_vec()).prop_map(|s| Op::Advance(Some(s))),
        5 => Just(Op::Step),
        1 => Just(Op::Prune),
        1 => (extreme_u32(), number(0.1, 30.0)).prop_map(|(steps, k)| Op::SchedulePrune(steps % 5, k)),
        1 => alpha_value().prop_map(Op::SetAlpha),
        1 => (alpha_value(), 0u32..4, number(0.1, 30.0)).prop_map(|(t, s, k)| Op::Retarget(t, s, k)),
        2 => (number(0.0, 100.0), number(0.0, 100.0)).prop_map(|(t, v)| Op::Accuracy(t, v)),
        2 => (number(0.0, 5.0), number(0.0, 5.0), host_params()).prop_map(|(s, h, p)| Op::Gradients(s, h, p)),
        1 => number(-100.0, 100.0).prop_map(Op::Counterfactual),
        1 => any::<bool>().prop_map(Op::Healthy),
    ]
}

fn apply(slot: &mut SeedSlot, op: &Op, count: u32) -> kasmina::Result<()> {
    match *op {
        Op::Germinate {
            target,
            steepness,
            tempo,
            algorithm,
        } => {
            let mut options =
                GerminationOptions::new(format!("seed-{count}")).with_algorithm(algorithm);
            options.alpha_target = target;
            options.blend_steepness = steepness;
            options.tempo_epochs = tempo;
            slot.germinate("norm", options, Device::Cpu)
        }
        Op::Advance(target) => slot.advance_stage(target).map(|_| ()),
        Op::Step => slot.step_epoch(),
        Op::Prune => slot.prune("property", PruneInitiator::Policy).map(|_| ()),
        Op::SchedulePrune(steps, k) => slot
            .schedule_prune(steps, AlphaCurve::Sigmoid, k)
            .map(|_| ()),
        Op::SetAlpha(alpha) => slot.set_alpha(alpha),
        Op::Retarget(target, steps, k) => {
            slot.retarget_alpha(target, steps, AlphaCurve::Sigmoid, k)
        }
        Op::Accuracy(train, val) => slot.record_accuracy(train, val),
        Op::Gradients(seed, host, params) => slot.record_gradient_norms(seed, host, params),
        Op::Counterfactual(value) => slot.set_counterfactual_contribution(value),
        Op::Healthy(healthy) => slot.set_healthy(healthy),
    }
}

/// What a run covered: stages visited, and stages in which a non-finite
/// value was refused.
#[derive(Default)]
struct Coverage {
    visited: HashSet<SeedStage>,
    refused_in: HashSet<SeedStage>,
}

fn run(ops: &[Op], strict: bool) -> Result<Coverage, TestCaseError> {
    let mut coverage = Coverage::default();
    let mode = if strict {
        GateMode::Strict
    } else {
        GateMode::Permissive
    };
    let mut config = common::slot_config(mode);
    config.auto_forward_g1 = true;
    config.auto_forward_g2 = true;
    config.auto_forward_g3 = true;
    let mut slot =
        SeedSlot::new(spec(4, 6), Topology::Cnn, config, Telemetry::disabled()).expect("slot");
    let input = features(1);
    for (count, op) in (0u32..).zip(ops) {
        let before = slot.state().cloned();
        let result = apply(&mut slot, op, count);
        if op.non_finite() {
            prop_assert!(result.is_err(), "{:?} accepted a non-finite value", op);
            prop_assert_eq!(slot.state().cloned(), before, "{:?} changed the seed", op);
            if let Some(stage) = slot.stage() {
                coverage.refused_in.insert(stage);
            }
        }
        if let Some(stage) = slot.stage() {
            coverage.visited.insert(stage);
        }
        if let Some(state) = slot.state() {
            prop_assert!((0.0..=1.0).contains(&state.alpha()));
            prop_assert!(seed_state_message(&slot).is_ok(), "export after {:?}", op);
        }
        let output = slot.forward(&input, None).expect("forward");
        prop_assert!(
            output.isfinite().all().int64_value(&[]) == 1,
            "non-finite output after {:?}",
            op
        );
    }
    Ok(coverage)
}

/// Guards the property below against vacuity: the same generator, run
/// deterministically, reaches every live stage and throws non-finite values
/// at seeds in each of them.
#[test]
fn hostile_sequences_reach_every_live_stage() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = prop::collection::vec(op(), 40..80);
    let mut total = Coverage::default();
    for round in 0..160 {
        let ops = strategy.new_tree(&mut runner).expect("tree").current();
        let coverage = run(&ops, round % 2 == 0).expect("invariants");
        total.visited.extend(coverage.visited);
        total.refused_in.extend(coverage.refused_in);
    }
    for stage in [
        SeedStage::Germinated,
        SeedStage::Training,
        SeedStage::Blending,
        SeedStage::Holding,
        SeedStage::Fossilized,
        SeedStage::Pruned,
    ] {
        assert!(total.visited.contains(&stage), "{stage} never reached");
        assert!(
            total.refused_in.contains(&stage),
            "no hostile value in {stage}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn hostile_numbers_never_decide_a_lifecycle(
        ops in prop::collection::vec(op(), 1..40),
        strict in any::<bool>(),
    ) {
        run(&ops, strict)?;
    }

    #[test]
    fn the_alpha_controller_refuses_hostile_values_and_stays_in_range(
        calls in prop::collection::vec((extreme_f64(), extreme_u32(), extreme_f64(), curve(), 0u8..3), 1..24),
    ) {
        let mut controller = AlphaController::default();
        for (value, steps, steepness, curve, which) in calls {
            let before = controller.clone();
            let result = match which {
                0 => controller.set_alpha(value),
                1 => controller.retarget(value, steps % 8, Some(curve), Some(steepness)),
                _ => { controller.step(); Ok(()) }
            };
            if result.is_err() {
                prop_assert_eq!(&controller, &before);
            }
            if which < 2 && (!value.is_finite() || !(0.0..=1.0).contains(&value)) {
                prop_assert!(result.is_err());
            }
            prop_assert!((0.0..=1.0).contains(&controller.alpha()));
            let json = serde_json::to_string(&controller).expect("encode");
            let decoded: AlphaController = serde_json::from_str(&json).expect("round trip");
            prop_assert_eq!(decoded, controller.clone());
        }
    }

    #[test]
    fn curve_progress_is_in_the_unit_interval_or_refused(
        t in extreme_f64(), steepness in extreme_f64(), curve in curve(),
    ) {
        match curve_progress(t, curve, steepness) {
            Ok(progress) => prop_assert!((0.0..=1.0).contains(&progress)),
            Err(_) => prop_assert!(!t.is_finite() || !steepness.is_finite() || steepness < 0.1),
        }
    }

    #[test]
    fn gates_never_pass_on_non_finite_inputs_and_scores_stay_finite(
        numbers in prop::collection::vec(extreme_f64(), 6),
        epochs in extreme_u32(),
        strict in any::<bool>(),
        gate in prop::sample::select(vec![GateLevel::G0, GateLevel::G1, GateLevel::G2, GateLevel::G3, GateLevel::G5]),
    ) {
        let inputs = GateInputs {
            seed_id: "s",
            blueprint_id: "norm",
            stage: SeedStage::Training,
            epochs_in_stage: epochs,
            improvement: numbers[0],
            gradient_ratio: Some(numbers[1]),
            gradient_health: Some(numbers[2]),
            gradients_exploding: false,
            alpha: numbers[3],
            alpha_target: numbers[4],
            alpha_mode: AlphaMode::Hold,
            counterfactual: Some(numbers[5]),
            is_healthy: true,
        };
        let gates = if strict { QualityGates::strict() } else { QualityGates::permissive() };
        let outcome = gates.evaluate(gate, &inputs);
        prop_assert!(outcome.score.is_finite() && (0.0..=1.0).contains(&outcome.score));
        let read: &[f64] = match gate {
            GateLevel::G2 => &numbers[0..3],
            GateLevel::G3 => &numbers[3..5],
            GateLevel::G5 => &numbers[5..6],
            _ => &[],
        };
        if read.iter().any(|v| !v.is_finite()) {
            prop_assert!(!outcome.passed, "{:?} passed on {:?}", gate, read);
        }
    }

    #[test]
    fn configs_accept_exactly_their_ranges(
        thresholds in prop::collection::vec(extreme_f64(), 4),
        target in extreme_f64(), steepness in extreme_f64(),
    ) {
        let config = SlotConfig {
            gates: QualityGates {
                mode: GateMode::Strict,
                thresholds: GateThresholds {
                    min_training_improvement: thresholds[0],
                    gradient_ratio_threshold: thresholds[1],
                    min_gradient_health: thresholds[2],
                    min_fossilize_contribution: thresholds[3],
                    min_stage_epochs: 3,
                },
            },
            ..SlotConfig::default()
        };
        // The seed learning rate and momentum moved with the optimizers to
        // the trainer: see tolaria's tests/optim_groups.rs.
        let valid = thresholds[0].is_finite()
            && thresholds[1].is_finite() && thresholds[1] >= 0.0
            && (0.0..=1.0).contains(&thresholds[2])
            && thresholds[3].is_finite();
        prop_assert_eq!(config.validate().is_ok(), valid, "{:?}", config);
        prop_assert_eq!(
            SeedSlot::new(spec(4, 6), Topology::Cnn, config, Telemetry::disabled()).is_ok(),
            valid
        );
        let mut options = GerminationOptions::new("s");
        options.alpha_target = target;
        options.blend_steepness = steepness;
        let valid = (0.0..=1.0).contains(&target) && steepness.is_finite() && steepness >= 0.1;
        prop_assert_eq!(options.validate().is_ok(), valid);
    }

    #[test]
    fn host_configs_validate_without_panicking(
        sizes in prop::collection::vec(extreme_i64(), 4),
        counts in prop::collection::vec(extreme_usize(), 3),
    ) {
        let cnn = CnnHostConfig {
            in_channels: sizes[0],
            input_size: sizes[1],
            n_blocks: counts[0],
            base_channels: sizes[2],
            kernel_size: sizes[3],
            pool_layers: counts[1],
            n_classes: sizes[0],
        };
        if let Ok(params) = cnn.validate() {
            prop_assert!(params > 0 && params <= kasmina::validate::MAX_PARAMETERS);
            prop_assert!(cnn.n_blocks <= MAX_LAYERS && cnn.base_channels <= MAX_CHANNELS);
        }
        let transformer = TransformerHostConfig {
            vocab_size: sizes[0],
            n_embd: sizes[1],
            n_head: sizes[2],
            n_layer: counts[0],
            block_size: sizes[3],
            num_segments: counts[2],
        };
        let _ = transformer.param_count();
        if transformer.validate().is_ok() {
            prop_assert!(transformer.n_layer >= 1 && transformer.n_layer <= MAX_LAYERS);
        }
    }

    #[test]
    fn lookups_never_panic_on_hostile_strings(text in hostile_string(), dim in extreme_i64()) {
        if let Ok(id) = SlotId::parse(&text) {
            prop_assert_eq!(SlotId::parse(&id.to_string()).expect("canonical"), id);
        }
        for topology in [Topology::Cnn, Topology::Transformer] {
            if let Ok(blueprint) = Blueprint::from_name(topology, &text) {
                prop_assert!(blueprint.exists_in(topology));
                if blueprint.check_dim(topology, dim).is_ok() {
                    prop_assert!((1..=MAX_CHANNELS).contains(&dim));
                }
            }
        }
    }

    #[test]
    fn scalar_blends_refuse_exactly_the_non_finite(alpha in extreme_f64()) {
        let host = features(1);
        let seed = features(2);
        let result = blend_add(&host, &seed, &BlendAlpha::Scalar(alpha));
        prop_assert_eq!(result.is_ok(), alpha.is_finite());
        if let Ok(output) = result {
            prop_assert!(output.isfinite().all().int64_value(&[]) == 1);
        }
    }

    #[test]
    fn masks_never_index_out_of_bounds(start in extreme_usize(), end in extreme_usize(), total in extreme_usize()) {
        let layout = kasmina::masks::SeedMasks {
            total,
            host: OwnerMask { owner: "host".to_owned(), seed_id: None, ranges: vec![] },
            seeds: vec![],
        };
        let mask = OwnerMask {
            owner: "r0c0".to_owned(),
            seed_id: None,
            ranges: vec![ParamRange { name: "w".to_owned(), range: start..end }],
        };
        // Only small layouts are built; huge ones must be refused up front.
        if total > 1 << 20 && total <= kasmina::masks::MAX_MASK_ELEMENTS as usize {
            return Ok(());
        }
        match layout.to_tensor(&mask, Device::Cpu) {
            Ok(tensor) => {
                prop_assert!(start <= end && end <= total);
                let owned = tensor.to_kind(Kind::Int64).sum(Kind::Int64).int64_value(&[]);
                prop_assert_eq!(owned as usize, end - start);
            }
            Err(_) => prop_assert!(start > end || end > total || total > 1 << 20),
        }
    }

    #[test]
    fn prefetch_sizing_is_bounded(queue in extreme_usize(), workers in extreme_usize()) {
        let config = PrefetchConfig { queue_capacity: queue, worker_threads: workers };
        let valid = (1..=kasmina::prefetch::MAX_QUEUE_CAPACITY).contains(&queue)
            && (1..=kasmina::prefetch::MAX_WORKER_THREADS).contains(&workers);
        prop_assert_eq!(config.validate().is_ok(), valid);
    }
}

#[test]
fn prefetch_requests_refuse_hostile_widths_at_request_time() {
    let prefetcher = Prefetcher::new(PrefetchConfig::default()).expect("prefetcher");
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (hostile_string(), extreme_i64());
    for _ in 0..200 {
        let (name, dim) = proptest::strategy::ValueTree::current(
            &proptest::strategy::Strategy::new_tree(&strategy, &mut runner).expect("tree"),
        );
        let name = if dim % 2 == 0 {
            "conv_small".to_owned()
        } else {
            name
        };
        let result = prefetcher.try_request(&name, dim, SlotId::new(0, 0), Device::Cpu);
        if result.is_ok() {
            assert!((1..=MAX_CHANNELS).contains(&dim), "accepted width {dim}");
        }
    }
    prefetcher.shutdown(Duration::from_secs(5));
}

#[test]
fn non_finite_values_are_refused_by_every_recording_call() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = non_finite_f64();
    for _ in 0..16 {
        let value = proptest::strategy::ValueTree::current(
            &proptest::strategy::Strategy::new_tree(&strategy, &mut runner).expect("tree"),
        );
        let mut slot = common::lone_slot(Topology::Cnn);
        common::walk_to(
            &mut slot,
            "norm",
            GerminationOptions::new("s"),
            SeedStage::Holding,
        );
        let before = slot.state().cloned();
        assert!(slot.record_accuracy(value, 50.0).is_err());
        assert!(slot.record_gradient_norms(value, 1.0, 10).is_err());
        assert!(slot.record_gradient_norms(1.0, value, 10).is_err());
        assert!(slot.set_counterfactual_contribution(value).is_err());
        assert!(slot.set_alpha(value).is_err());
        assert!(
            slot.retarget_alpha(value, 2, AlphaCurve::Linear, 12.0)
                .is_err()
        );
        assert!(
            slot.retarget_alpha(0.5, 2, AlphaCurve::Linear, value)
                .is_err()
        );
        assert!(slot.schedule_prune(2, AlphaCurve::Linear, value).is_err());
        let alpha = Tensor::full([2, 1, 1, 1], value, (Kind::Float, Device::Cpu));
        // A per-sample alpha on the CPU is read and refused (on a device it
        // is shape-checked only; its builder checks the host numbers).
        assert!(matches!(
            slot.forward(&features(1), Some(&alpha)),
            Err(kasmina::Error::NonFinite {
                field: "per-sample alpha",
                ..
            })
        ));
        assert_eq!(slot.state().cloned(), before);
    }
}
