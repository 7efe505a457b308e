//! Prometheus exposition: a sink that keeps one counter, gauge or histogram
//! family per leyline metric, and the `/metrics` HTTP endpoint serving it.
//!
//! Names follow [`leyline::telemetry::prometheus_name`] (dots become
//! underscores); counters always end in `_total` (OpenMetrics adds the suffix,
//! so a leyline counter named `..._total` keeps its name and one without it
//! gains it). [`exposed_name`] is the single place that spells this rule.
//!
//! Value semantics of a [`TelemetryMetric`](leyline::proto::TelemetryMetric):
//! for a counter the value is an increment (finite, not negative); for a gauge
//! the new value; for a histogram one observation. Attributes become labels.
//! Metric names outside leyline's catalogue are ignored by this sink (they
//! still reach the other sinks). The hub's own `nissa.*` counters are read from
//! the hub's statistics at scrape time.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use leyline::proto::TelemetryPacket;
use leyline::telemetry::{MetricKind, MetricSpec};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod endpoint;

pub(crate) use self::endpoint::MetricsEndpoint;
use crate::sink::Sink;
use crate::stats::HubStats;
use crate::{Error, Result};

/// Content type of the exposition (OpenMetrics text, which Prometheus scrapes
/// natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Most connections the metrics endpoint serves at once; a connection
/// beyond them is closed at once, so idle or hostile clients cannot pile up
/// tasks and descriptors.
pub const MAX_CONNECTIONS: usize = 64;

/// A client must send its request headers within this time, or the
/// connection is closed.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Name of the Prometheus sink in statistics and labels.
pub const PROMETHEUS_SINK_NAME: &str = "prometheus";

/// Most label sets one metric may grow to; further ones are refused (the
/// packet counts as failed) so that a runaway attribute cannot exhaust memory.
pub const MAX_SERIES_PER_METRIC: usize = 1000;

/// Most attributes (labels) one metric of a packet may carry.
pub const MAX_LABELS: usize = 16;

/// Longest attribute name, in bytes.
pub const MAX_LABEL_NAME_BYTES: usize = 128;

/// Longest attribute value, in bytes.
pub const MAX_LABEL_VALUE_BYTES: usize = 1024;

/// Histogram buckets for millisecond metrics. 18 ms is the seeds' epoch
/// latency budget (p95), so the alert on it reads an exact bucket edge.
pub const MS_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 18.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
    5000.0, 10_000.0, 30_000.0, 60_000.0,
];

/// Histogram buckets for microsecond metrics.
pub const US_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 25.0, 37.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10_000.0, 100_000.0,
];

/// Histogram buckets for everything else (decades).
pub const GENERIC_BUCKETS: &[f64] = &[0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 10_000.0];

/// The name under which a leyline metric's samples are exposed. For
/// histograms this is the family name; the samples add `_bucket`, `_sum` and
/// `_count`.
pub fn exposed_name(spec: &MetricSpec) -> String {
    let name = leyline::telemetry::prometheus_name(spec.name);
    match spec.kind {
        MetricKind::Counter if !name.ends_with("_total") => format!("{name}_total"),
        _ => name,
    }
}

/// Every sample name the endpoint can expose for leyline's metrics
/// (histograms contribute `_bucket`, `_sum` and `_count`).
pub fn exposed_sample_names() -> Vec<String> {
    let mut names = Vec::new();
    for spec in leyline::telemetry::METRICS {
        let name = exposed_name(spec);
        if spec.kind == MetricKind::Histogram {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.push(format!("{name}{suffix}"));
            }
        } else {
            names.push(name);
        }
    }
    names
}

/// Name passed to the registry: OpenMetrics appends `_total` to counters.
fn registered_name(spec: &MetricSpec) -> String {
    let name = exposed_name(spec);
    match spec.kind {
        MetricKind::Counter => name.trim_end_matches("_total").to_owned(),
        _ => name,
    }
}

type Labels = Vec<(String, String)>;
type CounterFamily = Family<Labels, Counter<f64, AtomicU64>>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;
type HubCounterFamily = Family<Labels, Counter<u64, AtomicU64>>;

fn ms_histogram() -> Histogram {
    Histogram::new(MS_BUCKETS.iter().copied())
}

fn us_histogram() -> Histogram {
    Histogram::new(US_BUCKETS.iter().copied())
}

fn generic_histogram() -> Histogram {
    Histogram::new(GENERIC_BUCKETS.iter().copied())
}

