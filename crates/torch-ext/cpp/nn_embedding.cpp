// nn_embedding.cpp: embedding(weight, ids) as an autograd function whose
// backward computes the weight gradient without a sort: a run-time
// compiled kernel (src/nn/embedding_source.rs) sums each vocabulary row's
// output-gradient rows per chunk of ids, then the convolution source's
// fixed-order reduction adds the chunks. Forward: libtorch's embedding.
#include "esper_torch_ext.h"
#include "error.h"
#include "nn_internal.h"

#include <c10/cuda/CUDAGuard.h>

namespace {

using namespace esper::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The kernel's widest row and block (src/nn/embedding_source.rs:
// EMB_MAX_C, EMB_WARPS).
constexpr int64_t kMaxWidth = 512;
constexpr int kWarps = 8;
// Most chunks of ids, and the fewest ids a chunk (a multiple of 32 ids a
// warp): the partial sums are chunks x vocabulary x width floats, at most
// kMaxPartials (64 MiB). Weights of at most kMaxElements values
// (src/nn/mod.rs: MAX_FUSED_EMBEDDING_VALUES).
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kMinSpan = 32 * kWarps * 2;
constexpr int64_t kMaxPartials = int64_t{1} << 24;
constexpr int64_t kMaxElements = int64_t{1} << 22;

class Embedding : public torch::autograd::Function<Embedding> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids,
                            int64_t backward_kernel, int64_t reduce_kernel) {
    c10::cuda::CUDAGuard guard(weight.device());
    at::Tensor y = at::embedding(weight, ids);
    ctx->save_for_backward({ids});
    ctx->saved_data["vocabulary"] = weight.size(0);
    ctx->saved_data["width"] = weight.size(1);
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["backward"] = backward_kernel;
    ctx->saved_data["reduce"] = reduce_kernel;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor ids = ctx->get_saved_variables()[0].reshape({-1}).contiguous();
    variable_list out(4);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) {
      return out;
    }
    c10::cuda::CUDAGuard guard(ids.device());
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    int vocabulary = static_cast<int>(ctx->saved_data["vocabulary"].toInt());
    int width = static_cast<int>(ctx->saved_data["width"].toInt());
    at::Tensor g = grads[0].to(dtype).reshape({-1, width}).contiguous();
    long long n = g.size(0);
    const int64_t most_chunks =
        std::max<int64_t>(1, std::min<int64_t>(kMaxChunks, kMaxPartials / (int64_t{vocabulary} * width)));
    long long span = std::max<int64_t>(kMinSpan, (n + most_chunks - 1) / most_chunks);
    span = (span + 32 * kWarps - 1) / (32 * kWarps) * (32 * kWarps);
    int chunks = static_cast<int>(std::max<long long>(1, (n + span - 1) / span));
    at::Tensor partials = at::empty({static_cast<int64_t>(chunks) * vocabulary * width},
                                    g.options().dtype(at::kFloat));
    const void* ids_ptr = ids.data_ptr();
    const void* g_ptr = g.data_ptr();
    void* partials_ptr = partials.data_ptr();
    cudaStream_t stream = stream_of(g);
    void* args[] = {&ids_ptr, &g_ptr, &partials_ptr, &n, &vocabulary, &width, &span};
    esper::jit_launch(handle(ctx, "backward"),
                      dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(vocabulary)),
                      dim3(32 * kWarps), 0, args, stream);
    at::Tensor dw =
        sum_partials(handle(ctx, "reduce"), partials, chunks, vocabulary * width, stream);
    out[0] = dw.view({vocabulary, width}).to(dtype);
    return out;
  }
};

}  // namespace

extern "C" {

char* esper_embedding(void* weight, void* ids, void* const* kernels, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(weight != nullptr && ids != nullptr && kernels != nullptr &&
                  kernels[0] != nullptr && kernels[1] != nullptr,
              "embedding: null argument");
  const auto& w = *static_cast<const at::Tensor*>(weight);
  const auto& index = *static_cast<const at::Tensor*>(ids);
  TORCH_CHECK(w.is_cuda() && w.dim() == 2 && w.is_contiguous() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "embedding: expected a contiguous f32 or bf16 CUDA weight [V, C]");
  TORCH_CHECK(w.size(0) >= 1 && w.size(0) <= 65535 && w.size(1) >= 1 && w.size(1) <= kMaxWidth &&
                  w.size(0) * w.size(1) <= kMaxElements,
              "embedding: a weight of shape ", w.sizes(), " (the kernel takes at most 65535 rows of at most ",
              kMaxWidth, " values, ", kMaxElements, " in all)");
  TORCH_CHECK(index.scalar_type() == at::kLong && index.device() == w.device(),
              "embedding: ids must be int64 on the weight's device");
  at::Tensor y = Embedding::apply(w, index, as_int(kernels[0]), as_int(kernels[1]));
  *out = new at::Tensor(std::move(y));
  ESPER_CATCH
}

}  // extern "C"
