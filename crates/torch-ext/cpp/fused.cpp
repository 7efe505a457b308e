// fused.cpp: multi-tensor ("foreach") operations and fused optimizer steps.
// On CUDA each call is one (or a few) multi-tensor-apply kernel launches for
// the whole list instead of one launch per tensor. All mutating entry points
// run under no-grad, like torch.optim does, so they may update leaf
// parameters that require grad.
#include "esper_torch_ext.h"
#include "error.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_foreach_zero.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>

#include <optional>
#include <vector>

namespace {

std::vector<at::Tensor> tensor_list(void* const* tensors, int64_t n, const char* what) {
  TORCH_CHECK(n >= 0, what, ": negative length ", n);
  TORCH_CHECK(n == 0 || tensors != nullptr, what, ": null tensor array");
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(tensors[i] != nullptr, what, ": null tensor at index ", i);
    // Copying an at::Tensor shares the same TensorImpl (a reference-count
    // bump), so in-place updates reach the caller's tensors.
    out.push_back(*static_cast<const at::Tensor*>(tensors[i]));
  }
  return out;
}

std::optional<at::Tensor> optional_tensor(const void* tensor) {
  if (tensor == nullptr) {
    return std::nullopt;
  }
  return *static_cast<const at::Tensor*>(tensor);
}

const at::Tensor& tensor_ref(const void* tensor, const char* what) {
  TORCH_CHECK(tensor != nullptr, what, ": null tensor");
  return *static_cast<const at::Tensor*>(tensor);
}

}  // namespace

extern "C" {

char* esper_foreach_zero_(void* const* tensors, int64_t n) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  at::_foreach_zero_(tensor_list(tensors, n, "foreach_zero_"));
  ESPER_CATCH
}

char* esper_foreach_add_list_(void* const* tensors, void* const* others, int64_t n, double alpha) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  at::_foreach_add_(tensor_list(tensors, n, "foreach_add_"), tensor_list(others, n, "foreach_add_"),
                    alpha);
  ESPER_CATCH
}

char* esper_foreach_add_scalar_(void* const* tensors, int64_t n, double scalar) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  at::_foreach_add_(tensor_list(tensors, n, "foreach_add_scalar_"), at::Scalar(scalar));
  ESPER_CATCH
}

char* esper_foreach_mul_scalar_(void* const* tensors, int64_t n, double scalar) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  at::_foreach_mul_(tensor_list(tensors, n, "foreach_mul_scalar_"), at::Scalar(scalar));
  ESPER_CATCH
}

char* esper_foreach_mul_tensor_(void* const* tensors, int64_t n, const void* scalar_tensor) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  at::_foreach_mul_(tensor_list(tensors, n, "foreach_mul_tensor_"),
                    tensor_ref(scalar_tensor, "foreach_mul_tensor_"));
  ESPER_CATCH
}

char* esper_foreach_copy_(void* const* dst, void* const* src, int64_t n, int32_t non_blocking) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  at::_foreach_copy_(tensor_list(dst, n, "foreach_copy_"), tensor_list(src, n, "foreach_copy_"),
                     non_blocking != 0);
  ESPER_CATCH
}

char* esper_foreach_norm(void* const* tensors, int64_t n, double ord, void** out) {
  ESPER_TRY
  TORCH_CHECK(n == 0 || out != nullptr, "foreach_norm: null output array");
  auto norms = at::_foreach_norm(tensor_list(tensors, n, "foreach_norm"), at::Scalar(ord));
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == n, "foreach_norm: returned ", norms.size(),
              " norms for ", n, " tensors");
  for (int64_t i = 0; i < n; ++i) {
    out[i] = new at::Tensor(std::move(norms[static_cast<size_t>(i)]));
  }
  ESPER_CATCH
}

char* esper_clip_grad_norm_(void* const* grads, int64_t n, double max_norm, double norm_type,
                            void** total_norm_out) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  auto list = tensor_list(grads, n, "clip_grad_norm_");
  TORCH_CHECK(!list.empty(), "clip_grad_norm_: no gradients");
  // Same arithmetic as torch.nn.utils.clip_grad_norm_(foreach=True), all on
  // the device: no value is read back, so the step stays capturable.
  auto norms = at::_foreach_norm(list, at::Scalar(norm_type));
  auto total = at::linalg_vector_norm(at::stack(norms), at::Scalar(norm_type));
  auto clip_coef = total.add(at::Scalar(1e-6)).reciprocal().mul(max_norm).clamp_max(1.0);
  at::_foreach_mul_(list, clip_coef);
  *total_norm_out = new at::Tensor(std::move(total));
  ESPER_CATCH
}

