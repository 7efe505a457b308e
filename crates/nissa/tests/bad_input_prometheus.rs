//! Hostile packets against the Prometheus sink: attribute names that collide
//! after sanitising, label values that need escaping, oversized label sets,
//! non-finite values and increments that would overflow. A refused packet
//! changes no series and counts as failed; the scrape always stays valid.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryMetric, TelemetryPacket};
use leyline::telemetry;
use nissa::prometheus::{MAX_LABEL_NAME_BYTES, MAX_LABEL_VALUE_BYTES, MAX_LABELS};
use nissa::{Hub, PrometheusSink, Sink};

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

fn scrape(hub: &Hub) -> String {
    let addr = hub.metrics_addr().expect("the hub serves metrics");
    let mut response = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .expect("scrape succeeds");
    response.body_mut().read_to_string().expect("body is text")
}

/// One parsed sample: metric name, labels (unescaped) and value.
type Sample = (String, BTreeMap<String, String>, f64);

/// A strict reader of the OpenMetrics text: every sample line is
/// `name{label="value",...} number` with valid names, properly escaped
/// values, no label name twice in one series and no series twice; the text
/// ends with `# EOF`. Panics (fails the test) on anything else.
fn parse_strict(text: &str) -> Vec<Sample> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    assert_eq!(lines.pop(), Some(""), "exposition must end with a newline");
    assert_eq!(lines.pop(), Some("# EOF"), "exposition must end with # EOF");
    let mut samples = Vec::new();
    let mut seen = BTreeSet::new();
    for line in lines {
        if let Some(comment) = line.strip_prefix("# ") {
            let keyword = comment.split(' ').next().unwrap_or_default();
            assert!(["HELP", "TYPE", "UNIT"].contains(&keyword), "{line:?}");
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let name = &line[..name_end];
        assert!(is_name(name, true), "bad metric name in {line:?}");
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(inner) = rest.strip_prefix('{') {
            rest = inner;
            loop {
                if let Some(after) = rest.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let (label, after) = rest
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("bad label in {line:?}"));
                assert!(
                    is_name(label, false),
                    "bad label name {label:?} in {line:?}"
                );
                let mut value = String::new();
                let mut chars = after.char_indices();
                let end = loop {
                    let (index, c) = chars
                        .next()
                        .unwrap_or_else(|| panic!("unterminated value in {line:?}"));
                    match c {
                        '"' => break index,
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            other => panic!("bad escape {other:?} in {line:?}"),
                        },
                        c => value.push(c),
                    }
                };
                assert!(
                    labels.insert(label.to_owned(), value).is_none(),
                    "label {label} twice in {line:?}"
                );
                rest = &after[end + 1..];
                rest = rest.strip_prefix(',').unwrap_or(rest);
            }
        }
        let number = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = number
            .parse()
            .unwrap_or_else(|_| panic!("bad number in {line:?}"));
        assert!(
            value.is_finite() || (name.ends_with("_bucket") && labels.contains_key("le")),
            "non-finite sample {line:?}"
        );
        assert!(
            seen.insert((name.to_owned(), labels.clone())),
            "series twice: {line:?}"
        );
        samples.push((name.to_owned(), labels, value));
    }
    samples
}

fn is_name(name: &str, colons: bool) -> bool {
    let mut chars = name.chars();
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':');
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(ok)
}

fn value_of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    samples
        .iter()
        .find(|(sample, found, _)| sample == name && *found == wanted)
        .map(|(_, _, value)| *value)
}

fn prometheus_stats(hub: &Hub) -> nissa::SinkStats {
    hub.stats().sink("prometheus").unwrap().clone()
}

