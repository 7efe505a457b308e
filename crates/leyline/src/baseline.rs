//! Benchmark baseline records (`baselines/perf/<workload>/<label>.json`):
//! the record's schema, its validation, and pure helpers to fill it.
//!
//! A benchmark's measuring code (in its crate's `bench` module) returns
//! [`Measurements`]; the `esper bench` binary probes the machine for the
//! [`Environment`], builds the [`BaselineRecord`] and writes it; `cargo xtask
//! bench --compare` and parity checks read records back. The shape follows
//! DESIGN.md §7: metric keys are snake_case with the unit as suffix (`_ms`,
//! `_us`, `_ns`, `_per_s`, `_bytes`).
//!
//! A record is validated when built from measurements, when serialised and
//! when read (see [`validate`] for the rules), so a record that could not be
//! read back is never written. Nothing here reads the environment, runs a
//! command or touches a file: contracts stay contracts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod validate;

pub use validate::{ENVIRONMENT_FIELDS, MAX_FILE_NAME_BYTES, file_name_problem};

/// Version of the record layout.
pub const BASELINE_SCHEMA: u32 = 1;

/// Where and with what a benchmark ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// GPU name (e.g. "NVIDIA H100 80GB HBM3") or "cpu".
    pub device: String,
    /// libtorch / PyTorch version, or "n/a" for workloads without torch.
    pub torch: String,
    /// CUDA version, or "n/a".
    pub cuda: String,
    /// GPU driver version, or "n/a".
    pub driver: String,
    /// CPU model.
    pub cpu: String,
    /// Git revision of the code that ran, or "unknown".
    pub git_rev: String,
    /// Whether TF32 matmuls were allowed.
    pub tf32: bool,
    /// Autocast dtype: "bf16", "fp16" or "off".
    pub amp: String,
    /// Anything else worth recording (core count, OS, ...).
    #[serde(default, flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One implementation/mode's measured metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultEntry {
    /// "rust" or "python".
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Execution mode ("eager", "graph-step", "graph-epoch", "compile-default", ...).
    pub mode: String,
    /// Metric name (snake_case with unit suffix) to value.
    pub metrics: BTreeMap<String, f64>,
    /// Why this variant produced no figures, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The autocast dtype of this entry when it differs per entry within a
    /// record (`"off"`, `"bf16"` or `"fp16"`; the record-wide setting is
    /// `environment.amp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amp: Option<String>,
}

/// One benchmark run of one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineRecord {
    /// Always [`BASELINE_SCHEMA`].
    pub schema: u32,
    /// Workload name (DESIGN.md §6).
    pub workload: String,
    /// Run label (file stem).
    pub label: String,
    /// Where it ran.
    pub environment: Environment,
    /// The workload's parameters.
    pub params: serde_json::Value,
    /// One entry per implementation and mode.
    pub results: Vec<ResultEntry>,
    /// Telemetry names the run emitted.
    pub telemetry_names: Vec<String>,
}

/// What a benchmark measured: a record less the three things the program
/// that writes it adds (workload name, label and the [`Environment`] it
/// probed). Library crates return this from their benchmark functions; the
/// `esper` binary turns it into a record with
/// [`BaselineRecord::from_measurements`].
#[derive(Debug, Clone, PartialEq)]
pub struct Measurements {
    /// The workload's parameters.
    pub params: serde_json::Value,
    /// One entry per implementation and mode.
    pub results: Vec<ResultEntry>,
    /// Telemetry names the run emitted.
    pub telemetry_names: Vec<String>,
}

impl BaselineRecord {
    /// The record of `measurements` of `workload` run under `label` on
    /// `environment`, checked by [`BaselineRecord::validate`] (so a record
    /// that could not be written is refused here already).
    pub fn from_measurements(
        workload: &str,
        label: &str,
        environment: Environment,
        measurements: Measurements,
    ) -> crate::Result<BaselineRecord> {
        let record = BaselineRecord {
            schema: BASELINE_SCHEMA,
            workload: workload.to_owned(),
            label: label.to_owned(),
            environment,
            params: measurements.params,
            results: measurements.results,
            telemetry_names: measurements.telemetry_names,
        };
        record.validate()?;
        Ok(record)
    }

