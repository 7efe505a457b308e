//! Reading records back after a run: the result table of one record and the
//! before/after comparison against a committed one (`--compare LABEL`).
//! Records are read as plain JSON (xtask does not depend on leyline), so a
//! record of an older shape still prints.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// Metric columns shown in tables when a record has them, in this order.
const TABLE_KEYS: &[(&str, &str)] = &[
    ("epoch_ms_p50", "p50 ms"),
    ("epoch_ms_p95", "p95 ms"),
    ("epoch_ms_max", "max ms"),
    ("replay_us_per_step", "replay us"),
    ("bare_replays_ms_p50", "bare ms"),
    ("capture_ms", "capture ms"),
    ("h2d_ms_p50", "h2d ms"),
    ("peak_device_memory_bytes", "peak bytes"),
];

/// The record at `path`, as JSON.
pub(crate) fn read_record(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn entries(record: &Value) -> Vec<&Value> {
    record["results"]
        .as_array()
        .map(|results| results.iter().collect())
        .unwrap_or_default()
}

fn metric(entry: &Value, key: &str) -> Option<f64> {
    entry["metrics"][key].as_f64()
}

fn format_metric(key: &str, value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(value) if key.ends_with("_bytes") => format!("{value:.0}"),
        Some(value) => format!("{value:.4}"),
    }
}

/// Columns of [`TABLE_KEYS`] present in the record, or its first metrics.
fn columns(record: &Value) -> Vec<(String, String)> {
    let present = |key: &str| {
        entries(record)
            .iter()
            .any(|entry| metric(entry, key).is_some())
    };
    let mut columns: Vec<(String, String)> = TABLE_KEYS
        .iter()
        .filter(|(key, _)| present(key))
        .map(|(key, title)| ((*key).to_owned(), (*title).to_owned()))
        .collect();
    if columns.is_empty()
        && let Some(metrics) = entries(record)
            .iter()
            .find_map(|entry| entry["metrics"].as_object())
    {
        columns = metrics
            .keys()
            .take(6)
            .map(|key| (key.clone(), key.clone()))
            .collect();
    }
    columns
}

/// Prints the table of one record.
pub(crate) fn print_table(record: &Value) {
    let columns = columns(record);
    println!();
    println!(
        "{} on {} (label {}, rev {})",
        record["workload"].as_str().unwrap_or("?"),
        record["environment"]["device"].as_str().unwrap_or("?"),
        record["label"].as_str().unwrap_or("?"),
        record["environment"]["git_rev"].as_str().unwrap_or("?"),
    );
    let mut header = format!("{:<7} {:<24}", "impl", "mode");
    for (_, title) in &columns {
        header.push_str(&format!(" {title:>11}"));
    }
    println!("{header}");
    for entry in entries(record) {
        let mut line = format!(
            "{:<7} {:<24}",
            entry["impl"].as_str().unwrap_or("?"),
            entry["mode"].as_str().unwrap_or("?")
        );
        if let Some(error) = entry["error"].as_str() {
            let first_line = error.lines().next().unwrap_or("");
            line.push_str(&format!(
                " error: {}",
                first_line.chars().take(90).collect::<String>()
            ));
        } else {
            for (key, _) in &columns {
                line.push_str(&format!(" {:>11}", format_metric(key, metric(entry, key))));
            }
        }
        println!("{line}");
    }
}

/// Prints `after` against `before`, entry by entry, with after/before ratios.
pub(crate) fn print_comparison(before: &Value, after: &Value) {
    let columns = columns(after);
    println!();
    println!(
        "before {} (rev {}) -> after {} (rev {}), after/before in parentheses",
        before["label"].as_str().unwrap_or("?"),
        before["environment"]["git_rev"].as_str().unwrap_or("?"),
        after["label"].as_str().unwrap_or("?"),
        after["environment"]["git_rev"].as_str().unwrap_or("?"),
    );
    for entry in entries(after) {
        let (implementation, mode) = (
            entry["impl"].as_str().unwrap_or("?"),
            entry["mode"].as_str().unwrap_or("?"),
        );
        let Some(old) = entries(before).into_iter().find(|old| {
            old["impl"].as_str() == Some(implementation) && old["mode"].as_str() == Some(mode)
        }) else {
            println!("{implementation:<7} {mode:<24} (new)");
            continue;
        };
        let mut line = format!("{implementation:<7} {mode:<24}");
        if let Some(error) = entry["error"].as_str().or(old["error"].as_str()) {
            let first_line = error.lines().next().unwrap_or("");
            line.push_str(&format!(
                " (error: {})",
                first_line.chars().take(80).collect::<String>()
            ));
        }
        for (key, title) in &columns {
            if let (Some(was), Some(now)) = (metric(old, key), metric(entry, key)) {
                let ratio = if was == 0.0 { f64::NAN } else { now / was };
                line.push_str(&format!(
                    " {title}: {} -> {} ({ratio:.2}x);",
                    format_metric(key, Some(was)),
                    format_metric(key, Some(now))
                ));
            }
        }
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_prefer_the_headline_keys_then_the_first_metrics() {
        let reference = serde_json::json!({ "results": [
            { "impl": "rust", "mode": "eager",
              "metrics": { "epoch_ms_p95": 2.0, "epoch_ms_p50": 1.0, "other": 3.0 } },
        ]});
        let titles: Vec<String> = columns(&reference).into_iter().map(|(_, t)| t).collect();
        assert_eq!(titles, ["p50 ms", "p95 ms"]);
        let emit = serde_json::json!({ "results": [
            { "impl": "rust", "mode": "1-producer",
              "metrics": { "emit_ns_p50": 100.0, "emitted": 10.0 } },
        ]});
        let keys: Vec<String> = columns(&emit).into_iter().map(|(key, _)| key).collect();
        assert_eq!(keys, ["emit_ns_p50", "emitted"]);
        assert!(columns(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn metrics_format_by_unit() {
        assert_eq!(
            format_metric("peak_device_memory_bytes", Some(1024.4)),
            "1024"
        );
        assert_eq!(format_metric("epoch_ms_p50", Some(0.12345)), "0.1235");
        assert_eq!(format_metric("epoch_ms_p50", None), "-");
    }
}