#[test]
fn colliding_label_names_refuse_the_packet_and_keep_the_scrape_valid() {
    let hub = Hub::builder().prometheus_on_port(0).build().unwrap();
    let collisions: [&[(&str, &str)]; 5] = [
        &[("a.b", "1"), ("a_b", "2")],
        &[("le", "1"), ("attr_le", "2")],
        &[("", "1"), ("_", "2")],
        &[("0x", "1"), ("_0x", "2")],
        &[("slot-id", "1"), ("slot id", "2")],
    ];
    for attributes in collisions {
        hub.emit(packet(vec![metric(
            telemetry::KASMINA_SEED_ALPHA,
            0.5,
            attributes,
        )]));
        hub.emit(packet(vec![metric(
            telemetry::TOLARIA_GRAPH_REPLAY_US,
            3.0,
            attributes,
        )]));
    }
    hub.emit(packet(vec![
        metric(telemetry::KASMINA_SEED_ALPHA, 0.75, &[("slot", "r0c1")]),
        metric(telemetry::TOLARIA_ROLLBACK_TOTAL, 1.0, &[]),
    ]));
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let body = scrape(&hub);
    let samples = parse_strict(&body);
    assert_eq!(
        value_of(&samples, "kasmina_seed_alpha", &[("slot", "r0c1")]),
        Some(0.75),
        "{body}"
    );
    assert_eq!(value_of(&samples, "tolaria_rollback_total", &[]), Some(1.0));
    // Nothing of the refused packets reached a series.
    assert_eq!(
        samples
            .iter()
            .filter(|(name, _, _)| name == "kasmina_seed_alpha")
            .count(),
        1,
        "{body}"
    );
    assert_eq!(
        value_of(&samples, "tolaria_graph_replay_us_count", &[]),
        Some(0.0)
    );
    let stats = prometheus_stats(&hub);
    assert_eq!(stats.failed, 10, "{stats:?}");
    assert_eq!(stats.delivered, 1, "{stats:?}");
    assert_eq!(
        value_of(
            &samples,
            "nissa_sink_failed_total",
            &[("sink", "prometheus")]
        ),
        Some(10.0)
    );
    hub.close();
}

#[test]
fn label_values_are_escaped_and_read_back_unchanged() {
    let hub = Hub::builder().prometheus_on_port(0).build().unwrap();
    let values = [
        "quote\"back\\slash",
        "new\nline",
        "tab\tcarriage\rreturn",
        "é-ü-漢",
        "}{=,\"",
        "",
    ];
    for (index, value) in values.iter().enumerate() {
        hub.emit(packet(vec![metric(
            telemetry::KASMINA_SEED_ALPHA,
            index as f64,
            &[("slot", value)],
        )]));
    }
    assert!(hub.flush(Duration::from_secs(10)).is_complete());
    let samples = parse_strict(&scrape(&hub));
    for (index, value) in values.iter().enumerate() {
        assert_eq!(
            value_of(&samples, "kasmina_seed_alpha", &[("slot", value)]),
            Some(index as f64),
            "{value:?}"
        );
    }
    assert_eq!(prometheus_stats(&hub).failed, 0);
    hub.close();
}

#[test]
fn a_refused_metric_leaves_the_rest_of_its_packet_unrecorded() {
    let sink = PrometheusSink::new();
    let mut writer = sink.clone();
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let result = writer.write(&packet(vec![
            metric(telemetry::KASMINA_SEED_ALPHA, 0.5, &[("slot", "r0c1")]),
            metric(telemetry::TOLARIA_ROLLBACK_TOTAL, 1.0, &[]),
            metric(telemetry::TOLARIA_TRAINING_LATENCY_MS, bad, &[]),
        ]));
        assert!(result.is_err(), "{bad} was accepted");
        // Not in the catalogue, still refused: the rule is about the packet.
        let result = writer.write(&packet(vec![
            metric(telemetry::TOLARIA_ROLLBACK_TOTAL, 1.0, &[]),
            metric("not.in.the.catalogue", bad, &[]),
        ]));
        assert!(result.is_err(), "{bad} was accepted");
    }
    // A negative counter increment refuses the packet too.
    let result = writer.write(&packet(vec![
        metric(telemetry::KASMINA_SEED_ALPHA, 0.5, &[("slot", "r0c2")]),
        metric(telemetry::TOLARIA_ROLLBACK_TOTAL, -1.0, &[]),
    ]));
    assert!(result.is_err());
    let text = sink.exposition();
    assert!(!text.contains("kasmina_seed_alpha{"), "{text}");
    let samples = parse_strict(&text);
    assert_eq!(value_of(&samples, "tolaria_rollback_total", &[]), Some(0.0));
    assert_eq!(
        value_of(&samples, "tolaria_training_latency_ms_count", &[]),
        Some(0.0)
    );
}

