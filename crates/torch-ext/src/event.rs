//! CUDA events ([`CudaEvent`]): ordering between streams and GPU-side timing.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::cuda::ensure_available;
use crate::error::{Error, Result};
use crate::ffi;
use crate::stream::CudaStream;

/// A CUDA event (`at::cuda::CUDAEvent`), created lazily on its first record.
#[derive(Debug)]
pub struct CudaEvent {
    raw: NonNull<c_void>,
}

// SAFETY: a CUDA event handle may be used from any thread (the CUDA runtime is
// thread-safe and CUDAEvent remembers its device); the wrapper holds no
// thread-local state. It is not `Sync`: `record` mutates the C++ object.
unsafe impl Send for CudaEvent {}

impl CudaEvent {
    /// A new event; `enable_timing` is needed for [`CudaEvent::elapsed_ms`]
    /// and makes recording slightly more expensive.
    pub fn new(enable_timing: bool) -> Result<Self> {
        ensure_available()?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a live out-parameter; on success it owns a new
        // CUDAEvent released in `Drop`.
        unsafe {
            ffi::check(
                "CudaEvent::new",
                ffi::esper_event_new(i32::from(enable_timing), &mut raw),
            )?
        };
        let raw = NonNull::new(raw).ok_or(Error::Cpp {
            op: "CudaEvent::new",
            message: "shim returned a null event".to_owned(),
        })?;
        Ok(Self { raw })
    }

    pub(crate) fn raw_ptr(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    /// Records the event at the current end of `stream`'s queue.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: `self.raw` is the live CUDAEvent this value owns.
        unsafe {
            ffi::check(
                "CudaEvent::record",
                ffi::esper_event_record(self.raw_ptr(), stream.raw()),
            )
        }
    }

    /// Blocks the host until the recorded work has finished (returns at once
    /// if the event was never recorded).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.raw` is the live CUDAEvent this value owns.
        unsafe {
            ffi::check(
                "CudaEvent::synchronize",
                ffi::esper_event_synchronize(self.raw_ptr()),
            )
        }
    }

    /// Whether the recorded work has finished (non-blocking).
    pub fn query(&self) -> Result<bool> {
        let mut done = 0_i32;
        // SAFETY: `self.raw` is live and `done` is a live out-parameter.
        unsafe {
            ffi::check(
                "CudaEvent::query",
                ffi::esper_event_query(self.raw_ptr(), &mut done),
            )?
        };
        Ok(done != 0)
    }

    /// Milliseconds of GPU time between this event and `end`; both must have
    /// been created with timing enabled, recorded, and completed.
    pub fn elapsed_ms(&self, end: &CudaEvent) -> Result<f32> {
        let mut ms = 0.0_f32;
        // SAFETY: both events are live for the call; `ms` is a live out-parameter.
        unsafe {
            ffi::check(
                "CudaEvent::elapsed_ms",
                ffi::esper_event_elapsed_ms(self.raw_ptr(), end.raw_ptr(), &mut ms),
            )?;
        }
        Ok(ms)
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: `self.raw` was allocated by esper_event_new and is released
        // exactly once, here.
        unsafe { ffi::esper_event_free(self.raw.as_ptr()) }
    }
}
