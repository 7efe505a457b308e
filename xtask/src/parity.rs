//! `cargo xtask parity`: a fresh CPU capture (`esper parity-capture`, debug
//! build) compared with the committed baseline [`BASELINE`].
//!
//! The rules ([`compare`], a pure function over the two JSON documents):
//! - `telemetry.metrics` and `telemetry.events` of the capture must hold
//!   every name of the baseline's; a name that disappeared fails, naming
//!   it; a new name is reported;
//! - `figures` must match: floats within the baseline's `tolerance`
//!   (`|capture - baseline| <= absolute + relative * |baseline|`),
//!   integers, strings, booleans, nulls and array lengths exactly; a figure
//!   missing from the capture fails, a new one is reported;
//! - `timings_ms` are printed as capture/baseline ratios and never fail.
//!
//! `cargo xtask parity --update` rewrites the baseline from the capture,
//! keeping the baseline's tolerance (or writing [`DEFAULT_TOLERANCE`]).
//!
//! On one machine the figures repeat bit for bit (the capture is seeded and
//! runs on one CPU thread); the tolerance leaves room for another CPU's
//! vector code or libm rounding the last digits differently.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

/// The committed baseline, relative to the repository root.
pub(crate) const BASELINE: &str = "baselines/parity/cpu.json";

/// Where the fresh capture is written, relative to the repository root.
const CAPTURE: &str = "target/parity/cpu-capture.json";

/// The tolerance a new baseline gets.
pub(crate) const DEFAULT_TOLERANCE: Tolerance = Tolerance {
    relative: 1e-4,
    absolute: 1e-6,
};

/// The rule written beside the tolerance in the baseline, for its readers.
const TOLERANCE_RULE: &str = "a float in `figures` matches when |capture - baseline| <= \
    absolute + relative * |baseline|; integers, strings, booleans, nulls and array lengths match \
    exactly; telemetry names must be a superset of the baseline's; timings are never compared";

/// How far a float figure may move.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tolerance {
    /// Allowed difference relative to the baseline's value.
    pub(crate) relative: f64,
    /// Allowed absolute difference on top.
    pub(crate) absolute: f64,
}

impl Tolerance {
    /// The baseline's `tolerance` object (finite, non-negative numbers).
    fn from_baseline(baseline: &Value) -> Result<Tolerance> {
        let read = |key: &str| -> Result<f64> {
            let value = baseline
                .pointer(&format!("/tolerance/{key}"))
                .and_then(Value::as_f64)
                .with_context(|| {
                    format!("the baseline has no number `tolerance.{key}` (see {BASELINE})")
                })?;
            if !value.is_finite() || value < 0.0 {
                bail!("the baseline's `tolerance.{key}` is {value}; it must be finite and >= 0");
            }
            Ok(value)
        };
        Ok(Tolerance {
            relative: read("relative")?,
            absolute: read("absolute")?,
        })
    }

    fn allowed(self, baseline: f64) -> f64 {
        self.absolute + self.relative * baseline.abs()
    }

    fn to_json(self) -> Value {
        json!({
            "relative": self.relative,
            "absolute": self.absolute,
            "rule": TOLERANCE_RULE,
        })
    }
}

/// One timing of both runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TimingRatio {
    /// Its name in `timings_ms`.
    pub(crate) name: String,
    /// The baseline's milliseconds.
    pub(crate) baseline_ms: f64,
    /// The capture's milliseconds.
    pub(crate) capture_ms: f64,
}

/// The outcome of [`compare`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Comparison {
    /// What fails the check, one sentence each.
    pub(crate) failures: Vec<String>,
    /// What is reported only (new names, new figures, missing timings).
    pub(crate) notes: Vec<String>,
    /// The timings of both runs.
    pub(crate) timings: Vec<TimingRatio>,
}

impl Comparison {
    /// Whether the capture is at parity with the baseline.
    pub(crate) fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Options of `cargo xtask parity`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// Rewrite the baseline from the capture instead of comparing.
    pub(crate) update: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options::default();
        for arg in args {
            match arg.as_str() {
                "--update" => options.update = true,
                other => bail!("unknown parity option `{other}` (see `cargo xtask help`)"),
            }
        }
        Ok(options)
    }
}

