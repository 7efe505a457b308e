//! Bounded, deterministic fuzzing of every leyline decoder, run by
//! `cargo test` (the open-ended version is `fuzz/`, under cargo-fuzz).
//!
//! For each decoder (protobuf and JSON of each message, the baseline record)
//! a seeded SplitMix64 generator feeds random bytes, randomly built protobuf
//! fields and mutations of valid encodings (bit flips, interesting bytes,
//! insertions, deletions, splices, JSON token swaps such as `1e999`, `NaN`,
//! `null` or an unknown key). Each input must either decode to a value that
//! passes validation and re-encodes to the same value through both
//! encodings, or return a typed error; a panic or a broken round trip fails
//! the test and prints the input in hex.

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use leyline::baseline::{BASELINE_SCHEMA, BaselineRecord, Environment, ResultEntry};
use leyline::codec::Contract;
use leyline::proto::{
    AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryEvent, TelemetryMetric,
    TelemetryPacket,
};
use leyline::{SCHEMA_VERSION, TelemetryLevel};

/// Inputs per decoder (11 decoders: 440,000 inputs in all, about a second
/// in a debug build on two cores).
const INPUTS_PER_DECODER: usize = 40_000;

/// The mutation driver: leyline's seeded generator with the draws the
/// mutations need.
struct Mutator(leyline::rng::SplitMix64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const INTERESTING_BYTES: &[u8] = &[0x00, 0x01, 0x05, 0x7f, 0x80, 0xff, 0xfe, b'"', b'{', b'}'];

/// JSON fragments swapped in for a number or a literal.
const JSON_TOKENS: &[&str] = &[
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "null",
    "-1",
    "-0",
    "0.5",
    "100.0000001",
    "5",
    "4",
    "2147483648",
    "4294967296",
    "18446744073709551616",
    "-9223372036854775809",
    "1.7976931348623157e308",
    "4.9e-324",
    "1e-400",
    "true",
    "\"x\"",
    "[]",
    "{}",
    "\"\\u0000\"",
    "\"\\ud800\"",
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// One mutation of `input` (using `others` for splices).
fn mutate(rng: &mut Mutator, input: &mut Vec<u8>, others: &[Vec<u8>], json: bool) {
    let len = input.len();
    match rng.below(if json { 10 } else { 8 }) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = *rng.pick(INTERESTING_BYTES);
        }
        2 => {
            let at = rng.below(len + 1);
            let count = 1 + rng.below(4);
            for _ in 0..count {
                let byte = rng.byte();
                input.insert(at.min(input.len()), byte);
            }
        }
        3 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(8)).min(len);
            input.drain(start..end);
        }
        4 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(16)).min(len);
            let chunk = input[start..end].to_vec();
            let at = rng.below(input.len() + 1);
            input.splice(at..at, chunk);
        }
        5 => input.truncate(rng.below(len + 1)),
        6 => {
            let other = rng.pick(others);
            if !other.is_empty() {
                let start = rng.below(other.len());
                let end = (start + 1 + rng.below(32)).min(other.len());
                let at = rng.below(len + 1);
                input.splice(at..at, other[start..end].iter().copied());
            }
        }
        7 if len > 0 => {
            // A varint-looking run: long continuation bytes.
            let at = rng.below(len);
            let count = 1 + rng.below(10);
            input.splice(at..at, std::iter::repeat_n(0xff, count));
        }
        8 => swap_json_token(rng, input),
        9 => {
            // An unknown key, or a duplicate of the first key, after a `{`.
            if let Some(at) = input.iter().position(|&byte| byte == b'{') {
                let key: &[u8] = if rng.below(2) == 0 {
                    b"\"unknown_key\":1,"
                } else {
                    b"\"schema_version\":1,"
                };
                input.splice(at + 1..at + 1, key.iter().copied());
            }
        }
        _ => {
            let byte = rng.byte();
            input.push(byte);
        }
    }
}

