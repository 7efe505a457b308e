// nn_blend.cpp: the alpha blend lerp(h, s, w) with one weight per sample as
// an autograd function whose forward and backward launch run-time compiled
// kernels (src/nn/blend_source.rs), alone or followed by a 2x2 max-pool
// (BlendLerpPool): one elementwise pass each way, the
// weight of a value's sample read from the device, `vec` values a thread.
// h and s share one dense layout (contiguous, or channels-last 4-D), in
// which each sample's values lie together; the weight is f32 [N] (N the
// batch, or 1 for every sample) and gets no gradient; with `clamp` the
// kernels clamp each weight to [0, 1] as they read it.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::MemoryFormat format_of(const at::Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast)
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

// `period` > 0: the forward kernel's last argument (the values of h and s
// it reads again for each block of outputs); 0 for the backward kernel.
// flags: bit 0 one weight for every sample, bit 1 clamp the weights to
// [0, 1] (the kernels' blend_weight).
void launch(void* kernel, std::vector<void*> pointers, const at::Tensor& like, int64_t vec,
            int64_t per_sample, int flags, int64_t period = 0) {
  long long n = static_cast<long long>(like.numel());
  long long per = static_cast<long long>(per_sample);
  long long reread = static_cast<long long>(period);
  std::vector<void*> args;
  for (void*& p : pointers) {
    args.push_back(&p);
  }
  args.push_back(&n);
  args.push_back(&per);
  args.push_back(&flags);
  if (period > 0) {
    args.push_back(&reread);
  }
  const int blocks = elementwise_blocks((n + vec - 1) / vec, sm_count(like));
  esper::jit_launch(kernel, dim3(blocks), dim3(kThreads), 0, args.data(), stream_of(like));
}

class BlendLerp : public torch::autograd::Function<BlendLerp> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& s,
                            const at::Tensor& w, int64_t vec, bool clamp,
                            int64_t forward_kernel, int64_t backward_kernel) {
    c10::cuda::CUDAGuard guard(h.device());
    const at::MemoryFormat format = format_of(h);
    at::Tensor y = at::empty_like(h, h.options().memory_format(format));
    const int64_t per_sample = h.numel() / h.size(0);
    const int flags = (w.numel() == 1 ? 1 : 0) | (clamp ? 2 : 0);
    launch(reinterpret_cast<void*>(forward_kernel),
           {h.data_ptr(), s.data_ptr(), w.data_ptr(), y.data_ptr()}, h, vec, per_sample, flags,
           h.numel());
    ctx->save_for_backward({w});
    ctx->saved_data["flags"] = static_cast<int64_t>(flags);
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["channels_last"] = format == at::MemoryFormat::ChannelsLast;
    ctx->saved_data["per_sample"] = per_sample;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(7);
    if (!grads[0].defined()) {
      return out;
    }
    const at::Tensor w = ctx->get_saved_variables()[0];
    const at::MemoryFormat format = ctx->saved_data["channels_last"].toBool()
                                        ? at::MemoryFormat::ChannelsLast
                                        : at::MemoryFormat::Contiguous;
    c10::cuda::CUDAGuard guard(grads[0].device());
    const at::Tensor g = aligned(grads[0].contiguous(format), format);
    at::Tensor dh = at::empty_like(g, g.options().memory_format(format));
    at::Tensor ds = at::empty_like(g, g.options().memory_format(format));
    const int flags = static_cast<int>(ctx->saved_data["flags"].toInt());
    launch(handle(ctx, "backward"), {g.data_ptr(), w.data_ptr(), dh.data_ptr(), ds.data_ptr()}, g,
           ctx->saved_data["vec"].toInt(), ctx->saved_data["per_sample"].toInt(), flags);
    out[0] = dh;
    out[1] = ds;
    return out;
  }
};