/// Builds debug `esper`, captures, then compares with (or, with
/// `--update`, rewrites) the baseline.
pub(crate) fn run(root: &Path, options: Options) -> Result<()> {
    crate::run_step(
        "cargo build -p esper (debug, for the parity capture)",
        crate::cargo(root).args(["build", "-p", "esper", "--bin", "esper"]),
    )?;
    let esper = root.join("target/debug/esper");
    let capture_path = root.join(CAPTURE);
    crate::run_step(
        &format!("{} parity-capture --out {CAPTURE}", esper.display()),
        Command::new(&esper)
            .arg("parity-capture")
            .arg("--out")
            .arg(&capture_path)
            .current_dir(root),
    )?;
    let capture = read_json(&capture_path)?;
    let baseline_path = root.join(BASELINE);
    if options.update {
        let tolerance = read_json(&baseline_path)
            .and_then(|baseline| Tolerance::from_baseline(&baseline))
            .unwrap_or(DEFAULT_TOLERANCE);
        let baseline = with_tolerance(&capture, tolerance)?;
        write_json(&baseline_path, &baseline)?;
        eprintln!("==> wrote {BASELINE}");
        return Ok(());
    }
    let baseline = read_json(&baseline_path).with_context(|| {
        format!("no usable parity baseline; `cargo xtask parity --update` writes {BASELINE}")
    })?;
    let comparison = compare(&baseline, &capture)?;
    print_report(&comparison);
    if !comparison.passed() {
        bail!(
            "parity with {BASELINE} failed ({} difference(s)):\n  - {}\n(if the change is \
             intended, `cargo xtask parity --update` rewrites the baseline)",
            comparison.failures.len(),
            comparison.failures.join("\n  - ")
        );
    }
    eprintln!("==> parity with {BASELINE}: passed");
    Ok(())
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes `value` as pretty JSON through a temporary file renamed into
/// place.
fn write_json(path: &Path, value: &Value) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, text).with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))
}

/// `capture` with `tolerance` added: a baseline.
fn with_tolerance(capture: &Value, tolerance: Tolerance) -> Result<Value> {
    let mut baseline = capture
        .as_object()
        .cloned()
        .context("the capture is not a JSON object")?;
    baseline.insert("tolerance".to_owned(), tolerance.to_json());
    Ok(Value::Object(baseline))
}

/// Compares a capture with a baseline (see the module docs). An error
/// means a document is malformed (no tolerance, no telemetry lists, another
/// capture version); differences are [`Comparison::failures`].
pub(crate) fn compare(baseline: &Value, capture: &Value) -> Result<Comparison> {
    let tolerance = Tolerance::from_baseline(baseline)?;
    let version = |document: &Value, which: &str| -> Result<u64> {
        document
            .get("version")
            .and_then(Value::as_u64)
            .with_context(|| format!("the {which} has no `version`"))
    };
    let (baseline_version, capture_version) =
        (version(baseline, "baseline")?, version(capture, "capture")?);
    if baseline_version != capture_version {
        bail!(
            "the capture is version {capture_version} and the baseline version \
             {baseline_version}; `cargo xtask parity --update` re-records the baseline"
        );
    }
    let mut comparison = Comparison::default();
    for kind in ["metrics", "events"] {
        compare_names(baseline, capture, kind, &mut comparison)?;
    }
    match (baseline.get("figures"), capture.get("figures")) {
        (Some(before), Some(now)) => {
            compare_figure("figures", before, now, tolerance, &mut comparison);
        }
        (None, _) => bail!("the baseline has no `figures`"),
        (Some(_), None) => bail!("the capture has no `figures`"),
    }
    compare_timings(baseline, capture, &mut comparison);
    Ok(comparison)
}

fn names<'a>(document: &'a Value, kind: &str, which: &str) -> Result<Vec<&'a str>> {
    let list = document
        .pointer(&format!("/telemetry/{kind}"))
        .and_then(Value::as_array)
        .with_context(|| format!("the {which} has no list `telemetry.{kind}`"))?;
    list.iter()
        .map(|name| {
            name.as_str()
                .with_context(|| format!("the {which}'s `telemetry.{kind}` holds {name}"))
        })
        .collect()
}

