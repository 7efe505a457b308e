// Backward from a tensor with an explicit gradient (tch's `backward` always
// seeds it with ones): what a fused loss whose gradient was computed by a
// kernel needs to continue through autograd.
#include "esper_torch_ext.h"

#include "error.h"

#include <torch/csrc/autograd/autograd.h>

extern "C" {

char* esper_backward_with(void* tensor, void* grad) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr && grad != nullptr, "backward_with: null tensor");
  const auto& t = *static_cast<const at::Tensor*>(tensor);
  const auto& g = *static_cast<const at::Tensor*>(grad);
  TORCH_CHECK(t.requires_grad(), "backward_with: the tensor does not require grad");
  TORCH_CHECK(t.sizes() == g.sizes(), "backward_with: gradient of shape ", g.sizes(),
              " for a tensor of shape ", t.sizes());
  torch::autograd::backward({t}, {g});
  ESPER_CATCH
}

}  // extern "C"
