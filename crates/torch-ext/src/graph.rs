//! CUDA graphs: capture a step once, replay it with one launch.
//!
//! [`CudaGraph::capture`] follows the rules measured in DESIGN §4:
//!
//! 1. The capture stream must be a side stream (not the default stream). It
//!    first waits for everything already queued on the caller's current
//!    stream, so inputs filled there are visible.
//! 2. The body runs `warmup_iters` times **on that same stream** (made current
//!    for the whole call), so lazily created state (cuBLAS handles and
//!    workspaces, optimizer buffers, the allocator's blocks) belongs to the
//!    stream that will be captured. Three or more warm-up iterations are
//!    recommended.
//! 3. After warm-up iterations the capture stream is synchronised (not the
//!    whole device: other streams' work runs on), so the warm-up's work is
//!    done before the capture starts. With no warm-up iterations (the caller
//!    warmed up on the stream itself) nothing is waited for: work already
//!    queued on the stream stays ahead of every replay in stream order, and
//!    the capture allocates from its own pool, not from blocks that work may
//!    still use. Then `at::cuda::CUDAGraph::capture_begin`
//!    runs with the given memory pool (or a private one) and the body runs
//!    once more, recorded instead of executed; `capture_end` instantiates it.
//! 4. The caller's stream is made to wait for the capture stream, so work it
//!    queues next sees the warm-up's side effects.
//!
//! The body must not read values back (`f64::try_from`, `int64_value`, tch's
//! `clip_grad_norm`), must write results into tensors allocated before the
//! capture (e.g. with `copy_`), and must only use device-resident state.
//!
//! **Capture mode.** [`CudaGraph::capture`] uses
//! [`CaptureMode::ThreadLocal`]: the capturing thread is still forbidden from
//! unsafe CUDA calls (a hidden synchronisation fails the capture, as it
//! should), but other threads of the process, such as the telemetry worker or
//! a blueprint prefetcher that allocates on the GPU, do not invalidate the
//! capture. PyTorch's own default, [`CaptureMode::Global`], is available
//! through [`CudaGraph::capture_with_mode`].
//!
//! **Failure.** The body runs in Rust between two FFI calls; it is never called
//! from C++. A panic in it is caught with `catch_unwind` and returned as
//! [`Error::Panic`]; an `Err` it returns becomes [`Error::Body`]. If that
//! happens during capture, the capture is ended and discarded (the stream
//! leaves capture mode, the allocator stops routing to the graph's pool, the
//! CUDA RNG leaves graph mode, the pending CUDA error is cleared), so the
//! caller can fall back to eager execution in the same process. (When the body
//! failed before queuing any work, libtorch prints a harmless "The CUDA Graph
//! is empty" warning while the capture is ended.)

use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;

use crate::cuda::{self, ensure_available};
use crate::error::{Error, Result};
use crate::ffi;
use crate::stream::CudaStream;

/// A handle on a CUDA-graph memory pool (`at::cuda::graph_pool_handle()`).
///
/// Graphs captured with the same pool share its memory. That is safe when they
/// are replayed in the order they were captured (e.g. the steps of an epoch),
/// and it keeps several graphs from each holding a private copy of the
/// activations. The handle is a plain id: copying it is free, and the pool
/// lives while any graph captured into it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphPool {
    first: u64,
    second: u64,
}

impl GraphPool {
    /// A fresh pool id to share between captures.
    pub fn new() -> Result<Self> {
        ensure_available()?;
        let (mut first, mut second) = (0_u64, 0_u64);
        // SAFETY: both out-parameters are live for the duration of the call.
        unsafe {
            ffi::check(
                "GraphPool::new",
                ffi::esper_graph_pool_handle(&mut first, &mut second),
            )?
        };
        Ok(Self { first, second })
    }
}

/// Which CUDA API calls are forbidden while a capture is under way
/// (`cudaStreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// Unsafe calls are forbidden on every thread of the process (PyTorch's
    /// default, `capture_error_mode="global"`).
    Global,
    /// Unsafe calls are forbidden only on the capturing thread (this crate's
    /// default; see the module documentation).
    #[default]
    ThreadLocal,
    /// Nothing is forbidden; only for experts.
    Relaxed,
}

