// nn_conv.cpp: the 3x3 convolution (stride 1, padding 1, no bias, NHWC) as
// an autograd function whose forward and backward launch run-time compiled
// kernels (src/nn/conv_source.rs): a direct forward for at most four input
// channels; a direct forward and input gradient on TF32 tensor cores for
// few channels; the weight gradient on tensor cores or in f32, then a
// fixed-order reduction; cuDNN for whatever the kernels do not cover.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <ATen/ops/conv2d.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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


// Whether the TF32 tensor-core kernels may run for `like` (the compute
// dtype): an sm_80+ device, and bf16 (exact in TF32) or f32 with libtorch's
// cuDNN TF32 switch on (torch_ext::precision::set_allow_tf32); with TF32
// off an f32 convolution stays exact (cuDNN and the f32 weight-gradient
// kernel).
bool tensor_cores_allowed(const at::Tensor& like) {
  return at::cuda::getDeviceProperties(like.device().index())->major >= 8 &&
         (like.scalar_type() == at::kBFloat16 || at::globalContext().allowTF32CuDNN());
}

// What both tensor-core kernels need: tensor_cores_allowed, multiples of 8
// channels each way, and 32-bit indices.
bool mma_fits(const at::Tensor& like, int64_t n, int height, int width, int in_channels,
              int out_channels) {
  return in_channels % 8 == 0 && out_channels % 8 == 0 && in_channels >= 8 &&
         out_channels >= 8 &&
         n * height * width * std::max(in_channels, out_channels) <= INT32_MAX &&
         tensor_cores_allowed(like);
}

// The layer's weight [Co, Ci, 3, 3] as the kernels read it, [Co][3][3][Ci]
// contiguous (a view of a channels-last weight).
at::Tensor weight_rows(const at::Tensor& weight) {
  return weight.permute({0, 2, 3, 1}).contiguous();
}

// Shared memory of the direct kernel's weight, in 4-byte words: its rows
// padded as the kernel lays them out (forward: `out` rows of 9 x `in`
// values + 4; flipped: `in` rows of 9 x `out`, + 8 where that is a
// multiple of 16).
int64_t direct_weight_floats(int in_channels, int out_channels, int flip) {
  if (flip) {
    const int64_t row = 9LL * out_channels;
    return in_channels * (row % 16 == 0 ? row + 8 : row);
  }
  return out_channels * (9LL * in_channels + 4);
}

