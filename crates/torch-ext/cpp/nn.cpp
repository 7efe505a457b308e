// nn.cpp: fused network layers as autograd functions whose forward and
// backward launch run-time compiled kernels (src/nn.rs holds their source,
// compiles and loads them, checks every argument, and passes the loaded
// kernels here as handles).
//
// - batch norm (training statistics) + ReLU over a channels-last 4-D tensor:
//   two kernels forward (per-block sums of the shifted values and their
//   squares; every block of the second adds them up in one fixed order,
//   normalises and applies ReLU, block 0 also writing the saved statistics
//   and the running ones), two backward (per-block sums of the gradient and
//   of gradient x normalised input, then the input gradient, with block 0
//   writing the weight and bias gradients);
// - 2x2 max-pool with stride 2 (floor) over a contiguous NCHW or NHWC
//   tensor: one kernel forward, one backward that recomputes each window's
//   argmax from the saved input instead of keeping indices.
// Where the channel count allows (`vec` 4), each thread moves four channels
// with one 16-byte (8-byte in bf16) access.
//
// Nothing is read back and no scratch outlives a call, so both can be
// captured in a CUDA graph and may run on several streams at once.
#include "esper_torch_ext.h"
#include "error.h"
#include "jit_internal.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kThreads = 256;

void* handle(AutogradContext* ctx, const char* key) {
  return reinterpret_cast<void*>(static_cast<intptr_t>(ctx->saved_data[key].toInt()));
}

cudaStream_t stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

int sm_count(const at::Tensor& t) {
  return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount;
}

// Rows one block pass of a per-channel kernel covers: the kernels' `per`,
// the largest power of two with per * (C / vec) <= kThreads.
int rows_per_pass(int channels, int vec) {
  const int groups = channels / vec;
  int per = 1;
  while (per * 2 * groups <= kThreads) {
    per *= 2;
  }
  return per;
}

// Blocks of a per-channel pass: about eight rows a thread (two unrolled
// iterations of four), at most two blocks an SM.
int channel_blocks(int64_t rows, int per, int sms) {
  const int64_t wanted = (rows + 8 * per - 1) / (8 * per);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, 2 * sms)));
}

// The kernels load four channels at once with 16-byte accesses where vec is
// 4: a gradient that arrives as an unaligned view is copied first.
at::Tensor aligned(at::Tensor t, at::MemoryFormat format) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) {
    return t.clone(format);
  }
  return t;
}

int elementwise_blocks(int64_t n, int sms) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, 8 * sms)));
}