/// Replaces one JSON number or literal with a hostile token.
fn swap_json_token(rng: &mut Mutator, input: &mut Vec<u8>) {
    let starts: Vec<usize> = input
        .iter()
        .enumerate()
        .filter(|(i, byte)| {
            (byte.is_ascii_digit() || **byte == b'-' || **byte == b't' || **byte == b'f')
                && (*i == 0 || matches!(input[i - 1], b':' | b'[' | b',' | b' '))
        })
        .map(|(i, _)| i)
        .collect();
    if starts.is_empty() {
        return;
    }
    let start = *rng.pick(&starts);
    let end = input[start..]
        .iter()
        .position(|&byte| matches!(byte, b',' | b'}' | b']' | b'\n'))
        .map_or(input.len(), |offset| start + offset);
    let token = rng.pick(JSON_TOKENS).as_bytes().to_vec();
    input.splice(start..end, token);
}

/// A random sequence of protobuf fields (field 1..16, every wire type).
fn random_protobuf(rng: &mut Mutator) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.below(8) {
        let field = 1 + rng.below(16) as u64;
        let wire = *rng.pick(&[0u64, 1, 2, 5, 3, 4, 6, 7]);
        push_varint(&mut out, (field << 3) | wire);
        match wire {
            0 => {
                let value = match rng.below(4) {
                    0 => rng.next(),
                    1 => 5,
                    2 => u64::MAX,
                    _ => rng.below(12) as u64,
                };
                push_varint(&mut out, value);
            }
            1 => out.extend_from_slice(
                &rng.pick(&[f64::NAN, f64::INFINITY, -1.0, 0.5, 1e300, 150.0])
                    .to_le_bytes(),
            ),
            2 => {
                let len = rng.below(12);
                push_varint(
                    &mut out,
                    if rng.below(16) == 0 {
                        u64::MAX
                    } else {
                        len as u64
                    },
                );
                for _ in 0..len {
                    out.push(rng.byte());
                }
            }
            5 => out.extend_from_slice(&rng.next().to_le_bytes()[..4]),
            _ => {}
        }
    }
    out
}

fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A decoder check: `Ok(true)` accepted and round-tripped, `Ok(false)`
/// refused with a typed error, `Err` a broken invariant.
type Check = dyn Fn(&[u8]) -> Result<bool, String>;

/// Tally of one decoder's run.
#[derive(Default)]
struct Tally {
    accepted: usize,
    refused: usize,
}

/// Runs `check` on every input, turning a panic into a failure with the input.
fn drive(name: &str, seeds: &[Vec<u8>], json: bool, seed: u64, check: &Check) -> Tally {
    let mut rng = Mutator(leyline::rng::SplitMix64::new(seed));
    let mut tally = Tally::default();
    for index in 0..INPUTS_PER_DECODER {
        let input = match index % 8 {
            0 => (0..rng.below(64)).map(|_| rng.byte()).collect(),
            1 if !json => random_protobuf(&mut rng),
            _ => {
                let mut input = rng.pick(seeds).clone();
                for _ in 0..1 + rng.below(4) {
                    mutate(&mut rng, &mut input, seeds, json);
                }
                input
            }
        };
        match catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(Ok(true)) => tally.accepted += 1,
            Ok(Ok(false)) => tally.refused += 1,
            Ok(Err(broken)) => panic!("{name}: {broken}; input hex {}", hex(&input)),
            Err(_) => panic!("{name} panicked on input hex {}", hex(&input)),
        }
    }
    assert!(
        tally.accepted > 0 && tally.refused > 0,
        "{name}: {} accepted, {} refused: the loop does not reach both outcomes",
        tally.accepted,
        tally.refused
    );
    tally
}

/// Both re-encodings of an accepted message give it back.
fn re_encodes<T: Contract + PartialEq + Debug>(message: &T) -> Result<(), String> {
    message
        .validate()
        .map_err(|e| format!("accepted but invalid: {e}"))?;
    let bytes = message.encode_protobuf().map_err(|e| e.to_string())?;
    if T::decode_protobuf(&bytes).as_ref() != Ok(message) {
        return Err(format!("protobuf round trip changed {message:?}"));
    }
    let json = message.to_json().map_err(|e| e.to_string())?;
    if T::from_json(&json).as_ref() != Ok(message) {
        return Err(format!("JSON round trip changed {message:?}"));
    }
    Ok(())
}

