//! Async blueprint prefetch: build, initialise and place seed modules off the
//! training thread.
//!
//! A [`Prefetcher`] owns a small tokio runtime (so it works from plain,
//! non-async code) and a bounded request queue. [`Prefetcher::request`]
//! resolves the blueprint name at once (an unknown name is an immediate
//! [`Error::UnknownBlueprint`]), queues the request (waiting while the queue
//! is full; [`Prefetcher::try_request`] fails with [`Error::QueueFull`]
//! instead) and returns a [`Ticket`]. A dispatcher task hands each request to
//! a runtime worker, which builds the module on the requested device. The
//! ticket gives the [`PreparedSeed`] back ([`Ticket::wait`] blocks,
//! [`Ticket::try_take`] polls) for [`crate::slot::SeedSlot::germinate_module`].
//! [`Ticket::cancel`] abandons a request: a build that has not started is
//! skipped, a finished one is dropped, and the ticket yields
//! [`Error::Cancelled`].
//!
//! Modules draw their initial values from tch's global generator; with
//! several requests in flight the draw order, and so the values, depend on
//! scheduling. Germinate synchronously where bitwise reproducibility matters.
//!
//! Bounds: queue capacity in `[1, MAX_QUEUE_CAPACITY]`, worker threads in
//! `[1, MAX_WORKER_THREADS]` ([`Prefetcher::new`]); a request's width is
//! checked by [`Blueprint::check_dim`] when it is made, not in the worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tch::Device;
use tokio::sync::{mpsc, oneshot};

use crate::blueprint::{Blueprint, SeedModule};
use crate::host::{SlotId, Topology};
use crate::validate::size_in;
use crate::{Error, Result};

/// Default request queue capacity.
pub const DEFAULT_QUEUE_CAPACITY: usize = 64;
/// Default runtime worker threads.
pub const DEFAULT_WORKER_THREADS: usize = 2;
/// Largest request queue capacity.
pub const MAX_QUEUE_CAPACITY: usize = 1 << 16;
/// Largest number of runtime worker threads.
pub const MAX_WORKER_THREADS: usize = 256;

/// Prefetcher sizing (checked by [`PrefetchConfig::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchConfig {
    /// Requests that may wait in the queue.
    pub queue_capacity: usize,
    /// Runtime worker threads building modules.
    pub worker_threads: usize,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            worker_threads: DEFAULT_WORKER_THREADS,
        }
    }
}

impl PrefetchConfig {
    /// Checks the sizing: queue capacity in `[1, MAX_QUEUE_CAPACITY]`,
    /// worker threads in `[1, MAX_WORKER_THREADS]`.
    pub fn validate(&self) -> Result<()> {
        size_in(
            "PrefetchConfig.queue_capacity",
            self.queue_capacity,
            1,
            MAX_QUEUE_CAPACITY,
        )?;
        size_in(
            "PrefetchConfig.worker_threads",
            self.worker_threads,
            1,
            MAX_WORKER_THREADS,
        )?;
        Ok(())
    }
}

/// A built seed module, ready to germinate.
#[derive(Debug)]
pub struct PreparedSeed {
    /// Request id (matches [`Ticket::id`]).
    pub id: u64,
    /// Slot it was requested for.
    pub slot: SlotId,
    /// The module (on the requested device).
    pub module: SeedModule,
    /// Time from request to finished build.
    pub latency: Duration,
}

struct Job {
    id: u64,
    topology: Topology,
    blueprint: Blueprint,
    channels: i64,
    slot: SlotId,
    device: Device,
    requested_at: Instant,
    cancelled: Arc<AtomicBool>,
    reply: oneshot::Sender<Result<PreparedSeed>>,
}

impl Job {
    fn run(self) {
        let outcome = if self.cancelled.load(Ordering::Acquire) {
            Err(Error::Cancelled)
        } else {
            self.blueprint
                .build(self.topology, self.channels, self.device)
                .and_then(|module| {
                    if self.cancelled.load(Ordering::Acquire) {
                        Err(Error::Cancelled)
                    } else {
                        Ok(PreparedSeed {
                            id: self.id,
                            slot: self.slot,
                            module,
                            latency: self.requested_at.elapsed(),
                        })
                    }
                })
        };
        // The ticket may be gone; then nobody wants the result.
        let _ = self.reply.send(outcome);
    }
}

/// A pending prefetch.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    slot: SlotId,
    blueprint: Blueprint,
    cancelled: Arc<AtomicBool>,
    receiver: oneshot::Receiver<Result<PreparedSeed>>,
}

impl Ticket {
    /// Request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Slot the seed is for.
    pub fn slot(&self) -> SlotId {
        self.slot
    }

    /// Requested blueprint.
    pub fn blueprint(&self) -> Blueprint {
        self.blueprint
    }