impl CaptureMode {
    /// The `cudaStreamCaptureMode` enumerator value.
    fn to_raw(self) -> i32 {
        match self {
            CaptureMode::Global => 0,
            CaptureMode::ThreadLocal => 1,
            CaptureMode::Relaxed => 2,
        }
    }
}

/// A captured, instantiated CUDA graph (`at::cuda::CUDAGraph`).
#[derive(Debug)]
pub struct CudaGraph {
    raw: NonNull<c_void>,
    pool: GraphPool,
    stream: CudaStream,
}

// SAFETY: the graph is an owned heap object with no thread affinity;
// cudaGraphLaunch may be called from any thread. It is not `Sync`: replay and
// reset mutate the C++ object.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Warms `body` up `warmup_iters` times on `stream`, then captures one call
    /// of it on `stream` into a graph, using `pool` (shared) or a private pool.
    /// Uses [`CaptureMode::ThreadLocal`]; see the module documentation for the
    /// exact sequence and the failure behaviour.
    pub fn capture<F>(
        stream: &CudaStream,
        pool: Option<&GraphPool>,
        warmup_iters: usize,
        body: F,
    ) -> Result<CudaGraph>
    where
        F: FnMut() -> std::result::Result<(), String>,
    {
        Self::capture_with_mode(stream, pool, warmup_iters, CaptureMode::ThreadLocal, body)
    }

    /// [`CudaGraph::capture`] with an explicit capture mode.
    pub fn capture_with_mode<F>(
        stream: &CudaStream,
        pool: Option<&GraphPool>,
        warmup_iters: usize,
        mode: CaptureMode,
        mut body: F,
    ) -> Result<CudaGraph>
    where
        F: FnMut() -> std::result::Result<(), String>,
    {
        let device = stream.device();
        cuda::ensure_device(device)?;
        if *stream == CudaStream::default_stream(device)? {
            return Err(Error::InvalidArgument {
                op: "CudaGraph::capture",
                message: "CUDA graphs must be captured on a side stream, not the default stream \
                          (use CudaStream::from_pool)"
                    .to_owned(),
            });
        }
        let caller_stream = CudaStream::current(device)?;
        stream.wait_stream(&caller_stream)?;

        let graph = {
            let _on_capture_stream = stream.make_current()?;
            for _ in 0..warmup_iters {
                run_body(&mut body, "warm-up")?;
            }
            // Let the warm-up work finish before the capture starts. Only the
            // capture stream: torch.cuda.graph synchronises the whole device,
            // which would also wait for every other stream's work (another
            // trainer's epoch running beside this capture); the warm-up ran on
            // this stream and its lazy initialisation on the host. Without
            // warm-up iterations there is nothing of ours to wait for, and
            // waiting for the caller's queued work would only stall the host.
            if warmup_iters > 0 {
                stream.synchronize()?;
            }
            Self::capture_once(stream, pool, mode, &mut body)?
        };

        caller_stream.wait_stream(stream)?;
        Ok(graph)
    }

    /// Begins the capture, runs the body once, and ends (or aborts) it.
    fn capture_once<F>(
        stream: &CudaStream,
        pool: Option<&GraphPool>,
        mode: CaptureMode,
        body: &mut F,
    ) -> Result<CudaGraph>
    where
        F: FnMut() -> std::result::Result<(), String>,
    {
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a live out-parameter; on success it owns a new graph.
        unsafe { ffi::check("CudaGraph::capture", ffi::esper_graph_new(&mut raw))? };
        let raw = NonNull::new(raw).ok_or(Error::Cpp {
            op: "CudaGraph::capture",
            message: "shim returned a null graph".to_owned(),
        })?;
        // From here on `graph` owns `raw` and frees it on every return path.
        let mut graph = CudaGraph {
            raw,
            pool: GraphPool {
                first: 0,
                second: 0,
            },
            stream: *stream,
        };

        let requested = pool.copied().unwrap_or(GraphPool {
            first: 0,
            second: 0,
        });
        // SAFETY: `graph.raw` is live; the other arguments are values.
        unsafe {
            ffi::check(
                "CudaGraph::capture_begin",
                ffi::esper_graph_capture_begin(
                    graph.raw_ptr(),
                    requested.first,
                    requested.second,
                    mode.to_raw(),
                ),
            )?;
        }

        let ended = run_body(body, "capture").and_then(|()| {
            // SAFETY: `graph.raw` is live and capturing on the current stream.
            unsafe {
                ffi::check(
                    "CudaGraph::capture_end",
                    ffi::esper_graph_capture_end(graph.raw_ptr()),
                )
            }
        });
        if let Err(error) = ended {
            return Err(graph.abort_capture(error));
        }

        let (mut first, mut second) = (0_u64, 0_u64);
        // SAFETY: `graph.raw` is live; both out-parameters are live.
        unsafe {
            ffi::check(
                "CudaGraph::pool",
                ffi::esper_graph_pool(graph.raw_ptr(), &mut first, &mut second),
            )?;
        }
        graph.pool = GraphPool { first, second };
        Ok(graph)
    }

    /// Ends and discards a capture that failed; returns `cause`, with the
    /// cleanup failure appended to its message if cleanup failed too.
    fn abort_capture(&mut self, cause: Error) -> Error {
        // SAFETY: `self.raw` is live; `self.stream` is the capture stream.
        let cleanup = unsafe {
            ffi::check(
                "CudaGraph::capture_abort",
                ffi::esper_graph_capture_abort(self.raw_ptr(), self.stream.raw()),
            )
        };
        match cleanup {
            Ok(()) => cause,
            Err(cleanup) => append_cleanup_failure(cause, &cleanup),
        }
    }

    /// What the graph holds, read from the captured `cudaGraph_t` before it
    /// was instantiated: `(count, node)` pairs, one per kernel function
    /// (`"kernel NAME"`; kernels launched through the driver API, e.g.
    /// cuDNN's and cuBLAS's, are `"kernel (unnamed: ...)"`) and per other
    /// node kind (`"memcpy"`, `"memset"`, ...), sorted by node.
    pub fn node_summary(&self) -> Result<Vec<(usize, String)>> {
        let mut raw: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: `self.raw` is a live graph; `raw` receives a shim string.
        let text = unsafe {
            ffi::check(
                "CudaGraph::node_summary",
                ffi::esper_graph_summary(self.raw_ptr(), &mut raw),
            )?;
            ffi::take_string(raw).unwrap_or_default()
        };
        Ok(text
            .lines()
            .filter_map(|line| {
                let (count, name) = line.split_once('\t')?;
                Some((count.parse().ok()?, name.to_owned()))
            })
            .collect())
    }

    /// Kernel launches in the graph (all `"kernel ..."` nodes of
    /// [`CudaGraph::node_summary`]).
    pub fn kernel_count(&self) -> Result<usize> {
        Ok(self
            .node_summary()?
            .iter()
            .filter(|(_, name)| name.starts_with("kernel"))
            .map(|(count, _)| count)
            .sum())
    }

    fn raw_ptr(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    /// Launches the graph on the current stream of its device (after
    /// whatever is already queued there). Does not block the host.
    pub fn replay(&self) -> Result<()> {
        // SAFETY: `self.raw` is the live graph this value owns.
        unsafe { ffi::check("CudaGraph::replay", ffi::esper_graph_replay(self.raw_ptr())) }
    }

    /// Makes `stream` current, launches the graph on it, and restores the
    /// previous current stream. It does not wait for work queued on other
    /// streams: inputs written on another stream need
    /// [`CudaStream::wait_stream`] (or an event) first, or the replay may
    /// read them before they land on a busy GPU.
    pub fn replay_on(&self, stream: &CudaStream) -> Result<()> {
        let _current = stream.make_current()?;
        self.replay()
    }

    /// Destroys the executable graph and releases this graph's hold on its
    /// memory pool; [`CudaGraph::replay`] fails afterwards. Dropping the graph
    /// does the same.
    pub fn reset(&mut self) -> Result<()> {
        // SAFETY: `self.raw` is the live graph this value owns.
        unsafe { ffi::check("CudaGraph::reset", ffi::esper_graph_reset(self.raw_ptr())) }
    }

    /// The memory pool this graph was captured into, to share with the next
    /// capture.
    pub fn pool(&self) -> GraphPool {
        self.pool
    }

    /// The stream the graph was captured on.
    pub fn capture_stream(&self) -> CudaStream {
        self.stream
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: `self.raw` was allocated by esper_graph_new and is released
        // exactly once, here.
        unsafe { ffi::esper_graph_free(self.raw.as_ptr()) }
    }
}

