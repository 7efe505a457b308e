//! The Obs V3 observation: its layout, the values of a hand-built
//! observation field by field (reference §3.3), the tracker's history, and
//! the batched encoding into preallocated tensors.

mod common;

use common::{R0C0, R0C1, R0C2, observation, seed, tiny_model, with_metrics};
use kasmina::lifecycle::GerminationOptions;
use leyline::{AlphaAlgorithm, AlphaMode, BlueprintAction, LifecycleOp, SeedStage};
use tamiyo::Error;
use tamiyo::features::{
    BASE_FEATURES, BaseInputs, EMPTY_BLUEPRINT, FeatureBatch, ObservationTracker, RawObservation,
    SCHEMA_VERSION, SLOT_FEATURES, SlotExtras, SlotInputs, UNKNOWN, base, layout, slot,
    slot_extras, symlog,
};
use tch::{Device, Kind};

const EPS: f32 = 1e-6;

fn close(got: f32, want: f64) -> bool {
    (f64::from(got) - want).abs() < 1e-6
}

#[test]
fn the_layout_tiles_the_observation_with_reference_sizes() {
    assert_eq!(SCHEMA_VERSION, 1);
    assert_eq!((BASE_FEATURES, SLOT_FEATURES), (23, 31));
    for (slots, obs_dim, network) in [(1, 54, 58), (3, 116, 128), (7, 240, 268)] {
        let layout = layout(slots).expect("layout");
        assert_eq!(layout.obs_dim(), obs_dim);
        assert_eq!(layout.network_input_dim(), network);
        let fields = layout.fields();
        let mut next = 0;
        for field in &fields {
            assert_eq!(field.offset, next, "{field:?} leaves a gap or overlaps");
            next += field.width;
        }
        assert_eq!(next, obs_dim);
        assert_eq!(fields.iter().filter(|f| f.slot.is_none()).count(), 10);
        assert_eq!(
            fields
                .iter()
                .filter(|f| f.slot == Some(slots - 1))
                .map(|f| f.width)
                .sum::<usize>(),
            SLOT_FEATURES
        );
    }
    assert!(layout(0).is_err());
    assert!(layout(65).is_err());
}

fn training_slot() -> SlotInputs {
    SlotInputs {
        stage: SeedStage::Training,
        blueprint: BlueprintAction::ConvLight,
        alpha: 0.25,
        contribution: Some(25.0),
        contribution_velocity: -3.0,
        blend_tempo_epochs: 5,
        alpha_target: 0.7,
        alpha_mode: AlphaMode::Up,
        alpha_steps_total: 5,
        alpha_steps_done: 2,
        alpha_velocity: 2.0,
        alpha_algorithm: AlphaAlgorithm::Multiply,
        interaction_sum: 4.0,
        gradient_norm: Some(100.0),
        gradient_health: Some(0.8),
        gradients_vanishing: true,
        gradients_exploding: false,
        previous_gradient_health: None,
        epochs_in_stage: 4,
        epochs_since_counterfactual: Some(2),
        epochs_total: 300,
    }
}

fn hand_built() -> RawObservation {
    RawObservation {
        base: BaseInputs {
            epoch: 10,
            max_epochs: 150,
            val_loss: 2.3,
            val_accuracy: 41.5,
            loss_history: [None, None, Some(2.5), Some(2.4), Some(2.3)],
            accuracy_history: [None, None, Some(38.0), Some(40.0), Some(41.5)],
            last_action_success: false,
            last_op: LifecycleOp::Germinate,
        },
        slots: vec![
            Some(training_slot()),
            None,
            Some(SlotInputs {
                stage: SeedStage::Holding,
                blueprint: BlueprintAction::Attention,
                alpha: 1.0,
                contribution: None,
                contribution_velocity: 0.0,
                alpha_target: 1.0,
                alpha_mode: AlphaMode::Hold,
                alpha_steps_total: 0,
                alpha_steps_done: 0,
                alpha_velocity: 0.0,
                alpha_algorithm: AlphaAlgorithm::Add,
                interaction_sum: -40.0,
                gradient_norm: None,
                gradient_health: None,
                gradients_vanishing: false,
                previous_gradient_health: Some(0.5),
                epochs_since_counterfactual: None,
                epochs_total: 30,
                ..training_slot()
            }),
        ],
    }
}

