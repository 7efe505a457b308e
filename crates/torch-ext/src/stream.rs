//! CUDA streams ([`CudaStream`]) and the RAII guard that makes one current
//! ([`StreamGuard`]).
//!
//! Every tensor operation tch launches goes to the *current* stream of the
//! tensor's device; making a side stream current is how work (a staging copy,
//! a graph capture) is moved off the default stream.

use std::marker::PhantomData;

use crate::cuda::ensure_device;
use crate::error::Result;
use crate::event::CudaEvent;
use crate::ffi::{self, RawStream};

/// A CUDA stream of libtorch's stream pool (`c10::cuda::CUDAStream`).
///
/// A plain value (device, stream id): copying it does not create a stream, and
/// dropping it does not destroy one. Streams from the pool live as long as the
/// process. Values only come from the constructors below, which check that
/// CUDA is available.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStream {
    raw: RawStream,
}

impl CudaStream {
    /// A stream from libtorch's pool for `device` (round-robin over a fixed
    /// set, like `torch.cuda.Stream()`); `high_priority` picks the
    /// high-priority pool.
    pub fn from_pool(device: usize, high_priority: bool) -> Result<Self> {
        Self::from_shim(device, "CudaStream::from_pool", |device, raw| {
            // SAFETY: `raw` is a live out-parameter; the shim catches all exceptions.
            unsafe { ffi::esper_stream_from_pool(device, i32::from(high_priority), raw) }
        })
    }

    /// Runs a shim entry point that fills in the stream of a checked `device`.
    fn from_shim(
        device: usize,
        op: &'static str,
        shim: impl FnOnce(i32, *mut RawStream) -> ffi::RawError,
    ) -> Result<Self> {
        let device = ensure_device(device)?;
        let mut raw = RawStream {
            stream_id: 0,
            device_index: 0,
            device_type: 0,
        };
        let error = shim(device, &mut raw);
        // SAFETY: `error` comes straight from the shim entry point.
        unsafe { ffi::check(op, error)? };
        Ok(Self { raw })
    }

    /// The current stream of `device` on this thread.
    pub fn current(device: usize) -> Result<Self> {
        Self::from_shim(device, "CudaStream::current", |device, raw| {
            // SAFETY: `raw` is a live out-parameter; the shim catches all exceptions.
            unsafe { ffi::esper_stream_current(device, raw) }
        })
    }

    /// The default (legacy "null") stream of `device`.
    pub fn default_stream(device: usize) -> Result<Self> {
        Self::from_shim(device, "CudaStream::default_stream", |device, raw| {
            // SAFETY: `raw` is a live out-parameter; the shim catches all exceptions.
            unsafe { ffi::esper_stream_default(device, raw) }
        })
    }

    /// The device index this stream belongs to.
    pub fn device(&self) -> usize {
        usize::try_from(self.raw.device_index).unwrap_or(0)
    }

    /// libtorch's id of the stream (stable for the life of the process).
    pub fn id(&self) -> i64 {
        self.raw.stream_id
    }

    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }

    /// Blocks the host until all work queued on this stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: value argument; the shim catches all exceptions.
        unsafe {
            ffi::check(
                "CudaStream::synchronize",
                ffi::esper_stream_synchronize(self.raw),
            )
        }
    }

    /// Whether all work queued on this stream has finished (non-blocking).
    pub fn query(&self) -> Result<bool> {
        let mut done = 0_i32;
        // SAFETY: `done` is a live out-parameter.
        unsafe {
            ffi::check(
                "CudaStream::query",
                ffi::esper_stream_query(self.raw, &mut done),
            )?
        };
        Ok(done != 0)
    }

    /// Makes work queued on this stream from now on wait for everything
    /// already queued on `other` (`torch.cuda.Stream.wait_stream`). Does not
    /// block the host.
    pub fn wait_stream(&self, other: &CudaStream) -> Result<()> {
        // SAFETY: value arguments; the shim catches all exceptions.
        unsafe {
            ffi::check(
                "CudaStream::wait_stream",
                ffi::esper_stream_wait_stream(self.raw, other.raw),
            )
        }
    }

    /// Makes work queued on this stream from now on wait for the last
    /// [`CudaEvent::record`] of `event`. Does not block the host.
    pub fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        // SAFETY: `event.raw_ptr()` is a live CUDAEvent owned by `event`,
        // which outlives the call.
        unsafe {
            ffi::check(
                "CudaStream::wait_event",
                ffi::esper_stream_wait_event(self.raw, event.raw_ptr()),
            )
        }
    }

    /// Whether this stream is currently capturing a CUDA graph.
    pub fn is_capturing(&self) -> Result<bool> {
        let mut capturing = 0_i32;
        // SAFETY: `capturing` is a live out-parameter.
        unsafe {
            ffi::check(
                "CudaStream::is_capturing",
                ffi::esper_stream_is_capturing(self.raw, &mut capturing),
            )?;
        }
        Ok(capturing != 0)
    }

    /// Makes this stream the current stream of its device, and its device
    /// the current device, on this thread until the returned guard is
    /// dropped, which restores both (c10's `CUDAStreamGuard`). Graph capture
    /// and the caching allocator's capture pools work on the current device,
    /// so a stream of any GPU can be captured on.
    pub fn make_current(&self) -> Result<StreamGuard<'_>> {
        let previous_device = crate::cuda::current_device()?;
        let previous = CudaStream::current(self.device())?;
        if previous_device != self.device() {
            crate::cuda::set_device(self.device())?;
        }
        if let Err(error) = set_current(self.raw, "CudaStream::make_current") {
            let _ = crate::cuda::set_device(previous_device);
            return Err(error);
        }
        Ok(StreamGuard {
            previous,
            previous_device,
            _stream: PhantomData,
            _not_send: PhantomData,
        })
    }
}

fn set_current(raw: RawStream, op: &'static str) -> Result<()> {
    // SAFETY: value argument; the shim catches all exceptions.
    unsafe { ffi::check(op, ffi::esper_stream_set_current(raw)) }
}

/// Restores the previously current stream of the device, and the previously
/// current device, when dropped.
///
/// The current stream is thread-local state, so the guard is neither `Send`
/// nor `Sync`; guards should be dropped in reverse order of creation.
#[must_use = "the stream is current only while the guard lives"]
#[derive(Debug)]
pub struct StreamGuard<'a> {
    previous: CudaStream,
    previous_device: usize,
    _stream: PhantomData<&'a CudaStream>,
    _not_send: PhantomData<*const ()>,
}

impl StreamGuard<'_> {
    /// The stream that becomes current again when this guard drops.
    pub fn previous(&self) -> CudaStream {
        self.previous
    }
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        // Restoring a stream that was current a moment ago cannot fail short
        // of a corrupted CUDA context; there is no way to report from drop.
        let _ = set_current(self.previous.raw, "StreamGuard::drop");
        if self.previous_device != self.previous.device() {
            let _ = crate::cuda::set_device(self.previous_device);
        }
    }
}
