// nn_internal.h: what the shim's layer sources (nn*.cpp) share: the block
// size, kernel handles kept in an autograd node, the current stream,
// launch-shape helpers, and the fixed-order sum of per-block partials.
#pragma once

#include "jit_internal.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <utility>

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

// How the reduction kernel splits a sum of `blocks` partials of
// `out_size` floats: `lanes` outputs a block (32, fewer where that leaves
// under 64 blocks) and `slices` of the partials (a power of two, as many as
// leave each thread at most 8 loads, 1024 threads a block at most). From the
// sizes alone, so a sum's order is the same on every device.
struct ReducePlan {
  int lanes = 32;
  int slices = 8;
};

inline ReducePlan reduce_plan(int blocks, int out_size) {
  ReducePlan plan;
  while (plan.lanes > 8 && (out_size + plan.lanes - 1) / plan.lanes < 64) {
    plan.lanes /= 2;
  }
  while (plan.slices * plan.lanes < 1024 && plan.slices * 8 < blocks) {
    plan.slices *= 2;
  }
  return plan;
}

// f32 [out_size]: the sums over `blocks` of the f32 partials
// ([blocks, out_size]), added up in a fixed order (reduce_plan) by the
// convolution source's reduction kernel (`reduce`).
inline at::Tensor sum_partials(void* reduce, const at::Tensor& partials, int blocks, int out_size,
                               cudaStream_t stream) {
  at::Tensor sums = at::empty({static_cast<int64_t>(out_size)}, partials.options());
  const void* partials_ptr = partials.data_ptr();
  void* sums_ptr = sums.data_ptr();
  ReducePlan plan = reduce_plan(blocks, out_size);
  void* args[] = {&partials_ptr, &sums_ptr, &blocks, &out_size, &plan.lanes};
  esper::jit_launch(reduce, dim3((out_size + plan.lanes - 1) / plan.lanes),
                    dim3(plan.lanes * plan.slices), 0, args, stream);
  return sums;
}

// The weight and bias gradients of a normalisation from its blocks' partial
// sums (`partials`: f32 [blocks, 2C], C weight sums then C bias sums),
// added up in a fixed order by the convolution source's reduction kernel
// (`reduce`), in the parameters' dtypes: (dweight, dbias).
inline std::pair<at::Tensor, at::Tensor> weight_bias_from_partials(
    void* reduce, const at::Tensor& partials, int blocks, int channels, const at::Tensor& weight,
    const at::Tensor& bias, cudaStream_t stream) {
  at::Tensor sums = sum_partials(reduce, partials, blocks, 2 * channels, stream);
  return {sums.narrow(0, 0, channels).to(weight.scalar_type()),
          sums.narrow(0, channels, channels).to(bias.scalar_type())};
}

}  // namespace esper::nn
