//! The [`Sink`] trait: where telemetry packets end up.
//!
//! A sink is plain synchronous code. The hub runs each sink on the blocking
//! pool of its own runtime, one batch at a time, behind the sink's own bounded
//! queue, so a sink may block (a slow disk, a full pipe) without stalling the
//! emitters or the other sinks. Errors and panics are counted and reported
//! once through `tracing`; they never reach the code that emitted the packet.

use leyline::proto::TelemetryPacket;

use crate::{Error, Result};

/// What [`Sink::flush_written`] achieved for the packets accepted since the
/// previous flush.
#[derive(Debug)]
pub struct Flushed {
    /// How many of the accepted packets, counted from the first in write
    /// order, reached the destination whole (readable by a consumer).
    pub delivered: u64,
    /// Why the others did not, if some did not.
    pub error: Option<Error>,
}

/// A destination for telemetry packets.
///
/// Accounting: the hub calls [`Sink::write`] for each packet of a batch and
/// then [`Sink::flush_written`] once, with the number of writes that returned
/// `Ok`. A packet counts as *delivered* when its `write` returned `Ok` and the
/// flush reports it delivered; as *failed* otherwise. The default
/// `flush_written` calls [`Sink::flush`]: all accepted packets are delivered
/// when it returns `Ok`, none when it fails. A sink that buffers must push its
/// buffer out in `flush` (and discard it on error, so that a broken
/// destination does not grow memory); a sink that can tell how much of a
/// failed flush got through overrides `flush_written`.
///
/// Delivered means readable: a sink never reports a packet delivered that a
/// consumer cannot read back. The built-in sinks refuse (fail) a packet with
/// a non-finite metric value, which JSON cannot carry.
pub trait Sink: Send + 'static {
    /// Short name used in statistics, logs and the `sink` metric label.
    fn name(&self) -> &str;

    /// Writes one packet (or buffers it until [`Sink::flush`]).
    fn write(&mut self, packet: &TelemetryPacket) -> Result<()>;

    /// Makes everything written so far durable or visible.
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// Flushes the `accepted` packets written since the previous flush and
    /// reports how many of them reached the destination (see [`Flushed`]).
    fn flush_written(&mut self, accepted: u64) -> Flushed {
        match self.flush() {
            Ok(()) => Flushed {
                delivered: accepted,
                error: None,
            },
            Err(error) => Flushed {
                delivered: 0,
                error: Some(error),
            },
        }
    }
}

impl<S: Sink + ?Sized> Sink for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn write(&mut self, packet: &TelemetryPacket) -> Result<()> {
        (**self).write(packet)
    }

    fn flush(&mut self) -> Result<()> {
        (**self).flush()
    }

    fn flush_written(&mut self, accepted: u64) -> Flushed {
        (**self).flush_written(accepted)
    }
}
