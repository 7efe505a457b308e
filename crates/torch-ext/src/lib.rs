//! torch-ext: the libtorch pieces tch 0.24 does not wrap, as a small C++ shim
//! plus a safe Rust API.
//!
//! # What is here
//!
//! - [`device`]: the workspace's one device selection ([`DeviceChoice`],
//!   [`device::select`]).
//! - [`cuda`]: availability, device synchronisation, sync-debug mode,
//!   caching-allocator statistics, device name and CUDA versions.
//! - [`CudaStream`] / [`StreamGuard`], [`CudaEvent`]: side streams, making a
//!   stream current, ordering and GPU timing.
//! - [`CudaGraph`] / [`GraphPool`]: CUDA-graph capture and replay
//!   (`at::cuda::CUDAGraph`), with shared memory pools.
//! - [`copy_non_blocking`]: `copy_(src, non_blocking=true)`.
//! - [`precision`]: TF32, float32 matmul precision, cuDNN benchmark and
//!   determinism switches.
//! - [`InferenceModeGuard`], [`AutocastGuard`]: inference mode and autocast
//!   with a chosen dtype (bf16 or fp16, CPU or CUDA).
//! - [`fused`]: `_foreach_*` multi-tensor ops, fused SGD / AdamW steps, AMP
//!   unscale and a read-back-free `clip_grad_norm_`.
//! - [`jit`]: CUDA C kernels compiled at run time with NVRTC and launched on
//!   the current stream (capturable), for fused kernels libtorch lacks;
//!   [`pdl`]: which of them may start before the kernel ahead of them ends.
//! - [`loss`]: mean cross-entropy, its logits gradient and the epoch's
//!   loss/hit counters in two kernels ([`loss::FusedCrossEntropy`]), and
//!   [`loss::backward_with`] (backward from a tensor with a given gradient).
//! - [`nn`]: batch normalisation with ReLU, and the 2x2 max-pool, as fused
//!   kernels with their backward in autograd (libtorch's ops where they do
//!   not apply).
//! - [`profile`]: the CUDA kernels a stretch of work ran and their device
//!   time (libtorch's Kineto), for kernels per step and GPU-busy time.
//! - [`rng`]: leyline's integer hash computed on the device, for counter-based
//!   draws (the epoch shuffle, the policy's noise).
//! - [`dist`]: c10d process groups (TCPStore rendezvous, Gloo on the CPU,
//!   NCCL on CUDA) with all-reduce, broadcast and barrier, for data-parallel
//!   training across processes.
//! - [`launcher`]: which rank this process is, read once from torchrun's (and
//!   esper's launcher's) or Slurm's environment ([`launcher::RankEnv`]); with
//!   [`device::for_rank`] the one owner of ranks and their devices.
//!
//! torch-ext owns the libtorch concerns of the workspace (device selection,
//! streams, graphs, precision, fused kernels) and nothing above them: it knows
//! no model, data set, optimizer policy or telemetry, and depends on no other
//! workspace crate.
//!
//! On a machine without CUDA every CUDA-only function returns
//! [`Error::CudaUnavailable`]; nothing crashes. Precision switches, modes,
//! copies and the fused ops work on CPU too.
//!
//! # The shim
//!
//! `build.rs` compiles `cpp/*.cpp` with the `cc` crate against the libtorch
//! that `LIBTORCH` points at (set by `.cargo/config.toml`), with
//! `-std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1`, and links `torch_cuda`, `c10_cuda`
//! and `libcudart.so.13`. `cpp/esper_torch_ext.h` is the whole C ABI; `src/ffi.rs`
//! declares it on the Rust side. Conventions:
//!
//! - Every fallible C entry point wraps its body in `try { } catch (...)` and
//!   returns NULL or a heap error message (turned into [`Error::Cpp`] and
//!   freed by `ffi::check`). No C++ exception crosses into Rust.
//! - Tensors cross as the `at::Tensor*` that tch's `Tensor::as_ptr` returns
//!   (tch's `C_tensor` is `torch::Tensor`); tensors created by the shim are
//!   `new at::Tensor` handed to `Tensor::from_ptr`, which owns and frees them.
//! - Streams cross by value (c10's `pack3` triple); events, graphs and the
//!   inference-mode guard are opaque heap objects freed exactly once in `Drop`.
//! - No Rust callback is ever invoked from C++: a graph capture calls
//!   `capture_begin`, runs the body in Rust under `catch_unwind`, then calls
//!   `capture_end` or the clean-abort entry point.
//!
//! # Safety argument
//!
//! Each `unsafe` block carries a `// SAFETY:` comment. They rely on: (1) the
//! header and `ffi.rs` agreeing (checked by the CPU tests, which call every
//! entry point); (2) pointers passed in being live for the call, which holds
//! because they come from borrowed tch tensors, slices, or owned handles;
//! (3) owned handles being freed exactly once (`NonNull` fields, freed only in
//! `Drop`); (4) thread-local libtorch state (current stream, inference mode,
//! autocast) being changed and restored on one thread, enforced by making
//! those guards `!Send`.
//!
//! # Capture rules
//!
//! See [`graph`]: warm up on the same side stream you capture on (the capture
//! function does it for you), never read values back inside the body, write
//! results into pre-allocated tensors, keep optimizer state on the device
//! (e.g. [`fused::adamw_step`]'s device step counts), share one [`GraphPool`]
//! between graphs replayed in capture order. Captures use
//! `cudaStreamCaptureModeThreadLocal` by default (see [`CaptureMode`]).

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

mod adamw_kernel;
mod autocast;
mod copy;
pub mod cuda;
pub mod device;
pub mod dist;
mod error;
mod event;
mod ffi;
mod foreach_kernel;
pub mod fused;
pub mod graph;
mod inference;
pub mod jit;
pub mod launcher;
pub mod loss;
pub mod memory;
pub mod nn;
pub mod pdl;
pub mod precision;
pub mod profile;
pub mod rng;
mod sgd_kernel;
mod stream;

pub use autocast::{AutocastDevice, AutocastGuard, AutocastState, autocast_state};
pub use copy::{copy_non_blocking, index_copy_many, memcpy_async, write_host_bytes};
pub use device::DeviceChoice;
pub use error::{Error, Result};
pub use event::CudaEvent;
pub use graph::{CaptureMode, CudaGraph, GraphPool};
pub use inference::{InferenceModeGuard, is_inference, is_inference_mode_enabled};
pub use stream::{CudaStream, StreamGuard};
