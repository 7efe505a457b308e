// nn_group_norm.cpp: relu(group_norm(x)), or residual + relu(group_norm(x))
// (a seed's residual block), over a channels-last 4-D tensor as an autograd
// function whose forward and backward launch run-time compiled
// kernels (src/nn/norm_source.rs): one block an image. Forward: one kernel
// (the group statistics, then the normalised, affine, rectified output;
// mean and 1/std saved). Backward: one kernel for the input gradient and
// the image's per-channel sums, then the convolution source's fixed-order
// reduction of those sums into the weight and bias gradients. With a
// residual, the forward kernel adds it to its output (as libtorch's add
// would, bit for bit), and the residual's gradient is the output's.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GroupNormRelu : public torch::autograd::Function<GroupNormRelu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& residual,
                            bool has_residual, int64_t groups, double eps,
                            int64_t forward_kernel, int64_t backward_kernel,
                            int64_t reduce_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t batch = x.size(0);
    int channels = static_cast<int>(x.size(1));
    int hw = static_cast<int>(x.size(2) * x.size(3));
    int g = static_cast<int>(groups);
    float epsilon = static_cast<float>(eps);
    at::Tensor y = at::empty_like(x, x.options().memory_format(at::MemoryFormat::ChannelsLast));
    auto f32 = x.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    at::Tensor mean = at::empty({batch, groups}, f32);
    at::Tensor rstd = at::empty({batch, groups}, f32);
    const void* x_ptr = x.data_ptr();
    const void* w_ptr = weight.data_ptr();
    const void* b_ptr = bias.data_ptr();
    void* y_ptr = y.data_ptr();
    void* mean_ptr = mean.data_ptr();
    void* rstd_ptr = rstd.data_ptr();
    const void* res_ptr = has_residual ? residual.data_ptr() : nullptr;
    void* args[] = {&x_ptr,    &w_ptr, &b_ptr,    &res_ptr, &y_ptr, &mean_ptr,
                    &rstd_ptr, &hw,    &channels, &g,       &epsilon};
    esper::jit_launch(reinterpret_cast<void*>(forward_kernel), dim3(static_cast<unsigned>(batch)),
                      dim3(kThreads), 0, args, stream_of(x));
    ctx->save_for_backward({x, weight, bias, mean, rstd});
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["reduce"] = reduce_kernel;
    ctx->saved_data["residual"] = has_residual;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    variable_list out(10);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor dy = aligned(grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast),
                            at::MemoryFormat::ChannelsLast);
    int batch = static_cast<int>(x.size(0));
    int channels = static_cast<int>(x.size(1));
    int hw = static_cast<int>(x.size(2) * x.size(3));
    int g = static_cast<int>(ctx->saved_data["groups"].toInt());
    at::Tensor dx = at::empty_like(x, x.options().memory_format(at::MemoryFormat::ChannelsLast));
    auto f32 = x.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    at::Tensor partials = at::empty({batch, 2 * channels}, f32);
    const void* x_ptr = x.data_ptr();
    const void* dy_ptr = dy.data_ptr();
    const void* w_ptr = weight.data_ptr();
    const void* b_ptr = saved[2].data_ptr();
    const void* mean_ptr = saved[3].data_ptr();
    const void* rstd_ptr = saved[4].data_ptr();
    void* dx_ptr = dx.data_ptr();
    void* partials_ptr = partials.data_ptr();
    cudaStream_t stream = stream_of(x);
    {
      void* args[] = {&x_ptr,  &dy_ptr,       &w_ptr, &b_ptr,     &mean_ptr, &rstd_ptr,
                      &dx_ptr, &partials_ptr, &hw,    &channels, &g};
      esper::jit_launch(handle(ctx, "backward"), dim3(batch), dim3(kThreads), 0, args, stream);
    }
    auto [dweight, dbias] = weight_bias_from_partials(handle(ctx, "reduce"), partials, batch,
                                                      channels, weight, saved[2], stream);
    out[0] = dx;
    out[1] = dweight;
    out[2] = dbias;
    if (ctx->saved_data["residual"].toBool()) {
      out[3] = grads[0];
    }
    return out;
  }
};

}  // namespace

extern "C" {

char* esper_group_norm_relu(void* x, void* weight, void* bias, void* residual, int64_t groups,
                            double eps, void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && bias != nullptr && kernels != nullptr &&
                  kernels[0] != nullptr && kernels[1] != nullptr && kernels[2] != nullptr,
              "group_norm_relu: null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  const auto& b = *static_cast<const at::Tensor*>(bias);
  TORCH_CHECK(input.is_cuda() && input.dim() == 4 &&
                  input.is_contiguous(at::MemoryFormat::ChannelsLast) && aligned16(input),
              "group_norm_relu: expected an aligned channels-last 4-D CUDA tensor");
  const int64_t channels = input.size(1);
  TORCH_CHECK(groups >= 1 && groups <= 64 && channels % groups == 0 && channels % 4 == 0 &&
                  channels <= 4 * kThreads,
              "group_norm_relu: ", channels, " channels in ", groups, " groups");
  TORCH_CHECK(input.size(2) * input.size(3) <= INT32_MAX / channels,
              "group_norm_relu: an image larger than 32-bit indexing covers");
  for (const at::Tensor* t : {&w, &b}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == channels && t->scalar_type() == at::kFloat &&
                    t->is_contiguous() && t->device() == input.device(),
                "group_norm_relu: weight and bias must be contiguous f32 [C] on the input's "
                "device");
  }
  // Without a residual, an empty placeholder: autograd functions take no
  // undefined tensor inputs.
  at::Tensor res = at::empty({0}, input.options());
  if (residual != nullptr) {
    res = *static_cast<const at::Tensor*>(residual);
    TORCH_CHECK(res.sizes() == input.sizes() && res.scalar_type() == input.scalar_type() &&
                    res.device() == input.device() &&
                    res.is_contiguous(at::MemoryFormat::ChannelsLast) && aligned16(res),
                "group_norm_relu: the residual must be an aligned channels-last tensor of the "
                "input's shape, dtype and device");
  }
  at::Tensor y = GroupNormRelu::apply(input, w, b, res, residual != nullptr, groups, eps,
                                      as_int(kernels[0]), as_int(kernels[1]), as_int(kernels[2]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