#[test]
fn a_hand_built_observation_encodes_to_the_reference_values() {
    let raw = hand_built();
    let mut row = vec![f32::NAN; 116];
    let mut blueprints = vec![99_i64; 3];
    raw.encode_into(&mut row, &mut blueprints).expect("encode");

    // Base features.
    assert!(close(row[base::EPOCH], 10.0 / 150.0));
    assert!(close(row[base::VAL_LOSS], 2.3_f64.ln_1p() / 7.0));
    assert!(close(row[base::VAL_ACCURACY], 0.415));
    let losses = &row[base::LOSS_HISTORY..base::LOSS_HISTORY + 5];
    assert_eq!(&losses[..2], [UNKNOWN, UNKNOWN]);
    assert!(close(losses[2], 2.5_f64.ln_1p() / 7.0));
    assert!(close(losses[4], row[base::VAL_LOSS].into()));
    let accuracies = &row[base::ACCURACY_HISTORY..base::ACCURACY_HISTORY + 5];
    assert_eq!(&accuracies[..2], [UNKNOWN, UNKNOWN]);
    assert!(close(accuracies[2], 0.38));
    // One TRAINING, no BLENDING, one HOLDING out of three slots.
    assert!(close(row[base::TRAINING_FRACTION], 1.0 / 3.0));
    assert_eq!(row[base::BLENDING_FRACTION], 0.0);
    assert!(close(row[base::HOLDING_FRACTION], 1.0 / 3.0));
    assert_eq!(row[base::LAST_ACTION_SUCCESS], 0.0);
    assert_eq!(
        &row[base::LAST_OP..base::LAST_OP + 6],
        [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    );

    // Slot 0: TRAINING.
    let s = &row[23..54];
    assert_eq!(s[slot::OCCUPIED], 1.0);
    let mut stage = [0.0; 10];
    stage[3] = 1.0;
    assert_eq!(&s[slot::STAGE..slot::STAGE + 10], stage);
    assert!(close(s[slot::ALPHA], 0.25));
    assert_eq!(s[slot::CONTRIBUTION], 1.0, "25 pp clamps to 1");
    assert!(close(s[slot::CONTRIBUTION_VELOCITY], -0.3));
    assert!(close(s[slot::BLEND_TEMPO], 5.0 / 12.0));
    assert!(close(s[slot::ALPHA_TARGET], 0.7));
    assert!(close(s[slot::ALPHA_MODE], 0.5), "UP = 1 of 2");
    assert!(close(s[slot::ALPHA_STEPS_TOTAL], 5.0 / 150.0));
    assert!(close(s[slot::ALPHA_STEPS_DONE], 2.0 / 150.0));
    assert!(close(s[slot::TIME_TO_TARGET], 3.0 / 150.0));
    assert_eq!(s[slot::ALPHA_VELOCITY], 1.0, "clamped");
    assert!(
        close(s[slot::ALPHA_ALGORITHM], 0.5),
        "MULTIPLY = (2 - 1) / 2"
    );
    assert!(close(s[slot::INTERACTION_SUM], 0.4));
    assert!(close(s[slot::GRADIENT_NORM], symlog(100.0) / 7.0));
    assert!(close(s[slot::GRADIENT_HEALTH], 0.8));
    assert_eq!((s[slot::HAS_VANISHING], s[slot::HAS_EXPLODING]), (1.0, 0.0));
    assert_eq!(s[slot::PREVIOUS_GRADIENT_HEALTH], UNKNOWN);
    assert!(close(s[slot::EPOCHS_IN_STAGE], 4.0 / 150.0));
    assert!(close(s[slot::COUNTERFACTUAL_FRESHNESS], 0.995_f64.powi(2)));
    assert_eq!(s[slot::SEED_AGE], 1.0, "300 epochs caps at 1");

    // Slot 1: empty, all zeros.
    assert!(row[54..85].iter().all(|&v| v == 0.0));

    // Slot 2: HOLDING, unmeasured.
    let s = &row[85..116];
    assert_eq!(
        s[slot::STAGE + 5],
        1.0,
        "HOLDING (value 6) is one-hot index 5"
    );
    assert_eq!(s[slot::CONTRIBUTION], 0.0, "no contribution yet");
    assert_eq!(s[slot::ALPHA_MODE], 0.0);
    assert_eq!(s[slot::ALPHA_ALGORITHM], 0.0, "ADD");
    assert_eq!(s[slot::INTERACTION_SUM], -1.0, "clamped");
    assert_eq!(
        (s[slot::GRADIENT_NORM], s[slot::GRADIENT_HEALTH]),
        (0.0, 0.0)
    );
    assert!(close(s[slot::PREVIOUS_GRADIENT_HEALTH], 0.5));
    assert_eq!(s[slot::COUNTERFACTUAL_FRESHNESS], UNKNOWN);
    assert!(close(s[slot::SEED_AGE], 0.2));

    assert_eq!(
        blueprints,
        [
            i64::from(BlueprintAction::ConvLight.value()),
            EMPTY_BLUEPRINT,
            i64::from(BlueprintAction::Attention.value())
        ]
    );
    assert!(row.iter().all(|v| v.is_finite()));
}

#[test]
fn impossible_inputs_are_refused_and_nothing_is_written() {
    let mut cases: Vec<(&str, RawObservation)> = Vec::new();
    let mut raw = hand_built();
    raw.base.val_loss = f64::NAN;
    cases.push(("observation.val_loss", raw));
    let mut raw = hand_built();
    raw.base.val_accuracy = 100.5;
    cases.push(("observation.val_accuracy", raw));
    let mut raw = hand_built();
    raw.base.loss_history[4] = Some(f64::INFINITY);
    cases.push(("observation.loss_history", raw));
    let mut raw = hand_built();
    raw.base.max_epochs = 0;
    cases.push(("observation.max_epochs", raw));
    let mut raw = hand_built();
    if let Some(Some(slot)) = raw.slots.first_mut() {
        slot.alpha = 1.5;
    }
    cases.push(("slot.alpha", raw));
    let mut raw = hand_built();
    if let Some(Some(slot)) = raw.slots.last_mut() {
        slot.gradient_health = Some(f64::NAN);
    }
    cases.push(("slot.gradient_health", raw));
    for (field, raw) in cases {
        let mut row = vec![7.0_f32; 116];
        let mut blueprints = vec![7_i64; 3];
        let error = raw.encode_into(&mut row, &mut blueprints).expect_err(field);
        assert!(
            matches!(
                error,
                Error::InvalidInput { field: f, .. } | Error::NonFinite { field: f, .. }
                    if f == field
            ),
            "{field}: {error}"
        );
        assert!(row.iter().all(|&v| v == 7.0) && blueprints == [7, 7, 7]);
    }
    let error = hand_built()
        .encode_into(&mut [0.0; 115], &mut [0; 3])
        .expect_err("short row");
    assert!(matches!(error, Error::ShapeMismatch { .. }), "{error}");
}

#[test]
fn the_tracker_keeps_history_velocity_freshness_and_the_last_action() {
    let slots = [R0C0, R0C1];
    let mut tracker = ObservationTracker::new(&slots, 20).expect("tracker");
    let contribution = |value: Option<f64>| {
        with_metrics(seed("s1", R0C0, "conv_light", SeedStage::Training), |m| {
            m.counterfactual_contribution = value;
            m.epochs_total = 3;
        })
    };
    let encode = |raw: &RawObservation| {
        let mut row = vec![0.0_f32; 85];
        let mut blueprints = vec![0_i64; 2];
        raw.encode_into(&mut row, &mut blueprints).expect("encode");
        row
    };

    // Epoch 0: nothing measured yet, no history beyond this epoch.
    let raw = tracker
        .observe(
            &observation(0, 2.0, 20.0, vec![contribution(None)], &slots),
            &[],
        )
        .expect("observe");
    let row = encode(&raw);
    assert!(
        close(row[base::EPOCH], 1.0 / 20.0),
        "the epoch counts from 1"
    );
    assert_eq!(&row[3..7], [UNKNOWN; 4]);
    assert!(close(row[7], symlog(2.0) / 7.0));
    assert_eq!(row[base::LAST_ACTION_SUCCESS], 1.0, "no action yet");
    assert_eq!(row[base::LAST_OP], 1.0, "WAIT before any action");
    let s = &row[23..54];
    assert_eq!(s[slot::COUNTERFACTUAL_FRESHNESS], UNKNOWN);
    assert_eq!(s[slot::PREVIOUS_GRADIENT_HEALTH], UNKNOWN);
    assert!(
        close(s[slot::BLEND_TEMPO], 5.0 / 12.0),
        "Kasmina's default tempo"
    );

    tracker.record_action(LifecycleOp::Advance, false);
    // Epoch 1: first measurement (1.0 pp): fresh, no velocity yet.
    let raw = tracker
        .observe(
            &observation(1, 1.9, 22.0, vec![contribution(Some(1.0))], &slots),
            &[],
        )
        .expect("observe");
    let row = encode(&raw);
    assert_eq!(row[base::LAST_ACTION_SUCCESS], 0.0);
    assert_eq!(row[base::LAST_OP + 5], 1.0, "ADVANCE");
    let s = &row[23..54];
    assert_eq!(s[slot::COUNTERFACTUAL_FRESHNESS], 1.0);
    assert_eq!(s[slot::CONTRIBUTION_VELOCITY], 0.0);
    assert!(close(s[slot::CONTRIBUTION], 0.1));

    // Epoch 2: 3.0 pp: velocity 0.3 · 2 = 0.6 pp, encoded / 10.
    let raw = tracker
        .observe(
            &observation(2, 1.8, 23.0, vec![contribution(Some(3.0))], &slots),
            &[],
        )
        .expect("observe");
    let s = &encode(&raw)[23..54];
    assert!(close(s[slot::CONTRIBUTION_VELOCITY], 0.06));
    assert_eq!(s[slot::COUNTERFACTUAL_FRESHNESS], 1.0);

    // Epochs 3 and 4: the same value again is not a new measurement.
    for (epoch, age) in [(3, 1), (4, 2)] {
        let raw = tracker
            .observe(
                &observation(epoch, 1.7, 24.0, vec![contribution(Some(3.0))], &slots),
                &[],
            )
            .expect("observe");
        let row = encode(&raw);
        let s = &row[23..54];
        assert!(close(
            s[slot::COUNTERFACTUAL_FRESHNESS],
            0.995_f64.powi(age)
        ));
        assert!(close(s[slot::CONTRIBUTION_VELOCITY], 0.06));
        if epoch == 4 {
            // Five epochs seen: the history is full, oldest first.
            let losses: Vec<f64> = [2.0, 1.9, 1.8, 1.7, 1.7]
                .iter()
                .map(|l| symlog(*l) / 7.0)
                .collect();
            for (got, want) in row[3..8].iter().zip(losses) {
                assert!(close(*got, want));
            }
        }
    }

    // A measurement the caller declares (same value, measured again).
    let extras = vec![
        Some(SlotExtras {
            blend_tempo_epochs: 8,
            alpha_start: 0.0,
            alpha_steps_total: 0,
            alpha_steps_done: 0,
            gradient_health: Some(0.9),
            interaction_sum: 0.0,
            counterfactual_measured: Some(true),
        }),
        None,
    ];
    let raw = tracker
        .observe(
            &observation(5, 1.7, 24.0, vec![contribution(Some(3.0))], &slots),
            &extras,
        )
        .expect("observe");
    let s = &encode(&raw)[23..54];
    assert_eq!(s[slot::COUNTERFACTUAL_FRESHNESS], 1.0);
    assert!(
        close(s[slot::CONTRIBUTION_VELOCITY], 0.042),
        "0.7 · 0.6 + 0.3 · 0"
    );
    assert!(close(s[slot::BLEND_TEMPO], 8.0 / 12.0));
    assert!(close(s[slot::GRADIENT_HEALTH], 0.9));
    assert_eq!(s[slot::PREVIOUS_GRADIENT_HEALTH], UNKNOWN);
    let raw = tracker
        .observe(
            &observation(6, 1.7, 24.0, vec![contribution(Some(3.0))], &slots),
            &[],
        )
        .expect("observe");
    let s = &encode(&raw)[23..54];
    assert!(
        close(s[slot::PREVIOUS_GRADIENT_HEALTH], 0.9),
        "last epoch's health"
    );

    // A new seed in the slot starts a fresh record.
    let other = with_metrics(seed("s2", R0C0, "norm", SeedStage::Germinated), |m| {
        m.counterfactual_contribution = Some(3.0);
    });
    let raw = tracker
        .observe(&observation(7, 1.7, 24.0, vec![other], &slots), &[])
        .expect("observe");
    let s = &encode(&raw)[23..54];
    assert_eq!(s[slot::CONTRIBUTION_VELOCITY], 0.0);
    assert_eq!(s[slot::PREVIOUS_GRADIENT_HEALTH], UNKNOWN);
    assert_eq!(s[slot::STAGE + 2], 1.0, "GERMINATED");
}

#[test]
fn the_tracker_refuses_what_it_cannot_encode_and_keeps_its_history() {
    let slots = [R0C0, R0C1];
    let mut tracker = ObservationTracker::new(&slots, 20).expect("tracker");
    let good = observation(0, 2.0, 20.0, vec![], &slots);
    tracker.observe(&good, &[]).expect("observe");

    let wrong_slots = observation(1, 2.0, 20.0, vec![], &[R0C0, R0C2]);
    assert!(matches!(
        tracker.observe(&wrong_slots, &[]),
        Err(Error::SlotMismatch { .. })
    ));
    let elsewhere = observation(
        1,
        2.0,
        20.0,
        vec![seed("s", R0C2, "norm", SeedStage::Training)],
        &slots,
    );
    assert!(matches!(
        tracker.observe(&elsewhere, &[]),
        Err(Error::InvalidInput {
            field: "seed.slot_id",
            ..
        })
    ));
    let twice = observation(
        1,
        2.0,
        20.0,
        vec![
            seed("a", R0C0, "norm", SeedStage::Training),
            seed("b", R0C0, "norm", SeedStage::Training),
        ],
        &slots,
    );
    assert!(tracker.observe(&twice, &[]).is_err());
    let unknown = observation(
        1,
        2.0,
        20.0,
        vec![seed("s", R0C0, "resnet", SeedStage::Training)],
        &slots,
    );
    assert!(matches!(
        tracker.observe(&unknown, &[]),
        Err(Error::InvalidInput {
            field: "seed.blueprint_id",
            ..
        })
    ));
    let mut reserved = seed("s", R0C0, "norm", SeedStage::Training);
    reserved.stage = 5;
    let reserved = observation(1, 2.0, 20.0, vec![reserved], &slots);
    assert!(matches!(
        tracker.observe(&reserved, &[]),
        Err(Error::Contract(_))
    ));
    let mut bad = observation(1, 2.0, 20.0, vec![], &slots);
    bad.metrics.val_loss = f64::NAN;
    assert!(tracker.observe(&bad, &[]).is_err());
    assert!(
        tracker.observe(&good, &[None]).is_err(),
        "extras for one of two slots"
    );
    assert!(ObservationTracker::new(&[R0C0, R0C0], 20).is_err());
    assert!(ObservationTracker::new(&slots, 0).is_err());

    // None of the refused observations entered the history.
    let raw = tracker
        .observe(&observation(1, 1.5, 30.0, vec![], &slots), &[])
        .expect("observe");
    assert_eq!(
        raw.base.loss_history,
        [None, None, None, Some(2.0), Some(1.5)]
    );
}

#[test]
fn extras_come_from_a_kasmina_model() {
    let slots = [R0C0, R0C1];
    let mut model = tiny_model(&slots);
    model
        .germinate(
            R0C1,
            "attention",
            GerminationOptions::new("seed-1").with_tempo(leyline::TempoAction::Slow),
        )
        .expect("germinate");
    let observation =
        tolaria::controller::EpochObservation::from_model(&model, 3, common::metrics(1.0, 50.0))
            .expect("observation");
    let extras = slot_extras(&model);
    assert!(extras[0].is_none());
    assert_eq!(extras[1].as_ref().map(|e| e.blend_tempo_epochs), Some(8));
    let mut tracker = ObservationTracker::new(&slots, 25).expect("tracker");
    let raw = tracker.observe(&observation, &extras).expect("observe");
    let mut batch = FeatureBatch::new(1, 2, Device::Cpu).expect("batch");
    batch.set(0, &raw).expect("set");
    batch.upload().expect("upload");
    let row = batch.host_row(0).expect("row");
    let s = &row[54..85];
    assert_eq!(s[slot::OCCUPIED], 1.0);
    assert!(close(s[slot::BLEND_TEMPO], 8.0 / 12.0));
    assert_eq!(s[slot::STAGE + 2], 1.0, "GERMINATED");
    let indices = Vec::<i64>::try_from(batch.blueprint_indices().view(-1)).expect("indices");
    assert_eq!(
        indices,
        [
            EMPTY_BLUEPRINT,
            i64::from(BlueprintAction::Attention.value())
        ]
    );
}

#[test]
fn a_batch_writes_every_environment_into_preallocated_tensors() {
    let mut batch = FeatureBatch::new(4, 3, Device::Cpu).expect("batch");
    let obs_ptr = batch.obs().data_ptr();
    let mut observations = Vec::new();
    for env in 0..4 {
        let mut raw = hand_built();
        raw.base.epoch = 10 + env;
        if env % 2 == 1 {
            raw.slots[0] = None;
        }
        observations.push(raw);
    }
    batch.write_all(&observations).expect("write");
    assert_eq!(batch.obs().size(), [4, 116]);
    assert_eq!(batch.obs().kind(), Kind::Float);
    assert_eq!(batch.obs().data_ptr(), obs_ptr, "written in place");
    for (env, raw) in observations.iter().enumerate() {
        let mut row = vec![0.0_f32; 116];
        let mut blueprints = vec![0_i64; 3];
        raw.encode_into(&mut row, &mut blueprints).expect("encode");
        let device_row = Vec::<f32>::try_from(batch.obs().get(env as i64)).expect("row");
        assert!(
            row.iter()
                .zip(&device_row)
                .all(|(a, b)| (a - b).abs() < EPS),
            "env {env}"
        );
        let device_blueprints =
            Vec::<i64>::try_from(batch.blueprint_indices().get(env as i64)).expect("indices");
        assert_eq!(device_blueprints, blueprints);
    }
    assert_eq!(
        batch.blueprint_indices().kind(),
        Kind::Int64,
        "indices feed the embedding"
    );
    assert!(batch.write_all(&observations[..3]).is_err());
    let mut two_slots = hand_built();
    two_slots.slots.pop();
    assert!(batch.set(0, &two_slots).is_err());
    assert!(batch.set(4, &hand_built()).is_err());
    assert!(FeatureBatch::new(0, 3, Device::Cpu).is_err());
}
