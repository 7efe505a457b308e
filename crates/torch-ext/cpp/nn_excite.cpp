// nn_excite.cpp: squeeze-and-excite channel attention,
// x * sigmoid(W2 relu(W1 mean_hw(x)) + b2), over a channels-last 4-D
// tensor as an autograd function whose forward and backward launch
// run-time compiled kernels (src/nn/excite_source.rs), one block an image.
// Forward: one kernel (the means, both products, the output; the means,
// hidden activations and gates saved). Backward: one kernel for the input
// gradient and each image's share of the parameter gradients, then the
// convolution source's fixed-order reduction of those shares.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kMaxChannels = 256;  // the kernels' SE_MAX_C (THREADS)
constexpr int64_t kMaxHidden = 64;     // SE_MAX_R

class SqueezeExcite : public torch::autograd::Function<SqueezeExcite> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const at::Tensor& w2, const at::Tensor& b2, int64_t forward_kernel,
                            int64_t backward_kernel, int64_t reduce_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t batch = x.size(0);
    int channels = static_cast<int>(x.size(1));
    int hidden = static_cast<int>(w1.size(0));
    int hw = static_cast<int>(x.size(2) * x.size(3));
    at::Tensor y = at::empty_like(x, x.options().memory_format(at::MemoryFormat::ChannelsLast));
    auto f32 = x.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    at::Tensor saved = at::empty({batch, 2 * channels + hidden}, f32);
    const void* x_ptr = x.data_ptr();
    const void* w1_ptr = w1.data_ptr();
    const void* w2_ptr = w2.data_ptr();
    const void* b2_ptr = b2.data_ptr();
    void* y_ptr = y.data_ptr();
    void* saved_ptr = saved.data_ptr();
    void* args[] = {&x_ptr, &w1_ptr, &w2_ptr, &b2_ptr, &y_ptr, &saved_ptr, &hw, &channels, &hidden};
    esper::jit_launch(reinterpret_cast<void*>(forward_kernel), dim3(static_cast<unsigned>(batch)),
                      dim3(kThreads), 0, args, stream_of(x));
    ctx->save_for_backward({x, w1, w2, saved});
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["reduce"] = reduce_kernel;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w1 = saved[1];
    const at::Tensor& w2 = saved[2];
    variable_list out(7);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    int batch = static_cast<int>(x.size(0));
    int channels = static_cast<int>(x.size(1));
    int hidden = static_cast<int>(w1.size(0));
    int hw = static_cast<int>(x.size(2) * x.size(3));
    int write_dx = ctx->needs_input_grad(0) ? 1 : 0;
    at::Tensor dx;
    if (write_dx != 0) {
      dx = at::empty_like(x, x.options().memory_format(at::MemoryFormat::ChannelsLast));
    }
    const int share = 2 * hidden * channels + channels;
    auto f32 = x.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    at::Tensor partials = at::empty({batch, share}, f32);
    const void* x_ptr = x.data_ptr();
    const void* dy_ptr = dy.data_ptr();
    const void* w1_ptr = w1.data_ptr();
    const void* w2_ptr = w2.data_ptr();
    const void* saved_ptr = saved[3].data_ptr();
    void* dx_ptr = write_dx != 0 ? dx.data_ptr() : nullptr;
    void* partials_ptr = partials.data_ptr();
    cudaStream_t stream = stream_of(x);
    void* args[] = {&x_ptr,  &dy_ptr,       &w1_ptr, &w2_ptr,   &saved_ptr,
                    &dx_ptr, &partials_ptr, &hw,     &channels, &hidden,
                    &write_dx};
    esper::jit_launch(handle(ctx, "backward"), dim3(batch), dim3(kThreads), 0, args, stream);
    const at::Tensor sums = sum_partials(handle(ctx, "reduce"), partials, batch, share, stream);
    const int64_t rc = static_cast<int64_t>(hidden) * channels;
    out[0] = dx;
    out[1] = sums.narrow(0, 0, rc).view({hidden, channels});
    out[2] = sums.narrow(0, rc, rc).view({channels, hidden});
    out[3] = sums.narrow(0, 2 * rc, channels);
    return out;
  }
};

}  // namespace

extern "C" {

char* esper_squeeze_excite(void* x, void* squeeze, void* excite, void* excite_bias,
                           void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && squeeze != nullptr && excite != nullptr && excite_bias != nullptr &&
                  kernels != nullptr && kernels[0] != nullptr && kernels[1] != nullptr &&
                  kernels[2] != nullptr,
              "squeeze_excite: null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  const auto& w1 = *static_cast<const at::Tensor*>(squeeze);
  const auto& w2 = *static_cast<const at::Tensor*>(excite);
  const auto& b2 = *static_cast<const at::Tensor*>(excite_bias);
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 && input.size(0) >= 1 &&
                  input.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                  (input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16),
              "squeeze_excite: expected a channels-last 4-D f32 or bf16 CUDA tensor");
  const int64_t channels = input.size(1);
  const int64_t hidden = w1.dim() == 2 ? w1.size(0) : 0;
  TORCH_CHECK(channels >= 1 && channels <= kMaxChannels && hidden >= 1 && hidden <= kMaxHidden,
              "squeeze_excite: ", channels, " channels and ", hidden, " hidden units (at most ",
              kMaxChannels, " and ", kMaxHidden, ")");
  TORCH_CHECK(input.size(2) * input.size(3) >= 1 &&
                  input.size(2) * input.size(3) <= INT32_MAX / channels &&
                  input.size(0) <= INT32_MAX,
              "squeeze_excite: an image or batch larger than 32-bit indexing covers");
  auto parameter = [&](const at::Tensor& t, at::IntArrayRef shape, const char* what) {
    TORCH_CHECK(t.sizes() == shape && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                    t.device() == input.device(),
                "squeeze_excite: the ", what, " must be a contiguous f32 ", shape,
                " on the input's device");
  };
  parameter(w1, {hidden, channels}, "squeeze weight");
  parameter(w2, {channels, hidden}, "excite weight");
  parameter(b2, {channels}, "excite bias");
  at::Tensor y = SqueezeExcite::apply(input, w1, w2, b2, as_int(kernels[0]), as_int(kernels[1]),
                                      as_int(kernels[2]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
