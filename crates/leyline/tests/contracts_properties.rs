//! Property tests of the leyline contracts: the transition table, enum value
//! checks, decoding arbitrary bytes, and lossless JSON / protobuf round trips.

use std::collections::BTreeMap;

use leyline::codec::Contract;
use leyline::proto::{
    AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryEvent, TelemetryMetric,
    TelemetryPacket,
};
use leyline::stage::{VALID_TRANSITIONS, validate_transition, validate_transition_values};
use leyline::{Error, SCHEMA_VERSION, SeedStage};
use proptest::prelude::*;

/// The legal moves of ESPER_PYTHON_REFERENCE.md §1.2, written out independently
/// of the table in the crate so that a wrong table fails this test.
const REFERENCE_EDGES: &[(i32, i32)] = &[
    (0, 1),
    (1, 2),
    (2, 3),
    (2, 8),
    (3, 4),
    (3, 8),
    (4, 6),
    (4, 8),
    (6, 7),
    (6, 4),
    (6, 8),
    (8, 9),
    (9, 10),
    (10, 1),
];

const VALID_STAGE_VALUES: &[i32] = &[0, 1, 2, 3, 4, 6, 7, 8, 9, 10];

#[test]
fn table_matches_the_reference_edges() {
    let mut table_edges: Vec<(i32, i32)> = VALID_TRANSITIONS
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from.value(), to.value())))
        .collect();
    let mut reference: Vec<(i32, i32)> = REFERENCE_EDGES.to_vec();
    table_edges.sort_unstable();
    reference.sort_unstable();
    assert_eq!(table_edges, reference);
}

proptest! {
    #[test]
    fn transition_accepted_exactly_when_the_table_allows(from in -3i32..14, to in -3i32..14) {
        let result = validate_transition_values(from, to);
        let both_valid = VALID_STAGE_VALUES.contains(&from) && VALID_STAGE_VALUES.contains(&to);
        let allowed = both_valid && REFERENCE_EDGES.contains(&(from, to));
        prop_assert_eq!(result.is_ok(), allowed, "{} -> {}: {:?}", from, to, result);
        if both_valid && !allowed {
            let is_illegal_transition = matches!(result, Err(Error::IllegalTransition { .. }));
            prop_assert!(is_illegal_transition);
        }
        if !both_valid {
            let is_invalid_value = matches!(result, Err(Error::InvalidEnumValue { .. }));
            prop_assert!(is_invalid_value);
        }
    }

    #[test]
    fn stage_values_outside_the_contract_are_rejected(value in any::<i32>()) {
        let decoded = SeedStage::from_value(value);
        prop_assert_eq!(decoded.is_ok(), VALID_STAGE_VALUES.contains(&value));
        if let Ok(stage) = decoded {
            prop_assert_eq!(stage.value(), value);
            prop_assert_eq!(SeedStage::from_name(stage.name()), Ok(stage));
        }
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = SeedState::decode_protobuf(&bytes);
        let _ = SeedMetricSet::decode_protobuf(&bytes);
        let _ = GateResult::decode_protobuf(&bytes);
        let _ = TelemetryPacket::decode_protobuf(&bytes);
        let _ = AdaptationCommand::decode_protobuf(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        let _ = SeedState::from_json(&text);
        let _ = TelemetryPacket::from_json(&text);
        let _ = AdaptationCommand::from_json(&text);
    }

    #[test]
    fn seed_state_round_trips(state in seed_state()) {
        assert_round_trips(&state)?;
    }

    #[test]
    fn gate_result_round_trips(result in gate_result()) {
        assert_round_trips(&result)?;
    }

    #[test]
    fn telemetry_packet_round_trips(packet in telemetry_packet()) {
        assert_round_trips(&packet)?;
    }

    #[test]
    fn adaptation_command_round_trips(command in adaptation_command()) {
        assert_round_trips(&command)?;
        let decoded = command.decoded();
        prop_assert!(decoded.is_ok());
        if let Ok(decoded) = decoded {
            prop_assert_eq!(AdaptationCommand::from_decoded(decoded, command.env_id, command.epoch), command);
        }
    }

    #[test]
    fn reserved_stage_in_a_message_is_rejected(mut state in seed_state()) {
        state.stage = 5;
        let bytes = prost::Message::encode_to_vec(&state);
        let is_invalid = matches!(
            SeedState::decode_protobuf(&bytes),
            Err(Error::InvalidEnumValue { value: 5, .. })
        );
        prop_assert!(is_invalid);
        prop_assert!(state.to_json().is_err());
    }
}

fn assert_round_trips<T: Contract + Clone + PartialEq + std::fmt::Debug>(
    message: &T,
) -> Result<(), TestCaseError> {
    let bytes = message.encode_protobuf();
    prop_assert!(bytes.is_ok(), "encode failed: {:?}", bytes);
    let bytes = bytes.unwrap_or_default();
    prop_assert_eq!(&T::decode_protobuf(&bytes).ok(), &Some(message.clone()));
    let json = message.to_json();
    prop_assert!(json.is_ok(), "json failed: {:?}", json);
    let json = json.unwrap_or_default();
    prop_assert_eq!(&T::from_json(&json).ok(), &Some(message.clone()));
    Ok(())
}

fn stage_value() -> impl Strategy<Value = i32> {
    proptest::sample::select(VALID_STAGE_VALUES.to_vec())
}

fn finite() -> impl Strategy<Value = f64> {
    prop_oneof![
        -1.0e6f64..1.0e6,
        Just(0.0),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(f64::MAX),
        Just(f64::MIN)
    ]
}

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9_.\\-\u{e9}\u{4e2d} \"\\\\]{0,12}"
}

fn attributes() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(text(), text(), 0..3)
}

