//! Raw declarations of the C ABI in `cpp/esper_torch_ext.h`, and the helper
//! that turns its returned error strings into [`crate::Error`].
//!
//! Keep this file in sync with the header by hand: it is small, and a mismatch
//! shows up in the CPU tests (every entry point here is called by one).

use std::ffi::{CStr, c_char, c_void};

use crate::error::{Error, Result};

/// A CUDA stream by value: c10's `CUDAStream::pack3()` triple.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RawStream {
    pub(crate) stream_id: i64,
    pub(crate) device_index: i64,
    pub(crate) device_type: i64,
}

/// Autocast state of one device type, as saved and restored by the guard.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawAutocastState {
    pub(crate) enabled: i32,
    pub(crate) dtype: i32,
    pub(crate) cache_enabled: i32,
}

/// An error string returned by the shim: NULL on success.
pub(crate) type RawError = *mut c_char;

unsafe extern "C" {
    pub(crate) fn esper_free_string(message: *mut c_char);

    // device.cpp
    pub(crate) fn esper_cuda_device_count() -> i32;
    pub(crate) fn esper_cuda_current_device(out: *mut i32) -> RawError;
    pub(crate) fn esper_cuda_set_device(device: i32) -> RawError;
    pub(crate) fn esper_cuda_synchronize(device: i32) -> RawError;
    pub(crate) fn esper_cuda_set_sync_debug_mode(mode: i32) -> RawError;
    pub(crate) fn esper_cuda_get_sync_debug_mode(mode: *mut i32) -> RawError;
    pub(crate) fn esper_cuda_memory_stats(
        device: i32,
        allocated_current: *mut u64,
        allocated_peak: *mut u64,
        reserved_current: *mut u64,
    ) -> RawError;
    pub(crate) fn esper_cuda_reset_peak_memory_stats(device: i32) -> RawError;
    pub(crate) fn esper_cuda_empty_cache() -> RawError;
    pub(crate) fn esper_cuda_device_name(device: i32, name: *mut *mut c_char) -> RawError;
    pub(crate) fn esper_cuda_device_capability(
        device: i32,
        major: *mut i32,
        minor: *mut i32,
    ) -> RawError;
    pub(crate) fn esper_cuda_runtime_versions(runtime: *mut i32, driver: *mut i32) -> RawError;

    pub(crate) fn esper_stream_from_pool(
        device: i32,
        high_priority: i32,
        out: *mut RawStream,
    ) -> RawError;
    pub(crate) fn esper_stream_current(device: i32, out: *mut RawStream) -> RawError;
    pub(crate) fn esper_stream_default(device: i32, out: *mut RawStream) -> RawError;
    pub(crate) fn esper_stream_set_current(stream: RawStream) -> RawError;
    pub(crate) fn esper_stream_synchronize(stream: RawStream) -> RawError;
    pub(crate) fn esper_stream_query(stream: RawStream, done: *mut i32) -> RawError;
    pub(crate) fn esper_stream_wait_stream(waiter: RawStream, other: RawStream) -> RawError;
    pub(crate) fn esper_stream_wait_event(waiter: RawStream, event: *mut c_void) -> RawError;

    pub(crate) fn esper_event_new(enable_timing: i32, out: *mut *mut c_void) -> RawError;
    pub(crate) fn esper_event_free(event: *mut c_void);
    pub(crate) fn esper_event_record(event: *mut c_void, stream: RawStream) -> RawError;
    pub(crate) fn esper_event_synchronize(event: *mut c_void) -> RawError;
    pub(crate) fn esper_event_query(event: *mut c_void, done: *mut i32) -> RawError;
    pub(crate) fn esper_event_elapsed_ms(
        start: *mut c_void,
        end: *mut c_void,
        out: *mut f32,
    ) -> RawError;

    pub(crate) fn esper_copy_(dst: *mut c_void, src: *const c_void, non_blocking: i32) -> RawError;
    pub(crate) fn esper_memcpy_async(dst: *mut c_void, src: *const c_void) -> RawError;

    // graph.cpp
    pub(crate) fn esper_graph_pool_handle(first: *mut u64, second: *mut u64) -> RawError;
    pub(crate) fn esper_graph_new(out: *mut *mut c_void) -> RawError;
    pub(crate) fn esper_graph_free(graph: *mut c_void);
    pub(crate) fn esper_graph_capture_begin(
        graph: *mut c_void,
        pool_first: u64,
        pool_second: u64,
        capture_mode: i32,
    ) -> RawError;
    pub(crate) fn esper_graph_capture_end(graph: *mut c_void) -> RawError;
    pub(crate) fn esper_graph_capture_abort(graph: *mut c_void, stream: RawStream) -> RawError;
    pub(crate) fn esper_graph_pool(
        graph: *mut c_void,
        first: *mut u64,
        second: *mut u64,
    ) -> RawError;
    pub(crate) fn esper_graph_replay(graph: *mut c_void) -> RawError;
    pub(crate) fn esper_graph_summary(graph: *mut c_void, out: *mut *mut c_char) -> RawError;
    pub(crate) fn esper_graph_reset(graph: *mut c_void) -> RawError;
    pub(crate) fn esper_stream_is_capturing(stream: RawStream, capturing: *mut i32) -> RawError;

    // modes.cpp
    pub(crate) fn esper_set_allow_tf32(matmul: i32, cudnn: i32) -> RawError;
    pub(crate) fn esper_get_allow_tf32(matmul: *mut i32, cudnn: *mut i32) -> RawError;
    pub(crate) fn esper_set_float32_matmul_precision(precision: i32) -> RawError;
    pub(crate) fn esper_get_float32_matmul_precision(precision: *mut i32) -> RawError;
    pub(crate) fn esper_set_cudnn_flags(benchmark: i32, deterministic: i32) -> RawError;
    pub(crate) fn esper_get_cudnn_flags(benchmark: *mut i32, deterministic: *mut i32) -> RawError;

    pub(crate) fn esper_inference_mode_enter(out: *mut *mut c_void) -> RawError;
    pub(crate) fn esper_inference_mode_exit(guard: *mut c_void);
    pub(crate) fn esper_inference_mode_is_enabled() -> i32;
    pub(crate) fn esper_tensor_is_inference(tensor: *const c_void, out: *mut i32) -> RawError;

    pub(crate) fn esper_autocast_enter(
        device_type: i32,
        dtype: i32,
        cache_enabled: i32,
        previous: *mut RawAutocastState,
    ) -> RawError;
    pub(crate) fn esper_autocast_exit(device_type: i32, previous: RawAutocastState) -> RawError;
    pub(crate) fn esper_autocast_state(device_type: i32, out: *mut RawAutocastState) -> RawError;

    // fused.cpp
    pub(crate) fn esper_foreach_zero_(tensors: *const *mut c_void, n: i64) -> RawError;
    pub(crate) fn esper_foreach_add_list_(
        tensors: *const *mut c_void,
        others: *const *mut c_void,
        n: i64,
        alpha: f64,
    ) -> RawError;
    pub(crate) fn esper_foreach_add_scalar_(
        tensors: *const *mut c_void,
        n: i64,
        scalar: f64,
    ) -> RawError;
    pub(crate) fn esper_foreach_mul_scalar_(
        tensors: *const *mut c_void,
        n: i64,
        scalar: f64,
    ) -> RawError;
    pub(crate) fn esper_foreach_mul_tensor_(
        tensors: *const *mut c_void,
        n: i64,
        scalar_tensor: *const c_void,
    ) -> RawError;
    pub(crate) fn esper_foreach_copy_(
        dst: *const *mut c_void,
        src: *const *mut c_void,
        n: i64,
        non_blocking: i32,
    ) -> RawError;
    pub(crate) fn esper_foreach_norm(
        tensors: *const *mut c_void,
        n: i64,
        ord: f64,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_contiguous_channels_last(
        tensor: *const c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_set_channels_last_(tensor: *mut c_void, changed: *mut i32) -> RawError;
    pub(crate) fn esper_is_channels_last(tensor: *const c_void, result: *mut i32) -> RawError;
    pub(crate) fn esper_set_grads_to_none(tensors: *const *mut c_void, n: i64) -> RawError;
    pub(crate) fn esper_pin_memory(tensor: *const c_void, out: *mut *mut c_void) -> RawError;
    pub(crate) fn esper_is_pinned(tensor: *const c_void, pinned: *mut i32) -> RawError;
    pub(crate) fn esper_clip_grad_norm_(
        grads: *const *mut c_void,
        n: i64,
        max_norm: f64,
        norm_type: f64,
        total_norm_out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_amp_foreach_non_finite_check_and_unscale_(
        grads: *const *mut c_void,
        n: i64,
        found_inf: *mut c_void,
        inv_scale: *const c_void,
    ) -> RawError;
    pub(crate) fn esper_fused_sgd_(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        momentum_buffers: *const *mut c_void,
        n: i64,
        n_momentum: i64,
        weight_decay: f64,
        momentum: f64,
        lr: f64,
        lr_tensor: *const c_void,
        dampening: f64,
        nesterov: i32,
        maximize: i32,
        is_first_step: i32,
        grad_scale: *const c_void,
        found_inf: *const c_void,
    ) -> RawError;
    pub(crate) fn esper_fused_adamw_(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        state_steps: *const *mut c_void,
        n: i64,
        lr: f64,
        lr_tensor: *const c_void,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        maximize: i32,
        grad_scale: *const c_void,
        found_inf: *const c_void,
    ) -> RawError;

    // dist.cpp
    pub(crate) fn esper_dist_new(
        host: *const c_char,
        port: i32,
        rank: i32,
        world_size: i32,
        backend: i32,
        device_index: i32,
        timeout_ms: i64,
        listen_fd: i32,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_dist_free(group: *mut c_void);
    pub(crate) fn esper_dist_all_reduce(
        group: *mut c_void,
        tensor: *mut c_void,
        op: i32,
    ) -> RawError;
    pub(crate) fn esper_dist_broadcast(
        group: *mut c_void,
        tensor: *mut c_void,
        root: i32,
    ) -> RawError;
    pub(crate) fn esper_dist_barrier(group: *mut c_void) -> RawError;

    // autograd.cpp
    pub(crate) fn esper_backward_with(tensor: *mut c_void, grad: *mut c_void) -> RawError;

    // jit.cpp
    pub(crate) fn esper_jit_compile(
        source: *const c_char,
        name: *const c_char,
        major: i32,
        minor: i32,
        cubin: *mut *mut u8,
        cubin_len: *mut u64,
        log: *mut *mut c_char,
    ) -> RawError;
    pub(crate) fn esper_jit_free_cubin(cubin: *mut u8);
    pub(crate) fn esper_jit_load(
        cubin: *const u8,
        name: *const c_char,
        programmatic: i32,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_jit_unload(kernel: *mut c_void);
    pub(crate) fn esper_jit_launch(
        kernel: *mut c_void,
        device: i32,
        grid: *const u32,
        block: *const u32,
        shared: u32,
        args: *mut *mut c_void,
    ) -> RawError;

    // nn.cpp
    pub(crate) fn esper_batch_norm_relu(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        running_mean: *mut c_void,
        running_var: *mut c_void,
        momentum: f64,
        eps: f64,
        vec: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_batch_norm_relu_pool2(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        running_mean: *mut c_void,
        running_var: *mut c_void,
        momentum: f64,
        eps: f64,
        vec: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_batch_norm_relu_eval(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        running_mean: *mut c_void,
        running_var: *mut c_void,
        eps: f64,
        vec: i32,
        kernel: *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    // profile.cpp
    pub(crate) fn esper_kernel_profile_start() -> RawError;
    pub(crate) fn esper_kernel_profile_stop(
        out: *mut *mut c_char,
        sample_len: i64,
        sample: *mut *mut c_char,
    ) -> RawError;
    pub(crate) fn esper_conv3x3(
        x: *mut c_void,
        weight: *mut c_void,
        bf16: i32,
        vec: i32,
        overlap: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_group_norm_relu(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        residual: *mut c_void,
        groups: i64,
        eps: f64,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_layer_norm(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        eps: f64,
        bf16_out: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_layer_norm_fork(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        eps: f64,
        bf16_out: i32,
        kernels: *const *mut c_void,
        out_pass: *mut *mut c_void,
        out_y: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_linear(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        weight_c: *mut c_void,
        bias_c: *mut c_void,
        bf16: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_embedding(
        weight: *mut c_void,
        ids: *mut c_void,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_causal_attention(
        qkv: *mut c_void,
        heads: i64,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_squeeze_excite(
        x: *mut c_void,
        squeeze: *mut c_void,
        excite: *mut c_void,
        excite_bias: *mut c_void,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_pooled_linear(
        x: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_blend_lerp(
        host: *mut c_void,
        seed: *mut c_void,
        weight: *mut c_void,
        vec: i32,
        clamp: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_blend_lerp_replicated(
        host: *mut c_void,
        seed: *mut c_void,
        weight: *mut c_void,
        replicas: i64,
        vec: i32,
        forward_kernel: *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_blend_lerp_pool2(
        host: *mut c_void,
        seed: *mut c_void,
        weight: *mut c_void,
        channels_last: i32,
        vec: i32,
        clamp: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
    pub(crate) fn esper_conv3x3_fits(
        height: i64,
        width: i64,
        in_channels: i64,
        out_channels: i64,
    ) -> i32;
    pub(crate) fn esper_max_pool2(
        x: *mut c_void,
        channels_last: i32,
        vec: i32,
        kernels: *const *mut c_void,
        out: *mut *mut c_void,
    ) -> RawError;
}

/// Takes ownership of a string the shim allocated and returns it as a `String`.
///
/// # Safety
/// `raw` must be NULL or a pointer returned by the shim that has not been
/// freed yet; it is freed here.
pub(crate) unsafe fn take_string(raw: *mut c_char) -> Option<String> {
    if raw.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `raw` is a live, NUL-terminated string
    // allocated by the shim (esper::make_error / copy_string).
    let text = unsafe { CStr::from_ptr(raw) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: same pointer, released exactly once, by the shim's own `free`.
    unsafe { esper_free_string(raw) };
    Some(text)
}

/// Converts a shim return value into a `Result`, naming the operation.
///
/// # Safety
/// `raw` must come straight from a shim entry point (see [`take_string`]).
pub(crate) unsafe fn check(op: &'static str, raw: RawError) -> Result<()> {
    // SAFETY: forwarded caller guarantee.
    match unsafe { take_string(raw) } {
        None => Ok(()),
        Some(message) => Err(Error::Cpp { op, message }),
    }
}

/// The `at::Tensor*` behind a tch tensor, as the shim's `void*`.
///
/// tch's `C_tensor` is `torch::Tensor` (= `at::Tensor`) in torch-sys'
/// `torch_api.h`, and `Tensor::as_ptr` returns that pointer unchanged.
pub(crate) fn tensor_ptr(tensor: &tch::Tensor) -> *mut c_void {
    tensor.as_ptr() as *mut c_void
}

/// The `at::Tensor*` of every tensor of a slice, for the shim's list arguments.
pub(crate) fn tensor_ptrs(tensors: &[tch::Tensor]) -> Vec<*mut c_void> {
    tensors.iter().map(tensor_ptr).collect()
}