class BatchNormRelu : public torch::autograd::Function<BatchNormRelu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean,
                            at::Tensor running_var, double momentum, double eps, int64_t vec,
                            int64_t stats_kernel, int64_t forward_kernel, int64_t reduce_kernel,
                            int64_t apply_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    long long rows = x.size(0) * x.size(2) * x.size(3);
    int channels = static_cast<int>(x.size(1));
    int blocks = channel_blocks(rows, rows_per_pass(channels, static_cast<int>(vec)), sm_count(x));
    auto f32 = x.options().dtype(at::kFloat);
    at::Tensor partials = at::empty({static_cast<int64_t>(blocks) * channels * 2}, f32);
    at::Tensor save_mean = at::empty({channels}, f32);
    at::Tensor save_invstd = at::empty({channels}, f32);
    at::Tensor y = at::empty_like(x);
    const void* x_ptr = x.data_ptr();
    void* y_ptr = y.data_ptr();
    void* partials_ptr = partials.data_ptr();
    cudaStream_t stream = stream_of(x);
    {
      void* args[] = {&x_ptr, &partials_ptr, &rows, &channels};
      esper::jit_launch(reinterpret_cast<void*>(stats_kernel), dim3(blocks), dim3(kThreads), 0,
                        args, stream);
    }
    {
      const void* w = weight.data_ptr();
      const void* b = bias.data_ptr();
      void* sm = save_mean.data_ptr();
      void* si = save_invstd.data_ptr();
      void* rm = running_mean.numel() > 0 ? running_mean.data_ptr() : nullptr;
      void* rv = running_var.numel() > 0 ? running_var.data_ptr() : nullptr;
      float m = static_cast<float>(momentum);
      float e = static_cast<float>(eps);
      void* args[] = {&x_ptr, &y_ptr, &partials_ptr, &blocks, &w,   &b,    &sm,
                      &si,    &rm,    &rv,           &m,      &e,   &rows, &channels};
      esper::jit_launch(reinterpret_cast<void*>(forward_kernel), dim3(blocks), dim3(kThreads), 0,
                        args, stream);
    }
    ctx->save_for_backward({x, weight, bias, save_mean, save_invstd});
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["reduce"] = reduce_kernel;
    ctx->saved_data["apply"] = apply_kernel;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& bias = saved[2];
    const at::Tensor& save_mean = saved[3];
    const at::Tensor& save_invstd = saved[4];
    variable_list out(12);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor dy = aligned(grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast),
                            at::MemoryFormat::ChannelsLast);
    long long rows = x.size(0) * x.size(2) * x.size(3);
    int channels = static_cast<int>(x.size(1));
    int vec = static_cast<int>(ctx->saved_data["vec"].toInt());
    int blocks = channel_blocks(rows, rows_per_pass(channels, vec), sm_count(x));
    auto f32 = x.options().dtype(at::kFloat);
    at::Tensor partials = at::empty({static_cast<int64_t>(blocks) * channels * 2}, f32);
    at::Tensor dx = at::empty_like(x);
    at::Tensor dweight = at::empty({channels}, f32);
    at::Tensor dbias = at::empty({channels}, f32);
    const void* x_ptr = x.data_ptr();
    const void* dy_ptr = dy.data_ptr();
    const void* w = weight.data_ptr();
    const void* b = bias.data_ptr();
    const void* sm = save_mean.data_ptr();
    const void* si = save_invstd.data_ptr();
    void* partials_ptr = partials.data_ptr();
    cudaStream_t stream = stream_of(x);
    {
      void* args[] = {&x_ptr, &dy_ptr, &sm, &si, &w, &b, &partials_ptr, &rows, &channels};
      esper::jit_launch(handle(ctx, "reduce"), dim3(blocks), dim3(kThreads), 0, args, stream);
    }
    {
      void* dx_ptr = dx.data_ptr();
      void* dw = dweight.data_ptr();
      void* db = dbias.data_ptr();
      void* args[] = {&x_ptr, &dy_ptr, &dx_ptr, &partials_ptr, &blocks, &sm,       &si,
                      &w,     &b,      &dw,     &db,           &rows,   &channels};
      esper::jit_launch(handle(ctx, "apply"), dim3(blocks), dim3(kThreads), 0, args, stream);
    }
    out[0] = dx;
    out[1] = dweight.to(weight.scalar_type());
    out[2] = dbias.to(bias.scalar_type());
    return out;
  }
};

class MaxPool2 : public torch::autograd::Function<MaxPool2> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, bool channels_last,
                            int64_t vec, int64_t forward_kernel, int64_t backward_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    int n = static_cast<int>(x.size(0));
    int channels = static_cast<int>(x.size(1));
    int height = static_cast<int>(x.size(2));
    int width = static_cast<int>(x.size(3));
    at::Tensor y = at::empty({n, channels, height / 2, width / 2}, x.options().memory_format(format));
    if (y.numel() > 0) {
      const void* x_ptr = x.data_ptr();
      void* y_ptr = y.data_ptr();
      int cl = channels_last ? 1 : 0;
      void* args[] = {&x_ptr, &y_ptr, &n, &channels, &height, &width, &cl};
      esper::jit_launch(reinterpret_cast<void*>(forward_kernel),
                        dim3(elementwise_blocks(y.numel() / vec, sm_count(x))), dim3(kThreads), 0,
                        args, stream_of(x));
    }
    ctx->save_for_backward({x});
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["channels_last"] = channels_last;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    variable_list out(5);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(x.device());
    bool channels_last = ctx->saved_data["channels_last"].toBool();
    auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    at::Tensor gy = aligned(grads[0].to(x.scalar_type()).contiguous(format), format);
    int vec = static_cast<int>(ctx->saved_data["vec"].toInt());
    if (gy.numel() == 0) {
      // No window: every input gradient is zero.
      out[0] = at::zeros_like(x);
      return out;
    }
    // Each window's thread writes all its inputs' gradients (and the edge
    // row and column a floor pool leaves out), so nothing needs zeroing.
    at::Tensor gx = at::empty_like(x);
    {
      const void* x_ptr = x.data_ptr();
      const void* gy_ptr = gy.data_ptr();
      void* gx_ptr = gx.data_ptr();
      int n = static_cast<int>(x.size(0));
      int channels = static_cast<int>(x.size(1));
      int height = static_cast<int>(x.size(2));
      int width = static_cast<int>(x.size(3));
      int cl = channels_last ? 1 : 0;
      void* args[] = {&x_ptr, &gy_ptr, &gx_ptr, &n, &channels, &height, &width, &cl};
      esper::jit_launch(handle(ctx, "backward"),
                        dim3(elementwise_blocks(gy.numel() / vec, sm_count(x))), dim3(kThreads), 0,
                        args, stream_of(x));
    }
    out[0] = gx;
    return out;
  }
};

