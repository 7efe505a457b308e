//! The `/metrics` endpoint scraped with a real HTTP client: values, format
//! (checked by `promtool check metrics` where installed), and agreement with
//! the names used by the alert rules and the Grafana dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryMetric, TelemetryPacket};
use leyline::telemetry::{self, MetricKind};
use nissa::{FailingSink, Hub, MemorySink};

fn observability_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/observability")
}

fn metric(name: &str, value: f64, attributes: &[(&str, &str)]) -> TelemetryMetric {
    let mut metric = TelemetryMetric::new(name, value, "");
    for (key, value) in attributes {
        metric
            .attributes
            .insert((*key).to_owned(), (*value).to_owned());
    }
    metric
}

fn packet(metrics: Vec<TelemetryMetric>) -> TelemetryPacket {
    let mut packet = TelemetryPacket::new("test", TelemetryLevel::Info);
    packet.metrics = metrics;
    packet
}

fn scrape(hub: &Hub) -> (String, String) {
    let addr = hub.metrics_addr().expect("the hub serves metrics");
    let mut response = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .expect("scrape succeeds");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.body_mut().read_to_string().expect("body is text");
    (content_type, body)
}

/// A strict reader of the exposition text: every line is a `# HELP`,
/// `# TYPE`, `# UNIT` comment or a `name{labels} value` sample, and the text
/// ends with `# EOF`. Returns sample (name with labels) to value.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.pop(), Some("# EOF"), "exposition must end with # EOF");
    for line in lines {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let keyword = parts.next().unwrap_or_default();
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&keyword),
                "unexpected comment {line:?}"
            );
            let name = parts.next().unwrap_or_default();
            assert!(is_metric_name(name), "bad metric name in {line:?}");
            if keyword == "TYPE" {
                let kind = parts.next().unwrap_or_default();
                assert!(
                    ["counter", "gauge", "histogram"].contains(&kind),
                    "unexpected type in {line:?}"
                );
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("sample without value: {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value is not a number: {line:?}"));
        let name = series.split('{').next().unwrap_or_default();
        assert!(is_metric_name(name), "bad sample name in {line:?}");
        let labels = &series[name.len()..];
        assert!(
            labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
            "bad labels in {line:?}"
        );
        // `name{}` (an empty label set, legal in both formats) is `name`.
        let series = series.strip_suffix("{}").unwrap_or(series);
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "duplicate series {series}"
        );
    }
    samples
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn sample_names(samples: &BTreeMap<String, f64>) -> BTreeSet<String> {
    samples
        .keys()
        .map(|series| series.split('{').next().unwrap_or_default().to_owned())
        .collect()
}

/// `promtool check metrics` on the exposition. Exit code 1 means the text
/// did not parse and fails the test; exit code 3 means lint findings, of which
/// two kinds are expected and nothing else is allowed:
/// - "metric names should not contain abbreviated units": the names are
///   leyline's (`..._ms`), kept as they are by design;
/// - "no help text" on a counter sample: promtool lints with the classic text
///   parser, which looks for `# HELP name_total`, while OpenMetrics (what the
///   endpoint serves and Prometheus scrapes) puts the help on the family name
///   without `_total`; the test checks that line exists.
fn check_with_promtool(body: &str) {
    let Some((code, report)) = promtool_status(&["check", "metrics"], body) else {
        return;
    };
    assert_ne!(
        code,
        Some(1),
        "promtool could not parse the exposition:\n{report}"
    );
    for finding in report.lines().filter(|line| !line.trim().is_empty()) {
        let (metric, problem) = finding.split_once(' ').unwrap_or((finding, ""));
        match problem {
            "metric names should not contain abbreviated units" => {
                assert!(
                    telemetry::METRICS
                        .iter()
                        .any(|spec| nissa::exposed_name(spec) == metric),
                    "{finding}: not a leyline name"
                );
            }
            "no help text" => {
                let family = metric.strip_suffix("_total").unwrap_or_else(|| {
                    panic!("{finding}: only counters may lack classic help text")
                });
                assert!(
                    body.contains(&format!("# HELP {family} ")),
                    "{finding}: no OpenMetrics help either"
                );
            }
            _ => panic!("unexpected promtool finding: {finding}\n{body}"),
        }
    }
    eprintln!("promtool check metrics: parsed; findings:\n{report}");
}

