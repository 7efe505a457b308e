//! What a [`BaselineRecord`] must satisfy to be written or read, so that every
//! record written reads back equal:
//!
//! - `schema` is [`BASELINE_SCHEMA`];
//! - `workload` and `label` are portable file names (they become
//!   `baselines/perf/<workload>/<label>.json`): 1 to [`MAX_FILE_NAME_BYTES`]
//!   bytes of `[A-Za-z0-9._-]`, starting with a letter or digit (so no `..`,
//!   no path separator, no hidden file, no control character);
//! - no `environment.extra` key repeats a fixed environment field
//!   ([`ENVIRONMENT_FIELDS`]) or is empty (a repeated key would be written
//!   twice and refused as a duplicate on reading);
//! - every result has a non-empty `impl` and `mode`, and no two results share
//!   both;
//! - every metric key is 1 to [`MAX_FILE_NAME_BYTES`] bytes of `[a-z0-9_]`
//!   and every metric value is finite (JSON has no NaN or infinity);
//! - every telemetry name is one of [`crate::telemetry`]'s names.

use std::collections::BTreeSet;

use super::{BASELINE_SCHEMA, BaselineRecord};
use crate::checks::{self, invalid, shown};
use crate::{Error, Result};

/// Message name in errors.
const NAME: &str = "BaselineRecord";

/// Longest workload, label or metric key, in bytes.
pub const MAX_FILE_NAME_BYTES: usize = 128;

/// The fixed fields of [`super::Environment`]; `extra` may not repeat them.
pub const ENVIRONMENT_FIELDS: [&str; 8] = [
    "device", "torch", "cuda", "driver", "cpu", "git_rev", "tf32", "amp",
];

/// Why `text` is not a portable file name (see the module docs), or `None`.
pub fn file_name_problem(text: &str) -> Option<String> {
    let first_ok = text
        .chars()
        .next()
        .is_some_and(|first| first.is_ascii_alphanumeric());
    if text.is_empty() {
        Some("is empty".to_owned())
    } else if text.len() > MAX_FILE_NAME_BYTES {
        Some(format!(
            "{} is {} bytes, more than {MAX_FILE_NAME_BYTES}",
            shown(text),
            text.len()
        ))
    } else if !first_ok
        || !text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        Some(format!(
            "{} is not a file name: use [A-Za-z0-9._-], starting with a letter or digit",
            shown(text)
        ))
    } else {
        None
    }
}

fn check_file_name(field: &'static str, text: &str) -> Result<()> {
    match file_name_problem(text) {
        None => Ok(()),
        Some(reason) => Err(invalid(NAME, field, reason)),
    }
}

fn check_metric_key(key: &str) -> Result<()> {
    let well_formed = !key.is_empty()
        && key.len() <= MAX_FILE_NAME_BYTES
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if well_formed {
        Ok(())
    } else {
        Err(invalid(
            NAME,
            "results.metrics",
            format!(
                "metric key {} is not 1 to {MAX_FILE_NAME_BYTES} bytes of [a-z0-9_]",
                shown(key)
            ),
        ))
    }
}

impl BaselineRecord {
    /// Checks the record against the rules of the module docs;
    /// `from_measurements`, `to_json_pretty` and `from_json` all run it.
    pub fn validate(&self) -> Result<()> {
        if self.schema != BASELINE_SCHEMA {
            return Err(Error::SchemaVersion {
                message: NAME,
                expected: BASELINE_SCHEMA,
                got: self.schema,
            });
        }
        check_file_name("workload", &self.workload)?;
        check_file_name("label", &self.label)?;
        for key in self.environment.extra.keys() {
            if key.is_empty() || ENVIRONMENT_FIELDS.contains(&key.as_str()) {
                return Err(invalid(
                    NAME,
                    "environment.extra",
                    format!("key {} is empty or repeats a fixed field", shown(key)),
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for entry in &self.results {
            checks::non_empty(NAME, "results.impl", &entry.implementation)?;
            checks::non_empty(NAME, "results.mode", &entry.mode)?;
            if !seen.insert((entry.implementation.as_str(), entry.mode.as_str())) {
                return Err(invalid(
                    NAME,
                    "results",
                    format!(
                        "two entries for impl {} mode {}",
                        shown(&entry.implementation),
                        shown(&entry.mode)
                    ),
                ));
            }
            if let Some(amp) = &entry.amp
                && !matches!(amp.as_str(), "off" | "bf16" | "fp16")
            {
                return Err(invalid(
                    NAME,
                    "results.amp",
                    format!("{} is not one of \"off\", \"bf16\", \"fp16\"", shown(amp)),
                ));
            }
            for (key, &value) in &entry.metrics {
                check_metric_key(key)?;
                if !value.is_finite() {
                    return Err(invalid(
                        NAME,
                        "results.metrics",
                        format!("{key} = {value} is not finite"),
                    ));
                }
            }
        }
        for name in &self.telemetry_names {
            let known = crate::telemetry::metric_spec(name).is_some()
                || crate::telemetry::event_spec(name).is_some();
            if !known {
                return Err(invalid(
                    NAME,
                    "telemetry_names",
                    format!("{} is not a leyline telemetry name", shown(name)),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_follow_the_portable_rule() {
        for good in ["cpu-2026-11-22", "h100", "a.b_c-d", "9"] {
            assert_eq!(file_name_problem(good), None, "{good}");
        }
        for bad in ["", ".", "..", "-x", "_x", "a/b", "a b", "é", "a\0"] {
            assert!(file_name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(file_name_problem(&"a".repeat(MAX_FILE_NAME_BYTES)).is_none());
        assert!(file_name_problem(&"a".repeat(MAX_FILE_NAME_BYTES + 1)).is_some());
    }
}