fn compare_names(
    baseline: &Value,
    capture: &Value,
    kind: &str,
    comparison: &mut Comparison,
) -> Result<()> {
    let before = names(baseline, kind, "baseline")?;
    let now = names(capture, kind, "capture")?;
    let singular = kind.trim_end_matches('s');
    for name in &before {
        if !now.contains(name) {
            comparison.failures.push(format!(
                "telemetry {singular} `{name}` disappeared: the baseline has it, the capture \
                 did not emit it"
            ));
        }
    }
    for name in &now {
        if !before.contains(name) {
            comparison.notes.push(format!(
                "new telemetry {singular} `{name}` (not in the baseline)"
            ));
        }
    }
    Ok(())
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(number) if number.is_f64() => "a float",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Compares one figure (recursively), appending what differs.
fn compare_figure(
    path: &str,
    before: &Value,
    now: &Value,
    tolerance: Tolerance,
    comparison: &mut Comparison,
) {
    match (before, now) {
        (Value::Object(before), Value::Object(now)) => {
            for (key, value) in before {
                let child = format!("{path}.{key}");
                match now.get(key) {
                    Some(current) => compare_figure(&child, value, current, tolerance, comparison),
                    None => comparison
                        .failures
                        .push(format!("{child} disappeared: the capture does not have it")),
                }
            }
            for key in now.keys().filter(|key| !before.contains_key(*key)) {
                comparison
                    .notes
                    .push(format!("new figure {path}.{key} (not in the baseline)"));
            }
        }
        (Value::Array(before), Value::Array(now)) => {
            if before.len() != now.len() {
                comparison.failures.push(format!(
                    "{path} has {} entries, the baseline {}",
                    now.len(),
                    before.len()
                ));
                return;
            }
            for (index, (value, current)) in before.iter().zip(now).enumerate() {
                compare_figure(
                    &format!("{path}[{index}]"),
                    value,
                    current,
                    tolerance,
                    comparison,
                );
            }
        }
        (Value::Number(before), Value::Number(now)) if before.is_f64() && now.is_f64() => {
            let (Some(expected), Some(actual)) = (before.as_f64(), now.as_f64()) else {
                comparison
                    .failures
                    .push(format!("{path}: {now} cannot be compared with {before}"));
                return;
            };
            let allowed = tolerance.allowed(expected);
            let difference = (actual - expected).abs();
            if difference > allowed {
                comparison.failures.push(format!(
                    "{path} is {actual}, the baseline {expected}: a difference of {difference:e} \
                     beyond the tolerance {allowed:e} (absolute {:e} + relative {:e} x \
                     |baseline|)",
                    tolerance.absolute, tolerance.relative
                ));
            }
        }
        _ if before == now => {}
        _ if kind_of(before) != kind_of(now) => comparison.failures.push(format!(
            "{path} is {} ({now}), the baseline {} ({before})",
            kind_of(now),
            kind_of(before)
        )),
        _ => comparison.failures.push(format!(
            "{path} is {now}, the baseline {before} (must match exactly)"
        )),
    }
}

fn compare_timings(baseline: &Value, capture: &Value, comparison: &mut Comparison) {
    let empty = Map::new();
    let timings = |document: &Value| {
        document
            .get("timings_ms")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_else(|| empty.clone())
    };
    let (before, now) = (timings(baseline), timings(capture));
    for (name, value) in &now {
        match (before.get(name).and_then(Value::as_f64), value.as_f64()) {
            (Some(baseline_ms), Some(capture_ms)) => comparison.timings.push(TimingRatio {
                name: name.clone(),
                baseline_ms,
                capture_ms,
            }),
            _ => comparison
                .notes
                .push(format!("timing `{name}` has no baseline to compare with")),
        }
    }
}

/// Prints the timings as ratios and the notes.
fn print_report(comparison: &Comparison) {
    if !comparison.timings.is_empty() {
        eprintln!("==> parity timings (capture / baseline; reported, never failed on):");
        for timing in &comparison.timings {
            let ratio = if timing.baseline_ms > 0.0 {
                format!("{:.2}x", timing.capture_ms / timing.baseline_ms)
            } else {
                "n/a".to_owned()
            };
            eprintln!(
                "    {:<16} {:>10.1} ms  (baseline {:>10.1} ms)  {ratio}",
                timing.name, timing.capture_ms, timing.baseline_ms
            );
        }
    }
    for note in &comparison.notes {
        eprintln!("    note: {note}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline() -> Value {
        json!({
            "version": 1,
            "tolerance": { "relative": 1e-4, "absolute": 1e-6, "rule": "..." },
            "telemetry": {
                "metrics": ["kasmina.seed.alpha", "tolaria.training.latency_ms"],
                "events": ["kasmina.seed.germinated"],
            },
            "figures": {
                "trainer": { "final_train_loss": 1.25, "steps": 48, "stages": ["TRAINING"] },
                "parameters": { "hosts": { "cnn": 12345 } },
            },
            "timings_ms": { "trainer_walk": 100.0, "total": 400.0 },
        })
    }

    /// The baseline as a capture (a capture has no tolerance).
    fn capture() -> Value {
        let mut capture = baseline();
        if let Some(object) = capture.as_object_mut() {
            object.remove("tolerance");
        }
        capture
    }

    fn set(document: &mut Value, pointer: &str, value: Value) {
        *document.pointer_mut(pointer).expect("the pointer exists") = value;
    }

    #[test]
    fn identical_captures_pass() {
        let comparison = compare(&baseline(), &capture()).expect("comparable");
        assert!(comparison.passed(), "{comparison:?}");
        assert!(comparison.notes.is_empty(), "{comparison:?}");
        assert_eq!(comparison.timings.len(), 2);
    }

    #[test]
    fn a_telemetry_name_that_disappeared_fails_naming_it() {
        let mut now = capture();
        set(
            &mut now,
            "/telemetry/metrics",
            json!(["kasmina.seed.alpha"]),
        );
        set(&mut now, "/telemetry/events", json!([]));
        let comparison = compare(&baseline(), &now).expect("comparable");
        assert!(!comparison.passed());
        assert_eq!(comparison.failures.len(), 2, "{comparison:?}");
        assert!(
            comparison.failures[0].contains("`tolaria.training.latency_ms` disappeared"),
            "{comparison:?}"
        );
        assert!(
            comparison.failures[1].contains("event `kasmina.seed.germinated` disappeared"),
            "{comparison:?}"
        );
    }

    #[test]
    fn a_new_telemetry_name_is_reported_not_failed() {
        let mut now = capture();
        set(
            &mut now,
            "/telemetry/events",
            json!(["kasmina.seed.germinated", "kasmina.seed.pruned"]),
        );
        let comparison = compare(&baseline(), &now).expect("comparable");
        assert!(comparison.passed(), "{comparison:?}");
        assert_eq!(
            comparison.notes,
            ["new telemetry event `kasmina.seed.pruned` (not in the baseline)"]
        );
    }

    #[test]
    fn a_float_outside_the_tolerance_fails_and_one_inside_passes() {
        // 1.25 allows 1e-6 + 1e-4 * 1.25 = 1.26e-4.
        let mut inside = capture();
        set(
            &mut inside,
            "/figures/trainer/final_train_loss",
            json!(1.2501),
        );
        assert!(compare(&baseline(), &inside).expect("comparable").passed());
        let mut outside = capture();
        set(
            &mut outside,
            "/figures/trainer/final_train_loss",
            json!(1.2502),
        );
        let comparison = compare(&baseline(), &outside).expect("comparable");
        assert_eq!(comparison.failures.len(), 1, "{comparison:?}");
        let failure = &comparison.failures[0];
        assert!(
            failure.starts_with("figures.trainer.final_train_loss is 1.2502, the baseline 1.25"),
            "{failure}"
        );
        assert!(failure.contains("tolerance"), "{failure}");
    }

    #[test]
    fn integers_strings_and_lengths_match_exactly() {
        for (pointer, value, expected) in [
            (
                "/figures/parameters/hosts/cnn",
                json!(12346),
                "12346, the baseline 12345",
            ),
            (
                "/figures/trainer/stages/0",
                json!("BLENDING"),
                "the baseline \"TRAINING\"",
            ),
            (
                "/figures/trainer/stages",
                json!(["TRAINING", "BLENDING"]),
                "has 2 entries",
            ),
            ("/figures/trainer/steps", json!(48.0), "is a float"),
        ] {
            let mut now = capture();
            set(&mut now, pointer, value);
            let comparison = compare(&baseline(), &now).expect("comparable");
            assert_eq!(comparison.failures.len(), 1, "{pointer}: {comparison:?}");
            assert!(
                comparison.failures[0].contains(expected),
                "{pointer}: {comparison:?}"
            );
        }
    }

    #[test]
    fn a_missing_figure_fails_and_a_new_one_is_reported() {
        let mut now = capture();
        if let Some(trainer) = now
            .pointer_mut("/figures/trainer")
            .and_then(Value::as_object_mut)
        {
            trainer.remove("steps");
            trainer.insert("epochs".to_owned(), json!(12));
        }
        let comparison = compare(&baseline(), &now).expect("comparable");
        assert_eq!(
            comparison.failures,
            ["figures.trainer.steps disappeared: the capture does not have it"]
        );
        assert_eq!(
            comparison.notes,
            ["new figure figures.trainer.epochs (not in the baseline)"]
        );
    }

    #[test]
    fn timings_never_fail() {
        let mut now = capture();
        set(&mut now, "/timings_ms/trainer_walk", json!(100_000.0));
        set(&mut now, "/timings_ms/total", json!(0.001));
        let comparison = compare(&baseline(), &now).expect("comparable");
        assert!(comparison.passed(), "{comparison:?}");
        assert_eq!(
            comparison.timings[0],
            TimingRatio {
                name: "total".to_owned(),
                baseline_ms: 400.0,
                capture_ms: 0.001,
            }
        );
    }

    #[test]
    fn malformed_documents_are_errors() {
        let mut no_tolerance = baseline();
        if let Some(object) = no_tolerance.as_object_mut() {
            object.remove("tolerance");
        }
        let error = compare(&no_tolerance, &capture()).expect_err("no tolerance");
        assert!(error.to_string().contains("tolerance.relative"), "{error}");
        let mut negative = baseline();
        set(&mut negative, "/tolerance/absolute", json!(-1.0));
        assert!(compare(&negative, &capture()).is_err());
        let mut other_version = capture();
        set(&mut other_version, "/version", json!(2));
        let error = compare(&baseline(), &other_version).expect_err("version");
        assert!(error.to_string().contains("--update"), "{error}");
        let mut no_names = capture();
        set(&mut no_names, "/telemetry", json!({}));
        assert!(compare(&baseline(), &no_names).is_err());
    }

    #[test]
    fn update_adds_the_tolerance_and_the_result_passes() {
        let written = with_tolerance(&capture(), DEFAULT_TOLERANCE).expect("object");
        assert_eq!(
            Tolerance::from_baseline(&written).expect("tolerance"),
            DEFAULT_TOLERANCE
        );
        assert!(compare(&written, &capture()).expect("comparable").passed());
    }

    #[test]
    fn options_parse() {
        assert!(
            Options::parse(&["--update".to_owned()])
                .expect("valid")
                .update
        );
        assert!(!Options::parse(&[]).expect("valid").update);
        assert!(Options::parse(&["--fast".to_owned()]).is_err());
    }

    /// The committed baseline itself: it compares equal to itself, and
    /// losing one of its telemetry names fails naming that name.
    #[test]
    fn the_committed_baseline_fails_when_one_of_its_names_disappears() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the repository root");
        let committed = read_json(&root.join(BASELINE)).expect("the committed baseline");
        let mut now = committed.clone();
        if let Some(object) = now.as_object_mut() {
            object.remove("tolerance");
        }
        assert!(compare(&committed, &now).expect("comparable").passed());
        let events = now
            .pointer_mut("/telemetry/events")
            .and_then(Value::as_array_mut)
            .expect("the baseline lists events");
        let lost = events.pop().expect("the baseline has an event");
        let comparison = compare(&committed, &now).expect("comparable");
        assert_eq!(comparison.failures.len(), 1, "{comparison:?}");
        let name = lost.as_str().expect("a name");
        assert!(
            comparison.failures[0].contains(&format!("`{name}` disappeared")),
            "{comparison:?}"
        );
    }
}
