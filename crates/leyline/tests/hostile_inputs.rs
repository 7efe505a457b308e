//! Every public constructor and entry point of leyline fed from the shared
//! hostile-input strategies (`leyline::testing`): nothing panics; a value is
//! accepted exactly when the contract allows it, a refusal names the field,
//! and whatever is accepted round-trips through protobuf and JSON.

use std::collections::BTreeMap;

use leyline::action::head_index;
use leyline::baseline::{BASELINE_SCHEMA, BaselineRecord, Environment, ResultEntry, percentile};
use leyline::codec::{Contract, check_finite_packet};
use leyline::proto::{
    AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryEvent, TelemetryMetric,
    TelemetryPacket,
};
use leyline::stage::validate_transition_values;
use leyline::telemetry::{event_spec, metric_spec, prometheus_name};
use leyline::testing::{
    extreme_f64, extreme_i64, extreme_u32, extreme_u64, extreme_usize, hostile_string,
    valid_baseline_record,
};
use leyline::{
    AlphaAlgorithm, AlphaCurve, AlphaCurveAction, AlphaMode, AlphaSpeedAction, AlphaTargetAction,
    BlueprintAction, Error, GateLevel, GerminationStyle, HEAD_NAMES, LifecycleOp, SCHEMA_VERSION,
    SeedStage, TelemetryLevel, TempoAction,
};
use proptest::prelude::*;

/// Small case counts: the suite must stay quick on two CPU cores.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    }
}

/// An `i32` from an extreme `i64` (wrapping, to reach both ends).
fn extreme_i32() -> impl Strategy<Value = i32> {
    prop_oneof![
        extreme_i64().prop_map(|value| value as i32),
        Just(i32::MIN),
        Just(i32::MAX),
        Just(5),
        Just(4),
    ]
}

macro_rules! check_enum {
    ($enum:ty, $value:expr, $name:expr) => {{
        let value: i32 = $value;
        let name: &str = $name;
        let decoded = <$enum>::from_value(value);
        let listed = <$enum>::ALL.iter().find(|variant| variant.value() == value);
        prop_assert_eq!(decoded.as_ref().ok(), listed);
        if decoded.is_err() {
            let named = matches!(decoded, Err(Error::InvalidEnumValue { value: v, .. }) if v == i64::from(value));
            prop_assert!(named);
        }
        let by_name = <$enum>::from_name(name);
        let listed = <$enum>::ALL.iter().find(|variant| variant.name() == name);
        prop_assert_eq!(by_name.as_ref().ok(), listed);
        let parsed: Result<$enum, _> =
            serde_json::from_value(serde_json::Value::String(name.to_owned()));
        let parsed = parsed.ok();
        prop_assert_eq!(parsed.as_ref(), listed);
    }};
}

fn valid_metric_set() -> SeedMetricSet {
    SeedMetricSet {
        schema_version: SCHEMA_VERSION,
        epochs_total: 4,
        epochs_in_stage: 2,
        train_accuracy: 50.0,
        val_accuracy: 48.0,
        accuracy_at_stage_start: 40.0,
        improvement_since_stage_start: 8.0,
        gradient_norm: 0.5,
        gradient_ratio: Some(0.3),
        counterfactual_contribution: Some(2.0),
        param_count: 10,
        gradients_vanishing: false,
        gradients_exploding: false,
    }
}

fn valid_seed_state() -> SeedState {
    SeedState {
        schema_version: SCHEMA_VERSION,
        seed_id: "s".into(),
        slot_id: "r0c0".into(),
        blueprint_id: "norm".into(),
        stage: SeedStage::Blending.value(),
        previous_stage: SeedStage::Training.value(),
        alpha: 0.5,
        alpha_target: 1.0,
        alpha_mode: AlphaMode::Up.value(),
        alpha_curve: AlphaCurve::Linear.value(),
        alpha_algorithm: AlphaAlgorithm::Add.value(),
        isolate_gradients: false,
        is_healthy: true,
        metrics: Some(valid_metric_set()),
    }
}

