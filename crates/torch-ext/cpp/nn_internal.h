// nn_internal.h: what the shim's layer sources (nn*.cpp) share: the block
// size, kernel handles kept in an autograd node, the current stream,
// launch-shape helpers, the fixed-order sum of per-block partials, and
// side-stream work of a backward node.
#pragma once

#include "jit_internal.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace esper::nn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kThreads = 256;

inline void* handle(AutogradContext* ctx, const char* key) {
  return reinterpret_cast<void*>(static_cast<intptr_t>(ctx->saved_data[key].toInt()));
}

inline cudaStream_t stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

inline int sm_count(const at::Tensor& t) {
  return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount;
}

// Rows one block pass of a per-channel kernel covers: the kernels' `per`,
// the largest power of two with per * (C / vec) <= kThreads.
inline int rows_per_pass(int channels, int vec) {
  const int groups = channels / vec;
  int per = 1;
  while (per * 2 * groups <= kThreads) {
    per *= 2;
  }
  return per;
}

// Blocks of a per-channel pass: about eight rows a thread (two unrolled
// iterations of four), at most two blocks an SM.
inline int channel_blocks(int64_t rows, int per, int sms) {
  const int64_t wanted = (rows + 8 * per - 1) / (8 * per);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, 2 * sms)));
}

// The kernels load four channels at once with 16-byte accesses where vec is
// 4: a gradient that arrives as an unaligned view is copied first.
inline at::Tensor aligned(at::Tensor t, at::MemoryFormat format) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) {
    return t.clone(format);
  }
  return t;
}

inline int elementwise_blocks(int64_t n, int sms) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, 8 * sms)));
}

inline bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// A kernel handle as an autograd argument (custom functions take no raw
// pointers).
inline int64_t as_int(void* kernel) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(kernel)); }

// Whether the device's current stream is being captured into a graph.
inline bool capturing(c10::DeviceIndex device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error =
      cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(device).stream(), &status);
  return error == cudaSuccess && status == cudaStreamCaptureStatusActive;
}

// Work a backward node queues on a side stream (side_stream.cpp): with
// `active`, the side stream waits for everything the device's current
// (main) stream has queued, and `finish` makes the main stream (and the
// current stream of the caller's backward call) wait for the side work
// when the backward pass ends, keeping the storages of `keep` (every
// tensor the side work reads or writes) alive until then. Only for work
// nothing else in the pass reads. Inactive, `stream()` is the main stream
// and `finish` does nothing.
class SideWork {
 public:
  SideWork(bool active, c10::DeviceIndex device);
  cudaStream_t stream() const { return side_.stream(); }
  void finish(const std::vector<at::Tensor>& keep);

 private:
  c10::cuda::CUDAStream main_;
  c10::cuda::CUDAStream side_;
  bool active_;
};

// f32 [out_size] into `sums`: the sums over `blocks` of the f32 partials
// ([blocks, out_size]), added up in block order by the convolution
// source's reduction kernel (`reduce`).
inline void sum_partials_into(void* reduce, const at::Tensor& partials, int blocks, int out_size,
                              void* sums, cudaStream_t stream) {
  const void* partials_ptr = partials.data_ptr();
  void* args[] = {&partials_ptr, &sums, &blocks, &out_size};
  esper::jit_launch(reduce, dim3((out_size + 31) / 32), dim3(kThreads), 0, args, stream);
}

// f32 [out_size]: the sums over `blocks` of the f32 partials
// ([blocks, out_size]), added up in block order by the convolution
// source's reduction kernel (`reduce`).
inline at::Tensor sum_partials(void* reduce, const at::Tensor& partials, int blocks, int out_size,
                               cudaStream_t stream) {
  at::Tensor sums = at::empty({static_cast<int64_t>(out_size)}, partials.options());
  sum_partials_into(reduce, partials, blocks, out_size, sums.data_ptr(), stream);
  return sums;
}

// The weight and bias gradients of a normalisation from its blocks' partial
// sums (`partials`: f32 [blocks, 2C], C weight sums then C bias sums),
// added up in block order by the convolution source's reduction kernel
// (`reduce`), in the parameters' dtypes: (dweight, dbias).
inline std::pair<at::Tensor, at::Tensor> weight_bias_from_partials(
    void* reduce, const at::Tensor& partials, int blocks, int channels, const at::Tensor& weight,
    const at::Tensor& bias, cudaStream_t stream) {
  at::Tensor sums = sum_partials(reduce, partials, blocks, 2 * channels, stream);
  return {sums.narrow(0, 0, channels).to(weight.scalar_type()),
          sums.narrow(0, channels, channels).to(bias.scalar_type())};
}

}  // namespace esper::nn
