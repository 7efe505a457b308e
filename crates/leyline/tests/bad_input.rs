//! Regression tests of issue 9 for leyline: each bad input named there (and
//! the rest of its class) is refused with a typed error naming the field,
//! and whatever is written reads back.

use std::collections::BTreeMap;

use leyline::baseline::{BASELINE_SCHEMA, BaselineRecord, Environment, ResultEntry, percentile};
use leyline::codec::{Contract, check_finite_packet};
use leyline::proto::{
    AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryEvent, TelemetryMetric,
    TelemetryPacket,
};
use leyline::{Error, SCHEMA_VERSION, TelemetryLevel};

fn metric_set() -> SeedMetricSet {
    SeedMetricSet {
        schema_version: SCHEMA_VERSION,
        epochs_total: 12,
        epochs_in_stage: 3,
        train_accuracy: 61.0,
        val_accuracy: 60.0,
        accuracy_at_stage_start: 55.0,
        improvement_since_stage_start: 5.0,
        gradient_norm: 0.3,
        gradient_ratio: Some(0.4),
        counterfactual_contribution: Some(1.5),
        param_count: 1234,
        gradients_vanishing: false,
        gradients_exploding: false,
    }
}

fn seed_state() -> SeedState {
    SeedState {
        schema_version: SCHEMA_VERSION,
        seed_id: "seed-1".into(),
        slot_id: "r0c1".into(),
        blueprint_id: "norm".into(),
        stage: 4,
        previous_stage: 3,
        alpha: 0.4,
        alpha_target: 1.0,
        alpha_mode: 1,
        alpha_curve: 1,
        alpha_algorithm: 1,
        isolate_gradients: true,
        is_healthy: true,
        metrics: Some(metric_set()),
    }
}

fn gate_result() -> GateResult {
    GateResult {
        schema_version: SCHEMA_VERSION,
        gate: 2,
        passed: true,
        score: 0.5,
        checks_passed: vec!["improvement".into()],
        checks_failed: vec![],
        message: "ok".into(),
        timestamp_unix_ns: 1,
    }
}

fn packet() -> TelemetryPacket {
    let mut metric = TelemetryMetric::new("kasmina.seed.alpha", 0.5, "ratio");
    metric.attributes.insert("seed_id".into(), "seed-1".into());
    let mut packet = TelemetryPacket::new("kasmina", TelemetryLevel::Info)
        .with_metric(metric)
        .with_event(TelemetryEvent::new(
            "kasmina.seed.germinated",
            TelemetryLevel::Info,
            "hello",
        ));
    packet.timestamp_unix_ns = 7;
    packet
}

fn command() -> AdaptationCommand {
    AdaptationCommand {
        schema_version: SCHEMA_VERSION,
        slot: 1,
        blueprint: 2,
        style: 1,
        tempo: 1,
        alpha_target: 2,
        alpha_speed: 1,
        alpha_curve: 0,
        op: 1,
        env_id: 3,
        epoch: 9,
    }
}

fn field_of<T>(result: leyline::Result<T>) -> Option<&'static str> {
    match result {
        Err(Error::InvalidField { field, .. }) => Some(field),
        _ => None,
    }
}

/// Adds `"misspelt": 1` next to the first key of a JSON object.
fn with_extra_key(json: &str, key: &str) -> String {
    json.replacen('{', &format!("{{\"{key}\":1,"), 1)
}

fn assert_unknown_key_refused<T: Contract + std::fmt::Debug>(message: &T) {
    let json = message.to_json().expect("valid message encodes");
    assert!(T::from_json(&json).is_ok());
    let bad = with_extra_key(&json, "alhpa_tagret");
    match T::from_json(&bad) {
        Err(Error::Json { reason, .. }) => {
            assert!(reason.contains("alhpa_tagret"), "{}: {reason}", T::NAME);
        }
        other => panic!("{}: misspelt key accepted: {other:?}", T::NAME),
    }
}

#[test]
fn misspelt_json_keys_are_refused_by_every_message() {
    assert_unknown_key_refused(&metric_set());
    assert_unknown_key_refused(&seed_state());
    assert_unknown_key_refused(&gate_result());
    assert_unknown_key_refused(&packet());
    assert_unknown_key_refused(&command());
}

#[test]
fn misspelt_keys_in_nested_messages_are_refused() {
    let json = seed_state().to_json().expect("json");
    let nested = json.replacen("\"epochs_total\"", "\"epoch_total\"", 1);
    assert!(matches!(
        SeedState::from_json(&nested),
        Err(Error::Json { reason, .. }) if reason.contains("epoch_total")
    ));
    let json = packet().to_json().expect("json");
    let nested = json.replacen("\"unit\"", "\"units\"", 1);
    assert!(matches!(
        TelemetryPacket::from_json(&nested),
        Err(Error::Json { reason, .. }) if reason.contains("units")
    ));
}