/// Whether validation's verdict matches `expected_ok`, the refusal names
/// `field`, and an accepted message round-trips both ways.
fn verdict<T: Contract + Clone + PartialEq + std::fmt::Debug>(
    message: &T,
    expected_ok: bool,
    field: &'static str,
) -> Result<(), TestCaseError> {
    let result = message.validate();
    prop_assert_eq!(result.is_ok(), expected_ok, "{:?}", result);
    match result {
        Ok(()) => round_trips(message),
        Err(Error::InvalidField { field: named, .. }) => {
            prop_assert_eq!(named, field);
            prop_assert!(message.to_json().is_err());
            prop_assert!(message.encode_protobuf().is_err());
            Ok(())
        }
        Err(other) => Err(TestCaseError::fail(format!("{field}: {other:?}"))),
    }
}

fn round_trips<T: Contract + Clone + PartialEq + std::fmt::Debug>(
    message: &T,
) -> Result<(), TestCaseError> {
    let bytes = message
        .encode_protobuf()
        .map_err(|error| TestCaseError::fail(format!("{error}")))?;
    prop_assert_eq!(T::decode_protobuf(&bytes), Ok(message.clone()));
    let json = message
        .to_json()
        .map_err(|error| TestCaseError::fail(format!("{error}")))?;
    prop_assert_eq!(T::from_json(&json), Ok(message.clone()));
    Ok(())
}

type MetricEdit = fn(&mut SeedMetricSet, f64);

/// Each float field of `SeedMetricSet` with its contract range.
const METRIC_FIELDS: [(&str, MetricEdit, f64, f64); 7] = [
    ("train_accuracy", |m, v| m.train_accuracy = v, 0.0, 100.0),
    ("val_accuracy", |m, v| m.val_accuracy = v, 0.0, 100.0),
    (
        "accuracy_at_stage_start",
        |m, v| m.accuracy_at_stage_start = v,
        0.0,
        100.0,
    ),
    (
        "improvement_since_stage_start",
        |m, v| m.improvement_since_stage_start = v,
        -100.0,
        100.0,
    ),
    ("gradient_norm", |m, v| m.gradient_norm = v, 0.0, f64::MAX),
    (
        "gradient_ratio",
        |m, v| m.gradient_ratio = Some(v),
        0.0,
        10.0,
    ),
    (
        "counterfactual_contribution",
        |m, v| m.counterfactual_contribution = Some(v),
        -100.0,
        100.0,
    ),
];