// The blend then the 2x2 max-pool (stride 2, floor) of 4-D h and s in one
// layout (channels-last, or contiguous NCHW with vec 1): the pooled
// [N, C, H/2, W/2] in that layout, nothing full-size written. h, s and w are
// saved; the backward recomputes each window's argmax from them, routes the
// pooled gradient to it and splits it between h and s in one pass.
class BlendLerpPool : public torch::autograd::Function<BlendLerpPool> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& s,
                            const at::Tensor& w, bool channels_last, int64_t vec, bool clamp,
                            int64_t forward_kernel, int64_t backward_kernel) {
    c10::cuda::CUDAGuard guard(h.device());
    const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    at::Tensor y = at::empty({h.size(0), h.size(1), h.size(2) / 2, h.size(3) / 2},
                             h.options().memory_format(format));
    const int flags = (w.numel() == 1 ? 1 : 0) | (clamp ? 2 : 0);
    launch_pooled(reinterpret_cast<void*>(forward_kernel),
                  {h.data_ptr(), s.data_ptr(), w.data_ptr(), y.data_ptr()}, h, y, channels_last,
                  vec, flags);
    ctx->save_for_backward({h, s, w});
    ctx->saved_data["flags"] = static_cast<int64_t>(flags);
    ctx->saved_data["vec"] = vec;
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["channels_last"] = channels_last;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(8);
    if (!grads[0].defined()) {
      return out;
    }
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& s = saved[1];
    const at::Tensor& w = saved[2];
    const bool channels_last = ctx->saved_data["channels_last"].toBool();
    const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    c10::cuda::CUDAGuard guard(h.device());
    const at::Tensor g = aligned(grads[0].to(h.scalar_type()).contiguous(format), format);
    // Every window writes its inputs' gradients and the row and column a
    // floor pool leaves out, so nothing needs zeroing.
    at::Tensor dh = at::empty_like(h, h.options().memory_format(format));
    at::Tensor ds = at::empty_like(h, h.options().memory_format(format));
    launch_pooled(handle(ctx, "backward"),
                  {h.data_ptr(), s.data_ptr(), w.data_ptr(), g.data_ptr(), dh.data_ptr(),
                   ds.data_ptr()},
                  h, g, channels_last, ctx->saved_data["vec"].toInt(),
                  static_cast<int>(ctx->saved_data["flags"].toInt()));
    out[0] = dh;
    out[1] = ds;
    return out;
  }

 private:
  // One thread a pooled value group: `pointers`, then N, C, H, W of the
  // full-size `h`, the layout and the weight flags.
  static void launch_pooled(void* kernel, std::vector<void*> pointers, const at::Tensor& h,
                            const at::Tensor& pooled, bool channels_last, int64_t vec,
                            int flags) {
    int n = static_cast<int>(h.size(0));
    int channels = static_cast<int>(h.size(1));
    int height = static_cast<int>(h.size(2));
    int width = static_cast<int>(h.size(3));
    int cl = channels_last ? 1 : 0;
    std::vector<void*> args;
    for (void*& p : pointers) {
      args.push_back(&p);
    }
    args.push_back(&n);
    args.push_back(&channels);
    args.push_back(&height);
    args.push_back(&width);
    args.push_back(&cl);
    args.push_back(&flags);
    esper::jit_launch(kernel, dim3(elementwise_blocks(pooled.numel() / vec, sm_count(h))),
                      dim3(kThreads), 0, args.data(), stream_of(h));
  }
};

}  // namespace

