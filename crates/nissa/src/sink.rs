//! The [`Sink`] trait: where telemetry packets end up.
//!
//! A sink is plain synchronous code. The hub runs each sink on the blocking
//! pool of its own runtime, one batch at a time, behind the sink's own bounded
//! queue, so a sink may block (a slow disk, a full pipe) without stalling the
//! emitters or the other sinks. Errors and panics are counted and reported
//! once through `tracing`; they never reach the code that emitted the packet.

use leyline::proto::TelemetryPacket;

use crate::Result;

/// A destination for telemetry packets.
///
/// Accounting: the hub calls [`Sink::write`] for each packet of a batch and
/// then [`Sink::flush`] once. A packet counts as *delivered* when its `write`
/// returned `Ok` and the batch's `flush` returned `Ok`; as *failed* otherwise.
/// A sink that buffers must therefore make `flush` push its buffer out (and
/// discard it on error, so that a broken destination does not grow memory).
pub trait Sink: Send + 'static {
    /// Short name used in statistics, logs and the `sink` metric label.
    fn name(&self) -> &str;

    /// Writes one packet (or buffers it until [`Sink::flush`]).
    fn write(&mut self, packet: &TelemetryPacket) -> Result<()>;

    /// Makes everything written so far durable or visible.
    fn flush(&mut self) -> Result<()> {
        Ok(())
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
}
