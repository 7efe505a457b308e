//! `cargo xtask bench --compare A B`: a before/after report of two committed
//! labels, without running anything. For every workload that has both
//! `baselines/perf/<workload>/A.json` and `B.json`, the report
//! (`target/bench-compare/A-vs-B/report.md`) has a table per result entry:
//! every metric before, after, and after/before. Beside it, one SVG per
//! workload (`<workload>.svg`) draws the latency distribution of each entry:
//! its p50/p95/max (or, for records without percentiles, its millisecond
//! metrics) before and after, as paired bars on one scale.
//!
//! Records are read as plain JSON, like [`super::compare`]; the SVG is
//! written by hand (no plotting crate: xtask stays small).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::compare::read_record;

fn entries(record: &Value) -> Vec<&Value> {
    record["results"]
        .as_array()
        .map(|results| results.iter().collect())
        .unwrap_or_default()
}

fn key_of(entry: &Value) -> (String, String) {
    (
        entry["impl"].as_str().unwrap_or("?").to_owned(),
        entry["mode"].as_str().unwrap_or("?").to_owned(),
    )
}

fn find<'a>(record: &'a Value, key: &(String, String)) -> Option<&'a Value> {
    entries(record)
        .into_iter()
        .find(|entry| key_of(entry) == *key)
}

fn metrics(entry: Option<&Value>) -> Vec<(String, f64)> {
    entry
        .and_then(|entry| entry["metrics"].as_object())
        .map(|metrics| {
            metrics
                .iter()
                .filter_map(|(key, value)| value.as_f64().map(|value| (key.clone(), value)))
                .collect()
        })
        .unwrap_or_default()
}

fn number(value: f64) -> String {
    if value.abs() >= 1000.0 || value == value.trunc() {
        format!("{value:.0}")
    } else {
        format!("{value:.4}")
    }
}

