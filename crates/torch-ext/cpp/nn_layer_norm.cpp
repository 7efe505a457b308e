// nn_layer_norm.cpp: layer_norm(x) over the last dimension of dense [..., C]
// rows as an autograd function whose forward and backward launch run-time
// compiled kernels (src/nn/layer_norm_source.rs): one warp a row. Forward:
// one kernel (the output, the rows' mean and 1/std saved). Backward: one
// kernel for the input gradient and the blocks' per-column sums, then the
// convolution source's fixed-order reduction of those sums into the weight
// and bias gradients. With `bf16_out`, an f32 input gives a bf16 output
// (and takes a bf16 output gradient): the f32 build's `_bf16_out` kernels.
// layer_norm_fork returns (x, layer_norm(x)) as one node whose backward
// kernel adds the pass-through's gradient into dx (a residual stream's
// fork, without autograd's separate sum).
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

#include <memory>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The kernels' widest row (src/nn/layer_norm_source.rs: LN_MAX_C).
constexpr int64_t kMaxWidth = 512;

// Blocks of eight warps a row pass: about `rows_per_warp` rows a warp, at
// most `per_sm` blocks an SM.
int row_blocks(int64_t rows, int rows_per_warp, int per_sm, int sms) {
  const int64_t per_block = 8 * static_cast<int64_t>(rows_per_warp);
  const int64_t wanted = (rows + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, per_sm * sms)));
}

// The forward kernel's launch: y (bf16 where `bf16_out`, else x's dtype),
// the rows' mean and 1/std saved in `ctx` with x, weight and bias.
at::Tensor ln_forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, double eps, bool bf16_out, int64_t forward_kernel,
                      int64_t backward_kernel, int64_t reduce_kernel) {
  c10::cuda::CUDAGuard guard(x.device());
  int width = static_cast<int>(x.size(-1));
  int rows = static_cast<int>(x.numel() / std::max<int64_t>(1, width));
  float epsilon = static_cast<float>(eps);
  at::Tensor y = bf16_out ? at::empty(x.sizes(), x.options().dtype(at::kBFloat16))
                          : at::empty_like(x, at::MemoryFormat::Contiguous);
  auto f32 = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({rows}, f32);
  at::Tensor rstd = at::empty({rows}, f32);
  const void* x_ptr = x.data_ptr();
  const void* w_ptr = weight.data_ptr();
  const void* b_ptr = bias.data_ptr();
  void* y_ptr = y.data_ptr();
  void* mean_ptr = mean.data_ptr();
  void* rstd_ptr = rstd.data_ptr();
  void* args[] = {&x_ptr, &w_ptr, &b_ptr, &y_ptr, &mean_ptr, &rstd_ptr, &rows, &width, &epsilon};
  const int blocks = row_blocks(rows, 2, 8, sm_count(x));
  esper::jit_launch(reinterpret_cast<void*>(forward_kernel), dim3(blocks), dim3(kThreads), 0, args,
                    stream_of(x));
  ctx->save_for_backward({x, weight, bias, mean, rstd});
  ctx->saved_data["backward"] = backward_kernel;
  ctx->saved_data["bf16_out"] = bf16_out;
  ctx->saved_data["reduce"] = reduce_kernel;
  return y;
}

// The backward from the output gradient `dy`: {dx, dweight, dbias}, with
// `residual` (defined or not) added into dx by the kernel itself.
variable_list ln_backward(AutogradContext* ctx, const at::Tensor& grad_y,
                          const at::Tensor& residual) {
  auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  const at::Tensor& weight = saved[1];
  c10::cuda::CUDAGuard guard(x.device());
  const auto dy_type = ctx->saved_data["bf16_out"].toBool() ? at::kBFloat16 : x.scalar_type();
  at::Tensor dy = aligned(grad_y.to(dy_type).contiguous(), at::MemoryFormat::Contiguous);
  at::Tensor dres;
  if (residual.defined()) {
    dres = aligned(residual.to(x.scalar_type()).contiguous(), at::MemoryFormat::Contiguous);
  }
  int width = static_cast<int>(x.size(-1));
  int rows = static_cast<int>(x.numel() / std::max<int64_t>(1, width));
  int blocks = row_blocks(rows, 4, 2, sm_count(x));
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto f32 = x.options().dtype(at::kFloat);
  at::Tensor partials = at::empty({blocks, 2 * static_cast<int64_t>(width)}, f32);
  const void* x_ptr = x.data_ptr();
  const void* dy_ptr = dy.data_ptr();
  const void* w_ptr = weight.data_ptr();
  const void* mean_ptr = saved[3].data_ptr();
  const void* rstd_ptr = saved[4].data_ptr();
  const void* dres_ptr = dres.defined() ? dres.data_ptr() : nullptr;
  void* dx_ptr = dx.data_ptr();
  void* partials_ptr = partials.data_ptr();
  cudaStream_t stream = stream_of(x);
  {
    void* args[] = {&x_ptr,    &dy_ptr, &w_ptr,        &mean_ptr, &rstd_ptr,
                    &dres_ptr, &dx_ptr, &partials_ptr, &rows,     &width};
    esper::jit_launch(handle(ctx, "backward"), dim3(blocks), dim3(kThreads), 0, args, stream);
  }
  auto [dweight, dbias] = weight_bias_from_partials(handle(ctx, "reduce"), partials, blocks, width,
                                                    weight, saved[2], stream);
  return {dx, dweight, dbias};
}

