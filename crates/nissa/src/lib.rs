//! Nissa: the Esper-rs telemetry hub.
//!
//! Every subsystem hands [`leyline::proto::TelemetryPacket`]s to a [`Hub`].
//! [`Hub::emit`] never blocks and never fails: it pushes the packet into a
//! bounded lock-free queue (or drops and counts it when the queue is full).
//! A worker on the hub's own tokio runtime fans packets out to every
//! [`Sink`], each behind a bounded queue of its own, so a slow or broken sink
//! only loses its own packets. [`Hub::stats`] accounts for every packet:
//! after a flush, per sink, `emitted == delivered + dropped + failed`.
//! [`Hub`] implements [`leyline::Emitter`], the workspace's one emitting
//! trait, and [`Hub::telemetry`] gives producers the [`leyline::Telemetry`]
//! handle they hold; nissa defines no emitting trait of its own.
//!
//! - [`hub`]: the handle, its builder and configuration.
//! - [`sink`]: the [`Sink`] trait other crates implement.
//! - [`jsonl`], [`tracing_bridge`], [`prometheus`]: the built-in sinks (JSON
//!   lines with rotation; `tracing` events; a Prometheus `/metrics` endpoint).
//! - [`testing`]: [`MemorySink`] and friends for tests and benchmarks.
//! - [`stats`]: the delivery accounting.
//! - [`bench`](mod@bench): the `nissa-emit` benchmark's measuring code
//!   (figures only; `esper bench nissa-emit` writes the record).
//!
//! Bad input: configuration is checked when a hub is built (typed
//! [`Error::Config`] naming the field, with stated bounds such as
//! [`hub::MAX_QUEUE_CAPACITY`]); packets are checked where a sink takes them.
//! Building is all or nothing: the metrics port is bound before any file is
//! created, and a build that fails removes what it created
//! ([`HubBuilder::build`]).
//! A sink counts a packet delivered only when a consumer can read it back, so
//! the built-in sinks refuse (count failed) a packet with a non-finite metric
//! value, which JSON cannot carry. Timeouts saturate to "no deadline" instead
//! of overflowing.
//!
//! Nissa depends on leyline only (no tch); telemetry names come from
//! [`leyline::telemetry`].

#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing
    )
)]

pub mod bench;
pub mod error;
pub mod hub;
pub mod jsonl;
pub mod prometheus;
pub mod sink;
pub mod stats;
pub mod testing;
pub mod tracing_bridge;
mod validate;
mod worker;

pub use error::{Error, Result};
pub use hub::{DEFAULT_METRICS_PORT, Hub, HubBuilder, HubConfig};
pub use jsonl::{JsonlConfig, JsonlSink};
pub use prometheus::{PrometheusSink, exposed_name};
pub use sink::{Flushed, Sink};
pub use stats::{FlushOutcome, HubStats, SinkStats};
pub use testing::{FailingSink, MemorySink, SlowSink};
pub use tracing_bridge::{TracingSink, init_subscriber};
