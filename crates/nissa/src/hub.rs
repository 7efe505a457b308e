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

use crate::stats::{FlushOutcome, HubStats};
use crate::validate::deadline;
use crate::worker::Shared;
use crate::{Error, Result};

mod builder;

pub use builder::HubBuilder;

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
