// nn.cpp: fused network layers as autograd functions whose forward and
// backward launch run-time compiled kernels (src/nn/ holds their source,
// compiles and loads them, checks every argument, and passes the loaded
// kernels here as handles).
//
// - batch norm (training statistics) + ReLU over a channels-last 4-D tensor:
//   two kernels forward (per-block sums of the shifted values and their
//   squares; every block of the second adds them up in one fixed order,
//   normalises and applies ReLU, block 0 also writing the saved statistics
//   and the running ones), two backward (per-block sums of the gradient and
//   of gradient x normalised input, then the input gradient, with block 0
//   writing the weight and bias gradients); with `pool` the same node also
//   takes the 2x2 max-pool: the second forward kernel writes each window's
//   maximum only, and the backward kernels route the pooled gradient to the
//   argmax they recompute from the saved input;
// - 2x2 max-pool with stride 2 (floor) over a contiguous NCHW or NHWC
//   tensor: one kernel forward, one backward that recomputes each window's
//   argmax from the saved input instead of keeping indices.
// Where the channel count allows (`vec` 4), each thread moves four channels
// with one 16-byte (8-byte in bf16) access.
//
// Nothing is read back and no scratch outlives a call, so both can be
// captured in a CUDA graph and may run on several streams at once. The
// convolution is in nn_conv.cpp, group norm + ReLU in nn_group_norm.cpp.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class BatchNormRelu : public torch::autograd::Function<BatchNormRelu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean,
                            at::Tensor running_var, double momentum, double eps, int64_t vec,
                            int64_t stats_kernel, int64_t forward_kernel, int64_t reduce_kernel,
                            int64_t apply_kernel, bool pool) {
    c10::cuda::CUDAGuard guard(x.device());
    long long rows = x.size(0) * x.size(2) * x.size(3);
    int channels = static_cast<int>(x.size(1));
    int blocks = channel_blocks(rows, rows_per_pass(channels, static_cast<int>(vec)), sm_count(x));
    auto f32 = x.options().dtype(at::kFloat);
    at::Tensor partials = at::empty({static_cast<int64_t>(blocks) * channels * 2}, f32);
    at::Tensor save_mean = at::empty({channels}, f32);
    at::Tensor save_invstd = at::empty({channels}, f32);
    int height = static_cast<int>(x.size(2));
    int width = static_cast<int>(x.size(3));
    at::Tensor y = pool ? at::empty({x.size(0), channels, height / 2, width / 2},
                                    x.options().memory_format(at::MemoryFormat::ChannelsLast))
                        : at::empty_like(x);
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
      void* args[] = {&x_ptr, &y_ptr, &partials_ptr, &blocks, &w,        &b,     &sm,   &si,
                      &rm,    &rv,    &m,            &e,      &rows,     &channels, &height, &width};
      esper::jit_launch(reinterpret_cast<void*>(forward_kernel), dim3(blocks), dim3(kThreads), 0,
                        args, stream);
    }
    ctx->save_for_backward({x, weight, bias, save_mean, save_invstd});
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["reduce"] = reduce_kernel;
    ctx->saved_data["apply"] = apply_kernel;
    ctx->saved_data["pool"] = pool;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& bias = saved[2];
    const at::Tensor& save_mean = saved[3];
    const at::Tensor& save_invstd = saved[4];
    variable_list out(13);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(x.device());
    // With the pool, dy is the pooled output's gradient.
    at::Tensor dy = aligned(grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast),
                            at::MemoryFormat::ChannelsLast);
    long long rows = x.size(0) * x.size(2) * x.size(3);
    int channels = static_cast<int>(x.size(1));
    int height = static_cast<int>(x.size(2));
    int width = static_cast<int>(x.size(3));
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
      void* args[] = {&x_ptr, &dy_ptr,       &sm,   &si,       &w,      &b,
                      &partials_ptr, &rows, &channels, &height, &width};
      esper::jit_launch(handle(ctx, "reduce"), dim3(blocks), dim3(kThreads), 0, args, stream);
    }
    {
      void* dx_ptr = dx.data_ptr();
      void* dw = dweight.data_ptr();
      void* db = dbias.data_ptr();
      void* args[] = {&x_ptr, &dy_ptr, &dx_ptr, &partials_ptr, &blocks, &sm,      &si,    &w,
                      &b,     &dw,     &db,     &rows,         &channels, &height, &width};
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

}  // namespace