// Most input channels the direct forward kernel takes (its weights, at most
// 256 x 9 x 4 floats, sit in shared memory).
constexpr int kSmallConvInputChannels = 4;

// Floats of shared memory a weight-gradient block may stage (48 KiB, the
// default dynamic limit).
constexpr int kConvSharedFloats = 12 * 1024;

// The rows of one weight-gradient band: as many as fit in shared memory
// (the dy rows and the x rows around them); 0 when not even one does.
int conv_band_rows(int height, int width, int in_channels, int out_channels) {
  for (int rows = height; rows >= 1; --rows) {
    const int64_t floats = static_cast<int64_t>(rows) * width * out_channels +
                           static_cast<int64_t>(rows + 2) * (width + 2) * in_channels;
    if (floats <= kConvSharedFloats) {
      return rows;
    }
  }
  return 0;
}

// Most channels (in or out) the direct convolution kernel takes (its
// accumulators and shared memory); wider layers are cuDNN's.
constexpr int kDirectMaxChannels = 64;

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Rows of one direct-convolution band (the weights and the padded input
// rows in shared memory); 0 where the kernel does not apply: it needs an
// sm_80+ device (TF32 mma), in % 8 == 0 and out % 8 == 0, both at most
// kDirectMaxChannels, and 32-bit indices.
int direct_rows(const at::Tensor& like, int64_t n, int height, int width, int in_channels,
                int out_channels) {
  if (in_channels % 8 != 0 || out_channels % 8 != 0 || in_channels < 8 || out_channels < 8 ||
      in_channels > kDirectMaxChannels || out_channels > kDirectMaxChannels ||
      n * height * width * std::max(in_channels, out_channels) > INT32_MAX ||
      at::cuda::getDeviceProperties(like.device().index())->major < 8) {
    return 0;
  }
  const int64_t weights = 9LL * in_channels * out_channels;
  for (int rows = height; rows >= 1; --rows) {
    if (weights + (rows + 2LL) * (width + 2) * (in_channels + 4) <= kConvSharedFloats) {
      return rows;
    }
  }
  return 0;
}

// Shared memory of one tensor-core weight-gradient band, in 4-byte words
// (the kernel's layout: dy, x rows, pixel offsets).
int64_t wgrad_mma_floats(int rows, int width, int in_channels, int out_channels) {
  const int64_t padded = (static_cast<int64_t>(rows) * width + 7) / 8 * 8;
  const int64_t co_stride = out_channels % 16 == 0 ? out_channels + 8 : out_channels;
  const int64_t ci_stride = in_channels % 16 == 0 ? in_channels + 8 : in_channels;
  return padded * co_stride + (rows + 2LL) * (width + 2) * ci_stride + padded;
}

// Rows of one band of the tensor-core weight gradient (dy, the padded x
// rows and the pixels' offsets in shared memory); 0 where it does not
// apply: it needs an sm_80+ device, in % 8 == 0, out % 8 == 0 and 32-bit
// indices.
int wgrad_mma_rows(const at::Tensor& like, int64_t n, int height, int width, int in_channels,
                   int out_channels) {
  if (in_channels % 8 != 0 || out_channels % 8 != 0 || in_channels < 8 || out_channels < 8 ||
      n * height * width * std::max(in_channels, out_channels) > INT32_MAX ||
      at::cuda::getDeviceProperties(like.device().index())->major < 8) {
    return 0;
  }
  for (int rows = height; rows >= 1; --rows) {
    const int64_t floats = wgrad_mma_floats(rows, width, in_channels, out_channels);
    if (floats <= kConvSharedFloats) {
      return rows;
    }
  }
  return 0;
}

// The direct kernel: `out` = conv3x3(`in`, weight) for flip 0, the input
// gradient (`in` = dy) for flip 1; `wk` is the layer's weight as
// [Co][3][3][Ci] in the compute dtype, `rows` from direct_rows. A warp a
// 16-pixel tile at a time, eight warps a block.
void launch_direct(void* kernel, const at::Tensor& in, const at::Tensor& wk, at::Tensor& out,
                   int rows, int flip) {
  int height = static_cast<int>(in.size(2));
  int width = static_cast<int>(in.size(3));
  int in_channels = static_cast<int>(in.size(1));
  int out_channels = static_cast<int>(out.size(1));
  int bands = (height + rows - 1) / rows;
  const int64_t blocks = in.size(0) * bands;
  // The kernel reads the weight four values at a time.
  const at::Tensor w = aligned16(wk) ? wk : wk.clone();
  const auto shared = static_cast<unsigned>(
      (9LL * in_channels * out_channels + (rows + 2LL) * (width + 2) * (in_channels + 4)) *
      sizeof(float));
  const void* in_ptr = in.data_ptr();
  const void* w_ptr = w.data_ptr();
  void* out_ptr = out.data_ptr();
  void* args[] = {&in_ptr, &w_ptr,  &out_ptr, &height, &width, &in_channels,
                  &out_channels, &rows, &bands, &flip};
  esper::jit_launch(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), shared, args,
                    stream_of(in));
}