fn check_protobuf<T: Contract + PartialEq + Debug>(bytes: &[u8]) -> Result<bool, String> {
    match T::decode_protobuf(bytes) {
        Ok(message) => re_encodes(&message).map(|()| true),
        Err(_) => Ok(false),
    }
}

fn check_json<T: Contract + PartialEq + Debug>(bytes: &[u8]) -> Result<bool, String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(false);
    };
    match T::from_json(text) {
        Ok(message) => re_encodes(&message).map(|()| true),
        Err(_) => Ok(false),
    }
}

fn check_baseline(bytes: &[u8]) -> Result<bool, String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(false);
    };
    match BaselineRecord::from_json(text) {
        Ok(record) => {
            let written = record.to_json_pretty().map_err(|e| e.to_string())?;
            if BaselineRecord::from_json(&written).as_ref() != Ok(&record) {
                return Err("baseline round trip changed the record".to_owned());
            }
            Ok(true)
        }
        Err(_) => Ok(false),
    }
}

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
        gradients_vanishing: true,
        gradients_exploding: false,
    }
}

fn seed_states() -> Vec<SeedState> {
    let full = SeedState {
        schema_version: SCHEMA_VERSION,
        seed_id: "seed-1".into(),
        slot_id: "r0c1".into(),
        blueprint_id: "norm".into(),
        stage: 4,
        previous_stage: 3,
        alpha: 0.4,
        alpha_target: 1.0,
        alpha_mode: 1,
        alpha_curve: 2,
        alpha_algorithm: 3,
        isolate_gradients: true,
        is_healthy: true,
        metrics: Some(metric_set()),
    };
    let bare = SeedState {
        metrics: None,
        stage: 1,
        previous_stage: 0,
        alpha: 0.0,
        ..full.clone()
    };
    vec![full, bare]
}

fn gate_results() -> Vec<GateResult> {
    vec![GateResult {
        schema_version: SCHEMA_VERSION,
        gate: 5,
        passed: true,
        score: 0.25,
        checks_passed: vec!["contribution".into(), "healthy".into()],
        checks_failed: vec!["age".into()],
        message: "G5".into(),
        timestamp_unix_ns: -3,
    }]
}

fn packets() -> Vec<TelemetryPacket> {
    let mut metric = TelemetryMetric::new("kasmina.seed.alpha", 0.5, "ratio");
    metric.attributes.insert("seed_id".into(), "seed-1".into());
    let mut event = TelemetryEvent::new("kasmina.seed.pruned", TelemetryLevel::Info, "bye");
    event.attributes.insert("reason".into(), "age".into());
    let mut packet = TelemetryPacket::new("kasmina.r0c1", TelemetryLevel::Warning)
        .with_metric(metric)
        .with_metric(TelemetryMetric::new(
            "tolaria.training.latency_ms",
            3.25,
            "ms",
        ))
        .with_event(event);
    packet.timestamp_unix_ns = 1_700_000_000_000_000_000;
    vec![packet]
}

fn commands() -> Vec<AdaptationCommand> {
    vec![AdaptationCommand {
        schema_version: SCHEMA_VERSION,
        slot: 2,
        blueprint: 12,
        style: 3,
        tempo: 2,
        alpha_target: 1,
        alpha_speed: 3,
        alpha_curve: 4,
        op: 5,
        env_id: 7,
        epoch: 99,
    }]
}

fn protobuf_seeds<T: Contract>(messages: &[T]) -> Vec<Vec<u8>> {
    messages
        .iter()
        .map(|message| message.encode_protobuf().expect("valid seed"))
        .collect()
}