class LayerNorm : public torch::autograd::Function<LayerNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps, bool bf16_out,
                            int64_t forward_kernel, int64_t backward_kernel,
                            int64_t reduce_kernel) {
    return ln_forward(ctx, x, weight, bias, eps, bf16_out, forward_kernel, backward_kernel,
                      reduce_kernel);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(8);
    if (!grads[0].defined()) {
      return out;
    }
    variable_list dx_dw_db = ln_backward(ctx, grads[0], at::Tensor());
    std::copy(dx_dw_db.begin(), dx_dw_db.end(), out.begin());
    return out;
  }
};

// (x, layer_norm(x)) as one node: a layer norm on a residual stream that
// goes on past it. Autograd hands this node both gradients, and the
// backward kernel adds the pass-through's into dx, where a plain layer
// norm would leave autograd to add the two in a pass of its own.
class LayerNormFork : public torch::autograd::Function<LayerNormFork> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& bias, double eps,
                               bool bf16_out, int64_t forward_kernel, int64_t backward_kernel,
                               int64_t reduce_kernel) {
    at::Tensor y = ln_forward(ctx, x, weight, bias, eps, bf16_out, forward_kernel,
                              backward_kernel, reduce_kernel);
    // Returned unchanged: autograd makes it a view with this node's
    // gradient edge (no copy).
    return {x, y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(8);
    const at::Tensor& pass = grads[0];
    const at::Tensor& grad_y = grads[1];
    if (!grad_y.defined()) {
      out[0] = pass;
      return out;
    }
    variable_list dx_dw_db = ln_backward(ctx, grad_y, pass);
    std::copy(dx_dw_db.begin(), dx_dw_db.end(), out.begin());
    return out;
  }
};

// The tensors behind an entry point's arguments, after the checks every
// layer-norm entry point makes before anything runs (`op` names it in the
// errors).
struct LayerNormArgs {
  const at::Tensor& input;
  const at::Tensor& weight;
  const at::Tensor& bias;
};

LayerNormArgs layer_norm_args(const char* op, void* x, void* weight, void* bias,
                              int32_t bf16_out, void* const* kernels) {
  TORCH_CHECK(x != nullptr && weight != nullptr && bias != nullptr && kernels != nullptr &&
                  kernels[0] != nullptr && kernels[1] != nullptr && kernels[2] != nullptr,
              op, ": null argument");
  LayerNormArgs args{*static_cast<const at::Tensor*>(x), *static_cast<const at::Tensor*>(weight),
                     *static_cast<const at::Tensor*>(bias)};
  const at::Tensor& input = args.input;
  TORCH_CHECK(input.is_cuda() && input.dim() >= 1 && input.is_contiguous() && aligned16(input) &&
                  (input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16),
              op, ": expected an aligned contiguous f32 or bf16 CUDA tensor");
  TORCH_CHECK(!bf16_out || input.scalar_type() == at::kFloat, op,
              ": a bf16 output is made from an f32 input");
  const int64_t width = input.size(-1);
  TORCH_CHECK(width >= 4 && width % 4 == 0 && width <= kMaxWidth, op, ": a last dimension of ",
              width, " (the kernels take multiples of 4 up to ", kMaxWidth, ")");
  TORCH_CHECK(input.numel() / width <= INT32_MAX, op,
              ": more rows than 32-bit indexing covers");
  for (const at::Tensor* t : {&args.weight, &args.bias}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == width && t->scalar_type() == at::kFloat &&
                    t->is_contiguous() && t->device() == input.device(),
                op, ": weight and bias must be contiguous f32 [C] on the input's device");
  }
  return args;
}

}  // namespace

extern "C" {

char* esper_layer_norm(void* x, void* weight, void* bias, double eps, int32_t bf16_out,
                       void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  const LayerNormArgs args = layer_norm_args("layer_norm", x, weight, bias, bf16_out, kernels);
  at::Tensor y = LayerNorm::apply(args.input, args.weight, args.bias, eps, bf16_out != 0,
                                  as_int(kernels[0]), as_int(kernels[1]), as_int(kernels[2]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

char* esper_layer_norm_fork(void* x, void* weight, void* bias, double eps, int32_t bf16_out,
                            void* const* kernels, void** out_pass, void** out_y) {
  ESPER_TRY
  *out_pass = nullptr;
  *out_y = nullptr;
  const LayerNormArgs args =
      layer_norm_args("layer_norm_fork", x, weight, bias, bf16_out, kernels);
  variable_list outs =
      LayerNormFork::apply(args.input, args.weight, args.bias, eps, bf16_out != 0,
                           as_int(kernels[0]), as_int(kernels[1]), as_int(kernels[2]));
  auto pass = std::make_unique<at::Tensor>(std::move(outs[0]));
  *out_y = new at::Tensor(std::move(outs[1]));
  *out_pass = pass.release();
  ESPER_CATCH
}

}  // extern "C"