/// The markdown section of one workload: a table per result entry (entries
/// of either record, in `after`'s order then `before`'s leftovers).
pub(crate) fn markdown_section(workload: &str, before: &Value, after: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## {workload}\n");
    let _ = writeln!(
        out,
        "before: `{}` (rev {}, {}); after: `{}` (rev {}, {})\n",
        before["label"].as_str().unwrap_or("?"),
        before["environment"]["git_rev"].as_str().unwrap_or("?"),
        before["environment"]["device"].as_str().unwrap_or("?"),
        after["label"].as_str().unwrap_or("?"),
        after["environment"]["git_rev"].as_str().unwrap_or("?"),
        after["environment"]["device"].as_str().unwrap_or("?"),
    );
    let mut keys: Vec<(String, String)> = entries(after).iter().map(|e| key_of(e)).collect();
    for entry in entries(before) {
        let key = key_of(entry);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for key in keys {
        let (old, new) = (find(before, &key), find(after, &key));
        let _ = writeln!(out, "### {} {}\n", key.0, key.1);
        for (label, entry) in [("before", old), ("after", new)] {
            match entry {
                None => {
                    let _ = writeln!(out, "- not in {label}");
                }
                Some(entry) => {
                    if let Some(error) = entry["error"].as_str() {
                        let _ = writeln!(
                            out,
                            "- {label} failed: {}",
                            error.lines().next().unwrap_or("")
                        );
                    }
                }
            }
        }
        let (old_metrics, new_metrics) = (metrics(old), metrics(new));
        let mut names: Vec<&String> = new_metrics.iter().map(|(name, _)| name).collect();
        for (name, _) in &old_metrics {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        if names.is_empty() {
            let _ = writeln!(out);
            continue;
        }
        let _ = writeln!(out, "\n| metric | before | after | after/before |");
        let _ = writeln!(out, "|---|---|---|---|");
        let lookup = |list: &[(String, f64)], name: &str| {
            list.iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| *value)
        };
        for name in names {
            let was = lookup(&old_metrics, name);
            let now = lookup(&new_metrics, name);
            let ratio = match (was, now) {
                (Some(was), Some(now)) if was != 0.0 => format!("{:.3}", now / was),
                _ => "-".to_owned(),
            };
            let show = |value: Option<f64>| value.map_or("-".to_owned(), number);
            let _ = writeln!(
                out,
                "| `{name}` | {} | {} | {ratio} |",
                show(was),
                show(now)
            );
        }
        let _ = writeln!(out);
    }
    out
}

/// The latency metrics of an entry: its `*_p50`/`*_p95`/`*_max` millisecond
/// metrics when it has any, otherwise every `*_ms*` metric.
fn latency_metrics(entry: Option<&Value>) -> Vec<(String, f64)> {
    let all: Vec<(String, f64)> = metrics(entry)
        .into_iter()
        .filter(|(name, value)| name.contains("_ms") && value.is_finite() && *value >= 0.0)
        .collect();
    let percentiles: Vec<(String, f64)> = all
        .iter()
        .filter(|(name, _)| {
            name.ends_with("_p50") || name.ends_with("_p95") || name.ends_with("_max")
        })
        .cloned()
        .collect();
    if percentiles.is_empty() {
        all
    } else {
        percentiles
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG of one workload's latency distributions (see the module docs),
/// `None` when neither record has a millisecond metric.
pub(crate) fn svg_chart(workload: &str, before: &Value, after: &Value) -> Option<String> {
    // Rows: (entry, metric, before, after).
    let mut rows: Vec<(String, String, Option<f64>, Option<f64>)> = Vec::new();
    let mut keys: Vec<(String, String)> = entries(after).iter().map(|e| key_of(e)).collect();
    for entry in entries(before) {
        let key = key_of(entry);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for key in &keys {
        let (old, new) = (
            latency_metrics(find(before, key)),
            latency_metrics(find(after, key)),
        );
        let mut names: Vec<String> = new.iter().map(|(name, _)| name.clone()).collect();
        for (name, _) in &old {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        for name in names {
            let pick = |list: &[(String, f64)]| {
                list.iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| *value)
            };
            rows.push((
                format!("{} {}", key.0, key.1),
                name.clone(),
                pick(&old),
                pick(&new),
            ));
        }
    }
    if rows.is_empty() {
        return None;
    }
    let largest = rows
        .iter()
        .flat_map(|(_, _, a, b)| [a.unwrap_or(0.0), b.unwrap_or(0.0)])
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let (label_width, bar_width, row_height) = (420.0, 420.0, 30.0);
    let height = 60.0 + row_height * rows.len() as f64;
    let width = label_width + bar_width + 140.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="10" y="20" font-size="15">{} — latency before (grey) and after (blue), ms, one scale (max {})</text>"#,
        escape(workload),
        number(largest)
    );
    for (index, (entry, metric, was, now)) in rows.iter().enumerate() {
        let y = 40.0 + row_height * index as f64;
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{}">{} · {}</text>"#,
            y + 15.0,
            escape(entry),
            escape(metric)
        );
        for (offset, value, colour) in [(2.0, was, "#999999"), (14.0, now, "#3366cc")] {
            if let Some(value) = value {
                let length = bar_width * value / largest;
                let _ = writeln!(
                    svg,
                    r#"<rect x="{label_width}" y="{}" width="{length:.1}" height="11" fill="{colour}"/>"#,
                    y + offset
                );
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{}" font-size="10">{}</text>"#,
                    label_width + length + 4.0,
                    y + offset + 10.0,
                    number(*value)
                );
            }
        }
    }
    let _ = writeln!(svg, "</svg>");
    Some(svg)
}

/// Writes the report of `before_label` → `after_label` for `workloads`
/// (every workload with both records when empty) and returns its path.
pub(crate) fn write(
    root: &Path,
    before_label: &str,
    after_label: &str,
    workloads: &[&str],
) -> Result<PathBuf> {
    let dir = root
        .join("target/bench-compare")
        .join(format!("{before_label}-vs-{after_label}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut markdown = format!("# Benchmark comparison: `{before_label}` → `{after_label}`\n\n");
    let mut found = 0;
    for workload in workloads {
        let base = root.join("baselines/perf").join(workload);
        let (before_path, after_path) = (
            base.join(format!("{before_label}.json")),
            base.join(format!("{after_label}.json")),
        );
        if !before_path.is_file() || !after_path.is_file() {
            continue;
        }
        let (before, after) = (read_record(&before_path)?, read_record(&after_path)?);
        markdown.push_str(&markdown_section(workload, &before, &after));
        if let Some(svg) = svg_chart(workload, &before, &after) {
            let path = dir.join(format!("{workload}.svg"));
            durable::write_file(&path, svg.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            let _ = writeln!(markdown, "![{workload} latency]({workload}.svg)\n");
        }
        found += 1;
    }
    if found == 0 {
        bail!(
            "no workload has both baselines/perf/<workload>/{before_label}.json and {after_label}.json"
        );
    }
    let path = dir.join("report.md");
    durable::write_file(&path, markdown.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(label: &str, p50: f64, with_fused: bool) -> Value {
        let mut results = vec![json!({
            "impl": "rust", "mode": "graph-step",
            "metrics": {"epoch_ms_p50": p50, "epoch_ms_p95": p50 * 1.5, "samples_per_s": 1000.0 / p50}
        })];
        if with_fused {
            results
                .push(json!({"impl": "rust", "mode": "fused", "metrics": {"epoch_ms_p50": 0.1}}));
        }
        json!({"label": label, "environment": {"git_rev": "abc", "device": "H100"}, "results": results})
    }

    #[test]
    fn the_table_shows_before_after_and_their_ratio() {
        let text = markdown_section("w", &record("a", 2.0, false), &record("b", 1.0, false));
        assert!(
            text.contains("| `epoch_ms_p50` | 2.0000 | 1 | 0.500 |")
                || text.contains("| `epoch_ms_p50` | 2 | 1 | 0.500 |"),
            "{text}"
        );
        assert!(
            text.contains("| `samples_per_s` | 500 | 1000 | 2.000 |"),
            "{text}"
        );
        assert!(text.contains("before: `a`"));
    }

    #[test]
    fn an_entry_in_one_record_only_is_named_not_dropped() {
        let text = markdown_section("w", &record("a", 2.0, true), &record("b", 1.0, false));
        assert!(text.contains("### rust fused"), "{text}");
        assert!(text.contains("- not in after"), "{text}");
    }

    #[test]
    fn the_chart_draws_a_pair_of_bars_per_percentile_on_one_scale() {
        let svg = svg_chart("w", &record("a", 2.0, false), &record("b", 1.0, false)).expect("svg");
        // p50 and p95 of one entry, before and after: four bars.
        assert_eq!(svg.matches("<rect").count(), 4, "{svg}");
        // The largest value (before p95 = 3) spans the whole bar width.
        assert!(svg.contains(r#"width="420.0""#), "{svg}");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn records_without_millisecond_metrics_have_no_chart() {
        let plain = json!({"results": [{"impl": "rust", "mode": "m", "metrics": {"eps": 3.0}}]});
        assert!(svg_chart("w", &plain, &plain).is_none());
    }
}