fn in_range(value: f64, low: f64, high: f64) -> bool {
    value.is_finite() && (low..=high).contains(&value)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn enum_conversions_never_panic(value in extreme_i32(), name in hostile_string()) {
        check_enum!(SeedStage, value, &name);
        check_enum!(GateLevel, value, &name);
        check_enum!(AlphaMode, value, &name);
        check_enum!(AlphaCurve, value, &name);
        check_enum!(AlphaAlgorithm, value, &name);
        check_enum!(TelemetryLevel, value, &name);
        check_enum!(LifecycleOp, value, &name);
        check_enum!(BlueprintAction, value, &name);
        check_enum!(GerminationStyle, value, &name);
        check_enum!(TempoAction, value, &name);
        check_enum!(AlphaTargetAction, value, &name);
        check_enum!(AlphaSpeedAction, value, &name);
        check_enum!(AlphaCurveAction, value, &name);
    }

    #[test]
    fn enum_names_round_trip_for_listed_values(value in -2i32..16) {
        if let Ok(stage) = SeedStage::from_value(value) {
            prop_assert_eq!(SeedStage::from_name(stage.name()), Ok(stage));
            prop_assert!(stage.one_hot_index() < leyline::stage::NUM_STAGES);
        }
    }

    #[test]
    fn transitions_from_extreme_values_are_refused(from in extreme_i32(), to in extreme_i32()) {
        let result = validate_transition_values(from, to);
        let legal = SeedStage::from_value(from)
            .and_then(|f| SeedStage::from_value(to).map(|t| f.can_transition_to(t)))
            .unwrap_or(false);
        prop_assert_eq!(result.is_ok(), legal);
    }

    #[test]
    fn name_lookups_never_panic(name in hostile_string()) {
        prop_assert_eq!(head_index(&name).is_some(), HEAD_NAMES.contains(&name.as_str()));
        if let Some(spec) = metric_spec(&name) {
            prop_assert_eq!(spec.name, name.as_str());
        }
        if let Some(spec) = event_spec(&name) {
            prop_assert_eq!(spec.name, name.as_str());
        }
        prop_assert!(!prometheus_name(&name).contains('.'));
    }

    #[test]
    fn seed_metric_floats_are_checked_where_they_enter(index in 0usize..7, value in extreme_f64()) {
        let (field, edit, low, high) = METRIC_FIELDS[index];
        let mut metrics = valid_metric_set();
        edit(&mut metrics, value);
        verdict(&metrics, in_range(value, low, high), field)?;
        let mut state = valid_seed_state();
        state.metrics = Some(metrics);
        verdict(&state, in_range(value, low, high), field)?;
    }

    #[test]
    fn seed_state_alpha_is_finite_and_in_the_unit_interval(alpha in extreme_f64(), target in extreme_f64()) {
        let mut state = valid_seed_state();
        state.alpha = alpha;
        verdict(&state, in_range(alpha, 0.0, 1.0), "alpha")?;
        let mut state = valid_seed_state();
        state.alpha_target = target;
        verdict(&state, in_range(target, 0.0, 1.0), "alpha_target")?;
    }

    #[test]
    fn seed_state_enums_and_strings_from_hostile_input(
        stage in extreme_i32(),
        previous in extreme_i32(),
        mode in extreme_i32(),
        text in hostile_string(),
        schema in extreme_u32(),
        (epochs, params) in (extreme_u32(), extreme_u64()),
    ) {
        let mut state = valid_seed_state();
        state.stage = stage;
        state.previous_stage = previous;
        state.alpha_mode = mode;
        state.seed_id = text.clone();
        state.slot_id = text.clone();
        state.blueprint_id = text;
        state.schema_version = schema;
        if let Some(metrics) = state.metrics.as_mut() {
            metrics.epochs_total = epochs;
            metrics.param_count = params;
        }
        let ok = schema == SCHEMA_VERSION
            && SeedStage::from_value(stage).is_ok()
            && SeedStage::from_value(previous).is_ok()
            && AlphaMode::from_value(mode).is_ok();
        let result = state.validate();
        prop_assert_eq!(result.is_ok(), ok, "{:?}", result);
        if ok {
            round_trips(&state)?;
        } else {
            let typed = matches!(
                result,
                Err(Error::InvalidEnumValue { .. } | Error::SchemaVersion { .. })
            );
            prop_assert!(typed);
        }
    }

    #[test]
    fn gate_result_score_and_gate(score in extreme_f64(), gate in extreme_i32(), text in hostile_string(), stamp in extreme_i64()) {
        let result = GateResult {
            schema_version: SCHEMA_VERSION,
            gate: GateLevel::G2.value(),
            passed: false,
            score,
            checks_passed: vec![text.clone()],
            checks_failed: vec![],
            message: text,
            timestamp_unix_ns: stamp,
        };
        verdict(&result, in_range(score, 0.0, 1.0), "score")?;
        let with_gate = GateResult { gate, score: 0.5, ..result };
        prop_assert_eq!(with_gate.validate().is_ok(), GateLevel::from_value(gate).is_ok());
    }

    #[test]
    fn telemetry_packets_from_hostile_input(
        source in hostile_string(),
        name in hostile_string(),
        value in extreme_f64(),
        level in extreme_i32(),
        key in hostile_string(),
    ) {
        let mut metric = TelemetryMetric::new(&name, value, &key);
        metric.attributes.insert(key.clone(), name.clone());
        let mut event = TelemetryEvent::new(&name, TelemetryLevel::Warning, &source);
        event.attributes.insert(key, source.clone());
        let packet = TelemetryPacket::new(&source, TelemetryLevel::Info)
            .with_metric(metric)
            .with_event(event);
        prop_assert_eq!(check_finite_packet(&packet).is_ok(), value.is_finite());
        let ok = !name.is_empty() && value.is_finite();
        let field = if name.is_empty() { "metrics.name" } else { "metrics.value" };
        verdict(&packet, ok, field)?;
        let mut leveled = packet.clone();
        leveled.level = level;
        leveled.metrics.clear();
        let level_ok = TelemetryLevel::from_value(level).is_ok() && !name.is_empty();
        prop_assert_eq!(leveled.validate().is_ok(), level_ok);
    }

    #[test]
    fn adaptation_commands_from_hostile_heads(
        heads in proptest::collection::vec(extreme_i32(), 7),
        slot in extreme_u32(),
        env in extreme_u32(),
        epoch in extreme_u64(),
    ) {
        let command = AdaptationCommand {
            schema_version: SCHEMA_VERSION,
            slot,
            blueprint: heads[0],
            style: heads[1],
            tempo: heads[2],
            alpha_target: heads[3],
            alpha_speed: heads[4],
            alpha_curve: heads[5],
            op: heads[6],
            env_id: env,
            epoch,
        };
        let ok = BlueprintAction::from_value(heads[0]).is_ok()
            && GerminationStyle::from_value(heads[1]).is_ok()
            && TempoAction::from_value(heads[2]).is_ok()
            && AlphaTargetAction::from_value(heads[3]).is_ok()
            && AlphaSpeedAction::from_value(heads[4]).is_ok()
            && AlphaCurveAction::from_value(heads[5]).is_ok()
            && LifecycleOp::from_value(heads[6]).is_ok();
        prop_assert_eq!(command.validate().is_ok(), ok);
        if ok {
            round_trips(&command)?;
        }
    }

    #[test]
    fn percentile_of_extreme_samples(samples in proptest::collection::vec(extreme_f64(), 0..16), percent in extreme_f64()) {
        let result = percentile(&samples, percent);
        let defined = !samples.is_empty() && (0.0..=100.0).contains(&percent);
        prop_assert_eq!(result.is_some(), defined);
        if let Some(value) = result {
            prop_assert!(samples.iter().any(|sample| sample.to_bits() == value.to_bits()));
        }
    }

    #[test]
    fn baseline_records_are_written_only_when_they_read_back(
        label in hostile_string(),
        workload in hostile_string(),
        extra_key in hostile_string(),
        metric_key in hostile_string(),
        value in extreme_f64(),
        cores in extreme_usize(),
    ) {
        let record = BaselineRecord {
            schema: BASELINE_SCHEMA,
            workload,
            label,
            environment: Environment {
                device: "cpu".into(),
                torch: "n/a".into(),
                cuda: "n/a".into(),
                driver: "n/a".into(),
                cpu: "x".into(),
                git_rev: "r".into(),
                tf32: true,
                amp: "off".into(),
                extra: BTreeMap::from([
                    (extra_key, serde_json::Value::from(cores)),
                    ("x".to_owned(), serde_json::Value::from(value)),
                ]),
            },
            params: serde_json::json!({ "value": value, "cores": cores }),
            results: vec![ResultEntry {
                amp: None,
                implementation: "rust".into(),
                mode: "eager".into(),
                metrics: BTreeMap::from([(metric_key, value)]),
                error: Some("e".into()),
            }],
            telemetry_names: vec![leyline::telemetry::NISSA_DROPPED_TOTAL.to_owned()],
        };
        match record.to_json_pretty() {
            Ok(text) => {
                prop_assert!(record.validate().is_ok());
                prop_assert_eq!(BaselineRecord::from_json(&text), Ok(record));
            }
            Err(error) => {
                prop_assert_eq!(record.validate(), Err(error.clone()));
                let typed = matches!(error, Error::InvalidField { message: "BaselineRecord", .. });
                prop_assert!(typed, "{:?}", error);
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_written_record_always_reads_back_equal(record in valid_baseline_record()) {
        // Serialised text; the file side is `esper`'s record writer's test.
        let text = record.to_json_pretty();
        prop_assert!(text.is_ok(), "{:?}", text);
        let text = text.unwrap_or_default();
        prop_assert_eq!(BaselineRecord::from_json(&text), Ok(record));
    }
}
