//! The parity rules: [`compare`], a pure function over a baseline and a
//! capture (telemetry names a superset, figures within the [`Tolerance`],
//! timings reported as ratios), and the [`Comparison`] it returns.

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use super::BASELINE;

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
    pub(super) fn from_baseline(baseline: &Value) -> Result<Tolerance> {
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

    pub(super) fn to_json(self) -> Value {
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