// 3x3 convolution, stride 1, padding 1, no bias, NHWC: the forward and input
// gradient from the direct kernels where they apply (few channels), cuDNN's
// otherwise; the weight gradient from the two jit kernels. `dtype` is the compute dtype (autocast's, applied
// here, so the saved tensors are the ones the convolution saw).
class Conv3x3 : public torch::autograd::Function<Conv3x3> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            int64_t dtype, int64_t vec, int64_t partial_kernel,
                            int64_t reduce_kernel, int64_t small_forward_kernel,
                            int64_t direct_kernel, int64_t wgrad_mma_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    auto type = static_cast<at::ScalarType>(dtype);
    at::Tensor xc = x.scalar_type() == type ? x : x.to(type);
    at::Tensor wc = weight.scalar_type() == type ? weight : weight.to(type);
    at::Tensor y;
    int n = static_cast<int>(xc.size(0));
    int in_channels = static_cast<int>(xc.size(1));
    int height = static_cast<int>(xc.size(2));
    int width = static_cast<int>(xc.size(3));
    int out_channels = static_cast<int>(wc.size(0));
    if (in_channels <= kSmallConvInputChannels && out_channels <= 256 &&
        xc.size(0) * xc.size(2) * xc.size(3) * wc.size(0) <= INT32_MAX) {
      // Few input channels: the direct kernel, weights as [Co][3][3][Ci].
      y = at::empty({n, out_channels, height, width},
                    xc.options().memory_format(at::MemoryFormat::ChannelsLast));
      at::Tensor wk = wc.permute({0, 2, 3, 1}).contiguous();
      const void* x_ptr = xc.data_ptr();
      const void* w_ptr = wk.data_ptr();
      void* y_ptr = y.data_ptr();
      void* args[] = {&x_ptr, &w_ptr, &y_ptr, &n, &height, &width, &in_channels, &out_channels};
      const unsigned shared = static_cast<unsigned>(out_channels * 9 * in_channels * sizeof(float));
      esper::jit_launch(reinterpret_cast<void*>(small_forward_kernel),
                        dim3(elementwise_blocks(y.numel() / out_channels, sm_count(xc))),
                        dim3(kThreads),
                        shared, args, stream_of(xc));
    } else if (int rows = direct_rows(xc, n, height, width, in_channels, out_channels);
               rows > 0 && aligned16(xc)) {
      y = at::empty({n, out_channels, height, width},
                    xc.options().memory_format(at::MemoryFormat::ChannelsLast));
      launch_direct(reinterpret_cast<void*>(direct_kernel), xc,
                    wc.permute({0, 2, 3, 1}).contiguous(), y, rows, 0);
    } else {
      // The casts above are autocast's; the convolution runs as given.
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      y = at::conv2d(xc, wc, {}, 1, 1);
    }
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["w_channels_last"] = weight.is_contiguous(at::MemoryFormat::ChannelsLast);
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["partial"] = partial_kernel;
    ctx->saved_data["reduce"] = reduce_kernel;
    ctx->saved_data["direct"] = direct_kernel;
    ctx->saved_data["wgrad_mma"] = wgrad_mma_kernel;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& xc = saved[0];
    const at::Tensor& wc = saved[1];
    variable_list out(9);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(xc.device());
    at::Tensor dy = aligned(grads[0].to(xc.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast),
                            at::MemoryFormat::ChannelsLast);
    if (ctx->needs_input_grad(0)) {
      at::Tensor dx;
      // The input gradient is the convolution of dy with the flipped,
      // transposed weight: the direct kernel with the channels swapped.
      if (int rows = direct_rows(xc, xc.size(0), static_cast<int>(xc.size(2)),
                                 static_cast<int>(xc.size(3)), static_cast<int>(wc.size(0)),
                                 static_cast<int>(xc.size(1)));
          rows > 0) {
        dx = at::empty(xc.sizes(), xc.options().memory_format(at::MemoryFormat::ChannelsLast));
        launch_direct(handle(ctx, "direct"), dy, wc.permute({0, 2, 3, 1}).contiguous(), dx, rows,
                      1);
      } else {
        c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
        auto grads_in = at::convolution_backward(dy, xc, wc, std::nullopt, {1, 1}, {1, 1}, {1, 1},
                                                 false, {0, 0}, 1, {true, false, false});
        dx = std::get<0>(grads_in);
      }
      out[0] = dx.to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    if (ctx->needs_input_grad(1)) {
      int n = static_cast<int>(xc.size(0));
      int in_channels = static_cast<int>(xc.size(1));
      int height = static_cast<int>(xc.size(2));
      int width = static_cast<int>(xc.size(3));
      int out_channels = static_cast<int>(wc.size(0));
      int vec = static_cast<int>(ctx->saved_data["vec"].toInt());
      const int mma_rows = wgrad_mma_rows(xc, n, height, width, in_channels, out_channels);
      int rows = mma_rows > 0 ? mma_rows : conv_band_rows(height, width, in_channels, out_channels);
      TORCH_CHECK(rows > 0, "conv3x3: no band fits in shared memory");
      int bands = (height + rows - 1) / rows;
      int blocks = n * bands;
      int out_size = out_channels * 9 * in_channels;
      unsigned shared = 0;
      if (mma_rows > 0) {
        shared = static_cast<unsigned>(
            wgrad_mma_floats(rows, width, in_channels, out_channels) * sizeof(float));
      } else {
        // The f32 kernel's thread tasks (4 output channels x vec input
        // channels x one kernel row) and position groups, for its
        // reduction's scratch.
        int tasks = (out_channels / 4) * 3 * (in_channels / vec);
        int groups = tasks >= kThreads ? 1 : kThreads / tasks;
        int64_t tile = static_cast<int64_t>(rows) * width * out_channels +
                       static_cast<int64_t>(rows + 2) * (width + 2) * in_channels;
        int64_t reduction =
            tasks >= kThreads ? 0 : static_cast<int64_t>(groups) * tasks * 3 * 4 * vec;
        shared = static_cast<unsigned>(std::max(tile, reduction) * sizeof(float));
      }
      TORCH_CHECK(shared <= kConvSharedFloats * sizeof(float), "conv3x3: ", shared,
                  " bytes of shared memory");
      auto f32 = xc.options().dtype(at::kFloat);
      at::Tensor partials = at::empty({static_cast<int64_t>(blocks) * out_size}, f32);
      at::Tensor dw = at::empty({out_channels, 3, 3, in_channels}, f32);
      const void* x_ptr = xc.data_ptr();
      const void* dy_ptr = dy.data_ptr();
      void* partials_ptr = partials.data_ptr();
      void* dw_ptr = dw.data_ptr();
      cudaStream_t stream = stream_of(xc);
      {
        void* args[] = {&x_ptr, &dy_ptr, &partials_ptr, &height, &width,
                        &in_channels, &out_channels, &rows, &bands};
        esper::jit_launch(handle(ctx, mma_rows > 0 ? "wgrad_mma" : "partial"), dim3(blocks),
                          dim3(kThreads), shared, args, stream);
      }
      {
        void* args[] = {&partials_ptr, &dw_ptr, &blocks, &out_size};
        esper::jit_launch(handle(ctx, "reduce"), dim3((out_size + 31) / 32), dim3(kThreads), 0,
                          args, stream);
      }
      // [Co, 3, 3, Ci] is the channels-last layout of [Co, Ci, 3, 3].
      at::Tensor grad = dw.permute({0, 3, 1, 2})
                            .to(static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
      if (!ctx->saved_data["w_channels_last"].toBool()) {
        grad = grad.contiguous();
      }
      out[1] = grad;
    }
    return out;
  }
};

