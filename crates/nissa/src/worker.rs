//! The hub's shared state and its background tasks.
//!
//! Data flow: producers push packets into the main [`ArrayQueue`]; one worker
//! task on the hub's tokio runtime pops them, wraps each in an [`Arc`] and
//! pushes a clone into every sink's own bounded queue (dropping, and counting,
//! where a sink's queue is full); one task per sink pops batches and runs the
//! sink on the runtime's blocking pool. Nothing on this path ever waits for a
//! sink, so a slow or broken sink only loses its own packets.
//!
//! Counting is arranged so that the producer's successful push touches no
//! shared counter: the worker counts what it pops, and
//! `emitted = popped + queued + queue_dropped`.

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use leyline::proto::TelemetryPacket;
use tokio::sync::Notify;

use crate::sink::Sink;
use crate::stats::{HubStats, SinkStats};

/// Keeps a hot atomic on its own cache line so that the worker's writes do not
/// slow down the producers' reads of neighbouring fields.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// Per-sink queue and counters.
pub(crate) struct SinkState {
    pub(crate) name: String,
    pub(crate) queue: ArrayQueue<Arc<TelemetryPacket>>,
    /// Packets the worker pushed into `queue` (worker only).
    pub(crate) pushed: Padded<AtomicU64>,
    /// Packets the worker could not push because `queue` was full.
    pub(crate) dropped: AtomicU64,
    /// Packets written and flushed.
    pub(crate) delivered: Padded<AtomicU64>,
    /// Packets whose write or flush failed.
    pub(crate) failed: AtomicU64,
    /// `pushed` value that the next flush must reach.
    pub(crate) flush_target: AtomicU64,
    /// Highest flush target that was written and flushed.
    pub(crate) flushed_through: AtomicU64,
    /// Wakes the sink task.
    pub(crate) wake: Notify,
    /// The first failure was reported through tracing.
    pub(crate) failure_reported: AtomicBool,
    /// The sink panicked or was lost: further packets count as failed.
    pub(crate) broken: AtomicBool,
}

impl SinkState {
    pub(crate) fn new(name: String, capacity: usize) -> SinkState {
        SinkState {
            name,
            queue: ArrayQueue::new(capacity),
            pushed: Padded::default(),
            dropped: AtomicU64::new(0),
            delivered: Padded::default(),
            failed: AtomicU64::new(0),
            flush_target: AtomicU64::new(0),
            flushed_through: AtomicU64::new(0),
            wake: Notify::new(),
            failure_reported: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }

    /// Reports the first failure of this sink; later ones are only counted.
    fn report_failure(&self, reason: &str) {
        if !self.failure_reported.swap(true, Ordering::AcqRel) {
            tracing::error!(
                target: "nissa",
                sink = %self.name,
                error = %reason,
                "telemetry sink failed; further failures of this sink are only counted \
                 (nissa_sink_failed_total)"
            );
        }
    }
}

/// Everything the producers, the worker and the sink tasks share.
pub(crate) struct Shared {
    pub(crate) queue: ArrayQueue<TelemetryPacket>,
    /// Set by close; read by every emit.
    pub(crate) closed: AtomicBool,
    /// A wake-up of the worker is already on its way.
    pub(crate) wake_pending: AtomicBool,
    /// Queue length at which a producer wakes the worker early.
    pub(crate) wake_threshold: usize,
    pub(crate) wake: Notify,
    /// Packets dropped because the main queue was full.
    pub(crate) queue_dropped: Padded<AtomicU64>,
    /// Emits after close.
    pub(crate) after_close: AtomicU64,
    /// Packets popped from the main queue by the worker.
    pub(crate) popped: Padded<AtomicU64>,
    /// Flush tickets handed out to callers of flush.
    pub(crate) flush_requested: AtomicU64,
    /// Highest ticket whose packets the worker has passed to the sinks.
    pub(crate) flush_fanned: AtomicU64,
    /// The runtime is gone; leftovers in queues are swept into the counters.
    pub(crate) stopped: AtomicBool,
    pub(crate) sinks: Vec<Arc<SinkState>>,
}

impl Shared {
    pub(crate) fn new(
        capacity: usize,
        wake_threshold: usize,
        sinks: Vec<Arc<SinkState>>,
    ) -> Shared {
        Shared {
            queue: ArrayQueue::new(capacity),
            closed: AtomicBool::new(false),
            wake_pending: AtomicBool::new(false),
            wake_threshold,
            wake: Notify::new(),
            queue_dropped: Padded::default(),
            after_close: AtomicU64::new(0),
            popped: Padded::default(),
            flush_requested: AtomicU64::new(0),
            flush_fanned: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            sinks,
        }
    }

