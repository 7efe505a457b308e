//! `cargo xtask parity`: a fresh CPU capture (`esper parity-capture`, debug
//! build) compared with the committed baseline [`BASELINE`].
//!
//! The rules ([`compare()`], a pure function over the two JSON documents):
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
use serde_json::Value;

mod compare;

use compare::{Comparison, Tolerance, compare};

/// The committed baseline, relative to the repository root.
pub(crate) const BASELINE: &str = "baselines/parity/cpu.json";

/// Where the fresh capture is written, relative to the repository root.
const CAPTURE: &str = "target/parity/cpu-capture.json";

/// The tolerance a new baseline gets.
pub(crate) const DEFAULT_TOLERANCE: Tolerance = Tolerance {
    relative: 1e-4,
    absolute: 1e-6,
};

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

/// Writes `value` as pretty JSON, atomically (`durable::write_file`).
fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    durable::write_file(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
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
    use serde_json::json;

    use super::compare::TimingRatio;
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