#[test]
fn counters_and_histogram_sums_never_overflow_to_infinity() {
    let sink = PrometheusSink::new();
    let mut writer = sink.clone();
    let big = packet(vec![
        metric(telemetry::TOLARIA_ROLLBACK_TOTAL, f64::MAX, &[]),
        metric(telemetry::TOLARIA_TRAINING_LATENCY_MS, f64::MAX, &[]),
    ]);
    writer.write(&big).unwrap();
    assert!(writer.write(&big).is_err(), "the sum overflowed");
    let only_counter = packet(vec![metric(
        telemetry::TOLARIA_ROLLBACK_TOTAL,
        f64::MAX,
        &[],
    )]);
    assert!(writer.write(&only_counter).is_err());
    let only_histogram = packet(vec![metric(
        telemetry::TOLARIA_TRAINING_LATENCY_MS,
        f64::MAX,
        &[],
    )]);
    assert!(writer.write(&only_histogram).is_err());
    let negative = packet(vec![metric(
        telemetry::TOLARIA_TRAINING_LATENCY_MS,
        f64::MIN,
        &[],
    )]);
    // The sum goes from f64::MAX to 0 to f64::MIN; one more would be -inf.
    writer.write(&negative).unwrap();
    writer.write(&negative).unwrap();
    assert!(writer.write(&negative).is_err());
    let samples = parse_strict(&sink.exposition());
    assert_eq!(
        value_of(&samples, "tolaria_rollback_total", &[]),
        Some(f64::MAX)
    );
    assert_eq!(
        value_of(&samples, "tolaria_training_latency_ms_count", &[]),
        Some(3.0)
    );
    assert_eq!(
        value_of(&samples, "tolaria_training_latency_ms_sum", &[]),
        Some(f64::MIN)
    );
}

#[test]
fn oversized_label_sets_are_refused() {
    let sink = PrometheusSink::new();
    let mut writer = sink.clone();
    let many: Vec<(String, String)> = (0..=MAX_LABELS)
        .map(|index| (format!("k{index}"), "v".to_owned()))
        .collect();
    let many: Vec<(&str, &str)> = many
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    let long_value = "v".repeat(MAX_LABEL_VALUE_BYTES + 1);
    let long_name = "k".repeat(MAX_LABEL_NAME_BYTES + 1);
    for attributes in [
        many.as_slice(),
        &[("slot", long_value.as_str())],
        &[(long_name.as_str(), "v")],
    ] {
        let result = writer.write(&packet(vec![metric(
            telemetry::KASMINA_SEED_ALPHA,
            0.5,
            attributes,
        )]));
        assert!(result.is_err(), "{} labels accepted", attributes.len());
    }
    // At the bounds it is accepted.
    let at_bound: Vec<(String, String)> = (0..MAX_LABELS)
        .map(|index| (format!("k{index}"), "v".repeat(MAX_LABEL_VALUE_BYTES)))
        .collect();
    let at_bound: Vec<(&str, &str)> = at_bound
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    writer
        .write(&packet(vec![metric(
            telemetry::KASMINA_SEED_ALPHA,
            0.5,
            &at_bound,
        )]))
        .unwrap();
    let samples = parse_strict(&sink.exposition());
    assert_eq!(
        samples
            .iter()
            .filter(|(name, _, _)| name == "kasmina_seed_alpha")
            .count(),
        1
    );
}

#[test]
fn idle_connections_beyond_the_cap_are_closed_and_scrapes_resume() {
    use std::io::Read;
    use std::net::TcpStream;

    let hub = Hub::builder().prometheus_on_port(0).build().unwrap();
    let addr = hub.metrics_addr().unwrap();
    let idle: Vec<TcpStream> = (0..nissa::prometheus::MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Let the endpoint accept them all.
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = extra.read(&mut byte);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|error| error.kind() != std::io::ErrorKind::WouldBlock
                    && error.kind() != std::io::ErrorKind::TimedOut),
        "the connection over the cap was kept open: {read:?}"
    );
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let body = scrape(&hub);
    assert!(body.ends_with("# EOF\n"));
    hub.close();
}
