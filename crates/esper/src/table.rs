//! The result table `esper bench` prints to standard output after writing a
//! record: one row per result entry, the workload's headline columns.

use leyline::baseline::BaselineRecord;

use crate::args::Workload;

/// One column: metric key, title, decimals.
type Column = (&'static str, &'static str, usize);

/// The headline columns of `workload`.
fn columns(workload: Workload) -> &'static [Column] {
    match workload {
        Workload::TolariaReference => &[
            ("epoch_ms_p50", "p50 ms", 4),
            ("epoch_ms_p95", "p95 ms", 4),
            ("epoch_ms_max", "max ms", 4),
            ("replay_us_per_step", "replay us", 4),
            ("capture_ms", "capture ms", 4),
            ("h2d_ms_p50", "h2d ms", 4),
            ("peak_device_memory_bytes", "peak bytes", 0),
        ],
        Workload::NissaEmit => &[
            ("events_per_s", "events/s", 0),
            ("emit_ns_p50", "p50 ns", 0),
            ("emit_ns_p99", "p99 ns", 0),
            ("emit_ns_max", "max ns", 0),
            ("emitted", "emitted", 0),
            ("delivered", "slow deliv", 0),
            ("dropped", "slow drop", 0),
            ("fast_delivered", "fast deliv", 0),
            ("accounting_exact", "exact", 0),
        ],
        Workload::KasminaPrefetch => &[
            ("latency_ms_p50", "p50 ms", 4),
            ("latency_ms_p95", "p95 ms", 4),
            ("latency_ms_max", "max ms", 4),
            ("requests", "requests", 0),
            ("requests_per_s", "requests/s", 1),
        ],
        Workload::TolariaLm => &[
            ("epoch_ms_p50", "p50 ms", 1),
            ("epoch_ms_p95", "p95 ms", 1),
            ("tokens_per_s", "tokens/s", 0),
            ("device_epoch_ms_p50", "device ms", 1),
            ("validation_ms_p50", "val ms", 1),
            ("capture_ms", "capture ms", 1),
            ("compile_s", "compile s", 1),
            ("peak_device_memory_bytes", "peak bytes", 0),
            ("val_perplexity", "val ppl", 2),
        ],
        Workload::TolariaFmnist => &[
            ("epoch_ms_p50", "p50 ms", 1),
            ("epoch_ms_p95", "p95 ms", 1),
            ("samples_per_s", "samples/s", 0),
            ("device_epoch_ms_p50", "device ms", 1),
            ("validation_ms_p50", "val ms", 1),
            ("capture_ms", "capture ms", 1),
            ("second_trainer_capture_ms", "2nd cap ms", 1),
            ("peak_device_memory_bytes", "peak bytes", 0),
            ("val_accuracy", "val acc", 2),
        ],
        Workload::TolariaTimeout => &[
            ("epochs", "epochs", 0),
            ("timeouts", "timeouts", 0),
            ("deadline_ms", "deadline ms", 1),
            ("decision_wait_ms_p50", "wait p50 ms", 2),
            ("recovery_ms_max", "recovery max ms", 3),
        ],
        Workload::TolariaRollback => &[
            ("recovery_ms", "recovery ms", 3),
            ("restored_tensors", "restored", 0),
            ("pruned_seeds", "pruned", 0),
            ("loss_before", "loss before", 4),
            ("loss_after", "loss after", 4),
        ],
        Workload::SimicThroughput
        | Workload::SimicCifar
        | Workload::SimicLm
        | Workload::SimicGrowth => &[
            ("eps", "eps", 2),
            ("eps_steady", "eps steady", 2),
            ("policy_inference_ms", "infer ms", 3),
            ("policy_replay_device_ms", "replay ms", 3),
            ("update_ms", "update ms", 1),
            ("train_ms_per_env_epoch", "train ms/ee", 1),
            ("counterfactual_ms_per_env_epoch", "cf ms/ee", 1),
            ("active_seeds_per_env", "seeds", 2),
            ("peak_memory_mb", "peak MB", 0),
        ],
        Workload::SimicLearning => &[
            ("mean_episode_reward", "reward", 3),
            ("final_accuracy_pct", "final acc", 2),
            ("greedy_accuracy_pct", "greedy acc", 2),
            ("active_seeds_per_env", "seeds", 2),
            ("fossilizations", "fossils", 0),
            ("mean_diff_pct", "diff", 2),
            ("ci95_low_pct", "ci95 low", 2),
            ("ci95_high_pct", "ci95 high", 2),
            ("sign_test_p", "sign p", 3),
            ("permutation_p", "perm p", 3),
            ("recovered_fraction", "recovered", 2),
        ],
        Workload::PpoCartpole => &[
            ("mean_return_100k", "ret 100k", 1),
            ("mean_return_250k", "ret 250k", 1),
            ("mean_return_500k", "ret 500k", 1),
            ("mean_return_final", "ret final", 1),
            ("steps_per_s", "steps/s", 0),
        ],
    }
}

