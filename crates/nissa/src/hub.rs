//! [`Hub`]: the handle every subsystem emits telemetry through.
//!
//! `emit` is a bounded, lock-free queue push that never blocks and never
//! fails; the hub owns a small tokio runtime (one worker thread plus a blocking
//! pool for the sinks), so it works from any thread, inside or outside tokio.
//! The hub implements [`leyline::Emitter`], the workspace's one emitting trait;
//! producers hold the [`leyline::Telemetry`] handle that [`Hub::telemetry`]
//! returns.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leyline::proto::TelemetryPacket;

use crate::jsonl::{Created, JSONL_SINK_NAME, JsonlConfig, JsonlSink};
use crate::prometheus::{PROMETHEUS_SINK_NAME, PrometheusSink};
use crate::sink::Sink;
use crate::stats::{FlushOutcome, HubStats};
use crate::tracing_bridge::{TRACING_SINK_NAME, TracingSink};
use crate::validate::{check_sink_name, deadline};
use crate::worker::{Shared, SinkState, WorkerTiming, run_sink, run_worker};
use crate::{Error, Result};

/// Port of the metrics endpoint unless configured otherwise (the port
/// OpenTelemetry's Prometheus exporters use).
pub const DEFAULT_METRICS_PORT: u16 = 9464;

/// Largest capacity of the main queue and of any sink's queue. Queues are
/// allocated up front (the main one holds whole packets, about 100 bytes a
/// slot), so the bound keeps a hub under about 100 MiB per queue.
pub const MAX_QUEUE_CAPACITY: usize = 1 << 20;

/// Largest `batch_max` (packets a sink writes between flushes).
pub const MAX_BATCH: usize = 1 << 16;

/// Most sinks one hub runs (each has a task and may hold a blocking thread).
pub const MAX_SINKS: usize = 64;

/// Longest `tick_max` (idle sleep of the worker, the worst-case delivery
/// delay of a trickle of packets).
pub const MAX_TICK: Duration = Duration::from_secs(3600);

/// Longest sink name, in bytes.
pub const MAX_SINK_NAME_BYTES: usize = 64;

/// Tuning of a hub. The defaults suit a training run; tests and benchmarks
/// shrink the queues to exercise dropping. [`HubBuilder::build`] checks every
/// field and returns [`Error::Config`] naming the one out of range.
#[derive(Debug, Clone, PartialEq)]
pub struct HubConfig {
    /// Capacity of the main queue between emitters and the worker
    /// (`1..=`[`MAX_QUEUE_CAPACITY`]).
    pub queue_capacity: usize,
    /// Capacity of each sink's own queue unless set per sink
    /// (`1..=`[`MAX_QUEUE_CAPACITY`]).
    pub sink_queue_capacity: usize,
    /// Most packets a sink writes before it flushes (`1..=`[`MAX_BATCH`]).
    pub batch_max: usize,
    /// Queue length at which an emitter wakes the worker before its next tick
    /// (`None`: a quarter of `queue_capacity`; otherwise
    /// `1..=queue_capacity`).
    pub wake_threshold: Option<usize>,
    /// Sleep of the worker after a round that moved packets (more than zero,
    /// at most `tick_max`).
    pub tick_min: Duration,
    /// Longest sleep of an idle worker (the worst-case delivery delay of a
    /// trickle of packets that never reaches the wake threshold; at most
    /// [`MAX_TICK`]).
    pub tick_max: Duration,
    /// How long [`Hub::close`] (and dropping the last handle) waits for the
    /// sinks to finish. Any value: one beyond what [`Instant`] can represent
    /// (such as `Duration::MAX`) waits without a deadline.
    pub close_timeout: Duration,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            queue_capacity: 8192,
            sink_queue_capacity: 4096,
            batch_max: 256,
            wake_threshold: None,
            tick_min: Duration::from_millis(1),
            tick_max: Duration::from_millis(50),
            close_timeout: Duration::from_secs(2),
        }
    }
}