    /// Abandons the request (see the module docs).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// Whether [`Ticket::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Blocks until the module is ready. Call from non-async code (it blocks
    /// the thread).
    pub fn wait(self) -> Result<PreparedSeed> {
        if self.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let outcome = self
            .receiver
            .blocking_recv()
            .map_err(|_| Error::PrefetcherClosed)?;
        if self.cancelled.load(Ordering::Acquire) {
            return Err(Error::Cancelled);
        }
        outcome
    }

    /// The module if it is ready, `Ok(None)` if not yet. After it returned
    /// `Some` (or an error) the ticket is spent: later calls report
    /// [`Error::PrefetcherClosed`].
    pub fn try_take(&mut self) -> Result<Option<PreparedSeed>> {
        if self.is_cancelled() {
            return Err(Error::Cancelled);
        }
        match self.receiver.try_recv() {
            Ok(outcome) => outcome.map(Some),
            Err(oneshot::error::TryRecvError::Empty) => Ok(None),
            Err(oneshot::error::TryRecvError::Closed) => Err(Error::PrefetcherClosed),
        }
    }
}

/// The prefetcher: a runtime, a bounded queue and a dispatcher.
pub struct Prefetcher {
    runtime: Option<tokio::runtime::Runtime>,
    sender: Option<mpsc::Sender<Job>>,
    capacity: usize,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("capacity", &self.capacity)
            .field("open", &self.sender.is_some())
            .finish()
    }
}

impl Prefetcher {
    /// Starts the runtime and the dispatcher.
    pub fn new(config: PrefetchConfig) -> Result<Prefetcher> {
        config.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads)
            .thread_name("kasmina-prefetch")
            .build()?;
        let (sender, mut receiver) = mpsc::channel::<Job>(config.queue_capacity);
        runtime.spawn(async move {
            while let Some(job) = receiver.recv().await {
                // Builds are short CPU work (microseconds to a millisecond):
                // run them on the runtime's own workers.
                tokio::spawn(async move { job.run() });
            }
        });
        Ok(Prefetcher {
            runtime: Some(runtime),
            sender: Some(sender),
            capacity: config.queue_capacity,
            next_id: AtomicU64::new(0),
        })
    }

    /// Queue capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn make_job(
        &self,
        topology: Topology,
        blueprint: &str,
        channels: i64,
        slot: SlotId,
        device: Device,
    ) -> Result<(Job, Ticket)> {
        let blueprint = Blueprint::from_name(topology, blueprint)?;
        blueprint.check_dim(topology, channels)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let cancelled = Arc::new(AtomicBool::new(false));
        let (reply, receiver) = oneshot::channel();
        let job = Job {
            id,
            topology,
            blueprint,
            channels,
            slot,
            device,
            requested_at: Instant::now(),
            cancelled: Arc::clone(&cancelled),
            reply,
        };
        let ticket = Ticket {
            id,
            slot,
            blueprint,
            cancelled,
            receiver,
        };
        Ok((job, ticket))
    }

    /// Queues a build of the CNN `blueprint` at `channels` channels on
    /// `device` for `slot`, waiting while the queue is full. Call from
    /// non-async code.
    pub fn request(
        &self,
        blueprint: &str,
        channels: i64,
        slot: SlotId,
        device: Device,
    ) -> Result<Ticket> {
        self.request_for(Topology::Cnn, blueprint, channels, slot, device)
    }

    /// Like [`Prefetcher::request`] for a host of any topology (`dim` is the
    /// slot's channel count or model width).
    pub fn request_for(
        &self,
        topology: Topology,
        blueprint: &str,
        dim: i64,
        slot: SlotId,
        device: Device,
    ) -> Result<Ticket> {
        let (job, ticket) = self.make_job(topology, blueprint, dim, slot, device)?;
        let sender = self.sender.as_ref().ok_or(Error::PrefetcherClosed)?;
        sender
            .blocking_send(job)
            .map_err(|_| Error::PrefetcherClosed)?;
        Ok(ticket)
    }

    /// Like [`Prefetcher::request`] but fails with [`Error::QueueFull`]
    /// instead of waiting.
    pub fn try_request(
        &self,
        blueprint: &str,
        channels: i64,
        slot: SlotId,
        device: Device,
    ) -> Result<Ticket> {
        let (job, ticket) = self.make_job(Topology::Cnn, blueprint, channels, slot, device)?;
        let sender = self.sender.as_ref().ok_or(Error::PrefetcherClosed)?;
        sender.try_send(job).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => Error::QueueFull {
                capacity: self.capacity,
            },
            mpsc::error::TrySendError::Closed(_) => Error::PrefetcherClosed,
        })?;
        Ok(ticket)
    }

    /// Stops accepting requests and stops the runtime, waiting up to
    /// `timeout` for running builds (any `Duration`, `Duration::MAX`
    /// included). Requests not yet built are abandoned: their tickets report
    /// [`Error::PrefetcherClosed`].
    pub fn shutdown(mut self, timeout: Duration) {
        self.sender = None;
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(timeout);
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