#[test]
fn non_finite_metric_values_are_refused_by_every_encoder() {
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut packet = packet();
        packet.metrics[0].value = value;
        assert_eq!(field_of(packet.validate()), Some("metrics.value"));
        assert_eq!(
            field_of(check_finite_packet(&packet)),
            Some("metrics.value")
        );
        assert_eq!(field_of(packet.to_json()), Some("metrics.value"));
        assert_eq!(field_of(packet.encode_protobuf()), Some("metrics.value"));
        // A protobuf carrying a NaN metric is refused on decode too.
        let bytes = prost::Message::encode_to_vec(&packet);
        assert_eq!(
            field_of(TelemetryPacket::decode_protobuf(&bytes)),
            Some("metrics.value")
        );
    }
    assert_eq!(check_finite_packet(&packet()), Ok(()));
}

#[test]
fn nan_json_value_written_as_null_is_not_produced() {
    // Before the fix, the packet encoded with `"value":null`, which its own
    // decoder then refused: written but unreadable.
    let mut packet = packet();
    packet.metrics[0].value = f64::NAN;
    assert!(packet.to_json().is_err());
}

#[test]
fn seed_metric_ranges_are_enforced_with_the_field_named() {
    type Edit = fn(&mut SeedMetricSet, f64);
    let cases: [(&str, Edit, &[f64]); 7] = [
        (
            "train_accuracy",
            |m, v| m.train_accuracy = v,
            &[-0.5, 100.5],
        ),
        ("val_accuracy", |m, v| m.val_accuracy = v, &[-1.0, 101.0]),
        (
            "accuracy_at_stage_start",
            |m, v| m.accuracy_at_stage_start = v,
            &[-1.0, 1e9],
        ),
        (
            "improvement_since_stage_start",
            |m, v| m.improvement_since_stage_start = v,
            &[-100.5, 100.5],
        ),
        ("gradient_norm", |m, v| m.gradient_norm = v, &[-1e-9, -1.0]),
        (
            "gradient_ratio",
            |m, v| m.gradient_ratio = Some(v),
            &[-0.1, 10.5],
        ),
        (
            "counterfactual_contribution",
            |m, v| m.counterfactual_contribution = Some(v),
            &[-100.5, 250.0],
        ),
    ];
    for (field, edit, out_of_range) in cases {
        for &value in out_of_range
            .iter()
            .chain(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY])
        {
            let mut metrics = metric_set();
            edit(&mut metrics, value);
            assert_eq!(field_of(metrics.validate()), Some(field), "{field}={value}");
            let mut state = seed_state();
            state.metrics = Some(metrics);
            assert_eq!(field_of(state.validate()), Some(field), "{field}={value}");
        }
    }
}

#[test]
fn non_finite_alpha_and_score_name_the_field() {
    for value in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut state = seed_state();
        state.alpha = value;
        let error = state.validate();
        assert_eq!(field_of(error.clone()), Some("alpha"));
        assert!(format!("{:?}", error).contains("not finite"), "{error:?}");
        let mut state = seed_state();
        state.alpha_target = value;
        assert_eq!(field_of(state.validate()), Some("alpha_target"));
        let mut gate = gate_result();
        gate.score = value;
        let error = gate.validate();
        assert_eq!(field_of(error.clone()), Some("score"));
        assert!(format!("{:?}", error).contains("not finite"), "{error:?}");
    }
}

fn record() -> BaselineRecord {
    BaselineRecord {
        schema: BASELINE_SCHEMA,
        workload: "nissa-emit".to_owned(),
        label: "cpu-test".to_owned(),
        environment: Environment {
            device: "cpu".into(),
            torch: "n/a".into(),
            cuda: "n/a".into(),
            driver: "n/a".into(),
            cpu: "test cpu".into(),
            git_rev: "abc".into(),
            tf32: false,
            amp: "off".into(),
            extra: BTreeMap::from([("cpu_cores".to_owned(), serde_json::Value::from(2))]),
        },
        params: serde_json::json!({ "events": 10 }),
        results: vec![ResultEntry {
            amp: None,
            implementation: "rust".to_owned(),
            mode: "default".to_owned(),
            metrics: BTreeMap::from([("emit_ns_p99".to_owned(), 120.0)]),
            error: None,
        }],
        telemetry_names: vec!["nissa.dropped_total".to_owned()],
    }
}

fn record_field(result: leyline::Result<String>) -> Option<&'static str> {
    match result {
        Err(Error::InvalidField {
            message: "BaselineRecord",
            field,
            ..
        }) => Some(field),
        _ => None,
    }
}

#[test]
fn baseline_record_with_non_finite_metric_is_refused_at_write() {
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut bad = record();
        bad.results[0]
            .metrics
            .insert("epoch_ms_p50".to_owned(), value);
        // Serialising validates, so nothing can write the record; the file
        // side (`esper`'s record writer) has its own test.
        assert_eq!(record_field(bad.to_json_pretty()), Some("results.metrics"));
        assert_eq!(
            record_field(bad.validate().map(|()| String::new())),
            Some("results.metrics")
        );
    }
}