/// Runs a capture body, turning a panic into [`Error::Panic`] and a returned
/// `Err` into [`Error::Body`].
///
/// `AssertUnwindSafe` is justified because after a panic the body is never
/// called again: the error goes straight back to the caller, who owns whatever
/// state the body touched.
pub(crate) fn run_body<F>(body: &mut F, phase: &'static str) -> Result<()>
where
    F: FnMut() -> std::result::Result<(), String>,
{
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(Error::Body { phase, message }),
        Err(payload) => Err(Error::Panic {
            message: panic_message(payload.as_ref()),
        }),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

fn append_cleanup_failure(cause: Error, cleanup: &Error) -> Error {
    let suffix = format!(" (aborting the capture also failed: {cleanup})");
    match cause {
        Error::Panic { message } => Error::Panic {
            message: message + &suffix,
        },
        Error::Body { phase, message } => Error::Body {
            phase,
            message: message + &suffix,
        },
        Error::Cpp { op, message } => Error::Cpp {
            op,
            message: message + &suffix,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_body_catches_a_panic_and_keeps_its_message() {
        let mut body = || -> std::result::Result<(), String> { panic!("boom at step {}", 3) };
        match run_body(&mut body, "capture") {
            Err(Error::Panic { message }) => assert_eq!(message, "boom at step 3"),
            other => panic!("expected Error::Panic, got {other:?}"),
        }
    }

    #[test]
    fn run_body_catches_a_static_str_panic() {
        let mut body = || -> std::result::Result<(), String> { panic!("static message") };
        match run_body(&mut body, "warm-up") {
            Err(Error::Panic { message }) => assert_eq!(message, "static message"),
            other => panic!("expected Error::Panic, got {other:?}"),
        }
    }

    #[test]
    fn run_body_reports_a_body_error_with_its_phase() {
        let mut body = || -> std::result::Result<(), String> { Err("shape mismatch".to_owned()) };
        match run_body(&mut body, "warm-up") {
            Err(Error::Body { phase, message }) => {
                assert_eq!(phase, "warm-up");
                assert_eq!(message, "shape mismatch");
            }
            other => panic!("expected Error::Body, got {other:?}"),
        }
    }

    #[test]
    fn run_body_runs_the_body_and_passes_success_through() {
        let mut calls = 0;
        let mut body = || -> std::result::Result<(), String> {
            calls += 1;
            Ok(())
        };
        run_body(&mut body, "capture").unwrap();
        run_body(&mut body, "capture").unwrap();
        assert_eq!(calls, 2);
    }

    #[test]
    fn a_cleanup_failure_is_appended_to_the_cause() {
        let cause = Error::Panic {
            message: "boom".to_owned(),
        };
        let cleanup = Error::Cpp {
            op: "CudaGraph::capture_abort",
            message: "bad".to_owned(),
        };
        match append_cleanup_failure(cause, &cleanup) {
            Error::Panic { message } => {
                assert!(message.starts_with("boom (aborting the capture also failed:"));
                assert!(message.contains("bad"));
            }
            other => panic!("expected Error::Panic, got {other:?}"),
        }
    }

    #[test]
    fn capture_modes_match_cuda_enumerators() {
        // cudaStreamCaptureModeGlobal = 0, ThreadLocal = 1, Relaxed = 2.
        assert_eq!(CaptureMode::Global.to_raw(), 0);
        assert_eq!(CaptureMode::ThreadLocal.to_raw(), 1);
        assert_eq!(CaptureMode::Relaxed.to_raw(), 2);
        assert_eq!(CaptureMode::default(), CaptureMode::ThreadLocal);
    }
}