/// One registered leyline metric.
enum Entry {
    Counter(CounterFamily),
    Gauge(GaugeFamily),
    Histogram(HistogramFamily),
}

/// The hub's own counters, refreshed from [`HubStats`] at scrape time.
struct HubCounters {
    dropped: Counter<u64, AtomicU64>,
    after_close: Counter<u64, AtomicU64>,
    sink_dropped: HubCounterFamily,
    sink_failed: HubCounterFamily,
    /// Serialises refreshes so that two scrapes cannot add the same delta.
    refresh: Mutex<()>,
}

/// Bookkeeping of the recorded series, behind one lock.
#[derive(Default)]
struct Recorded {
    /// Label sets seen per metric, for the cardinality cap.
    series: HashMap<&'static str, HashSet<Labels>>,
    /// Sum of the observations of each histogram series (the family does not
    /// expose it), so that an observation can be refused before the sum
    /// becomes non-finite.
    sums: HashMap<(&'static str, Labels), f64>,
}

/// The registry and its families, shared by the sink and the endpoint.
struct MetricSet {
    registry: Registry,
    by_name: HashMap<&'static str, Entry>,
    /// What was recorded; its lock serialises recording (check, then apply).
    recorded: Mutex<Recorded>,
    hub: HubCounters,
}

impl MetricSet {
    fn new() -> MetricSet {
        let mut registry = Registry::default();
        let mut by_name = HashMap::new();
        let unlabelled = Labels::new();
        let mut hub_dropped = None;
        let mut hub_after_close = None;
        let mut hub_sink_dropped = None;
        let mut hub_sink_failed = None;
        for spec in leyline::telemetry::METRICS {
            let name = registered_name(spec);
            match spec.name {
                leyline::telemetry::NISSA_DROPPED_TOTAL
                | leyline::telemetry::NISSA_AFTER_CLOSE_TOTAL => {
                    let counter = Counter::<u64, AtomicU64>::default();
                    registry.register(name, spec.help, counter.clone());
                    if spec.name == leyline::telemetry::NISSA_DROPPED_TOTAL {
                        hub_dropped = Some(counter);
                    } else {
                        hub_after_close = Some(counter);
                    }
                    continue;
                }
                leyline::telemetry::NISSA_SINK_DROPPED_TOTAL
                | leyline::telemetry::NISSA_SINK_FAILED_TOTAL => {
                    let family = HubCounterFamily::default();
                    registry.register(name, spec.help, family.clone());
                    if spec.name == leyline::telemetry::NISSA_SINK_DROPPED_TOTAL {
                        hub_sink_dropped = Some(family);
                    } else {
                        hub_sink_failed = Some(family);
                    }
                    continue;
                }
                _ => {}
            }
            let entry = match spec.kind {
                MetricKind::Counter => {
                    let family = CounterFamily::default();
                    // Counters start at zero so that rate() and increase() see
                    // the first increment.
                    drop(family.get_or_create(&unlabelled));
                    registry.register(name, spec.help, family.clone());
                    Entry::Counter(family)
                }
                MetricKind::Gauge => {
                    // Gauges appear once reported: a made-up zero would lie.
                    let family = GaugeFamily::default();
                    registry.register(name, spec.help, family.clone());
                    Entry::Gauge(family)
                }
                MetricKind::Histogram => {
                    let constructor: fn() -> Histogram = match spec.unit {
                        "ms" => ms_histogram,
                        "us" => us_histogram,
                        _ => generic_histogram,
                    };
                    let family = HistogramFamily::new_with_constructor(constructor);
                    drop(family.get_or_create(&unlabelled));
                    registry.register(name, spec.help, family.clone());
                    Entry::Histogram(family)
                }
            };
            by_name.insert(spec.name, entry);
        }
        MetricSet {
            registry,
            by_name,
            recorded: Mutex::new(Recorded::default()),
            hub: HubCounters {
                dropped: hub_dropped.unwrap_or_default(),
                after_close: hub_after_close.unwrap_or_default(),
                sink_dropped: hub_sink_dropped.unwrap_or_default(),
                sink_failed: hub_sink_failed.unwrap_or_default(),
                refresh: Mutex::new(()),
            },
        }
    }

