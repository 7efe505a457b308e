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
// In bf16 with an f32 weight and bias, where the wgrad kernel is given, the
// weight and bias gradients are one tensor-core kernel over the rows
// (src/nn/linear_source.rs: esper_linear_wgrad, per-split partials of
// gᵀx and of g's column sums) and one fixed-order reduction.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAGuard.h>

#include <limits>
#include <utility>

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

// The wgrad kernel's tile (src/nn/linear_source.rs: LW_TILE, LW_ROWS,
// LW_THREADS).
constexpr int kWgradTile = 64;
constexpr int kWgradRows = 32;
constexpr int kWgradThreads = 128;

// Whether esper_linear_wgrad takes this backward: bf16 rows g [R, O] and
// x [R, I], dense and 16-byte aligned, O and I multiples of 8, R >= 1, an
// f32 weight (and bias), a device with bf16 tensor cores.
bool wgrad_fits(const at::Tensor& g, const at::Tensor& x2, at::ScalarType w_dtype,
                bool bias_wanted, at::ScalarType b_dtype) {
  return g.scalar_type() == at::kBFloat16 && x2.scalar_type() == at::kBFloat16 &&
         w_dtype == at::kFloat && (!bias_wanted || b_dtype == at::kFloat) && g.size(0) >= 1 &&
         g.size(1) % 8 == 0 && x2.size(1) % 8 == 0 && g.is_contiguous() && x2.is_contiguous() &&
         aligned16(g) && aligned16(x2) &&
         g.size(1) * x2.size(1) + g.size(1) <= std::numeric_limits<int>::max() &&
         at::cuda::getDeviceProperties(g.device().index())->major >= 8;
}

// (dW f32 [O, I], dB f32 [O] or undefined): the per-split partials of one
// wgrad launch, added up in split order by the reduction kernel.
std::pair<at::Tensor, at::Tensor> weight_bias_gradients(const at::Tensor& g, const at::Tensor& x2,
                                                        bool bias_wanted, void* wgrad,
                                                        void* reduce) {
  long long rows = g.size(0);
  int outs = static_cast<int>(g.size(1)), ins = static_cast<int>(x2.size(1));
  const int64_t tiles = ((outs + kWgradTile - 1) / kWgradTile) *
                        static_cast<int64_t>((ins + kWgradTile - 1) / kWgradTile);
  // About two blocks an SM, splits of whole 32-row stages.
  const int64_t stages = (rows + kWgradRows - 1) / kWgradRows;
  const int64_t wanted = std::max<int64_t>(1, (2 * sm_count(g) + tiles - 1) / tiles);
  const int64_t splits0 = std::min<int64_t>(wanted, stages);
  long long span = (stages + splits0 - 1) / splits0 * kWgradRows;
  const int splits = static_cast<int>((rows + span - 1) / span);
  int out_size = outs * ins + (bias_wanted ? outs : 0);
  at::Tensor partials =
      at::empty({static_cast<int64_t>(splits) * out_size}, g.options().dtype(at::kFloat));
  const void* g_ptr = g.data_ptr();
  const void* x_ptr = x2.data_ptr();
  void* partials_ptr = partials.data_ptr();
  int with_bias = bias_wanted ? 1 : 0;
  void* args[] = {&g_ptr, &x_ptr, &partials_ptr, &rows, &outs, &ins, &span, &with_bias};
  cudaStream_t stream = stream_of(g);
  esper::jit_launch(wgrad, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)),
                    dim3(kWgradThreads), 0, args, stream);
  at::Tensor sums = sum_partials(reduce, partials, splits, out_size, stream);
  at::Tensor dw = sums.narrow(0, 0, static_cast<int64_t>(outs) * ins).view({outs, ins});
  at::Tensor db = bias_wanted ? sums.narrow(0, static_cast<int64_t>(outs) * ins, outs) : at::Tensor();
  return {dw, db};
}

class Linear : public torch::autograd::Function<Linear> {
 public:
  // `bias` is an empty tensor for a layer without one (autograd functions
  // take no undefined inputs), as are `weight_c` and `bias_c` where no
  // shadow is given. `dtype` is the compute dtype.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& weight_c,
                            const at::Tensor& bias_c, int64_t dtype, int64_t col_sum_kernel,
                            int64_t reduce_kernel, int64_t wgrad_kernel) {
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
    ctx->saved_data["wgrad"] = wgrad_kernel;
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
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t in_features = wc.size(1);
    const int64_t out_features = wc.size(0);
    at::Tensor g = grads[0].to(xc.scalar_type()).reshape({-1, out_features}).contiguous();
    const at::Tensor x2 = xc.reshape({-1, in_features});
    if (ctx->needs_input_grad(0)) {
      at::Tensor dx = at::mm(g, wc).view(xc.sizes());
      out[0] = dx.to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const auto b_dtype = static_cast<at::ScalarType>(ctx->saved_data["b_dtype"].toInt());
    if (ctx->saved_data["wgrad"].toInt() != 0 && ctx->needs_input_grad(1) &&
        wgrad_fits(g, x2, w_dtype, ctx->needs_input_grad(2), b_dtype)) {
      auto [dw, db] = weight_bias_gradients(g, x2, ctx->needs_input_grad(2), handle(ctx, "wgrad"),
                                            handle(ctx, "reduce"));
      out[1] = dw;
      if (ctx->needs_input_grad(2)) {
        out[2] = db;
      }
      return out;
    }
    if (ctx->needs_input_grad(1)) {
      // bf16 products into an f32 gradient: cuBLAS writes f32 (no bf16
      // rounding, no cast).
      out[1] = w_dtype == g.scalar_type() ? at::mm(g.t(), x2) : at::mm(g.t(), x2, w_dtype);
    }
    if (ctx->needs_input_grad(2)) {
      at::Tensor ga = aligned(g, at::MemoryFormat::Contiguous);
      at::Tensor sums = column_sums(ga, handle(ctx, "col_sum"), handle(ctx, "reduce"));
      out[2] = sums.to(b_dtype);
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
      Linear::apply(input, w, b, wc, bc, dtype, as_int(kernels[0]), as_int(kernels[1]),
                    as_int(kernels[2]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