/// `[low, high]` with both bounds (and -0.0 where 0 is one) drawn often.
fn bounded(low: f64, high: f64) -> impl Strategy<Value = f64> {
    prop_oneof![low..=high, Just(low), Just(high), Just(-0.0f64.max(low))]
}

fn metric_set() -> impl Strategy<Value = SeedMetricSet> {
    let accuracy = || bounded(0.0, 100.0);
    let points = || bounded(-100.0, 100.0);
    (
        (
            any::<u32>(),
            any::<u32>(),
            accuracy(),
            accuracy(),
            accuracy(),
        ),
        (
            points(),
            prop_oneof![finite().prop_map(f64::abs), Just(f64::MAX)],
            proptest::option::of(bounded(0.0, 10.0)),
        ),
        (
            proptest::option::of(points()),
            any::<u64>(),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (epochs_total, epochs_in_stage, train_accuracy, val_accuracy, start),
                (improvement, gradient_norm, gradient_ratio),
                (contribution, param_count, vanishing, exploding),
            )| SeedMetricSet {
                schema_version: SCHEMA_VERSION,
                epochs_total,
                epochs_in_stage,
                train_accuracy,
                val_accuracy,
                accuracy_at_stage_start: start,
                improvement_since_stage_start: improvement,
                gradient_norm,
                gradient_ratio,
                counterfactual_contribution: contribution,
                param_count,
                gradients_vanishing: vanishing,
                gradients_exploding: exploding,
            },
        )
}

fn seed_state() -> impl Strategy<Value = SeedState> {
    (
        (text(), text(), text(), stage_value(), stage_value()),
        (0.0f64..=1.0, 0.0f64..=1.0, 0i32..3, 1i32..4, 1i32..4),
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(metric_set()),
        ),
    )
        .prop_map(
            |(
                (seed_id, slot_id, blueprint_id, stage, previous_stage),
                (alpha, alpha_target, alpha_mode, alpha_curve, alpha_algorithm),
                (isolate_gradients, is_healthy, metrics),
            )| SeedState {
                schema_version: SCHEMA_VERSION,
                seed_id,
                slot_id,
                blueprint_id,
                stage,
                previous_stage,
                alpha,
                alpha_target,
                alpha_mode,
                alpha_curve,
                alpha_algorithm,
                isolate_gradients,
                is_healthy,
                metrics,
            },
        )
}

fn gate_result() -> impl Strategy<Value = GateResult> {
    (
        proptest::sample::select(vec![0, 1, 2, 3, 5]),
        any::<bool>(),
        0.0f64..=1.0,
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec(text(), 0..3),
        text(),
        any::<i64>(),
    )
        .prop_map(
            |(gate, passed, score, checks_passed, checks_failed, message, timestamp)| GateResult {
                schema_version: SCHEMA_VERSION,
                gate,
                passed,
                score,
                checks_passed,
                checks_failed,
                message,
                timestamp_unix_ns: timestamp,
            },
        )
}

fn telemetry_packet() -> impl Strategy<Value = TelemetryPacket> {
    let metric = ("[a-z]{1,8}\\.[a-z_]{1,8}", finite(), text(), attributes()).prop_map(
        |(name, value, unit, attributes)| TelemetryMetric {
            name,
            value,
            unit,
            attributes,
        },
    );
    let event = ("[a-z]{1,8}\\.[a-z_]{1,8}", 0i32..5, text(), attributes()).prop_map(
        |(name, level, message, attributes)| TelemetryEvent {
            name,
            level,
            message,
            attributes,
        },
    );
    (
        text(),
        any::<i64>(),
        0i32..5,
        proptest::collection::vec(metric, 0..4),
        proptest::collection::vec(event, 0..4),
    )
        .prop_map(
            |(source, timestamp, level, metrics, events)| TelemetryPacket {
                schema_version: SCHEMA_VERSION,
                source,
                timestamp_unix_ns: timestamp,
                level,
                metrics,
                events,
            },
        )
}

fn adaptation_command() -> impl Strategy<Value = AdaptationCommand> {
    (
        (any::<u32>(), 0i32..13, 0i32..4, 0i32..3, 0i32..3),
        (0i32..4, 0i32..5, 0i32..6, any::<u32>(), any::<u64>()),
    )
        .prop_map(
            |(
                (slot, blueprint, style, tempo, alpha_target),
                (alpha_speed, alpha_curve, op, env_id, epoch),
            )| AdaptationCommand {
                schema_version: SCHEMA_VERSION,
                slot,
                blueprint,
                style,
                tempo,
                alpha_target,
                alpha_speed,
                alpha_curve,
                op,
                env_id,
                epoch,
            },
        )
}

#[test]
fn transitions_through_the_typed_api_agree_with_the_table() {
    for &from in SeedStage::ALL {
        for &to in SeedStage::ALL {
            assert_eq!(
                validate_transition(from, to).is_ok(),
                REFERENCE_EDGES.contains(&(from.value(), to.value()))
            );
        }
    }
}

#[test]
fn wrong_schema_version_and_missing_json_keys_are_rejected() {
    let command = AdaptationCommand {
        schema_version: SCHEMA_VERSION + 1,
        ..Default::default()
    };
    assert!(matches!(
        command.validate(),
        Err(Error::SchemaVersion { got: 2, .. })
    ));
    assert!(matches!(
        AdaptationCommand::from_json("{\"schema_version\": 1}"),
        Err(Error::Json { .. })
    ));
    let nan_alpha = SeedState {
        schema_version: SCHEMA_VERSION,
        alpha: f64::NAN,
        alpha_curve: 1,
        alpha_algorithm: 1,
        ..Default::default()
    };
    assert!(matches!(
        nan_alpha.validate(),
        Err(Error::InvalidField { field: "alpha", .. })
    ));
}