impl HubConfig {
    /// Checks every setting against its range; the error names the field.
    fn validate(&self) -> Result<()> {
        let sized = [
            ("queue_capacity", self.queue_capacity, MAX_QUEUE_CAPACITY),
            (
                "sink_queue_capacity",
                self.sink_queue_capacity,
                MAX_QUEUE_CAPACITY,
            ),
            ("batch_max", self.batch_max, MAX_BATCH),
        ];
        for (field, value, max) in sized {
            check_size(field, value, max)?;
        }
        if let Some(threshold) = self.wake_threshold {
            check_size("wake_threshold", threshold, self.queue_capacity)?;
        }
        if self.tick_max > MAX_TICK {
            return Err(Error::Config {
                field: "tick_max",
                reason: format!("{:?} is longer than {MAX_TICK:?}", self.tick_max),
            });
        }
        if self.tick_min.is_zero() || self.tick_max < self.tick_min {
            return Err(Error::Config {
                field: "tick_min/tick_max",
                reason: format!(
                    "need 0 < tick_min <= tick_max, got {:?} and {:?}",
                    self.tick_min, self.tick_max
                ),
            });
        }
        Ok(())
    }
}

/// `value` must lie in `1..=max`.
fn check_size(field: &'static str, value: usize, max: usize) -> Result<()> {
    if (1..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::Config {
            field,
            reason: format!("{value} is outside 1..={max}"),
        })
    }
}

/// A sink waiting to be started, with an optional queue capacity of its own.
enum PlannedSink {
    Ready(Box<dyn Sink>, Option<usize>),
    Jsonl(JsonlConfig),
    Tracing,
}

/// Builds a [`Hub`]: configuration, sinks and the optional metrics endpoint.
pub struct HubBuilder {
    config: HubConfig,
    sinks: Vec<PlannedSink>,
    metrics_addr: Option<SocketAddr>,
}