extern "C" {

char* esper_blend_lerp_pool2(void* host, void* seed, void* weight, int32_t channels_last,
                             int32_t vec, int32_t clamp, void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(host != nullptr && seed != nullptr && weight != nullptr && kernels != nullptr &&
                  kernels[0] != nullptr && kernels[1] != nullptr,
              "blend_lerp_pool2: null argument");
  const auto& h = *static_cast<const at::Tensor*>(host);
  const auto& s = *static_cast<const at::Tensor*>(seed);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  const auto format =
      channels_last != 0 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  TORCH_CHECK(h.is_cuda() && h.dim() == 4 && h.size(0) >= 1 && h.size(1) >= 1 &&
                  h.size(2) >= 2 && h.size(3) >= 2 && h.is_contiguous(format),
              "blend_lerp_pool2: expected a 4-D CUDA tensor in the given layout with at least "
              "one sample and channel and two pixels a side");
  TORCH_CHECK(s.sizes() == h.sizes() && s.strides() == h.strides() &&
                  s.scalar_type() == h.scalar_type() && s.device() == h.device(),
              "blend_lerp_pool2: host and seed differ in shape, layout, dtype or device");
  TORCH_CHECK(h.numel() <= INT32_MAX,
              "blend_lerp_pool2: more elements than 32-bit indexing covers");
  TORCH_CHECK(w.dim() == 1 && (w.numel() == 1 || w.numel() == h.size(0)) &&
                  w.scalar_type() == at::kFloat && w.is_contiguous() && w.device() == h.device() &&
                  !w.requires_grad(),
              "blend_lerp_pool2: the weight must be a contiguous f32 [1] or [N] on the host's "
              "device, without gradient");
  TORCH_CHECK(vec == 1 || (vec == 4 && channels_last != 0 && h.size(1) % 4 == 0 &&
                           aligned16(h) && aligned16(s)),
              "blend_lerp_pool2: vec ", vec, " does not fit the tensors");
  at::Tensor y = BlendLerpPool::apply(h, s, w, channels_last != 0, vec, clamp != 0,
                                      as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

char* esper_blend_lerp(void* host, void* seed, void* weight, int32_t vec, int32_t clamp,
                       void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(host != nullptr && seed != nullptr && weight != nullptr && kernels != nullptr &&
                  kernels[0] != nullptr && kernels[1] != nullptr,
              "blend_lerp: null argument");
  const auto& h = *static_cast<const at::Tensor*>(host);
  const auto& s = *static_cast<const at::Tensor*>(seed);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  TORCH_CHECK(h.is_cuda() && h.dim() >= 1 && h.size(0) >= 1 && h.numel() > 0,
              "blend_lerp: expected a non-empty CUDA tensor");
  TORCH_CHECK(s.sizes() == h.sizes() && s.strides() == h.strides() &&
                  s.scalar_type() == h.scalar_type() && s.device() == h.device(),
              "blend_lerp: host and seed differ in shape, layout, dtype or device");
  TORCH_CHECK(h.is_contiguous() ||
                  (h.dim() == 4 && h.is_contiguous(at::MemoryFormat::ChannelsLast)),
              "blend_lerp: expected a contiguous or channels-last tensor");
  TORCH_CHECK(w.dim() == 1 && (w.numel() == 1 || w.numel() == h.size(0)) &&
                  w.scalar_type() == at::kFloat && w.is_contiguous() && w.device() == h.device() &&
                  !w.requires_grad(),
              "blend_lerp: the weight must be a contiguous f32 [1] or [N] on the host's "
              "device, without gradient");
  TORCH_CHECK(vec == 1 || (vec == 4 && (h.numel() / h.size(0)) % 4 == 0 && aligned16(h) &&
                           aligned16(s)),
              "blend_lerp: vec ", vec, " does not fit the tensors");
  at::Tensor y =
      BlendLerp::apply(h, s, w, vec, clamp != 0, as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

char* esper_blend_lerp_replicated(void* host, void* seed, void* weight, int64_t replicas,
                                  int32_t vec, void* forward_kernel, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(host != nullptr && seed != nullptr && weight != nullptr && forward_kernel != nullptr,
              "blend_lerp_replicated: null argument");
  const auto& h = *static_cast<const at::Tensor*>(host);
  const auto& s = *static_cast<const at::Tensor*>(seed);
  const auto& w = *static_cast<const at::Tensor*>(weight);
  TORCH_CHECK(replicas >= 1, "blend_lerp_replicated: ", replicas, " replicas");
  TORCH_CHECK(h.is_cuda() && h.dim() >= 1 && h.size(0) >= 1 && h.numel() > 0,
              "blend_lerp_replicated: expected a non-empty CUDA tensor");
  TORCH_CHECK(s.sizes() == h.sizes() && s.strides() == h.strides() &&
                  s.scalar_type() == h.scalar_type() && s.device() == h.device(),
              "blend_lerp_replicated: host and seed differ in shape, layout, dtype or device");
  TORCH_CHECK(!h.requires_grad() && !s.requires_grad(),
              "blend_lerp_replicated: forward only (host and seed must not require gradients)");
  TORCH_CHECK(h.is_contiguous() ||
                  (h.dim() == 4 && h.is_contiguous(at::MemoryFormat::ChannelsLast)),
              "blend_lerp_replicated: expected a contiguous or channels-last tensor");
  TORCH_CHECK(w.dim() == 1 && (w.numel() == 1 || w.numel() == replicas * h.size(0)) &&
                  w.scalar_type() == at::kFloat && w.is_contiguous() && w.device() == h.device(),
              "blend_lerp_replicated: the weight must be a contiguous f32 [1] or [replicas * N] "
              "on the host's device");
  const int64_t per_sample = h.numel() / h.size(0);
  TORCH_CHECK(vec == 1 || (vec == 4 && per_sample % 4 == 0 && aligned16(h) && aligned16(s)),
              "blend_lerp_replicated: vec ", vec, " does not fit the tensors");
  c10::cuda::CUDAGuard guard(h.device());
  std::vector<int64_t> sizes = h.sizes().vec();
  sizes[0] = replicas * h.size(0);
  at::Tensor y = at::empty(sizes, h.options().memory_format(format_of(h)));
  launch(forward_kernel, {h.data_ptr(), s.data_ptr(), w.data_ptr(), y.data_ptr()}, y, vec,
         per_sample, w.numel() == 1 ? 1 : 0, h.numel());
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
