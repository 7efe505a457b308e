// esper_torch_ext.h: the C ABI between the torch-ext C++ shim and Rust.
//
// Conventions (mirrored by src/ffi.rs, which must be kept in sync by hand):
// - Every fallible entry point returns `char*`: NULL on success, otherwise a
//   heap-allocated, NUL-terminated error message that the caller releases
//   with esper_free_string. No C++ exception ever crosses this boundary.
// - Tensors are passed as `void*` pointing at an `at::Tensor` (tch's
//   `C_tensor`); tensors the shim returns are `new at::Tensor` that tch's
//   `Tensor::from_ptr` takes ownership of.
// - Streams travel by value as EsperStream (c10's pack3 triple); events and
//   graphs are opaque heap objects with an explicit free function.
// - CUDA entry points assume the caller (Rust) already checked that a CUDA
//   device exists; they still fail with a message rather than crash.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct EsperStream {
  int64_t stream_id;
  int64_t device_index;
  int64_t device_type;
} EsperStream;

typedef struct EsperAutocastState {
  int32_t enabled;
  int32_t dtype;
  int32_t cache_enabled;
} EsperAutocastState;

void esper_free_string(char* message);

// ---- device.cpp: devices, memory, streams, events, copies ----
int32_t esper_cuda_device_count(void);
char* esper_cuda_current_device(int32_t* out);
char* esper_cuda_set_device(int32_t device);
char* esper_cuda_synchronize(int32_t device);
char* esper_cuda_set_sync_debug_mode(int32_t mode);
char* esper_cuda_get_sync_debug_mode(int32_t* mode);
char* esper_cuda_memory_stats(int32_t device, uint64_t* allocated_current,
                              uint64_t* allocated_peak, uint64_t* reserved_current);
char* esper_cuda_reset_peak_memory_stats(int32_t device);
char* esper_cuda_empty_cache(void);
char* esper_cuda_device_name(int32_t device, char** name);
char* esper_cuda_device_capability(int32_t device, int32_t* major, int32_t* minor);
char* esper_cuda_runtime_versions(int32_t* runtime, int32_t* driver);

char* esper_stream_from_pool(int32_t device, int32_t high_priority, EsperStream* out);
char* esper_stream_current(int32_t device, EsperStream* out);
char* esper_stream_default(int32_t device, EsperStream* out);
char* esper_stream_set_current(EsperStream stream);
char* esper_stream_synchronize(EsperStream stream);
char* esper_stream_query(EsperStream stream, int32_t* done);
char* esper_stream_wait_stream(EsperStream waiter, EsperStream other);
char* esper_stream_wait_event(EsperStream waiter, void* event);

char* esper_event_new(int32_t enable_timing, void** out);
void esper_event_free(void* event);
char* esper_event_record(void* event, EsperStream stream);
char* esper_event_synchronize(void* event);
char* esper_event_query(void* event, int32_t* done);
char* esper_event_elapsed_ms(void* start, void* end, float* out);

char* esper_copy_(void* dst, const void* src, int32_t non_blocking);
char* esper_memcpy_async(void* dst, const void* src);

// ---- graph.cpp: CUDA graphs ----
char* esper_graph_pool_handle(uint64_t* first, uint64_t* second);
char* esper_graph_new(void** out);
void esper_graph_free(void* graph);
char* esper_graph_capture_begin(void* graph, uint64_t pool_first, uint64_t pool_second,
                                int32_t capture_mode);
char* esper_graph_capture_end(void* graph);
char* esper_graph_summary(void* graph, char** out);
char* esper_graph_capture_abort(void* graph, EsperStream stream);
char* esper_graph_pool(void* graph, uint64_t* first, uint64_t* second);
char* esper_graph_replay(void* graph);
char* esper_graph_reset(void* graph);
char* esper_stream_is_capturing(EsperStream stream, int32_t* capturing);

// ---- modes.cpp: precision flags, inference mode, autocast ----
char* esper_set_allow_tf32(int32_t matmul, int32_t cudnn);
char* esper_get_allow_tf32(int32_t* matmul, int32_t* cudnn);
char* esper_set_float32_matmul_precision(int32_t precision);
char* esper_get_float32_matmul_precision(int32_t* precision);
char* esper_set_cudnn_flags(int32_t benchmark, int32_t deterministic);
char* esper_get_cudnn_flags(int32_t* benchmark, int32_t* deterministic);