impl HubBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: HubConfig) -> Self {
        self.config = config;
        self
    }

    /// Capacity of the main queue.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.config.queue_capacity = capacity;
        self
    }

    /// Default capacity of the sinks' queues.
    pub fn sink_queue_capacity(mut self, capacity: usize) -> Self {
        self.config.sink_queue_capacity = capacity;
        self
    }

    /// Adds a sink with the default queue capacity.
    pub fn sink(mut self, sink: impl Sink) -> Self {
        self.sinks.push(PlannedSink::Ready(Box::new(sink), None));
        self
    }

    /// Adds a sink with a queue capacity of its own.
    pub fn sink_with_queue(mut self, sink: impl Sink, capacity: usize) -> Self {
        self.sinks
            .push(PlannedSink::Ready(Box::new(sink), Some(capacity)));
        self
    }

    /// Adds a JSONL sink writing into `config.dir` (created, with the first
    /// file, when the hub is built, after the metrics endpoint is bound; see
    /// [`HubBuilder::build`]).
    pub fn jsonl(mut self, config: JsonlConfig) -> Self {
        self.sinks.push(PlannedSink::Jsonl(config));
        self
    }

    /// Adds the tracing bridge: every event is logged at its level.
    pub fn tracing(mut self) -> Self {
        self.sinks.push(PlannedSink::Tracing);
        self
    }

    /// Serves Prometheus metrics on `http://ADDR/metrics` (port 0 picks a
    /// free port; read it back with [`Hub::metrics_addr`]).
    pub fn prometheus(mut self, addr: SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Serves Prometheus metrics on 127.0.0.1 at `port`.
    pub fn prometheus_on_port(self, port: u16) -> Self {
        self.prometheus(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Checks the configuration and the sinks (at most [`MAX_SINKS`], names
    /// 1 to [`MAX_SINK_NAME_BYTES`] bytes without control characters and all
    /// different), then, if asked for, binds the metrics endpoint, starts the
    /// runtime and only then opens the sinks (creating the JSONL files).
    ///
    /// All or nothing: nothing is opened or bound when a check fails; a
    /// failed bind ([`Error::Bind`], say the port is taken) or runtime start
    /// comes before any file or directory is created; and if opening a sink
    /// fails, the files and directories this build created are removed again
    /// (never ones that existed before) before the error returns. Sinks
    /// passed in already opened ([`HubBuilder::sink`]) are dropped, their
    /// files left alone.
    pub fn build(self) -> Result<Hub> {
        let config = self.config;
        config.validate()?;
        let planned_sinks = self
            .sinks
            .len()
            .saturating_add(usize::from(self.metrics_addr.is_some()));
        if planned_sinks > MAX_SINKS {
            return Err(Error::Config {
                field: "sinks",
                reason: format!("{planned_sinks} sinks, more than {MAX_SINKS}"),
            });
        }
        // Checked before any sink opens a file or the endpoint binds; read
        // once, in the order the sinks are started below.
        let names: Vec<String> = self
            .sinks
            .iter()
            .map(|planned| match planned {
                PlannedSink::Ready(sink, _) => sink.name(),
                PlannedSink::Jsonl(_) => JSONL_SINK_NAME,
                PlannedSink::Tracing => TRACING_SINK_NAME,
            })
            .chain(self.metrics_addr.map(|_| PROMETHEUS_SINK_NAME))
            .map(str::to_owned)
            .collect();
        check_sink_names(names.iter().map(String::as_str))?;
        for planned in &self.sinks {
            if let PlannedSink::Ready(sink, Some(capacity)) = planned {
                check_size("sink queue capacity", *capacity, MAX_QUEUE_CAPACITY).map_err(
                    |error| match error {
                        Error::Config { field, reason } => Error::Config {
                            field,
                            reason: format!("sink {:?}: {reason}", sink.name()),
                        },
                        other => other,
                    },
                )?;
            }
        }
        // Everything that can fail without leaving anything behind comes
        // first: binding the metrics endpoint (a taken port is the usual
        // failure), starting the runtime, registering the listener with it.
        let endpoint = match self.metrics_addr {
            Some(addr) => Some(PrometheusSink::with_endpoint(addr)?),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(planned_sinks.saturating_add(1))
            .thread_name("nissa")
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let endpoint = match endpoint.map(|(sink, endpoint)| (sink, endpoint.attach(&runtime))) {
            Some((sink, Ok(attached))) => Some((sink, attached)),
            Some((_, Err(error))) => {
                // `shutdown_background` rather than a drop: building may
                // happen inside an async context, where dropping panics.
                runtime.shutdown_background();
                return Err(error);
            }
            None => None,
        };
        // Only now are files created. Opening the sinks is the last step that
        // can fail, and it removes whatever it created if it does.
        let mut sinks = match open_sinks(self.sinks, config.sink_queue_capacity) {
            Ok(sinks) => sinks,
            Err(error) => {
                drop(endpoint);
                runtime.shutdown_background();
                return Err(error);
            }
        };
        let endpoint = endpoint.map(|(sink, attached)| {
            sinks.push((Box::new(sink) as Box<dyn Sink>, config.sink_queue_capacity));
            attached
        });

        // Nothing below can fail.
        let states: Vec<Arc<SinkState>> = sinks
            .iter()
            .zip(names)
            .map(|((_, capacity), name)| Arc::new(SinkState::new(name, *capacity)))
            .collect();
        let wake_threshold = config
            .wake_threshold
            .unwrap_or((config.queue_capacity / 4).max(1))
            .min(config.queue_capacity);
        let shared = Arc::new(Shared::new(
            config.queue_capacity,
            wake_threshold,
            states.clone(),
        ));
        let timing = WorkerTiming {
            tick_min: config.tick_min,
            tick_max: config.tick_max,
        };
        runtime.spawn(run_worker(Arc::clone(&shared), timing));
        for ((sink, _), state) in sinks.into_iter().zip(states) {
            runtime.spawn(run_sink(state, sink, config.batch_max));
        }
        let metrics_addr = endpoint.map(|attached| attached.start(&runtime, Arc::clone(&shared)));
        Ok(Hub {
            inner: Some(Arc::new(HubInner {
                shared,
                runtime: Mutex::new(Some(runtime)),
                close_timeout: config.close_timeout,
                metrics_addr,
            })),
        })
    }
}

/// Opens the planned sinks in order, each with its queue capacity. All or
/// nothing: if one fails, the sinks opened so far are dropped and the files
/// and directories they created are removed (never anything that existed
/// before) before the error returns.
fn open_sinks(
    planned: Vec<PlannedSink>,
    default_capacity: usize,
) -> Result<Vec<(Box<dyn Sink>, usize)>> {
    let mut sinks: Vec<(Box<dyn Sink>, usize)> = Vec::with_capacity(planned.len());
    let mut created: Vec<Created> = Vec::new();
    for planned in planned {
        let opened: Result<(Box<dyn Sink>, Option<usize>)> = match planned {
            PlannedSink::Ready(sink, capacity) => Ok((sink, capacity)),
            PlannedSink::Jsonl(jsonl) => JsonlSink::create_recorded(jsonl).map(|(sink, made)| {
                created.push(made);
                (Box::new(sink) as Box<dyn Sink>, None)
            }),
            PlannedSink::Tracing => Ok((Box::new(TracingSink::new()), None)),
        };
        match opened {
            Ok((sink, capacity)) => sinks.push((sink, capacity.unwrap_or(default_capacity))),
            Err(error) => {
                // Close the files before removing them, newest first.
                drop(sinks);
                for made in created.into_iter().rev() {
                    made.undo();
                }
                return Err(error);
            }
        }
    }
    Ok(sinks)
}

/// Every name valid (see [`crate::validate`]) and no name twice: the name
/// keys the statistics and the `sink` label of the hub's counters.
fn check_sink_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        check_sink_name(name)?;
        if !seen.insert(name) {
            return Err(Error::Config {
                field: "sink name",
                reason: format!("two sinks are called {name:?}"),
            });
        }
    }
    Ok(())
}

/// The running hub behind every [`Hub`] clone.
struct HubInner {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    close_timeout: Duration,
    metrics_addr: Option<SocketAddr>,
}

/// Cheap, cloneable handle to a telemetry hub.
///
/// ```
/// use leyline::TelemetryLevel;
/// use leyline::proto::{TelemetryMetric, TelemetryPacket};
/// use std::time::Duration;
///
/// let memory = nissa::MemorySink::new();
/// let hub = nissa::Hub::builder().sink(memory.clone()).build()?;
/// hub.emit(
///     TelemetryPacket::new("tolaria", TelemetryLevel::Info).with_metric(TelemetryMetric::new(
///         leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS,
///         12.5,
///         "ms",
///     )),
/// );
/// assert!(hub.flush(Duration::from_secs(5)).is_complete());
/// assert_eq!(memory.len(), 1);
/// hub.close();
/// # Ok::<(), nissa::Error>(())
/// ```
#[derive(Clone)]
pub struct Hub {
    inner: Option<Arc<HubInner>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => formatter.write_str("Hub(disabled)"),
            Some(inner) => formatter
                .debug_struct("Hub")
                .field("sinks", &inner.shared.sinks.len())
                .field("metrics_addr", &inner.metrics_addr)
                .field("closed", &inner.shared.closed.load(Ordering::Relaxed))
                .finish(),
        }
    }
}