fn json_seeds<T: Contract>(messages: &[T]) -> Vec<Vec<u8>> {
    messages
        .iter()
        .map(|message| message.to_json().expect("valid seed").into_bytes())
        .collect()
}

fn report(name: &str, tally: &Tally, started: Instant) {
    eprintln!(
        "{name}: {INPUTS_PER_DECODER} inputs, {} accepted, {} refused, {:?}",
        tally.accepted,
        tally.refused,
        started.elapsed()
    );
}

#[test]
fn protobuf_decoders_survive_fuzzing() {
    let started = Instant::now();
    let metric_sets = vec![metric_set()];
    let runs: [(&str, Vec<Vec<u8>>, &Check); 5] = [
        (
            "SeedMetricSet",
            protobuf_seeds(&metric_sets),
            &check_protobuf::<SeedMetricSet>,
        ),
        (
            "SeedState",
            protobuf_seeds(&seed_states()),
            &check_protobuf::<SeedState>,
        ),
        (
            "GateResult",
            protobuf_seeds(&gate_results()),
            &check_protobuf::<GateResult>,
        ),
        (
            "TelemetryPacket",
            protobuf_seeds(&packets()),
            &check_protobuf::<TelemetryPacket>,
        ),
        (
            "AdaptationCommand",
            protobuf_seeds(&commands()),
            &check_protobuf::<AdaptationCommand>,
        ),
    ];
    for (index, (name, seeds, check)) in runs.iter().enumerate() {
        let tally = drive(name, seeds, false, 0x5EED_0000 + index as u64, *check);
        report(&format!("protobuf {name}"), &tally, started);
    }
}

#[test]
fn json_decoders_survive_fuzzing() {
    let started = Instant::now();
    let metric_sets = vec![metric_set()];
    let runs: [(&str, Vec<Vec<u8>>, &Check); 5] = [
        (
            "SeedMetricSet",
            json_seeds(&metric_sets),
            &check_json::<SeedMetricSet>,
        ),
        (
            "SeedState",
            json_seeds(&seed_states()),
            &check_json::<SeedState>,
        ),
        (
            "GateResult",
            json_seeds(&gate_results()),
            &check_json::<GateResult>,
        ),
        (
            "TelemetryPacket",
            json_seeds(&packets()),
            &check_json::<TelemetryPacket>,
        ),
        (
            "AdaptationCommand",
            json_seeds(&commands()),
            &check_json::<AdaptationCommand>,
        ),
    ];
    for (index, (name, seeds, check)) in runs.iter().enumerate() {
        let tally = drive(name, seeds, true, 0x15_0000 + index as u64, *check);
        report(&format!("json {name}"), &tally, started);
    }
}

#[test]
fn baseline_record_reader_survives_fuzzing() {
    let started = Instant::now();
    let record = BaselineRecord {
        schema: BASELINE_SCHEMA,
        workload: "tolaria-reference".into(),
        label: "cpu-1".into(),
        environment: Environment {
            device: "cpu".into(),
            torch: "n/a".into(),
            cuda: "n/a".into(),
            driver: "n/a".into(),
            cpu: "x".into(),
            git_rev: "abc".into(),
            tf32: false,
            amp: "off".into(),
            extra: [("cpu_cores".to_owned(), serde_json::Value::from(2))].into(),
        },
        params: serde_json::json!({ "epochs": 3, "lr": 0.1 }),
        results: vec![ResultEntry {
            amp: None,
            implementation: "rust".into(),
            mode: "eager".into(),
            metrics: [("epoch_ms_p50".to_owned(), 1.5), ("steps".to_owned(), 4.0)].into(),
            error: None,
        }],
        telemetry_names: vec!["tolaria.training.latency_ms".into()],
    };
    let pretty = record.to_json_pretty().expect("valid seed");
    let compact = serde_json::to_string(&record).expect("serialises");
    let seeds = vec![pretty.into_bytes(), compact.into_bytes()];
    let tally = drive("BaselineRecord", &seeds, true, 0xBA5E, &check_baseline);
    report("baseline BaselineRecord", &tally, started);
}