/// Runs `promtool` with `args`, feeding `stdin`; `None` when it is not installed.
fn promtool(args: &[&str], stdin: &str) -> Option<(bool, String)> {
    promtool_status(args, stdin).map(|(code, report)| (code == Some(0), report))
}

/// Like [`promtool`], with the exit code.
fn promtool_status(args: &[&str], stdin: &str) -> Option<(Option<i32>, String)> {
    let mut child = match Command::new("promtool")
        .args(args)
        .current_dir(observability_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            eprintln!("skipped promtool {args:?}: promtool is not runnable here ({error})");
            return None;
        }
    };
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("promtool reads stdin");
    let output = child.wait_with_output().expect("promtool finishes");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Some((output.status.code(), text))
}

#[test]
fn scraped_metrics_have_the_emitted_values_and_valid_format() {
    let failing = FailingSink::new();
    let hub = Hub::builder()
        .prometheus_on_port(0)
        .sink(MemorySink::new())
        .sink(failing.clone())
        .build()
        .unwrap();
    let addr = hub.metrics_addr().unwrap();
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);

    hub.emit(packet(vec![
        metric(telemetry::TOLARIA_ROLLBACK_TOTAL, 1.0, &[]),
        metric(telemetry::TOLARIA_GRAPH_FALLBACK_TOTAL, 1.0, &[]),
        metric(telemetry::TOLARIA_TRAINING_LATENCY_MS, 3.0, &[]),
        metric(telemetry::TOLARIA_TRAINING_LATENCY_MS, 12.0, &[]),
        metric(telemetry::KASMINA_SEED_ALPHA, 0.5, &[("slot", "r0c1")]),
        metric("not.a.leyline.metric", 7.0, &[]),
    ]));
    hub.emit(packet(vec![
        metric(telemetry::TOLARIA_ROLLBACK_TOTAL, 1.0, &[]),
        metric(telemetry::TOLARIA_TRAINING_LATENCY_MS, 20.0, &[]),
        metric(telemetry::KASMINA_SEED_ALPHA, 0.25, &[("slot", "r0c2")]),
        metric(telemetry::KASMINA_SEED_ALPHA, 0.75, &[("slot", "r0c1")]),
        metric(telemetry::TOLARIA_GRAPH_REPLAY_US, 30.0, &[("le", "x")]),
    ]));
    assert!(hub.flush(Duration::from_secs(10)).is_complete());

    let (content_type, body) = scrape(&hub);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let samples = parse_exposition(&body);
    let value = |series: &str| {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("{series} missing from\n{body}"))
    };
    assert_eq!(value("tolaria_rollback_total"), 2.0);
    assert_eq!(value("tolaria_graph_fallback_total"), 1.0);
    assert_eq!(value("tolaria_timeout_decisions_total"), 0.0);
    assert_eq!(value("kasmina_seed_alpha{slot=\"r0c1\"}"), 0.75);
    assert_eq!(value("kasmina_seed_alpha{slot=\"r0c2\"}"), 0.25);
    assert_eq!(value("tolaria_training_latency_ms_count"), 3.0);
    assert_eq!(value("tolaria_training_latency_ms_sum"), 35.0);
    assert_eq!(
        value("tolaria_training_latency_ms_bucket{le=\"10.0\"}"),
        1.0
    );
    assert_eq!(
        value("tolaria_training_latency_ms_bucket{le=\"18.0\"}"),
        2.0
    );
    assert_eq!(
        value("tolaria_training_latency_ms_bucket{le=\"+Inf\"}"),
        3.0
    );
    // A reserved attribute name is renamed rather than clashing with `le`.
    assert_eq!(value("tolaria_graph_replay_us_count{attr_le=\"x\"}"), 1.0);
    assert!(!body.contains("not_a_leyline_metric"));
    // The hub's own accounting: every packet failed in the failing sink.
    assert_eq!(value("nissa_sink_failed_total{sink=\"failing\"}"), 2.0);
    assert_eq!(value("nissa_sink_dropped_total{sink=\"memory\"}"), 0.0);
    assert_eq!(value("nissa_dropped_total"), 0.0);
    assert_eq!(failing.attempts(), 2);

    check_with_promtool(&body);

    // Other paths and methods get proper HTTP answers.
    let missing = ureq::get(&format!("http://{addr}/nope")).call();
    assert!(
        matches!(missing, Err(ureq::Error::StatusCode(404))),
        "{missing:?}"
    );
    hub.close();
}