impl Hub {
    /// Starts building a hub with the default configuration and no sinks.
    pub fn builder() -> HubBuilder {
        HubBuilder {
            config: HubConfig::default(),
            sinks: Vec::new(),
            metrics_addr: None,
        }
    }

    /// A hub with `config` and no sinks (packets are counted, then discarded).
    pub fn new(config: HubConfig) -> Result<Hub> {
        Hub::builder().config(config).build()
    }

    /// A no-op hub for callers that run without telemetry: `emit` discards the
    /// packet, `stats` stays empty, no thread is started.
    pub fn disabled() -> Hub {
        Hub { inner: None }
    }

    /// Whether this hub is the no-op one.
    pub fn is_disabled(&self) -> bool {
        self.inner.is_none()
    }

    /// Queues `packet` for every sink. Never blocks, never fails: when the main
    /// queue is full the packet is dropped and counted, after [`Hub::close`] it
    /// is counted in `after_close`.
    #[inline]
    pub fn emit(&self, packet: TelemetryPacket) {
        if let Some(inner) = &self.inner {
            inner.shared.emit(packet);
        }
    }

    /// Waits until every packet emitted before this call was delivered, dropped
    /// or failed in every sink and every sink was flushed, or until `timeout`
    /// (one beyond what [`Instant`] can represent, such as `Duration::MAX`,
    /// means no deadline). Blocks the calling thread; call it at checkpoints,
    /// not on a hot path.
    pub fn flush(&self, timeout: Duration) -> FlushOutcome {
        let Some(inner) = &self.inner else {
            return FlushOutcome {
                complete: true,
                pending: 0,
            };
        };
        let shared = &inner.shared;
        if shared.stopped.load(Ordering::Acquire) {
            let pending = shared.stats().pending();
            return FlushOutcome {
                complete: pending == 0,
                pending,
            };
        }
        flush_shared(shared, timeout)
    }