char* esper_inference_mode_enter(void** out);
void esper_inference_mode_exit(void* guard);
int32_t esper_inference_mode_is_enabled(void);
char* esper_tensor_is_inference(const void* tensor, int32_t* out);

char* esper_autocast_enter(int32_t device_type, int32_t dtype, int32_t cache_enabled,
                           EsperAutocastState* previous);
char* esper_autocast_exit(int32_t device_type, EsperAutocastState previous);
char* esper_autocast_state(int32_t device_type, EsperAutocastState* out);

// ---- fused.cpp: multi-tensor (foreach) and fused optimizer kernels ----
char* esper_foreach_zero_(void* const* tensors, int64_t n);
char* esper_foreach_add_list_(void* const* tensors, void* const* others, int64_t n, double alpha);
char* esper_foreach_add_scalar_(void* const* tensors, int64_t n, double scalar);
char* esper_foreach_mul_scalar_(void* const* tensors, int64_t n, double scalar);
char* esper_foreach_mul_tensor_(void* const* tensors, int64_t n, const void* scalar_tensor);
char* esper_foreach_copy_(void* const* dst, void* const* src, int64_t n, int32_t non_blocking);
char* esper_foreach_norm(void* const* tensors, int64_t n, double ord, void** out);
char* esper_clip_grad_norm_(void* const* grads, int64_t n, double max_norm, double norm_type,
                            void** total_norm_out);
char* esper_amp_foreach_non_finite_check_and_unscale_(void* const* grads, int64_t n,
                                                      void* found_inf, const void* inv_scale);
char* esper_fused_sgd_(void* const* params, void* const* grads, void* const* momentum_buffers,
                       int64_t n, int64_t n_momentum, double weight_decay, double momentum,
                       double lr, const void* lr_tensor, double dampening, int32_t nesterov,
                       int32_t maximize, int32_t is_first_step, const void* grad_scale,
                       const void* found_inf);
char* esper_fused_adamw_(void* const* params, void* const* grads, void* const* exp_avgs,
                         void* const* exp_avg_sqs, void* const* state_steps, int64_t n,
                         double lr, const void* lr_tensor, double beta1, double beta2,
                         double weight_decay, double eps, int32_t maximize,
                         const void* grad_scale, const void* found_inf);

char* esper_contiguous_channels_last(const void* tensor, void** out);
char* esper_set_channels_last_(void* tensor, int32_t* changed);
char* esper_is_channels_last(const void* tensor, int32_t* result);
char* esper_set_grads_to_none(void* const* tensors, int64_t n);
char* esper_pin_memory(const void* tensor, void** out);
char* esper_is_pinned(const void* tensor, int32_t* pinned);

// ---- dist.cpp: c10d process groups (TCPStore rendezvous; Gloo or NCCL) ----
// backend: 0 = Gloo (CPU tensors), 1 = NCCL (CUDA tensors on device_index).
// op: 0 = sum, 1 = max, 2 = min. Collectives are in place and blocking for
// Gloo; for NCCL they order the caller's current stream after the collective.
// listen_fd: -1, or (rank 0 only) a socket already bound to `port` and
// listening, which the store serves and takes over.
char* esper_dist_new(const char* host, int32_t port, int32_t rank, int32_t world_size,
                     int32_t backend, int32_t device_index, int64_t timeout_ms,
                     int32_t listen_fd, void** out);
void esper_dist_free(void* group);
char* esper_dist_all_reduce(void* group, void* tensor, int32_t op);
char* esper_dist_broadcast(void* group, void* tensor, int32_t root);
char* esper_dist_barrier(void* group);

// ---- autograd.cpp: backward with an explicit gradient ----
char* esper_backward_with(void* tensor, void* grad);