    /// Records every metric of `packet`, or nothing of it: a packet with a
    /// non-finite value, a negative counter increment, an increment or
    /// observation that would make a total non-finite, a label set over the
    /// bounds or with colliding names, or a new series beyond
    /// [`MAX_SERIES_PER_METRIC`] is refused whole.
    fn record(&self, packet: &TelemetryPacket) -> std::result::Result<(), String> {
        leyline::codec::check_finite_packet(packet).map_err(|error| error.to_string())?;
        // One lock for check and apply, so that the totals checked are the
        // totals added to (clones of the sink share the registry).
        let mut recorded = match self.recorded.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Recorded { series, sums } = &mut *recorded;
        let mut plan: Vec<(&'static str, &Entry, Labels, f64)> =
            Vec::with_capacity(packet.metrics.len());
        let mut totals: HashMap<(&'static str, Labels), f64> = HashMap::new();
        let mut new_series: HashMap<&'static str, HashSet<Labels>> = HashMap::new();
        for metric in &packet.metrics {
            let Some((&name, entry)) = self.by_name.get_key_value(metric.name.as_str()) else {
                continue;
            };
            let labels =
                label_set(&metric.attributes).map_err(|reason| format!("{name}: {reason}"))?;
            let value = metric.value;
            let current = match entry {
                Entry::Counter(_) if value < 0.0 => {
                    return Err(format!("counter {name} got a negative increment {value}"));
                }
                Entry::Counter(family) => Some(family.get(&labels).map_or(0.0, |c| c.get())),
                Entry::Histogram(_) => {
                    Some(sums.get(&(name, labels.clone())).copied().unwrap_or(0.0))
                }
                Entry::Gauge(_) => None,
            };
            if let Some(current) = current {
                let total = totals.entry((name, labels.clone())).or_insert(current);
                *total += value;
                if !total.is_finite() {
                    return Err(format!(
                        "{name}: adding {value} would make its total non-finite"
                    ));
                }
            }
            let known = series.get(name);
            if !known.is_some_and(|known| known.contains(&labels)) {
                let fresh = new_series.entry(name).or_default();
                fresh.insert(labels.clone());
                let count = known.map_or(0, HashSet::len).saturating_add(fresh.len());
                if count > MAX_SERIES_PER_METRIC {
                    return Err(format!(
                        "{name} already has {MAX_SERIES_PER_METRIC} label sets; refusing another"
                    ));
                }
            }
            plan.push((name, entry, labels, value));
        }
        for (name, fresh) in new_series {
            series.entry(name).or_default().extend(fresh);
        }
        for (name, entry, labels, value) in plan {
            match entry {
                Entry::Counter(family) => {
                    family.get_or_create(&labels).inc_by(value);
                }
                Entry::Gauge(family) => {
                    family.get_or_create(&labels).set(value);
                }
                Entry::Histogram(family) => {
                    family.get_or_create(&labels).observe(value);
                    *sums.entry((name, labels)).or_insert(0.0) += value;
                }
            }
        }
        Ok(())
    }

    /// Brings the hub counters up to `stats` (they only ever grow).
    fn refresh_hub_counters(&self, stats: &HubStats) {
        let _serialised = match self.hub.refresh.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        raise(&self.hub.dropped, stats.queue_dropped);
        raise(&self.hub.after_close, stats.after_close);
        for sink in &stats.sinks {
            let labels = vec![("sink".to_owned(), sink.name.clone())];
            raise(
                &self.hub.sink_dropped.get_or_create(&labels),
                sink.sink_queue_dropped,
            );
            raise(&self.hub.sink_failed.get_or_create(&labels), sink.failed);
        }
    }

    /// The exposition text; `None` if the encoder failed (never served
    /// half-written).
    fn exposition(&self) -> Option<String> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry).ok()?;
        Some(text)
    }
}

fn raise(counter: &Counter<u64, AtomicU64>, target: u64) {
    if let Some(delta) = target.checked_sub(counter.get()).filter(|delta| *delta > 0) {
        counter.inc_by(delta);
    }
}

/// Attributes as a label set: sorted, names made valid, reserved names
/// (`le`, `quantile`, `__*`) prefixed with `attr_`. Refused: more than
/// [`MAX_LABELS`] attributes, a name over [`MAX_LABEL_NAME_BYTES`] or a value
/// over [`MAX_LABEL_VALUE_BYTES`], and two names that become the same label
/// (`a.b` and `a_b`), which would put one label twice in a series. Values are
/// kept as they are; the encoder escapes `\`, `"` and newlines.
fn label_set(attributes: &BTreeMap<String, String>) -> std::result::Result<Labels, String> {
    if attributes.len() > MAX_LABELS {
        return Err(format!(
            "{} attributes, more than {MAX_LABELS}",
            attributes.len()
        ));
    }
    let mut labels = Labels::with_capacity(attributes.len());
    for (key, value) in attributes {
        if key.len() > MAX_LABEL_NAME_BYTES {
            return Err(format!(
                "an attribute name has {} bytes, more than {MAX_LABEL_NAME_BYTES}",
                key.len()
            ));
        }
        if value.len() > MAX_LABEL_VALUE_BYTES {
            return Err(format!(
                "attribute {key:?} has a value of {} bytes, more than {MAX_LABEL_VALUE_BYTES}",
                value.len()
            ));
        }
        labels.push((label_name(key), value.clone()));
    }
    labels.sort();
    if let Some([first, _]) = labels
        .windows(2)
        .find(|pair| matches!(pair, [first, second] if first.0 == second.0))
    {
        return Err(format!(
            "two attributes become the label {:?}; refusing a series with a label twice",
            first.0
        ));
    }
    Ok(labels)
}

fn label_name(key: &str) -> String {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    if name == "le" || name == "quantile" || name.starts_with("__") {
        name.insert_str(0, "attr_");
    }
    name
}

/// Keeps leyline's metrics in a Prometheus registry. Clones share the
/// registry, so a clone kept aside can render what the hub's copy recorded.
#[derive(Clone)]
pub struct PrometheusSink {
    metrics: Arc<MetricSet>,
}

impl Default for PrometheusSink {
    fn default() -> Self {
        PrometheusSink::new()
    }
}

impl PrometheusSink {
    /// A registry with every leyline metric registered.
    pub fn new() -> PrometheusSink {
        PrometheusSink {
            metrics: Arc::new(MetricSet::new()),
        }
    }