    /// Flushes (up to the configured close timeout), stops the worker and the
    /// sinks and releases the runtime. Idempotent; later emits are counted in
    /// `after_close`. Packets still queued when the timeout expires are counted
    /// as dropped.
    pub fn close(&self) {
        if let Some(inner) = &self.inner {
            inner.close();
        }
    }

    /// A snapshot of the delivery counters.
    pub fn stats(&self) -> HubStats {
        match &self.inner {
            Some(inner) => inner.shared.stats(),
            None => HubStats::default(),
        }
    }

    /// Address of the `/metrics` endpoint, when one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.inner.as_ref().and_then(|inner| inner.metrics_addr)
    }

    /// A [`leyline::Telemetry`] handle emitting into this hub (through a
    /// clone of it), the handle producers such as kasmina and tolaria take;
    /// the disabled handle for [`Hub::disabled`], so that producers skip
    /// building packets nobody reads.
    pub fn telemetry(&self) -> leyline::Telemetry {
        if self.is_disabled() {
            leyline::Telemetry::disabled()
        } else {
            leyline::Telemetry::new(self.clone())
        }
    }
}

/// The hub is the production [`leyline::Emitter`]: [`Hub::emit`] never blocks
/// and never fails, which is the trait's contract.
impl leyline::Emitter for Hub {
    #[inline]
    fn emit(&self, packet: TelemetryPacket) {
        Hub::emit(self, packet);
    }
}

impl HubInner {
    fn close(&self) {
        // Holding the lock for the whole close makes concurrent callers wait
        // for the first one instead of returning before the sinks are done.
        let mut runtime = match self.runtime.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(running) = runtime.take() else {
            return;
        };
        self.shared.closed.store(true, Ordering::SeqCst);
        let outcome = flush_shared(&self.shared, self.close_timeout);
        if !outcome.complete {
            tracing::warn!(
                target: "nissa",
                pending = outcome.pending,
                "telemetry hub closed before every sink caught up; the rest is counted as dropped"
            );
        }
        // Dropping a runtime inside an async context panics, and close may be
        // called from one: shut it down from a plain thread.
        let stopper = std::thread::Builder::new()
            .name("nissa-close".to_owned())
            .spawn(move || running.shutdown_timeout(Duration::from_millis(200)));
        if let Ok(handle) = stopper {
            let _ = handle.join();
        }
        self.shared.stopped.store(true, Ordering::Release);
        self.shared.sweep_leftovers();
    }
}

impl Drop for HubInner {
    fn drop(&mut self) {
        self.close();
    }
}

/// The flush protocol on the shared state (used by `close`, which already
/// holds the runtime).
fn flush_shared(shared: &Shared, timeout: Duration) -> FlushOutcome {
    // A timeout beyond what `Instant` can hold means no deadline.
    let deadline = deadline(timeout);
    let ticket = shared
        .flush_requested
        .fetch_add(1, Ordering::AcqRel)
        .saturating_add(1);
    shared.wake.notify_one();
    let mut complete = wait_until(deadline, || {
        shared.flush_fanned.load(Ordering::Acquire) >= ticket
    });
    if complete {
        for sink in &shared.sinks {
            let target = sink.flush_target.load(Ordering::Acquire);
            complete &= wait_until(deadline, || {
                sink.flushed_through.load(Ordering::Acquire) >= target
            });
        }
    }
    FlushOutcome {
        complete,
        pending: shared.stats().pending(),
    }
}

/// Polls `done` with a growing sleep (50 us to 2 ms) until it holds or the
/// deadline (if any) passes.
fn wait_until(deadline: Option<Instant>, mut done: impl FnMut() -> bool) -> bool {
    let mut pause = Duration::from_micros(50);
    loop {
        if done() {
            return true;
        }
        let sleep = match deadline {
            None => pause,
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => pause.min(left),
                _ => return false,
            },
        };
        std::thread::sleep(sleep);
        pause = pause.saturating_mul(2).min(Duration::from_millis(2));
    }
}