namespace {

// esper_batch_norm_relu and esper_batch_norm_relu_pool2: the checks, then
// one BatchNormRelu node.
char* batch_norm_relu_node(void* x, void* weight, void* bias, void* running_mean,
                           void* running_var, double momentum, double eps, int32_t vec,
                           void* const* kernels, bool pool, void** out) {
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
  TORCH_CHECK(!pool || (input.size(2) >= 2 && input.size(3) >= 2),
              "batch_norm_relu_pool2: expected at least 2 x 2 pixels, got ", input.sizes());
  at::Tensor y = BatchNormRelu::apply(input, *static_cast<const at::Tensor*>(weight),
                                      *static_cast<const at::Tensor*>(bias), rm, rv, momentum, eps,
                                      static_cast<int64_t>(vec), as_int(kernels[0]), as_int(kernels[1]), as_int(kernels[2]),
                                      as_int(kernels[3]), pool);
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // namespace

extern "C" {

char* esper_batch_norm_relu(void* x, void* weight, void* bias, void* running_mean,
                            void* running_var, double momentum, double eps, int32_t vec,
                            void* const* kernels, void** out) {
  return batch_norm_relu_node(x, weight, bias, running_mean, running_var, momentum, eps, vec,
                              kernels, false, out);
}

char* esper_batch_norm_relu_pool2(void* x, void* weight, void* bias, void* running_mean,
                                  void* running_var, double momentum, double eps, int32_t vec,
                                  void* const* kernels, void** out) {
  return batch_norm_relu_node(x, weight, bias, running_mean, running_var, momentum, eps, vec,
                              kernels, true, out);
}

char* esper_batch_norm_relu_eval(void* x, void* weight, void* bias, void* running_mean,
                                 void* running_var, double eps, int32_t vec, void* kernel,
                                 void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && bias != nullptr && running_mean != nullptr &&
                  running_var != nullptr && kernel != nullptr,
              "batch_norm_relu (eval): null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  const auto& b = *static_cast<const at::Tensor*>(bias);
  const auto& rm = *static_cast<const at::Tensor*>(running_mean);
  const auto& rv = *static_cast<const at::Tensor*>(running_var);
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 &&
                  input.is_contiguous(at::MemoryFormat::ChannelsLast),
              "batch_norm_relu (eval): expected a channels-last 4-D CUDA tensor");
  const int64_t channels = input.size(1);
  for (const at::Tensor* t : {&w, &b, &rm, &rv}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == channels && t->scalar_type() == at::kFloat &&
                    t->is_contiguous() && t->device() == input.device(),
                "batch_norm_relu (eval): expected contiguous f32 [", channels,
                "] parameters and statistics on the input's device");
  }
  TORCH_CHECK(vec == 1 || (vec == 4 && channels % 4 == 0),
              "batch_norm_relu (eval): vec ", vec, " for ", channels, " channels");
  if (c10::GradMode::is_enabled() && (input.requires_grad() || w.requires_grad() || b.requires_grad())) {
    // A gradient is wanted (the kernel has no backward): libtorch's ops.
    *out = new at::Tensor(at::relu(at::batch_norm(input, w, b, rm, rv, false, 0.0, eps, true)));
    return nullptr;
  }
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor y = at::empty_like(input);
  const void* x_ptr = input.data_ptr();
  void* y_ptr = y.data_ptr();
  const void* m = rm.data_ptr();
  const void* v = rv.data_ptr();
  const void* wp = w.data_ptr();
  const void* bp = b.data_ptr();
  float e = static_cast<float>(eps);
  long long n = static_cast<long long>(input.numel());
  int c = static_cast<int>(channels);
  void* args[] = {&x_ptr, &y_ptr, &m, &v, &wp, &bp, &e, &n, &c};
  esper::jit_launch(kernel, dim3(elementwise_blocks((n + vec - 1) / vec, sm_count(input))),
                    dim3(kThreads), 0, args, stream_of(input));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
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