#[test]
fn baseline_extra_key_equal_to_a_fixed_field_is_refused() {
    for key in [
        "device", "torch", "cuda", "driver", "cpu", "git_rev", "tf32", "amp",
    ] {
        let mut colliding = record();
        colliding
            .environment
            .extra
            .insert(key.to_owned(), serde_json::Value::from("x"));
        assert_eq!(
            record_field(colliding.to_json_pretty()),
            Some("environment.extra"),
            "{key}"
        );
    }
}

#[test]
fn baseline_labels_and_workloads_that_are_not_file_names_are_refused() {
    for bad in [
        "",
        ".",
        "..",
        "../up",
        "a/b",
        "a\\b",
        "/abs",
        "nul\0",
        "new\nline",
        ".hidden",
        " lead",
    ] {
        let mut labelled = record();
        labelled.label = bad.to_owned();
        assert_eq!(
            record_field(labelled.to_json_pretty()),
            Some("label"),
            "{bad:?}"
        );
        let mut named = record();
        named.workload = bad.to_owned();
        assert_eq!(
            record_field(named.to_json_pretty()),
            Some("workload"),
            "{bad:?}"
        );
    }
    let mut long = record();
    long.label = "x".repeat(129);
    assert_eq!(record_field(long.to_json_pretty()), Some("label"));
}

#[test]
fn baseline_unknown_keys_and_duplicate_entries_are_refused_on_read() {
    let text = record().to_json_pretty().expect("valid");
    assert_eq!(BaselineRecord::from_json(&text), Ok(record()));
    let misspelt = text.replacen("\"telemetry_names\"", "\"telemetry_name\"", 1);
    assert!(matches!(
        BaselineRecord::from_json(&misspelt),
        Err(Error::Json { reason, .. }) if reason.contains("telemetry_name")
    ));
    let misspelt = text.replacen("\"mode\"", "\"mod\"", 1);
    assert!(matches!(
        BaselineRecord::from_json(&misspelt),
        Err(Error::Json { reason, .. }) if reason.contains("mod")
    ));
    let mut duplicate = record();
    duplicate.results.push(duplicate.results[0].clone());
    assert_eq!(record_field(duplicate.to_json_pretty()), Some("results"));
    let mut unknown_name = record();
    unknown_name.telemetry_names.push("not.a.name".to_owned());
    assert_eq!(
        record_field(unknown_name.to_json_pretty()),
        Some("telemetry_names")
    );
    let mut bad_key = record();
    bad_key.results[0].metrics.insert(String::new(), 1.0);
    assert_eq!(
        record_field(bad_key.to_json_pretty()),
        Some("results.metrics")
    );
}

#[test]
fn baseline_reading_validates_like_writing() {
    // A file with a bad label (written by hand) is refused when read.
    let text =
        record()
            .to_json_pretty()
            .expect("valid")
            .replacen("\"cpu-test\"", "\"../escape\"", 1);
    assert!(matches!(
        BaselineRecord::from_json(&text),
        Err(Error::InvalidField { field: "label", .. })
    ));
}

#[test]
fn committed_baselines_still_read_back() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../baselines/perf");
    let mut read = 0;
    for workload in std::fs::read_dir(&root).expect("baselines/perf") {
        let workload = workload.expect("entry").path();
        for file in std::fs::read_dir(&workload).expect("workload dir") {
            let path = file.expect("entry").path();
            if path.extension().is_some_and(|ext| ext == "json") {
                let text = std::fs::read_to_string(&path).expect("read");
                let record = BaselineRecord::from_json(&text)
                    .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
                assert_eq!(
                    BaselineRecord::from_json(&record.to_json_pretty().expect("valid")),
                    Ok(record)
                );
                read += 1;
            }
        }
    }
    assert!(read >= 3, "read {read} records");
}

#[test]
fn percentile_refuses_percent_outside_its_range() {
    let samples = [1.0, 2.0, 3.0];
    for percent in [f64::NAN, -1.0, 100.5, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(percentile(&samples, percent), None, "{percent}");
    }
    assert_eq!(percentile(&samples, 0.0), Some(1.0));
    assert_eq!(percentile(&samples, 100.0), Some(3.0));
}

#[test]
fn a_result_entry_names_its_own_amp_only_as_off_bf16_or_fp16() {
    for amp in ["off", "bf16", "fp16"] {
        let mut good = record();
        good.results[0].amp = Some(amp.to_owned());
        let text = good.to_json_pretty().expect("valid");
        assert_eq!(BaselineRecord::from_json(&text), Ok(good));
    }
    for amp in ["", "fp8", "BF16"] {
        let mut bad = record();
        bad.results[0].amp = Some(amp.to_owned());
        assert_eq!(
            record_field(bad.to_json_pretty()),
            Some("results.amp"),
            "{amp:?}"
        );
    }
}
