// nn_linear.cpp: linear(x, weight, bias) over the last dimension as an
// autograd function whose backward writes the parameters' gradients in the
// parameters' own dtype. Forward: libtorch's linear on the compute dtype
// (autocast's, applied here). Backward: the input gradient as one GEMM; the
// weight gradient as one GEMM that writes f32 directly where the compute
// dtype is bf16 and the weight f32 (cuBLAS accumulates in f32 and writes
// f32, where libtorch writes bf16 and casts); the bias gradient as the
// column sums of the output gradient from a run-time compiled kernel
// (src/nn/source.rs: esper_col_sum, per-block partials) and the
// convolution source's fixed-order reduction, in f32. Where the caller
// passes bf16 shadows of an f32 weight and bias (src/nn/shadow.rs, cast
// for every layer at once), the forward takes them instead of casting.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The widest output the column-sum kernel takes with four columns a thread
// (src/nn/mod.rs: MAX_FUSED_LINEAR_OUT).
constexpr int64_t kMaxOut = 1024;

// f32 [C]: the column sums of the dense rows `g` ([rows, C], C a multiple
// of four, 16-byte aligned), summed in a fixed order.
at::Tensor column_sums(const at::Tensor& g, void* col_sum, void* reduce) {
  const int channels = static_cast<int>(g.size(1));
  long long rows = g.size(0);
  const int blocks = channel_blocks(rows, rows_per_pass(channels, 4), sm_count(g));
  at::Tensor partials = at::empty({blocks, channels}, g.options().dtype(at::kFloat));
  const void* g_ptr = g.data_ptr();
  void* partials_ptr = partials.data_ptr();
  int width = channels;
  cudaStream_t stream = stream_of(g);
  void* args[] = {&g_ptr, &partials_ptr, &rows, &width};
  esper::jit_launch(col_sum, dim3(blocks), dim3(kThreads), 0, args, stream);
  return sum_partials(reduce, partials, blocks, channels, stream);
}

class Linear : public torch::autograd::Function<Linear> {
 public:
  // `bias` is an empty tensor for a layer without one (autograd functions
  // take no undefined inputs), as are `weight_c` and `bias_c` where no
  // shadow is given. `dtype` is the compute dtype.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& weight_c,
                            const at::Tensor& bias_c, int64_t dtype, int64_t col_sum_kernel,
                            int64_t reduce_kernel) {
    c10::cuda::CUDAGuard guard(x.device());
    auto type = static_cast<at::ScalarType>(dtype);
    at::Tensor xc = x.scalar_type() == type ? x : x.to(type);
    xc = xc.contiguous();
    at::Tensor wc = weight.scalar_type() == type ? weight
                    : weight_c.numel() > 0       ? weight_c
                                                 : weight.to(type);
    const bool has_bias = bias.numel() > 0;
    at::Tensor bc;
    if (has_bias) {
      bc = bias.scalar_type() == type ? bias : bias_c.numel() > 0 ? bias_c : bias.to(type);
    }
    at::Tensor y;
    {
      // The casts above are autocast's; the product runs as given.
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      y = at::linear(xc, wc, bc.defined() ? std::optional<at::Tensor>(bc) : std::nullopt);
    }
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->saved_data["col_sum"] = col_sum_kernel;
    ctx->saved_data["reduce"] = reduce_kernel;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& xc = saved[0];
    const at::Tensor& wc = saved[1];
    variable_list out(8);
    if (!grads[0].defined()) {
      return out;
    }
    c10::cuda::CUDAGuard guard(xc.device());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t in_features = wc.size(1);
    const int64_t out_features = wc.size(0);
    at::Tensor g = grads[0].to(xc.scalar_type()).reshape({-1, out_features}).contiguous();
    const at::Tensor x2 = xc.reshape({-1, in_features});
    if (ctx->needs_input_grad(0)) {
      at::Tensor dx = at::mm(g, wc).view(xc.sizes());
      out[0] = dx.to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    if (ctx->needs_input_grad(1)) {
      const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
      // bf16 products into an f32 gradient: cuBLAS writes f32 (no bf16
      // rounding, no cast).
      out[1] = w_dtype == g.scalar_type() ? at::mm(g.t(), x2) : at::mm(g.t(), x2, w_dtype);
    }
    if (ctx->needs_input_grad(2)) {
      at::Tensor ga = aligned(g, at::MemoryFormat::Contiguous);
      at::Tensor sums = column_sums(ga, handle(ctx, "col_sum"), handle(ctx, "reduce"));
      out[2] = sums.to(static_cast<at::ScalarType>(ctx->saved_data["b_dtype"].toInt()));
    }
    return out;
  }
};

// A shadow must be the bf16 image of its f32 parameter: same sizes, same
// device, contiguous.
bool fits_shadow(const at::Tensor& shadow, const at::Tensor& param) {
  return shadow.scalar_type() == at::kBFloat16 && param.scalar_type() == at::kFloat &&
         shadow.sizes() == param.sizes() && shadow.device() == param.device() &&
         shadow.is_contiguous();
}

}  // namespace

extern "C" {

char* esper_linear(void* x, void* weight, void* bias, void* weight_c, void* bias_c, int32_t bf16,
                   void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(x != nullptr && weight != nullptr && kernels != nullptr && kernels[0] != nullptr &&
                  kernels[1] != nullptr,
              "linear: null argument");
  const auto& input = *static_cast<const at::Tensor*>(x);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  // No bias: an empty placeholder (see Linear::forward).
  at::Tensor b = bias != nullptr ? *static_cast<const at::Tensor*>(bias) : at::empty({0}, w.options());
  TORCH_CHECK(input.is_cuda() && input.dim() >= 2 &&
                  (input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16),
              "linear: expected an f32 or bf16 CUDA tensor of at least two dimensions");
  TORCH_CHECK(w.dim() == 2 && w.size(1) == input.size(-1) && w.device() == input.device() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "linear: weight of shape ", w.sizes(), " for input ", input.sizes());
  const int64_t out_features = w.size(0);
  TORCH_CHECK(out_features >= 4 && out_features % 4 == 0 && out_features <= kMaxOut,
              "linear: ", out_features, " outputs (the kernels take multiples of 4 up to ",
              kMaxOut, ")");
  TORCH_CHECK(bias == nullptr || (b.dim() == 1 && b.size(0) == out_features &&
                               b.device() == input.device() &&
                               (b.scalar_type() == at::kFloat || b.scalar_type() == at::kBFloat16)),
              "linear: bias must be [", out_features, "] on the input's device");
  const at::Tensor none = at::empty({0}, w.options());
  const at::Tensor wc = weight_c != nullptr ? *static_cast<const at::Tensor*>(weight_c) : none;
  const at::Tensor bc =
      bias_c != nullptr && bias != nullptr ? *static_cast<const at::Tensor*>(bias_c) : none;
  TORCH_CHECK(weight_c == nullptr || (bf16 && fits_shadow(wc, w)),
              "linear: the weight's shadow must be a contiguous bf16 tensor of its size");
  TORCH_CHECK(bias_c == nullptr || bias == nullptr || (bf16 && fits_shadow(bc, b)),
              "linear: the bias's shadow must be a contiguous bf16 tensor of its size");
  const auto dtype = static_cast<int64_t>(bf16 ? at::kBFloat16 : at::kFloat);
  at::Tensor y =
      Linear::apply(input, w, b, wc, bc, dtype, as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
