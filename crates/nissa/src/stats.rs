//! Delivery accounting: what was emitted, delivered, dropped and failed.
//!
//! Every packet handed to [`crate::Hub::emit`] while the hub is open ends up in
//! exactly one bucket per sink, so after a complete flush, for every sink,
//! `emitted == delivered + dropped + failed` (and `pending == 0`). Packets
//! emitted after [`crate::Hub::close`] are not part of `emitted`; they are
//! counted in [`HubStats::after_close`].

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

/// A snapshot of the hub's counters.
///
/// The counters are read one by one while the hub runs, so a snapshot taken
/// during traffic can be off by the packets in flight; after
/// [`crate::Hub::flush`] completed (or after [`crate::Hub::close`]) it is exact.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HubStats {
    /// Packets accepted or dropped by the hub while open.
    pub emitted: u64,
    /// Packets dropped because the main queue was full (counted for every sink).
    pub queue_dropped: u64,
    /// Packets emitted after close (or caught in the main queue by it).
    pub after_close: u64,
    /// Packets waiting in the main queue.
    pub queued: u64,
    /// Whether [`crate::Hub::close`] ran.
    pub closed: bool,
    /// One entry per sink, in the order they were added.
    pub sinks: Vec<SinkStats>,
}

/// One sink's share of the accounting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SinkStats {
    /// The sink's name.
    pub name: String,
    /// Packets meant for this sink: the hub's `emitted`.
    pub emitted: u64,
    /// Packets written and flushed by the sink.
    pub delivered: u64,
    /// Packets dropped before reaching the sink: main queue full
    /// ([`HubStats::queue_dropped`]) plus [`SinkStats::sink_queue_dropped`].
    pub dropped: u64,
    /// Packets dropped because this sink's own queue was full.
    pub sink_queue_dropped: u64,
    /// Packets the sink failed to write or flush (errors and panics).
    pub failed: u64,
    /// Packets still on their way (main queue, sink queue, being written).
    pub pending: u64,
}

impl SinkStats {
    /// `delivered + dropped + failed + pending`: equals `emitted` whenever the
    /// counters were read while no packet was in flight.
    pub fn accounted(&self) -> u64 {
        self.delivered
            .saturating_add(self.dropped)
            .saturating_add(self.failed)
            .saturating_add(self.pending)
    }
}

impl HubStats {
    /// The entry for the sink called `name`.
    pub fn sink(&self, name: &str) -> Option<&SinkStats> {
        self.sinks.iter().find(|sink| sink.name == name)
    }

    /// Packets not yet delivered, dropped or failed, summed over sinks.
    pub fn pending(&self) -> u64 {
        self.sinks
            .iter()
            .fold(0, |sum, sink| sum.saturating_add(sink.pending))
    }
}

/// What [`crate::Hub::flush`] achieved before its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushOutcome {
    /// Every packet emitted before the call was delivered, dropped or failed,
    /// and every sink was flushed after it.
    pub complete: bool,
    /// Packets still pending over all sinks when the call returned.
    pub pending: u64,
}

impl FlushOutcome {
    /// Whether the flush finished before its deadline.
    pub fn is_complete(&self) -> bool {
        self.complete
    }
}