    /// The hot path: one bounded push, no lock, no allocation.
    #[inline]
    pub(crate) fn emit(&self, packet: TelemetryPacket) {
        if self.closed.load(Ordering::Acquire) {
            self.count_after_close();
            return;
        }
        match self.queue.push(packet) {
            Ok(()) => {
                if self.queue.len() >= self.wake_threshold {
                    self.wake_worker();
                }
            }
            Err(rejected) => {
                self.queue_dropped.0.fetch_add(1, Ordering::Relaxed);
                self.wake_worker();
                drop(rejected);
            }
        }
    }

    #[cold]
    fn count_after_close(&self) {
        if self.after_close.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                target: "nissa",
                "telemetry emitted after the hub closed; such packets are counted \
                 (nissa_after_close_total) and not delivered"
            );
        }
    }

    /// Wakes the worker unless a wake-up is already pending.
    #[inline]
    pub(crate) fn wake_worker(&self) {
        if !self.wake_pending.load(Ordering::Relaxed)
            && !self.wake_pending.swap(true, Ordering::AcqRel)
        {
            self.wake.notify_one();
        }
    }

    /// Moves packets left in the queues of a stopped hub into the counters.
    pub(crate) fn sweep_leftovers(&self) {
        if !self.stopped.load(Ordering::Acquire) {
            return;
        }
        let caught = std::iter::from_fn(|| self.queue.pop()).count() as u64;
        self.after_close.fetch_add(caught, Ordering::Relaxed);
        for sink in &self.sinks {
            let left = std::iter::from_fn(|| sink.queue.pop()).count() as u64;
            sink.pushed.0.fetch_sub(left, Ordering::Relaxed);
            sink.dropped.fetch_add(left, Ordering::Relaxed);
        }
    }

    pub(crate) fn stats(&self) -> HubStats {
        self.sweep_leftovers();
        let queue_dropped = self.queue_dropped.0.load(Ordering::Acquire);
        let popped = self.popped.0.load(Ordering::Acquire);
        let queued = self.queue.len() as u64;
        // Counts of packets: they cannot reach 2^64 in practice; saturating
        // keeps a wrap from ever showing.
        let emitted = popped.saturating_add(queued).saturating_add(queue_dropped);
        let sinks = self
            .sinks
            .iter()
            .map(|sink| {
                let delivered = sink.delivered.0.load(Ordering::Acquire);
                let failed = sink.failed.load(Ordering::Acquire);
                let sink_queue_dropped = sink.dropped.load(Ordering::Acquire);
                let pushed = sink.pushed.0.load(Ordering::Acquire);
                // Packets the worker popped but has not yet offered to this
                // sink are in flight too.
                let not_yet_offered =
                    popped.saturating_sub(pushed.saturating_add(sink_queue_dropped));
                SinkStats {
                    name: sink.name.clone(),
                    emitted,
                    delivered,
                    dropped: queue_dropped.saturating_add(sink_queue_dropped),
                    sink_queue_dropped,
                    failed,
                    pending: queued
                        .saturating_add(not_yet_offered)
                        .saturating_add(pushed.saturating_sub(delivered.saturating_add(failed))),
                }
            })
            .collect();
        HubStats {
            emitted,
            queue_dropped,
            after_close: self.after_close.load(Ordering::Acquire),
            queued,
            closed: self.closed.load(Ordering::Acquire),
            sinks,
        }
    }
}

/// Timing of the worker's idle wake-ups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerTiming {
    /// Sleep after a round that moved packets.
    pub(crate) tick_min: Duration,
    /// Longest sleep of an idle worker.
    pub(crate) tick_max: Duration,
}

/// Most packets the worker moves before it lets the sink and HTTP tasks (which
/// share its runtime thread) run.
const ROUND_LIMIT: usize = 512;