    /// The sink plus an endpoint bound to `addr`, started by the hub.
    pub(crate) fn with_endpoint(addr: SocketAddr) -> Result<(PrometheusSink, MetricsEndpoint)> {
        let listener =
            std::net::TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| Error::Bind { addr, source })?;
        let sink = PrometheusSink::new();
        let endpoint = MetricsEndpoint {
            listener,
            addr,
            metrics: Arc::clone(&sink.metrics),
        };
        Ok((sink, endpoint))
    }

    /// The current exposition text (OpenMetrics), without the hub counters
    /// (empty if the encoder failed, which it does not for these types).
    pub fn exposition(&self) -> String {
        self.metrics.exposition().unwrap_or_default()
    }
}

impl Sink for PrometheusSink {
    fn name(&self) -> &str {
        PROMETHEUS_SINK_NAME
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        self.metrics
            .record(packet)
            .map_err(|reason| Error::sink(PROMETHEUS_SINK_NAME, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_end_in_total_exactly_once() {
        for spec in leyline::telemetry::METRICS {
            let name = exposed_name(spec);
            assert!(!name.contains('.'), "{name}");
            if spec.kind == MetricKind::Counter {
                assert!(name.ends_with("_total"), "{name}");
                assert!(!name.ends_with("_total_total"), "{name}");
            }
        }
        let fallback = leyline::telemetry::metric_spec("tolaria.graph.fallback_total");
        assert_eq!(
            fallback.map(exposed_name).as_deref(),
            Some("tolaria_graph_fallback_total")
        );
        let conflicts = leyline::telemetry::metric_spec("tolaria.grad_agg.conflicts");
        assert_eq!(
            conflicts.map(exposed_name).as_deref(),
            Some("tolaria_grad_agg_conflicts_total")
        );
    }

    #[test]
    fn label_names_are_made_valid() {
        assert_eq!(label_name("slot"), "slot");
        assert_eq!(label_name("seed.id"), "seed_id");
        assert_eq!(label_name("0x"), "_0x");
        assert_eq!(label_name("le"), "attr_le");
        assert_eq!(label_name("__name__"), "attr___name__");
        assert_eq!(label_name(""), "_");
    }

    #[test]
    fn colliding_label_names_are_refused() {
        let attributes = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        assert!(label_set(&attributes(&[("a.b", "1"), ("a_b", "2")])).is_err());
        assert!(label_set(&attributes(&[("le", "1"), ("attr_le", "2")])).is_err());
        assert_eq!(
            label_set(&attributes(&[("b", "1"), ("a", "2")])),
            Ok(vec![
                ("a".to_owned(), "2".to_owned()),
                ("b".to_owned(), "1".to_owned())
            ])
        );
    }
}