// ---- jit.cpp: CUDA C compiled at run time (NVRTC) and launched ----
// compile: source -> cubin for sm_<major><minor> (no GPU needed); the cubin is
// malloc'ed (free with esper_jit_free_cubin); *log gets NVRTC's log or NULL.
// load: a cubin's kernel `name` as an opaque handle (esper_jit_unload frees).
// launch: on the current stream of `device`; args as cudaLaunchKernel takes.
char* esper_jit_compile(const char* source, const char* name, int32_t major, int32_t minor,
                        uint8_t** cubin, uint64_t* cubin_len, char** log);
void esper_jit_free_cubin(uint8_t* cubin);
char* esper_jit_load(const uint8_t* cubin, const char* name, int32_t programmatic, void** out);
void esper_jit_unload(void* kernel);
char* esper_jit_launch(void* kernel, int32_t device, const uint32_t* grid, const uint32_t* block,
                       uint32_t shared, void** args);

// ---- nn.cpp: fused layers as autograd functions over jit kernels ----
// batch_norm_relu: relu(batch_norm(x)) with batch statistics, x a
// channels-last 4-D CUDA tensor; kernels = {stats, forward, backward reduce,
// backward apply} (loaded jit kernels for x's dtype); running stats may be
// NULL. vec: channels each thread moves (4 or 1), as the kernels were
// compiled. max_pool2: 2x2 stride-2 max-pool of a contiguous 4-D CUDA tensor
// (channels_last selects NHWC); kernels = {forward, backward}. *out gets a
// new tensor.
char* esper_batch_norm_relu(void* x, void* weight, void* bias, void* running_mean,
                            void* running_var, double momentum, double eps, int32_t vec,
                            void* const* kernels, void** out);
// batch_norm_relu_pool2: max_pool2d(relu(batch_norm(x)), 2, 2) as one node,
// as batch_norm_relu with kernels = {stats, pooled forward, pooled backward
// reduce, pooled backward apply}; x has at least 2 x 2 pixels.
char* esper_batch_norm_relu_pool2(void* x, void* weight, void* bias, void* running_mean,
                                  void* running_var, double momentum, double eps, int32_t vec,
                                  void* const* kernels, void** out);
// batch_norm_relu_eval: relu(batch_norm(x)) from the running statistics
// (evaluation mode), one kernel (esper_bn_relu_eval); libtorch's ops where a
// gradient is wanted.
char* esper_batch_norm_relu_eval(void* x, void* weight, void* bias, void* running_mean,
                                 void* running_var, double eps, int32_t vec, void* kernel,
                                 void** out);
char* esper_max_pool2(void* x, int32_t channels_last, int32_t vec, void* const* kernels,
                      void** out);
// conv3x3: 3x3 convolution, stride 1, padding 1, no bias, of a channels-last
// CUDA tensor computed in bf16 (bf16 != 0; autocast's casts applied here)
// or f32; kernels = {wgrad partial, wgrad reduce, small forward, direct,
// wgrad mma, then the nine direct kernels for 8/16/32 x 8/16/32 channels};
// overlap != 0: a leaf weight's gradient may run on a side stream, joined
// when the backward pass ends (torch_ext::nn::set_overlapped_weight_grads).
// conv3x3_fits: whether its weight-gradient band fits in shared memory.
char* esper_conv3x3(void* x, void* weight, int32_t bf16, int32_t vec, int32_t overlap,
                    void* const* kernels, void** out);
int32_t esper_conv3x3_fits(int64_t height, int64_t width, int64_t in_channels,
                           int64_t out_channels);
// relu(group_norm(x, groups, weight, bias, eps)) over a channels-last
// CUDA tensor, plus residual where it is not null (of x's shape, dtype and
// layout); kernels: forward, backward, reduction (nn_group_norm.cpp).
char* esper_group_norm_relu(void* x, void* weight, void* bias, void* residual, int64_t groups,
                            double eps, void* const* kernels, void** out);
// layer_norm(x, [C], weight, bias, eps) over the last dimension of a dense
// f32 or bf16 CUDA tensor (C a multiple of 4, at most 512); kernels:
// forward, backward, reduction (nn_layer_norm.cpp); bf16_out: an f32 input
// gives a bf16 output (the kernels are then the `_bf16_out` ones).
char* esper_layer_norm(void* x, void* weight, void* bias, double eps, int32_t bf16_out,
                       void* const* kernels, void** out);