/// The table of `record` as text, one line per row.
pub(crate) fn render(workload: Workload, record: &BaselineRecord) -> String {
    let columns = columns(workload);
    let mut lines = vec![format!(
        "{} on {} ({})",
        record.workload, record.environment.device, record.label
    )];
    let mut header = format!("{:<8} {:<32}", "impl", "mode");
    for (_, title, _) in columns {
        header.push_str(&format!(" {title:>11}"));
    }
    lines.push(header);
    for entry in &record.results {
        let mut line = format!("{:<8} {:<32}", entry.implementation, entry.mode);
        if let Some(error) = &entry.error {
            lines.push(format!("{line} error: {error}"));
            // A failed variant has no figures; an inexact nissa-emit
            // accounting has both: its figures follow on their own row.
            if entry.metrics.is_empty() {
                continue;
            }
            line = format!("{:<8} {:<32}", "", "");
        }
        for (key, _, decimals) in columns {
            let cell = entry.metrics.get(*key).map_or_else(
                || "-".to_owned(),
                |value| format!("{value:.decimals$}", decimals = *decimals),
            );
            line.push_str(&format!(" {cell:>11}"));
        }
        lines.push(line);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use leyline::baseline::{BASELINE_SCHEMA, Environment, ResultEntry};

    use super::*;

    #[test]
    fn rows_show_headline_metrics_dashes_and_errors() {
        let entry = |mode: &str, metrics: &[(&str, f64)], error: Option<&str>| ResultEntry {
            amp: None,
            implementation: "rust".to_owned(),
            mode: mode.to_owned(),
            metrics: metrics
                .iter()
                .map(|(key, value)| ((*key).to_owned(), *value))
                .collect(),
            error: error.map(str::to_owned),
        };
        let record = BaselineRecord {
            schema: BASELINE_SCHEMA,
            workload: "kasmina-prefetch".to_owned(),
            label: "t".to_owned(),
            environment: Environment {
                device: "cpu".into(),
                torch: "n/a".into(),
                cuda: "n/a".into(),
                driver: "n/a".into(),
                cpu: "test".into(),
                git_rev: "abc".into(),
                tf32: false,
                amp: "off".into(),
                extra: BTreeMap::new(),
            },
            params: serde_json::json!({}),
            results: vec![
                entry(
                    "sequential",
                    &[("latency_ms_p50", 1.5), ("requests", 32.0)],
                    None,
                ),
                entry("burst", &[], Some("prefetcher is closed")),
            ],
            telemetry_names: Vec::new(),
        };
        let text = render(Workload::KasminaPrefetch, &record);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "kasmina-prefetch on cpu (t)");
        assert!(lines[1].contains("p50 ms") && lines[1].contains("requests/s"));
        assert!(lines[2].contains("1.5000") && lines[2].contains(" 32") && lines[2].contains('-'));
        assert!(lines[3].ends_with("error: prefetcher is closed"));
        assert_eq!(lines.len(), 4);
    }
}