char* esper_amp_foreach_non_finite_check_and_unscale_(void* const* grads, int64_t n,
                                                      void* found_inf, const void* inv_scale) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  TORCH_CHECK(found_inf != nullptr, "amp unscale: null found_inf");
  at::_amp_foreach_non_finite_check_and_unscale_(tensor_list(grads, n, "amp unscale"),
                                                 *static_cast<at::Tensor*>(found_inf),
                                                 tensor_ref(inv_scale, "amp unscale"));
  ESPER_CATCH
}

char* esper_fused_sgd_(void* const* params, void* const* grads, void* const* momentum_buffers,
                       int64_t n, int64_t n_momentum, double weight_decay, double momentum,
                       double lr, const void* lr_tensor, double dampening, int32_t nesterov,
                       int32_t maximize, int32_t is_first_step, const void* grad_scale,
                       const void* found_inf) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  auto param_list = tensor_list(params, n, "fused sgd params");
  auto grad_list = tensor_list(grads, n, "fused sgd grads");
  auto momentum_list = tensor_list(momentum_buffers, n_momentum, "fused sgd momentum buffers");
  if (lr_tensor != nullptr) {
    at::_fused_sgd_(param_list, grad_list, momentum_list, weight_decay, momentum,
                    tensor_ref(lr_tensor, "fused sgd lr"), dampening, nesterov != 0,
                    maximize != 0, is_first_step != 0, optional_tensor(grad_scale),
                    optional_tensor(found_inf));
  } else {
    at::_fused_sgd_(param_list, grad_list, momentum_list, weight_decay, momentum, lr, dampening,
                    nesterov != 0, maximize != 0, is_first_step != 0, optional_tensor(grad_scale),
                    optional_tensor(found_inf));
  }
  ESPER_CATCH
}

char* esper_fused_adamw_(void* const* params, void* const* grads, void* const* exp_avgs,
                         void* const* exp_avg_sqs, void* const* state_steps, int64_t n,
                         double lr, const void* lr_tensor, double beta1, double beta2,
                         double weight_decay, double eps, int32_t maximize,
                         const void* grad_scale, const void* found_inf) {
  ESPER_TRY
  c10::NoGradGuard no_grad;
  auto param_list = tensor_list(params, n, "fused adamw params");
  auto grad_list = tensor_list(grads, n, "fused adamw grads");
  auto exp_avg_list = tensor_list(exp_avgs, n, "fused adamw exp_avgs");
  auto exp_avg_sq_list = tensor_list(exp_avg_sqs, n, "fused adamw exp_avg_sqs");
  auto step_list = tensor_list(state_steps, n, "fused adamw state_steps");
  const std::vector<at::Tensor> no_max_exp_avg_sqs;  // amsgrad is not offered
  // As torch.optim.AdamW(fused=True): the kernel reads the step count, the
  // caller advances it first, and takes a skipped (found_inf) step back.
  at::_foreach_add_(step_list, at::Scalar(1.0));
  if (lr_tensor != nullptr) {
    at::_fused_adamw_(param_list, grad_list, exp_avg_list, exp_avg_sq_list, no_max_exp_avg_sqs,
                      step_list, tensor_ref(lr_tensor, "fused adamw lr"), beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, maximize != 0,
                      optional_tensor(grad_scale), optional_tensor(found_inf));
  } else {
    at::_fused_adamw_(param_list, grad_list, exp_avg_list, exp_avg_sq_list, no_max_exp_avg_sqs,
                      step_list, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                      maximize != 0, optional_tensor(grad_scale), optional_tensor(found_inf));
  }
  if (found_inf != nullptr) {
    // found_inf holds one value (GradScaler makes it 0-dim, some callers [1]);
    // viewed as 0-dim it broadcasts into any step tensor.
    const at::Tensor found = tensor_ref(found_inf, "found_inf").reshape({});
    const std::vector<at::Tensor> found_inf_list(step_list.size(), found);
    at::_foreach_sub_(step_list, found_inf_list);
  }
  ESPER_CATCH
}

}  // extern "C"
