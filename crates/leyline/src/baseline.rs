//! Benchmark baseline records (`baselines/perf/<workload>/<label>.json`).
//!
//! Every benchmark binary writes a [`BaselineRecord`]; `cargo xtask bench
//! --compare` and parity checks read them back. The shape follows DESIGN.md §7:
//! metric keys are snake_case with the unit as suffix (`_ms`, `_us`, `_ns`,
//! `_per_s`, `_bytes`).
//!
//! A record is validated when written and when read (see [`validate`] for the
//! rules), so a record that could not be read back is never written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// Git revision of the code that ran (from `ESPER_GIT_REV`, else "unknown").
    pub git_rev: String,
    /// Whether TF32 matmuls were allowed.
    pub tf32: bool,
    /// Autocast dtype: "bf16", "fp16" or "off".
    pub amp: String,
    /// Anything else worth recording (core count, OS, ...).
    #[serde(default, flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Environment {
    /// A CPU-only environment description of this machine (no torch).
    pub fn cpu_only() -> Environment {
        Environment {
            device: "cpu".to_owned(),
            torch: "n/a".to_owned(),
            cuda: "n/a".to_owned(),
            driver: "n/a".to_owned(),
            cpu: cpu_model(),
            git_rev: git_rev(),
            tf32: false,
            amp: "off".to_owned(),
            extra: BTreeMap::from([(
                "cpu_cores".to_owned(),
                serde_json::Value::from(
                    std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
                ),
            )]),
        }
    }
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
            serde_json::from_str(text).map_err(|error| crate::ContractError::Json {
                message: "BaselineRecord",
                reason: error.to_string(),
            })?;
        record.validate()?;
        Ok(record)
    }

    /// Pretty JSON with a trailing newline, after [`BaselineRecord::validate`].
    pub fn to_json_pretty(&self) -> crate::Result<String> {
        self.validate()?;
        let mut text =
            serde_json::to_string_pretty(self).map_err(|error| crate::ContractError::Json {
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

/// The command line every benchmark binary accepts, as `cargo xtask bench`
/// calls it: `--out PATH.json --label LABEL [--quick]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchArgs {
    /// Where to write the [`BaselineRecord`].
    pub out: PathBuf,
    /// Record label.
    pub label: String,
    /// A smoke run with fewer iterations (not for committed records).
    pub quick: bool,
}

/// What a benchmark command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchCommand {
    /// Run the benchmark.
    Run(BenchArgs),
    /// `-h` / `--help`: print usage and stop.
    Help,
}

impl BenchArgs {
    /// Parses the arguments after the program name. Each option may appear
    /// once; `--out` must not be empty and `--label` must be a portable file
    /// name ([`file_name_problem`]), since it becomes one.
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> crate::Result<BenchCommand> {
        let usage = |reason: String| crate::ContractError::Usage { reason };
        let mut out: Option<PathBuf> = None;
        let mut label: Option<String> = None;
        let mut quick = false;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--out" => {
                    let value = args
                        .next()
                        .filter(|value| !value.is_empty())
                        .ok_or_else(|| usage("--out needs a path".to_owned()))?;
                    if out.replace(PathBuf::from(value)).is_some() {
                        return Err(usage("--out given twice".to_owned()));
                    }
                }
                "--label" => {
                    let value = args
                        .next()
                        .ok_or_else(|| usage("--label needs a value".to_owned()))?;
                    if let Some(problem) = file_name_problem(&value) {
                        return Err(usage(format!("--label {problem}")));
                    }
                    if label.replace(value).is_some() {
                        return Err(usage("--label given twice".to_owned()));
                    }
                }
                "--quick" => quick = true,
                "-h" | "--help" => return Ok(BenchCommand::Help),
                other => {
                    return Err(usage(format!(
                        "unknown argument {}",
                        crate::checks::shown(other)
                    )));
                }
            }
        }
        Ok(BenchCommand::Run(BenchArgs {
            out: out.ok_or_else(|| usage("--out PATH.json is required".to_owned()))?,
            label: label.ok_or_else(|| usage("--label LABEL is required".to_owned()))?,
            quick,
        }))
    }
}

impl BaselineRecord {
    /// Writes the record as pretty JSON to `path`, creating its folder. A
    /// record [`BaselineRecord::validate`] refuses is not written: the error
    /// has kind `InvalidData` and carries the [`crate::ContractError`]. The
    /// text goes to a temporary file in the same folder that is then renamed
    /// over `path`, so a reader never sees a partial record.
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        let text = self
            .to_json_pretty()
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
        let file_name = path.file_name().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} names no file", path.display()),
            )
        })?;
        let parent = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty());
        if let Some(parent) = parent {
            std::fs::create_dir_all(parent)?;
        }
        let mut temporary_name = std::ffi::OsString::from(".");
        temporary_name.push(file_name);
        temporary_name.push(format!(".{}.tmp", std::process::id()));
        let temporary = match parent {
            Some(parent) => parent.join(&temporary_name),
            None => PathBuf::from(&temporary_name),
        };
        let written =
            std::fs::write(&temporary, text).and_then(|()| std::fs::rename(&temporary, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
    }
}

/// The CPU model from `/proc/cpuinfo`, or "unknown".
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The code revision, from `ESPER_GIT_REV` (set by `cargo xtask bench` and the
/// bench bundle), else "unknown".
pub fn git_rev() -> String {
    std::env::var("ESPER_GIT_REV").unwrap_or_else(|_| "unknown".to_owned())
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

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn bench_args_follow_the_contract() {
        assert_eq!(
            BenchArgs::parse(strings(&["--label", "x", "--out", "a/b.json", "--quick"])),
            Ok(BenchCommand::Run(BenchArgs {
                out: PathBuf::from("a/b.json"),
                label: "x".to_owned(),
                quick: true,
            }))
        );
        assert_eq!(
            BenchArgs::parse(strings(&["--help"])),
            Ok(BenchCommand::Help)
        );
        for bad in [
            &["--out"][..],
            &["--label", "x"],
            &["--out", "a.json"],
            &["--out", "a.json", "--label", "x", "--fast"],
        ] {
            assert!(
                matches!(
                    BenchArgs::parse(strings(bad)),
                    Err(crate::ContractError::Usage { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn record_round_trips_and_checks_schema() {
        let record = BaselineRecord {
            schema: BASELINE_SCHEMA,
            workload: "nissa-emit".to_owned(),
            label: "test".to_owned(),
            environment: Environment::cpu_only(),
            params: serde_json::json!({ "events": 10 }),
            results: vec![ResultEntry {
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
}
