// nn_pooled.cpp: a classifier head, the global average over a channels-last
// image followed by a fully connected layer (with bias), as an autograd
// function whose forward and backward each launch one run-time compiled
// kernel (src/nn/pooled_source.rs). Forward: a block an image (the channel
// means, saved, then the outputs). Backward: a block an image for the input
// gradient, then blocks for the weight and bias gradients, a block an
// output and 32 columns, summing the images in a fixed order
// (deterministic).
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kMaxChannels = 1024;  // the kernels' PL_MAX_C
constexpr int64_t kMaxOutputs = 64;     // PL_MAX_K

class PooledLinear : public torch::autograd::Function<PooledLinear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, int64_t forward_kernel,
                            int64_t backward_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t batch = x.size(0);
    int channels = static_cast<int>(x.size(1));
    int outputs = static_cast<int>(weight.size(0));
    int hw = static_cast<int>(x.size(2) * x.size(3));
    at::Tensor y = at::empty({batch, outputs}, x.options().memory_format(at::MemoryFormat::Contiguous));
    auto f32 = x.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    at::Tensor mean = at::empty({batch, channels}, f32);
    const void* x_ptr = x.data_ptr();
    const void* w_ptr = weight.data_ptr();
    const void* b_ptr = bias.data_ptr();
    void* y_ptr = y.data_ptr();
    void* mean_ptr = mean.data_ptr();
    void* args[] = {&x_ptr, &w_ptr, &b_ptr, &y_ptr, &mean_ptr, &hw, &channels, &outputs};
    esper::jit_launch(reinterpret_cast<void*>(forward_kernel), dim3(static_cast<unsigned>(batch)),
                      dim3(kThreads), 0, args, stream_of(x));
    ctx->save_for_backward({weight, mean});
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor& mean = saved[1];
    variable_list out(5);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(weight.device());
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor dy = grads[0].to(dtype).contiguous();
    int batch = static_cast<int>(mean.size(0));
    int channels = static_cast<int>(mean.size(1));
    int outputs = static_cast<int>(weight.size(0));
    // x's [N, C, H, W]: the gradient's shape and the pixels each mean took.
    const auto shape = ctx->saved_data["shape"].toIntVector();
    int hw = static_cast<int>(shape.at(2) * shape.at(3));
    const bool want_dx = ctx->needs_input_grad(0);
    const bool want_w = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    at::Tensor dx;
    if (want_dx) {
      dx = at::empty(shape, dy.options().memory_format(at::MemoryFormat::ChannelsLast));
    }
    auto f32 = weight.options().memory_format(at::MemoryFormat::Contiguous);
    at::Tensor dw;
    at::Tensor db;
    if (want_w) {
      dw = at::empty({outputs, channels}, f32);
      db = at::empty({outputs}, f32);
    }
    int dx_blocks = want_dx ? batch : 0;
    // A block an output and 32 columns of [dW | db] (the kernel's tiles).
    const int64_t weight_blocks = want_w ? static_cast<int64_t>(outputs) * ((channels + 32) / 32) : 0;
    const int64_t blocks = dx_blocks + weight_blocks;
    if (blocks == 0) {
      return out;
    }
    const void* dy_ptr = dy.data_ptr();
    const void* w_ptr = weight.data_ptr();
    const void* mean_ptr = mean.data_ptr();
    void* dx_ptr = want_dx ? dx.data_ptr() : nullptr;
    void* dw_ptr = want_w ? dw.data_ptr() : nullptr;
    void* db_ptr = want_w ? db.data_ptr() : nullptr;
    void* args[] = {&dy_ptr, &w_ptr,  &mean_ptr, &dx_ptr,   &dw_ptr,   &db_ptr,
                    &batch,  &hw,     &channels, &outputs,  &dx_blocks};
    esper::jit_launch(handle(ctx, "backward"), dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                      0, args, stream_of(weight));
    out[0] = dx;
    if (ctx->needs_input_grad(1)) {
      out[1] = dw;
    }
    if (ctx->needs_input_grad(2)) {
      out[2] = db;
    }
    return out;
  }
};

}  // namespace

extern "C" {

char* esper_pooled_linear(void* x, void* weight, void* bias, void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && bias != nullptr && kernels != nullptr &&
                  kernels[0] != nullptr && kernels[1] != nullptr,
              "pooled_linear: null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  const auto& b = *static_cast<const at::Tensor*>(bias);
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 && input.size(0) >= 1 &&
                  input.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                  (input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16),
              "pooled_linear: expected a channels-last 4-D f32 or bf16 CUDA tensor");
  const int64_t channels = input.size(1);
  const int64_t outputs = w.dim() == 2 ? w.size(0) : 0;
  TORCH_CHECK(channels >= 1 && channels <= kMaxChannels && outputs >= 1 && outputs <= kMaxOutputs,
              "pooled_linear: ", channels, " channels and ", outputs, " outputs (at most ",
              kMaxChannels, " and ", kMaxOutputs, ")");
  TORCH_CHECK(input.size(2) * input.size(3) >= 1 &&
                  input.size(2) * input.size(3) <= INT32_MAX / channels &&
                  input.size(0) <= INT32_MAX / kThreads,
              "pooled_linear: an image or batch larger than 32-bit indexing covers");
  TORCH_CHECK(w.sizes() == at::IntArrayRef({outputs, channels}) && w.scalar_type() == at::kFloat &&
                  w.is_contiguous() && w.device() == input.device(),
              "pooled_linear: the weight must be a contiguous f32 [", outputs, ", ", channels,
              "] on the input's device");
  TORCH_CHECK(b.sizes() == at::IntArrayRef({outputs}) && b.scalar_type() == at::kFloat &&
                  b.is_contiguous() && b.device() == input.device(),
              "pooled_linear: the bias must be a contiguous f32 [", outputs,
              "] on the input's device");
  at::Tensor y = PooledLinear::apply(input, w, b, as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
