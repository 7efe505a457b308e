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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use leyline::proto::TelemetryPacket;
use leyline::telemetry::{MetricKind, MetricSpec};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::sink::Sink;
use crate::stats::HubStats;
use crate::worker::Shared;
use crate::{NissaError, Result};

/// Content type of the exposition (OpenMetrics text, which Prometheus scrapes
/// natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Most label sets one metric may grow to; further ones are refused (the
/// packet counts as failed) so that a runaway attribute cannot exhaust memory.
pub const MAX_SERIES_PER_METRIC: usize = 1000;

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

/// The registry and its families, shared by the sink and the endpoint.
struct MetricSet {
    registry: Registry,
    by_name: HashMap<&'static str, Entry>,
    /// Label sets seen per metric, for the cardinality cap.
    series: Mutex<HashMap<&'static str, HashSet<Labels>>>,
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
            series: Mutex::new(HashMap::new()),
            hub: HubCounters {
                dropped: hub_dropped.unwrap_or_default(),
                after_close: hub_after_close.unwrap_or_default(),
                sink_dropped: hub_sink_dropped.unwrap_or_default(),
                sink_failed: hub_sink_failed.unwrap_or_default(),
                refresh: Mutex::new(()),
            },
        }
    }

    fn record(&self, packet: &TelemetryPacket) -> std::result::Result<(), String> {
        let mut problem = None;
        for metric in &packet.metrics {
            let Some((name, entry)) = self.by_name.get_key_value(metric.name.as_str()) else {
                continue;
            };
            if !metric.value.is_finite() {
                problem.get_or_insert_with(|| format!("{} is not finite", metric.name));
                continue;
            }
            let labels = label_set(&metric.attributes);
            let outcome = match entry {
                Entry::Counter(family) => {
                    if metric.value < 0.0 {
                        Err(format!(
                            "counter {} got a negative increment {}",
                            metric.name, metric.value
                        ))
                    } else {
                        self.admit(name, &labels).map(|()| {
                            family.get_or_create(&labels).inc_by(metric.value);
                        })
                    }
                }
                Entry::Gauge(family) => self.admit(name, &labels).map(|()| {
                    family.get_or_create(&labels).set(metric.value);
                }),
                Entry::Histogram(family) => self
                    .admit(name, &labels)
                    .map(|()| family.get_or_create(&labels).observe(metric.value)),
            };
            if let Err(reason) = outcome {
                problem.get_or_insert(reason);
            }
        }
        match problem {
            None => Ok(()),
            Some(reason) => Err(reason),
        }
    }

    /// Admits `labels` as a series of `name` unless the metric already has
    /// [`MAX_SERIES_PER_METRIC`] others.
    fn admit(&self, name: &'static str, labels: &Labels) -> std::result::Result<(), String> {
        let mut series = match self.series.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let known = series.entry(name).or_default();
        if known.contains(labels) {
            return Ok(());
        }
        if known.len() >= MAX_SERIES_PER_METRIC {
            return Err(format!(
                "{name} already has {MAX_SERIES_PER_METRIC} label sets; refusing another"
            ));
        }
        known.insert(labels.clone());
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

    fn exposition(&self) -> String {
        let mut text = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

fn raise(counter: &Counter<u64, AtomicU64>, target: u64) {
    let current = counter.get();
    if target > current {
        counter.inc_by(target - current);
    }
}

/// Attributes as a label set: sorted, names made valid, reserved names
/// (`le`, `quantile`, `__*`) prefixed with `attr_`.
fn label_set(attributes: &BTreeMap<String, String>) -> Labels {
    let mut labels: Labels = attributes
        .iter()
        .map(|(key, value)| (label_name(key), value.clone()))
        .collect();
    labels.sort();
    labels
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
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|source| NissaError::Bind { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| NissaError::Bind { addr, source })?;
        let sink = PrometheusSink::new();
        let endpoint = MetricsEndpoint {
            listener,
            addr,
            metrics: Arc::clone(&sink.metrics),
        };
        Ok((sink, endpoint))
    }

    /// The current exposition text (OpenMetrics), without the hub counters.
    pub fn exposition(&self) -> String {
        self.metrics.exposition()
    }
}

impl Sink for PrometheusSink {
    fn name(&self) -> &str {
        "prometheus"
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        self.metrics
            .record(packet)
            .map_err(|reason| NissaError::sink("prometheus", reason))
    }
}

/// A bound listener waiting for the hub's runtime.
pub(crate) struct MetricsEndpoint {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    metrics: Arc<MetricSet>,
}

impl MetricsEndpoint {
    /// Starts serving on `runtime`; returns the bound address (the real port
    /// when port 0 was asked for).
    pub(crate) fn start(
        self,
        runtime: &tokio::runtime::Runtime,
        shared: Arc<Shared>,
    ) -> Result<SocketAddr> {
        let addr = self.addr;
        let bound = self
            .listener
            .local_addr()
            .map_err(|source| NissaError::Bind { addr, source })?;
        let _context = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .map_err(|source| NissaError::Bind { addr, source })?;
        runtime.spawn(serve(listener, self.metrics, shared));
        Ok(bound)
    }
}

async fn serve(listener: tokio::net::TcpListener, metrics: Arc<MetricSet>, shared: Arc<Shared>) {
    let mut accept_failure_reported = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                if !accept_failure_reported {
                    tracing::warn!(target: "nissa", %error, "metrics endpoint: accept failed");
                    accept_failure_reported = true;
                }
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let response = respond(&request, &metrics, &shared);
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            // A client hanging up mid-request is its own business.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

fn respond<B>(
    request: &Request<B>,
    metrics: &MetricSet,
    shared: &Shared,
) -> Response<http_body_util::Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            metrics.refresh_hub_counters(&shared.stats());
            (StatusCode::OK, CONTENT_TYPE, metrics.exposition())
        }
        (&Method::GET, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "Esper telemetry (nissa): metrics at /metrics\n".to_owned(),
        ),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found; metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET is supported\n".to_owned(),
        ),
    };
    let mut response = Response::new(http_body_util::Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
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
}
