//! Hostile input at every public entry point (leyline's `testing`
//! strategies: NaN, infinities, integer extremes, odd strings): a typed
//! error or a finite, in-range result, never a panic, and a refused input
//! changes nothing.

mod common;

use common::{R0C0, R0C1, observation, seed};
use leyline::testing::{
    extreme_f64, extreme_i64, extreme_u32, extreme_u64, extreme_usize, hostile_string,
};
use leyline::{AlphaAlgorithm, AlphaMode, BlueprintAction, LifecycleOp, SeedStage};
use proptest::prelude::*;
use tamiyo::features::{
    BaseInputs, FeatureBatch, ObservationTracker, RawObservation, SlotInputs, layout,
};
use tamiyo::heads::FactoredAction;
use tamiyo::masks::{MaskConfig, SlotMaskInfo, compute_masks, observation_masks};
use tamiyo::normaliser::{NormaliserConfig, NormaliserState, RunningMeanStd};
use tamiyo::policy::{PolicyConfig, PolicyRng, SampleMode, SamplingConfig};
use tch::Device;

fn slot_inputs(values: [f64; 6], counts: [u32; 5]) -> SlotInputs {
    SlotInputs {
        stage: SeedStage::Blending,
        blueprint: BlueprintAction::Norm,
        alpha: values[0],
        contribution: Some(values[1]),
        contribution_velocity: values[2],
        blend_tempo_epochs: counts[0],
        alpha_target: values[3],
        alpha_mode: AlphaMode::Up,
        alpha_steps_total: counts[1],
        alpha_steps_done: counts[2],
        alpha_velocity: values[4],
        alpha_algorithm: AlphaAlgorithm::Gate,
        interaction_sum: values[5],
        gradient_norm: Some(values[1].abs()),
        gradient_health: Some(values[0]),
        gradients_vanishing: false,
        gradients_exploding: true,
        previous_gradient_health: None,
        epochs_in_stage: counts[3],
        epochs_since_counterfactual: Some(counts[4]),
        epochs_total: counts[4],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encoding_gives_finite_features_or_a_typed_error(
        values in prop::array::uniform6(extreme_f64()),
        counts in prop::array::uniform5(extreme_u32()),
        base in prop::array::uniform3(extreme_f64()),
        epochs in prop::array::uniform2(extreme_u32()),
    ) {
        let raw = RawObservation {
            base: BaseInputs {
                epoch: epochs[0],
                max_epochs: epochs[1],
                val_loss: base[0],
                val_accuracy: base[1],
                loss_history: [None, None, None, Some(base[2]), Some(base[0])],
                accuracy_history: [None; 5],
                last_action_success: true,
                last_op: LifecycleOp::Prune,
            },
            slots: vec![Some(slot_inputs(values, counts)), None],
        };
        let mut row = vec![3.0_f32; 85];
        let mut blueprints = vec![3_i64; 2];
        match raw.encode_into(&mut row, &mut blueprints) {
            Ok(()) => {
                prop_assert!(row.iter().all(|v| v.is_finite()));
                // Bounded features stay in their ranges.
                for field in layout(2).expect("layout").fields() {
                    if matches!(field.name, "epoch" | "epochs_in_stage" | "seed_age"
                        | "alpha_steps_total" | "alpha_steps_done" | "time_to_target"
                        | "contribution" | "contribution_velocity" | "alpha_velocity"
                        | "interaction_sum") {
                        for value in &row[field.offset..field.offset + field.width] {
                            prop_assert!((-1.0..=1.0).contains(value), "{} = {}", field.name, value);
                        }
                    }
                }
            }
            Err(_) => {
                prop_assert!(row.iter().all(|&v| v == 3.0));
                prop_assert_eq!(&blueprints, &vec![3, 3]);
            }
        }
    }

    #[test]
    fn hostile_seed_states_are_refused_or_observed(
        stage in extreme_i64(),
        mode in extreme_i64(),
        algorithm in extreme_i64(),
        alpha in extreme_f64(),
        contribution in extreme_f64(),
        slot_id in prop_oneof![hostile_string(), Just("r0c1".to_owned())],
        blueprint in prop_oneof![hostile_string(), Just("norm".to_owned())],
        epochs in extreme_u32(),
    ) {
        let mut state = seed("s", R0C1, &blueprint, SeedStage::Training);
        state.slot_id = slot_id;
        state.stage = stage as i32;
        state.alpha_mode = mode as i32;
        state.alpha_algorithm = algorithm as i32;
        state.alpha = alpha;
        if let Some(metrics) = state.metrics.as_mut() {
            metrics.counterfactual_contribution = Some(contribution);
            metrics.epochs_total = epochs;
            metrics.epochs_in_stage = epochs;
        }
        let slots = [R0C0, R0C1];
        let obs = observation(epochs, 1.0, 50.0, vec![state], &slots);
        let mut tracker = ObservationTracker::new(&slots, 25).expect("tracker");
        if let Ok(raw) = tracker.observe(&obs, &[]) {
            let mut row = vec![0.0_f32; 85];
            let mut blueprints = vec![0_i64; 2];
            raw.encode_into(&mut row, &mut blueprints).expect("an observed state encodes");
            prop_assert!(row.iter().all(|v| v.is_finite()));
        }
        if let Ok(masks) = observation_masks(&obs, &MaskConfig::default()) {
            masks.check().expect("invariants");
        }
    }

    #[test]
    fn sizes_and_indices_at_the_extremes_are_refused(
        n_envs in extreme_usize(),
        slots in extreme_usize(),
        max_seeds in extreme_usize(),
        indices in prop::array::uniform8(extreme_i64()),
        max_epochs in extreme_u32(),
        seed_value in extreme_u64(),
    ) {
        let _ = FeatureBatch::new(n_envs, slots, Device::Cpu);
        let _ = layout(slots);
        if let Ok(action) = FactoredAction::from_indices(&indices, slots) {
            prop_assert_eq!(action.indices(), indices);
        }
        let config = PolicyConfig {
            num_slots: slots,
            feature_dim: indices[0],
            hidden_dim: indices[1],
            lstm_layers: n_envs,
        };
        if config.validate().is_ok() {
            prop_assert!(config.hidden_dim >= 8 && config.num_slots >= 1);
        }
        let infos = vec![None; slots.min(80)];
        let masks = compute_masks(&infos, &MaskConfig { max_seeds, ..MaskConfig::default() });
        if let Ok(masks) = masks {
            masks.check().expect("invariants");
        }
        let _ = ObservationTracker::new(&[R0C0], max_epochs);
        let mut rng = PolicyRng::new(seed_value);
        prop_assert!(rng.uniform(&[indices[2].min(-1)], Device::Cpu).is_err());
        prop_assert!(rng.uniform(&[i64::MAX, 3], Device::Cpu).is_err());
        let _ = SlotMaskInfo::from_seed(&{
            let mut state = seed("s", R0C0, "norm", SeedStage::Training);
            state.stage = indices[3] as i32;
            state
        });
    }

    #[test]
    fn normaliser_states_and_sampling_floors_at_the_extremes(
        values in prop::array::uniform4(extreme_f64()),
        count in extreme_f64(),
        momentum in extreme_f64(),
        floor in extreme_f64(),
    ) {
        let state = NormaliserState {
            config: NormaliserConfig { momentum: Some(momentum), ..NormaliserConfig::default() },
            mean: vec![values[0], values[1]],
            var: vec![values[2], values[3]],
            count,
        };
        if let Ok(normaliser) = RunningMeanStd::from_state(&state, Device::Cpu) {
            let x = tch::Tensor::from_slice(&[1.0_f32, -1.0]).view([1, 2]);
            let out = Vec::<f32>::try_from(normaliser.normalize(&x).expect("normalize").view(-1))
                .expect("values");
            prop_assert!(out.iter().all(|v| v.is_finite() && v.abs() <= 10.0));
        }
        let sampling = SamplingConfig { mode: SampleMode::Stochastic, floors: Some([floor; 8]) };
        prop_assert_eq!(sampling.validate().is_ok(), (0.0..1.0).contains(&floor));
    }
}