int64_t as_int(void* kernel) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(kernel)); }

}  // namespace

extern "C" {

char* esper_batch_norm_relu(void* x, void* weight, void* bias, void* running_mean,
                            void* running_var, double momentum, double eps, int32_t vec,
                            void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && bias != nullptr && kernels != nullptr,
              "batch_norm_relu: null argument");
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK(kernels[i] != nullptr, "batch_norm_relu: null kernel ", i);
  }
  const auto& input = *static_cast<const at::Tensor*>(x);
  // Autograd functions take no undefined tensors: an absent running
  // statistic is an empty one (the forward passes NULL to the kernel).
  auto none = [&input]() { return at::empty({0}, input.options().dtype(at::kFloat)); };
  at::Tensor rm = running_mean ? *static_cast<const at::Tensor*>(running_mean) : none();
  at::Tensor rv = running_var ? *static_cast<const at::Tensor*>(running_var) : none();
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 &&
                  input.is_contiguous(at::MemoryFormat::ChannelsLast),
              "batch_norm_relu: expected a channels-last 4-D CUDA tensor");
  TORCH_CHECK(vec == 1 || (vec == 4 && input.size(1) % 4 == 0),
              "batch_norm_relu: vec ", vec, " for ", input.size(1), " channels");
  at::Tensor y = BatchNormRelu::apply(input, *static_cast<const at::Tensor*>(weight),
                                      *static_cast<const at::Tensor*>(bias), rm, rv, momentum, eps,
                                      static_cast<int64_t>(vec), as_int(kernels[0]), as_int(kernels[1]), as_int(kernels[2]),
                                      as_int(kernels[3]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

char* esper_conv3x3(void* x, void* weight, int32_t bf16, int32_t vec, void* const* kernels,
                    void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && kernels != nullptr && kernels[0] != nullptr &&
                  kernels[1] != nullptr && kernels[2] != nullptr && kernels[3] != nullptr &&
                  kernels[4] != nullptr,
              "conv3x3: null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 &&
                  input.is_contiguous(at::MemoryFormat::ChannelsLast),
              "conv3x3: expected a channels-last 4-D CUDA tensor");
  TORCH_CHECK(w.dim() == 4 && w.size(1) == input.size(1) && w.size(2) == 3 && w.size(3) == 3 &&
                  w.size(0) % 4 == 0,
              "conv3x3: weight of shape ", w.sizes(), " for input ", input.sizes());
  TORCH_CHECK(vec == 1 || (vec == 4 && input.size(1) % 4 == 0), "conv3x3: vec ", vec);
  TORCH_CHECK(conv_band_rows(static_cast<int>(input.size(2)), static_cast<int>(input.size(3)),
                             static_cast<int>(input.size(1)), static_cast<int>(w.size(0))) > 0,
              "conv3x3: the weight gradient's band does not fit in shared memory");
  const auto dtype = static_cast<int64_t>(bf16 ? at::kBFloat16 : at::kFloat);
  at::Tensor y = Conv3x3::apply(input, w, dtype, static_cast<int64_t>(vec),
                                as_int(kernels[0]), as_int(kernels[1]), as_int(kernels[2]),
                                as_int(kernels[3]), as_int(kernels[4]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

int32_t esper_conv3x3_fits(int64_t height, int64_t width, int64_t in_channels,
                           int64_t out_channels) {
  if (height > 65536 || width > 65536 || in_channels > 65536 || out_channels > 65536) {
    return 0;
  }
  return conv_band_rows(static_cast<int>(height), static_cast<int>(width),
                        static_cast<int>(in_channels), static_cast<int>(out_channels)) > 0;
}

char* esper_max_pool2(void* x, int32_t channels_last, int32_t vec, void* const* kernels,
                      void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && kernels != nullptr && kernels[0] != nullptr && kernels[1] != nullptr,
              "max_pool2: null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 && input.is_contiguous(format),
              "max_pool2: expected a contiguous 4-D CUDA tensor in the given layout");
  TORCH_CHECK(vec == 1 || (vec == 4 && channels_last && input.size(1) % 4 == 0),
              "max_pool2: vec ", vec, " for ", input.size(1), " channels");
  TORCH_CHECK(input.numel() <= INT32_MAX, "max_pool2: more elements than 32-bit indexing covers");
  at::Tensor y = MaxPool2::apply(input, channels_last != 0, static_cast<int64_t>(vec),
                                 as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