// (x, layer_norm(x)) as one autograd node for a layer norm that forks a
// residual stream: the backward adds the pass-through's gradient inside the
// layer norm's backward kernel. Arguments as esper_layer_norm; the outputs
// in out_pass (a view of x) and out_y.
char* esper_layer_norm_fork(void* x, void* weight, void* bias, double eps, int32_t bf16_out,
                            void* const* kernels, void** out_pass, void** out_y);
// linear(x, weight, bias) over the last dimension of an f32 or bf16 CUDA
// tensor (bias may be null; out features a multiple of 4, at most 1024),
// computed in bf16 when bf16 is set (autocast's casts applied inside, or
// the weight's and bias's bf16 shadows where weight_c / bias_c are not
// null); kernels: column sums, reduction, and the bf16 weight-and-bias
// gradient kernel or null (nn_linear.cpp).
char* esper_linear(void* x, void* weight, void* bias, void* weight_c, void* bias_c, int32_t bf16,
                   void* const* kernels, void** out);
// embedding(weight, ids) for a contiguous f32 or bf16 CUDA weight [V, C]
// (V at most 65535, C at most 512) and int64 ids; kernels: backward,
// reduction (nn_embedding.cpp).
char* esper_embedding(void* weight, void* ids, void* const* kernels, void** out);
// Causal self-attention over a contiguous bf16 CUDA projection qkv
// [B, T, 3C] (T at most 64, heads of 16 or 32 values): the merged output
// [B, T, C]; kernels: forward, backward for the head width
// (nn_attention.cpp).
char* esper_causal_attention(void* qkv, int64_t heads, void* const* kernels, void** out);
// lerp(host, seed, weight) with one f32 weight per sample ([N] or [1]) read
// on the device (clamped to [0, 1] as read when clamp is nonzero); host and
// seed share one dense layout; kernels: forward, backward (nn_blend.cpp).
char* esper_blend_lerp(void* host, void* seed, void* weight, int32_t vec, int32_t clamp,
                       void* const* kernels, void** out);
char* esper_blend_lerp_replicated(void* host, void* seed, void* weight, int64_t replicas,
                                  int32_t vec, void* forward_kernel, void** out);
// max_pool2d(lerp(host, seed, weight), 2, 2) (floor) of 4-D host and seed in
// one layout (channels-last when channels_last is nonzero, else contiguous
// NCHW with vec 1), weight and clamp as esper_blend_lerp's; kernels:
// forward, backward (nn_blend.cpp).
char* esper_blend_lerp_pool2(void* host, void* seed, void* weight, int32_t channels_last,
                             int32_t vec, int32_t clamp, void* const* kernels, void** out);
// Squeeze-and-excite x * sigmoid(excite relu(squeeze mean_hw(x)) + bias)
// over a channels-last f32 or bf16 CUDA tensor [B, C, H, W] (C <= 256),
// squeeze f32 [R, C] (R <= 64), excite f32 [C, R], bias f32 [C]; kernels:
// forward, backward, reduction (nn_excite.cpp).
char* esper_squeeze_excite(void* x, void* squeeze, void* excite, void* excite_bias,
                           void* const* kernels, void** out);
// Global average pool then linear, mean_hw(x) weight^T + bias, over a
// channels-last f32 or bf16 CUDA tensor [B, C, H, W] (C <= 1024), weight
// f32 [K, C] (K <= 64), bias f32 [K]; kernels: forward, backward
// (nn_pooled.cpp).
char* esper_pooled_linear(void* x, void* weight, void* bias, void* const* kernels, void** out);

// ---- profile.cpp: CUDA kernels run between start and stop (Kineto) ----
// stop: *out gets "name\tcount\ttotal_ns\n" lines, one per kernel or copy
// name (free with esper_free_string).
char* esper_kernel_profile_start(void);
// *sample gets `sample_len` consecutive launches from the middle of the
// run, in start order, as "name\t1\tns\n" lines.
char* esper_kernel_profile_stop(char** out, int64_t sample_len, char** sample);

#ifdef __cplusplus
}
#endif