// Rows of one direct-convolution band, `flip` 1 for the input gradient
// (the weights and the padded input rows in shared memory); 0 where the
// kernel does not apply: it needs mma_fits, and both channel counts at
// most kDirectMaxChannels.
int direct_rows(const at::Tensor& like, int64_t n, int height, int width, int in_channels,
                int out_channels, int flip) {
  if (!mma_fits(like, n, height, width, in_channels, out_channels) ||
      in_channels > kDirectMaxChannels || out_channels > kDirectMaxChannels) {
    return 0;
  }
  const int64_t weights = direct_weight_floats(in_channels, out_channels, flip);
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
// apply: it needs mma_fits.
int wgrad_mma_rows(const at::Tensor& like, int64_t n, int height, int width, int in_channels,
                   int out_channels) {
  if (!mma_fits(like, n, height, width, in_channels, out_channels)) {
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

// How esper_conv3_wgrad_mma splits one layer's work: threads a block, KS
// slices of each band's pixels, IPB images a block. A warp owns one unit
// (16 output x 8 input channels, all nine taps): 128 threads while there are
// at most four units, else 256 (past eight units, the warps take them in
// passes);
// the warps left over by the units split the pixels (KS, a power of two,
// with its (KS - 1) partial dW in shared memory); two images a block where
// one pass covers the units and the grid keeps at least three blocks an SM.
// Chosen from timings of the workloads' layers on an H200 (1 - 32 units,
// 7x7 - 32x32 pixels).
struct WgradPlan {
  int threads = 256;
  int slices = 1;
  int images = 1;
};

WgradPlan wgrad_mma_plan(int64_t n, int bands, int in_channels, int out_channels, int sms) {
  WgradPlan plan;
  const int units = ((out_channels + 15) / 16) * (in_channels / 8);
  const int64_t out_size = 9LL * in_channels * out_channels;
  plan.threads = units <= 4 ? 128 : 256;
  const int warps = plan.threads / 32;
  while (units * plan.slices * 2 <= warps && (2LL * plan.slices - 1) * out_size <= kConvSharedFloats) {
    plan.slices *= 2;
  }
  const bool one_pass = units * plan.slices <= warps;
  plan.images = one_pass && n * bands >= 3LL * sms ? 2 : 1;
  return plan;
}

// The kernels esper_conv3x3 is handed: five general ones, then the nine
// compile-time-sized direct ones (src/nn/kernels.rs, DIRECT_FIXED_KERNELS).
constexpr int kConvKernels = 5 + 9;

// The index of log2(channels / 8) for 8, 16 or 32 channels; -1 otherwise.
int channel_step(int channels) {
  return channels == 8 ? 0 : channels == 16 ? 1 : channels == 32 ? 2 : -1;
}

// The compile-time-sized direct kernel of `fixed` (nine handles, input
// channels outer) for `in` x `out` channels (the kernel's, so swapped for
// the input gradient) where both are 8, 16 or 32; nullptr otherwise.
void* sized_direct_kernel(void* const* fixed, int in, int out) {
  const int i = channel_step(in), o = channel_step(out);
  return i >= 0 && o >= 0 ? fixed[i * 3 + o] : nullptr;
}

// The direct kernel: `out` = conv3x3(`in`, weight) for flip 0, the input
// gradient (`in` = dy) for flip 1; `wk` is the layer's weight as
// [Co][3][3][Ci] in the compute dtype, `rows` from direct_rows; the
// compile-time-sized kernel `sized` (which takes no channel counts) where
// there is one, else `general`. A warp a 16-pixel tile at a time (two in the sized kernels below
// 32 output channels), eight warps a block; the sized kernels run four
// warps a block where the grid has at least two blocks an SM and at least
// 16 output channels (faster there on an H100; eight otherwise).
void launch_direct(void* general, void* sized, const at::Tensor& in, const at::Tensor& wk,
                   at::Tensor& out, int rows, int flip) {
  int height = static_cast<int>(in.size(2));
  int width = static_cast<int>(in.size(3));
  int in_channels = static_cast<int>(in.size(1));
  int out_channels = static_cast<int>(out.size(1));
  int bands = (height + rows - 1) / rows;
  const int64_t blocks = in.size(0) * bands;
  // The kernel reads the weight four values at a time.
  const at::Tensor w = aligned16(wk) ? wk : wk.clone();
  const auto shared = static_cast<unsigned>(
      (direct_weight_floats(in_channels, out_channels, flip) +
       (rows + 2LL) * (width + 2) * (in_channels + 4)) *
      sizeof(float));
  const void* in_ptr = in.data_ptr();
  const void* w_ptr = w.data_ptr();
  void* out_ptr = out.data_ptr();
  if (sized != nullptr) {
    void* args[] = {&in_ptr, &w_ptr, &out_ptr, &height, &width, &rows, &bands, &flip};
    const bool narrow = blocks >= 2LL * sm_count(in) && out_channels >= 16;
    esper::jit_launch(sized, dim3(static_cast<unsigned>(blocks)),
                      dim3(narrow ? kThreads / 2 : kThreads), shared, args, stream_of(in));
    return;
  }
  void* args[] = {&in_ptr, &w_ptr,  &out_ptr, &height, &width, &in_channels,
                  &out_channels, &rows, &bands, &flip};
  esper::jit_launch(general, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), shared, args,
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
                            int64_t direct_kernel, int64_t wgrad_mma_kernel,
                            int64_t fixed_kernels, bool overlap) {
    c10::cuda::CUDAGuard guard(x.device());
    // The nine sized direct kernels (esper_conv3x3's array, read only
    // here: the backward keeps the handle it needs in saved_data).
    void* const* fixed = reinterpret_cast<void* const*>(static_cast<intptr_t>(fixed_kernels));
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
      at::Tensor wk = weight_rows(wc);
      const void* x_ptr = xc.data_ptr();
      const void* w_ptr = wk.data_ptr();
      void* y_ptr = y.data_ptr();
      void* args[] = {&x_ptr, &w_ptr, &y_ptr, &n, &height, &width, &in_channels, &out_channels};
      const unsigned shared = static_cast<unsigned>(out_channels * 9 * in_channels * sizeof(float));
      esper::jit_launch(reinterpret_cast<void*>(small_forward_kernel),
                        dim3(elementwise_blocks(y.numel() / out_channels, sm_count(xc))),
                        dim3(kThreads),
                        shared, args, stream_of(xc));
    } else if (int rows = direct_rows(xc, n, height, width, in_channels, out_channels, 0);
               rows > 0 && aligned16(xc)) {
      y = at::empty({n, out_channels, height, width},
                    xc.options().memory_format(at::MemoryFormat::ChannelsLast));
      launch_direct(reinterpret_cast<void*>(direct_kernel),
                    sized_direct_kernel(fixed, in_channels, out_channels), xc, weight_rows(wc), y,
                    rows, 0);
    } else {
      // The casts above are autocast's; the convolution runs as given.
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      y = at::conv2d(xc, wc, {}, 1, 1);
    }
    // A leaf weight's gradient may be computed on the side stream (see
    // backward); the leaf is kept to see whether its gradient is empty.
    const bool side = overlap && weight.is_leaf() && weight.requires_grad();
    ctx->save_for_backward({xc, wc, side ? weight : at::Tensor()});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["w_channels_last"] = weight.is_contiguous(at::MemoryFormat::ChannelsLast);
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["partial"] = partial_kernel;
    ctx->saved_data["reduce"] = reduce_kernel;
    ctx->saved_data["direct"] = direct_kernel;
    ctx->saved_data["wgrad_mma"] = wgrad_mma_kernel;
    // The input gradient's sized kernel (the layer's channels swapped), 0
    // for none.
    ctx->saved_data["direct_flip"] =
        as_int(sized_direct_kernel(fixed, out_channels, in_channels));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& xc = saved[0];
    const at::Tensor& wc = saved[1];
    variable_list out(11);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(xc.device());
    at::Tensor dy = aligned(grads[0].to(xc.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast),
                            at::MemoryFormat::ChannelsLast);
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
      int out_size = out_channels * 9 * in_channels;
      WgradPlan plan;
      unsigned shared = 0;
      if (mma_rows > 0) {
        plan = wgrad_mma_plan(n, bands, in_channels, out_channels, sm_count(xc));
        shared = static_cast<unsigned>(
            std::max(wgrad_mma_floats(rows, width, in_channels, out_channels),
                     static_cast<int64_t>(plan.slices - 1) * out_size) *
            sizeof(float));
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
      int blocks = static_cast<int>((n + plan.images - 1) / plan.images) * bands;
      auto f32 = xc.options().dtype(at::kFloat);
      // Every tensor the weight gradient writes is allocated here, on the
      // main stream: [Co, Ci, 3, 3] in the weight's dtype and layout
      // ([Co, 3, 3, Ci] in memory where channels-last, which an f32
      // gradient the reduction writes itself).
      const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
      const bool w_channels_last = ctx->saved_data["w_channels_last"].toBool();
      at::Tensor grad = at::empty(
          {out_channels, in_channels, 3, 3},
          xc.options().dtype(w_dtype).memory_format(w_channels_last
                                                        ? at::MemoryFormat::ChannelsLast
                                                        : at::MemoryFormat::Contiguous));
      const bool in_place = w_dtype == at::kFloat && w_channels_last;
      at::Tensor dw = in_place ? grad : at::empty({out_channels, 3, 3, in_channels}, f32);
      at::Tensor partials = at::empty({static_cast<int64_t>(blocks) * out_size}, f32);
      // The side stream where the gradient goes to a leaf weight whose
      // accumulator takes it as it is (no gradient there yet, no graph of
      // the backward): then nothing in this pass reads it, and it runs
      // beside the input gradients of this layer and those before it. Only
      // while the stream is captured: a graph replays the two branches side
      // by side, while eagerly the host's launches are the bound and the
      // events would cost more than the overlap gives.
      const at::Tensor& leaf = saved[2];
      SideWork work(leaf.defined() && !at::GradMode::is_enabled() && !leaf.grad().defined() &&
                        capturing(xc.device().index()),
                    xc.device().index());
      cudaStream_t stream = work.stream();
      const void* x_ptr = xc.data_ptr();
      const void* dy_ptr = dy.data_ptr();
      void* partials_ptr = partials.data_ptr();
      if (mma_rows > 0) {
        void* args[] = {&x_ptr,        &dy_ptr, &partials_ptr, &n,           &height,
                        &width,        &in_channels, &out_channels, &rows, &bands,
                        &plan.images, &plan.slices};
        esper::jit_launch(handle(ctx, "wgrad_mma"), dim3(blocks), dim3(plan.threads), shared,
                          args, stream);
      } else {
        void* args[] = {&x_ptr, &dy_ptr, &partials_ptr, &height, &width,
                        &in_channels, &out_channels, &rows, &bands};
        esper::jit_launch(handle(ctx, "partial"), dim3(blocks), dim3(kThreads), shared, args,
                          stream);
      }
      sum_partials_into(handle(ctx, "reduce"), partials, blocks, out_size, dw.data_ptr(), stream);
      if (!in_place) {
        // [Co, 3, 3, Ci] is the channels-last layout of [Co, Ci, 3, 3].
        c10::cuda::CUDAStreamGuard on_side(
            c10::cuda::getStreamFromExternal(stream, xc.device().index()));
        grad.copy_(dw.permute({0, 3, 1, 2}));
      }
      work.finish({xc, dy, partials, dw, grad});
      out[1] = grad;
    }
    if (ctx->needs_input_grad(0)) {
      at::Tensor dx;
      // The input gradient is the convolution of dy with the flipped,
      // transposed weight: the direct kernel with the channels swapped.
      if (int rows = direct_rows(xc, xc.size(0), static_cast<int>(xc.size(2)),
                                 static_cast<int>(xc.size(3)), static_cast<int>(wc.size(0)),
                                 static_cast<int>(xc.size(1)), 1);
          rows > 0) {
        dx = at::empty(xc.sizes(), xc.options().memory_format(at::MemoryFormat::ChannelsLast));
        launch_direct(handle(ctx, "direct"), handle(ctx, "direct_flip"), dy, weight_rows(wc), dx,
                      rows, 1);
      } else {
        c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
        auto grads_in = at::convolution_backward(dy, xc, wc, std::nullopt, {1, 1}, {1, 1}, {1, 1},
                                                 false, {0, 0}, 1, {true, false, false});
        dx = std::get<0>(grads_in);
      }
      out[0] = dx.to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    return out;
  }
};

}  // namespace

extern "C" {

char* esper_conv3x3(void* x, void* weight, int32_t bf16, int32_t vec, int32_t overlap,
                    void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && kernels != nullptr, "conv3x3: null argument");
  for (int i = 0; i < kConvKernels; ++i) {
    TORCH_CHECK(kernels[i] != nullptr, "conv3x3: null kernel ", i);
  }
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
                                as_int(kernels[3]), as_int(kernels[4]),
                                static_cast<int64_t>(reinterpret_cast<intptr_t>(kernels + 5)),
                                overlap != 0);
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

}  // extern "C"