    /// Reads a record: unknown keys, missing fields and anything
    /// [`BaselineRecord::validate`] refuses (other schema versions included)
    /// are errors.
    pub fn from_json(text: &str) -> crate::Result<BaselineRecord> {
        let record: BaselineRecord =
            serde_json::from_str(text).map_err(|error| crate::Error::Json {
                message: "BaselineRecord",
                reason: error.to_string(),
            })?;
        record.validate()?;
        Ok(record)
    }

    /// Pretty JSON with a trailing newline, after [`BaselineRecord::validate`].
    pub fn to_json_pretty(&self) -> crate::Result<String> {
        self.validate()?;
        let mut text = serde_json::to_string_pretty(self).map_err(|error| crate::Error::Json {
            message: "BaselineRecord",
            reason: error.to_string(),
        })?;
        text.push('\n');
        Ok(text)
    }

    /// The entry for `implementation` and `mode`, if present.
    pub fn result(&self, implementation: &str, mode: &str) -> Option<&ResultEntry> {
        self.results
            .iter()
            .find(|entry| entry.implementation == implementation && entry.mode == mode)
    }
}

/// Percentile (0..=100) of `samples` by nearest rank; `None` when `samples`
/// is empty or `percent` is NaN or outside `[0, 100]`. Samples are ordered by
/// `f64::total_cmp` (a NaN sample sorts last; the record refuses it later).
pub fn percentile(samples: &[f64], percent: f64) -> Option<f64> {
    if samples.is_empty() || !(0.0..=100.0).contains(&percent) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    // `percent / 100 * len` is finite and in [0, len]; the cast saturates.
    let rank = ((percent / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()).checked_sub(1)?;
    sorted.get(index).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_uses_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 50.0), Some(50.0));
        assert_eq!(percentile(&samples, 95.0), Some(95.0));
        assert_eq!(percentile(&samples, 100.0), Some(100.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn record_round_trips_and_checks_schema() {
        let record = BaselineRecord {
            schema: BASELINE_SCHEMA,
            workload: "nissa-emit".to_owned(),
            label: "test".to_owned(),
            environment: Environment {
                device: "cpu".to_owned(),
                torch: "n/a".to_owned(),
                cuda: "n/a".to_owned(),
                driver: "n/a".to_owned(),
                cpu: "test cpu".to_owned(),
                git_rev: "abc".to_owned(),
                tf32: false,
                amp: "off".to_owned(),
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
        };
        let text = record.to_json_pretty().expect("valid");
        assert_eq!(BaselineRecord::from_json(&text), Ok(record));
        let wrong = text.replacen("\"schema\": 1", "\"schema\": 2", 1);
        assert!(BaselineRecord::from_json(&wrong).is_err());
    }

    #[test]
    fn a_record_from_measurements_is_validated() {
        let environment = || Environment {
            device: "cpu".to_owned(),
            torch: "n/a".to_owned(),
            cuda: "n/a".to_owned(),
            driver: "n/a".to_owned(),
            cpu: "test cpu".to_owned(),
            git_rev: "abc".to_owned(),
            tf32: false,
            amp: "off".to_owned(),
            extra: BTreeMap::new(),
        };
        let measurements = |value: f64| Measurements {
            params: serde_json::json!({ "requests": 4 }),
            results: vec![ResultEntry {
                amp: None,
                implementation: "rust".to_owned(),
                mode: "sequential".to_owned(),
                metrics: BTreeMap::from([("latency_ms_p50".to_owned(), value)]),
                error: None,
            }],
            telemetry_names: Vec::new(),
        };
        let record = BaselineRecord::from_measurements(
            "kasmina-prefetch",
            "t",
            environment(),
            measurements(1.5),
        )
        .expect("valid");
        assert_eq!(record.schema, BASELINE_SCHEMA);
        assert_eq!(record.workload, "kasmina-prefetch");
        assert_eq!(record.label, "t");
        assert_eq!(record.params["requests"], 4);
        assert_eq!(
            BaselineRecord::from_json(&record.to_json_pretty().expect("valid")),
            Ok(record)
        );
        for (workload, label, value, field) in [
            ("kasmina-prefetch", "t", f64::NAN, "results.metrics"),
            ("kasmina-prefetch", "../t", 1.0, "label"),
            ("", "t", 1.0, "workload"),
        ] {
            assert!(
                matches!(
                    BaselineRecord::from_measurements(workload, label, environment(), measurements(value)),
                    Err(crate::Error::InvalidField { field: refused, .. }) if refused == field
                ),
                "{workload:?} {label:?} {value}"
            );
        }
    }
}