/// The main worker: drains the main queue into the sink queues.
pub(crate) async fn run_worker(shared: Arc<Shared>, timing: WorkerTiming) {
    let mut flushes_handled = 0;
    // A flush ticket being served, and how many more pops guarantee that
    // every packet queued when it was read has been passed on.
    let mut flush_in_progress: Option<(u64, usize)> = None;
    let mut tick = timing.tick_min;
    let mut drops = DropReporter::default();
    loop {
        shared.wake_pending.store(false, Ordering::Release);
        // Read the flush ticket before draining: the caller's packets were
        // pushed before it took its ticket, so they are in the queue now.
        let flush_requested = shared.flush_requested.load(Ordering::Acquire);
        if flush_requested > flushes_handled
            && flush_in_progress.is_none_or(|(ticket, _)| ticket < flush_requested)
        {
            flush_in_progress = Some((flush_requested, shared.queue.capacity()));
        }
        let round = drain_round(&shared, ROUND_LIMIT);
        if let Some((ticket, left)) = flush_in_progress {
            // The queue is FIFO and held at most `capacity` packets when the
            // ticket was read: once it ran empty, or `capacity` packets were
            // popped since, all of the caller's packets have been passed on.
            let left = left.saturating_sub(round.moved);
            if round.emptied || left == 0 {
                for sink in &shared.sinks {
                    sink.flush_target
                        .fetch_max(sink.pushed.0.load(Ordering::Acquire), Ordering::AcqRel);
                    sink.wake.notify_one();
                }
                shared.flush_fanned.fetch_max(ticket, Ordering::AcqRel);
                flushes_handled = ticket;
                flush_in_progress = None;
            } else {
                flush_in_progress = Some((ticket, left));
            }
        }
        drops.report(&shared);
        if !round.emptied {
            // Sustained traffic: let the sink and HTTP tasks run, then go on.
            tokio::task::yield_now().await;
            continue;
        }
        tick = if round.moved > 0 {
            timing.tick_min
        } else {
            tick.saturating_mul(2).min(timing.tick_max)
        };
        let _ = tokio::time::timeout(tick, shared.wake.notified()).await;
    }
}

/// What one drain round did.
struct Round {
    moved: usize,
    /// The round stopped because the main queue was empty.
    emptied: bool,
}

/// Pops up to `limit` packets and offers each to every sink. Counters are
/// published once per round, which keeps atomics off the per-packet path.
fn drain_round(shared: &Shared, limit: usize) -> Round {
    let mut moved: usize = 0;
    let mut emptied = false;
    // (pushed, dropped) per sink in this round; at most `limit` each.
    let mut counts = vec![(0u64, 0u64); shared.sinks.len()];
    while moved < limit {
        let Some(packet) = shared.queue.pop() else {
            emptied = true;
            break;
        };
        let packet = Arc::new(packet);
        for (sink, (pushed, dropped)) in shared.sinks.iter().zip(counts.iter_mut()) {
            match sink.queue.push(Arc::clone(&packet)) {
                Ok(()) => *pushed = pushed.saturating_add(1),
                Err(_) => *dropped = dropped.saturating_add(1),
            }
        }
        moved = moved.saturating_add(1);
    }
    if moved > 0 {
        for (sink, (pushed, dropped)) in shared.sinks.iter().zip(counts) {
            sink.pushed.0.fetch_add(pushed, Ordering::AcqRel);
            sink.dropped.fetch_add(dropped, Ordering::AcqRel);
            if pushed > 0 {
                sink.wake.notify_one();
            }
        }
        shared.popped.0.fetch_add(moved as u64, Ordering::AcqRel);
    }
    Round { moved, emptied }
}

/// Logs drops on the first one and then at most every ten seconds.
#[derive(Default)]
struct DropReporter {
    reported: u64,
    last_report: Option<Instant>,
}

impl DropReporter {
    const INTERVAL: Duration = Duration::from_secs(10);

    fn report(&mut self, shared: &Shared) {
        let total = shared.sinks.iter().fold(
            shared.queue_dropped.0.load(Ordering::Relaxed),
            |sum, sink| sum.saturating_add(sink.dropped.load(Ordering::Relaxed)),
        );
        if total == self.reported {
            return;
        }
        let due = self
            .last_report
            .is_none_or(|last| last.elapsed() >= Self::INTERVAL);
        if due {
            tracing::warn!(
                target: "nissa",
                event = leyline::telemetry::NISSA_DROPPING,
                dropped_total = total,
                queue_dropped = shared.queue_dropped.0.load(Ordering::Relaxed),
                "telemetry is dropping packets (queues full); see nissa_dropped_total and \
                 nissa_sink_dropped_total"
            );
            self.reported = total;
            self.last_report = Some(Instant::now());
        }
    }
}

