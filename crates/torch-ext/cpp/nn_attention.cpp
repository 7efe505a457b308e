// nn_attention.cpp: causal self-attention over a packed bf16 projection
// qkv [B, T, 3C] (C = heads x D) as an autograd function whose forward and
// backward are one run-time compiled kernel each (src/nn/attention_source.rs):
// one block of four warps per (sequence, head). Forward: the merged output
// [B, T, C] and each row's base-2 log-sum-exp. Backward: the projection's
// gradient [B, T, 3C] (queries, keys, values side by side) in one launch.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

#include <cmath>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The kernels' block and their longest sequence (src/nn/attention_source.rs:
// ATT_THREADS, ATT_KEYS).
constexpr int kAttentionThreads = 128;
constexpr int64_t kMaxTime = 64;

struct Scales {
  float scale;
  float scale_log2;
};

Scales scales_of(int64_t head_dim) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return {scale, scale * 1.4426950408889634f};
}

class CausalAttention : public torch::autograd::Function<CausalAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                            int64_t forward_kernel, int64_t backward_kernel) {
    c10::cuda::CUDAGuard guard(qkv.device());
    const int64_t batch = qkv.size(0), time = qkv.size(1), width = qkv.size(2) / 3;
    at::Tensor out = at::empty({batch, time, width}, qkv.options());
    at::Tensor lse2 = at::empty({batch, heads, time}, qkv.options().dtype(at::kFloat));
    const void* qkv_ptr = qkv.data_ptr();
    void* out_ptr = out.data_ptr();
    void* lse_ptr = lse2.data_ptr();
    int t = static_cast<int>(time), h = static_cast<int>(heads);
    float scale_log2 = scales_of(width / heads).scale_log2;
    void* args[] = {&qkv_ptr, &out_ptr, &lse_ptr, &t, &h, &scale_log2};
    esper::jit_launch(reinterpret_cast<void*>(forward_kernel),
                      dim3(static_cast<unsigned>(batch * heads)), dim3(kAttentionThreads), 0, args,
                      stream_of(qkv));
    ctx->save_for_backward({qkv, out, lse2});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["backward"] = backward_kernel;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(4);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) {
      return result;
    }
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& qkv = saved[0];
    const at::Tensor& out = saved[1];
    const at::Tensor& lse2 = saved[2];
    c10::cuda::CUDAGuard guard(qkv.device());
    const int64_t heads = ctx->saved_data["heads"].toInt();
    at::Tensor dout = grads[0].to(at::kBFloat16).contiguous();
    if (!aligned16(dout)) {
      dout = dout.clone();
    }
    at::Tensor dqkv = at::empty_like(qkv, at::MemoryFormat::Contiguous);
    const void* qkv_ptr = qkv.data_ptr();
    const void* out_ptr = out.data_ptr();
    const void* dout_ptr = dout.data_ptr();
    const void* lse_ptr = lse2.data_ptr();
    void* dqkv_ptr = dqkv.data_ptr();
    int t = static_cast<int>(qkv.size(1)), h = static_cast<int>(heads);
    const Scales s = scales_of(qkv.size(2) / 3 / heads);
    float scale = s.scale, scale_log2 = s.scale_log2;
    void* args[] = {&qkv_ptr, &out_ptr, &dout_ptr, &lse_ptr, &dqkv_ptr,
                    &t,       &h,       &scale,    &scale_log2};
    esper::jit_launch(handle(ctx, "backward"),
                      dim3(static_cast<unsigned>(qkv.size(0) * heads)), dim3(kAttentionThreads), 0,
                      args, stream_of(qkv));
    result[0] = dqkv;
    return result;
  }
};

}  // namespace

extern "C" {

char* esper_causal_attention(void* qkv, int64_t heads, void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(qkv != nullptr && kernels != nullptr && kernels[0] != nullptr &&
                  kernels[1] != nullptr,
              "causal attention: null argument");
  const auto& x = *static_cast<const at::Tensor*>(qkv);
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.is_contiguous() &&
                  x.scalar_type() == at::kBFloat16 && aligned16(x),
              "causal attention: expected a contiguous, 16-byte aligned bf16 CUDA tensor "
              "[B, T, 3C]");
  TORCH_CHECK(heads >= 1 && x.size(2) % 3 == 0 && (x.size(2) / 3) % heads == 0,
              "causal attention: the last dimension ", x.size(2), " is not 3 x ", heads,
              " heads x head width");
  const int64_t head_dim = x.size(2) / 3 / heads;
  TORCH_CHECK(head_dim == 16 || head_dim == 32,
              "causal attention: the kernels take heads of 16 or 32 values, not ", head_dim);
  TORCH_CHECK(x.size(1) >= 1 && x.size(1) <= kMaxTime && x.size(0) >= 1 &&
                  x.size(0) * heads <= (int64_t{1} << 31) - 1,
              "causal attention: ", x.size(0), " sequences of ", x.size(1), " positions x ", heads,
              " heads (the kernels take 1 to ", kMaxTime, " positions)");
  at::Tensor y = CausalAttention::apply(x, heads, as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