#[test]
fn rules_and_dashboard_use_only_exposed_names() {
    let hub = Hub::builder().prometheus_on_port(0).build().unwrap();
    // One observation of every metric, so that gauges are exposed too.
    hub.emit(packet(
        telemetry::METRICS
            .iter()
            .map(|spec| metric(spec.name, 1.0, &[]))
            .collect(),
    ));
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let (_, body) = scrape(&hub);
    hub.close();
    let exposed = sample_names(&parse_exposition(&body));
    for name in nissa::prometheus::exposed_sample_names() {
        // The per-sink counters need a sink to have a series.
        if name.starts_with("nissa_sink_") {
            continue;
        }
        assert!(exposed.contains(&name), "{name} is not exposed");
    }
    for spec in telemetry::METRICS {
        if spec.kind == MetricKind::Counter {
            assert!(exposed.contains(&nissa::exposed_name(spec)));
        }
    }

    let dir = observability_dir();
    let rules = std::fs::read_to_string(dir.join("esper.rules.yml")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("esper-dashboard.json")).unwrap())
            .unwrap();
    let recorded: BTreeSet<String> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- record:"))
        .map(|name| name.trim().to_owned())
        .collect();
    let mut expressions: Vec<String> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("expr:"))
        .map(str::to_owned)
        .collect();
    let rule_expressions = expressions.len();
    collect_exprs(&dashboard, &mut expressions);
    assert!(rule_expressions >= 8, "the rules file lost its expressions");
    assert!(
        expressions.len() > rule_expressions + 20,
        "the dashboard lost its panels"
    );

    // The per-sink counters exist once sinks do (checked in the test above).
    let sink_counters: BTreeSet<String> = ["nissa_sink_dropped_total", "nissa_sink_failed_total"]
        .map(str::to_owned)
        .into();
    let mut checked = BTreeSet::new();
    for expression in &expressions {
        for token in
            expression.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        {
            if token.contains(':') {
                assert!(recorded.contains(token), "{token} is not a recording rule");
            } else if ["tolaria_", "kasmina_", "simic_", "nissa_"]
                .iter()
                .any(|prefix| token.starts_with(prefix))
            {
                assert!(
                    exposed.contains(token) || sink_counters.contains(token),
                    "{token} (in {expression:?}) is not exposed by /metrics"
                );
                checked.insert(token.to_owned());
            }
        }
    }
    assert!(checked.len() >= 30, "only {} names checked", checked.len());

    for alert in [
        "EsperGraphFallback",
        "EsperRollback",
        "EsperDecisionTimeout",
        "EsperTelemetryDropping",
        "EsperEpochLatencyOverBudget",
    ] {
        assert!(
            rules.contains(&format!("- alert: {alert}\n")),
            "{alert} missing"
        );
    }
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                collect_exprs(item, out);
            }
        }
        _ => {}
    }
}

#[test]
fn alert_rules_pass_promtool_checks_and_unit_tests() {
    if let Some((ok, report)) = promtool(&["check", "rules", "esper.rules.yml"], "") {
        assert!(ok, "{report}");
    }
    if let Some((ok, report)) = promtool(&["test", "rules", "esper-alerts.test.yml"], "") {
        assert!(ok, "{report}");
    }
}

#[test]
fn a_taken_port_is_a_bind_error() {
    let hub = Hub::builder().prometheus_on_port(0).build().unwrap();
    let addr = hub.metrics_addr().unwrap();
    let second = Hub::builder().prometheus(addr).build();
    assert!(
        matches!(second, Err(nissa::Error::Bind { .. })),
        "{second:?}"
    );
    hub.close();
}