/// A batch on its way to the blocking pool. If the closure carrying it is
/// dropped without running (runtime shutdown), its packets count as failed, so
/// that no packet leaves the accounting.
struct Batch {
    packets: Vec<Arc<TelemetryPacket>>,
    state: Arc<SinkState>,
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.packets.is_empty() {
            self.state
                .failed
                .fetch_add(self.packets.len() as u64, Ordering::AcqRel);
            self.state
                .report_failure("the hub shut down before the batch was written");
        }
    }
}

/// One sink's task: pops batches and writes them on the blocking pool.
pub(crate) async fn run_sink(state: Arc<SinkState>, sink: Box<dyn Sink>, batch_max: usize) {
    let mut sink = Some(sink);
    let mut popped: u64 = 0;
    let mut spare = Vec::with_capacity(batch_max);
    loop {
        let flush_target = state.flush_target.load(Ordering::Acquire);
        let mut packets = std::mem::take(&mut spare);
        while packets.len() < batch_max {
            match state.queue.pop() {
                Some(packet) => packets.push(packet),
                None => break,
            }
        }
        popped = popped.saturating_add(packets.len() as u64);
        if !packets.is_empty() {
            let batch = Batch {
                packets,
                state: Arc::clone(&state),
            };
            match sink.take() {
                Some(owned) => {
                    let job = tokio::task::spawn_blocking(move || {
                        let mut owned = owned;
                        let mut batch = batch;
                        write_batch(owned.as_mut(), &mut batch);
                        (owned, batch)
                    });
                    match job.await {
                        Ok((owned, mut batch)) => {
                            sink = Some(owned);
                            spare = std::mem::take(&mut batch.packets);
                        }
                        Err(error) => {
                            // The closure panicked outside the guarded calls or
                            // was cancelled; its Batch guard counted the packets.
                            state.broken.store(true, Ordering::Release);
                            state.report_failure(&format!("sink task lost: {error}"));
                        }
                    }
                }
                None => {
                    let mut batch = batch;
                    let lost = batch.packets.len() as u64;
                    batch.packets.clear();
                    state.failed.fetch_add(lost, Ordering::AcqRel);
                }
            }
            spare.clear();
        }
        if popped >= flush_target {
            state
                .flushed_through
                .fetch_max(flush_target, Ordering::AcqRel);
        }
        if state.queue.is_empty() {
            state.wake.notified().await;
        }
    }
}

/// Writes one batch and flushes; counts every packet exactly once.
fn write_batch(sink: &mut dyn Sink, batch: &mut Batch) {
    let state = Arc::clone(&batch.state);
    let packets = std::mem::take(&mut batch.packets);
    let total = packets.len() as u64;
    if state.broken.load(Ordering::Acquire) {
        state.failed.fetch_add(total, Ordering::AcqRel);
        batch.packets = packets;
        batch.packets.clear();
        return;
    }
    let mut written: u64 = 0;
    let mut first_error: Option<String> = None;
    for packet in &packets {
        match catch_unwind(AssertUnwindSafe(|| sink.write(packet))) {
            Ok(Ok(())) => written = written.saturating_add(1),
            Ok(Err(error)) => {
                first_error.get_or_insert_with(|| error.to_string());
            }
            Err(_) => {
                state.broken.store(true, Ordering::Release);
                first_error.get_or_insert_with(|| "the sink panicked while writing".to_owned());
                break;
            }
        }
    }
    if !state.broken.load(Ordering::Acquire) {
        match catch_unwind(AssertUnwindSafe(|| sink.flush_written(written))) {
            Ok(flushed) => {
                // The sink reports a prefix of what it accepted; a report
                // beyond that is not believed.
                written = written.min(flushed.delivered);
                if let Some(error) = flushed.error {
                    first_error.get_or_insert_with(|| error.to_string());
                }
            }
            Err(_) => {
                written = 0;
                state.broken.store(true, Ordering::Release);
                first_error.get_or_insert_with(|| "the sink panicked while flushing".to_owned());
            }
        }
    } else {
        written = 0;
    }
    state.delivered.0.fetch_add(written, Ordering::AcqRel);
    state
        .failed
        .fetch_add(total.saturating_sub(written), Ordering::AcqRel);
    if let Some(reason) = first_error {
        state.report_failure(&reason);
    }
    // Hand the (now empty) vector back for reuse; the guard sees no packets.
    batch.packets = packets;
    batch.packets.clear();
}
