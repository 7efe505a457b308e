// Memory formats: channels-last copies and in-place conversion of
// parameters (data and gradient), which libtorch's C API in tch lacks.
#include "esper_torch_ext.h"

#include "error.h"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

namespace {

// A 4-D tensor with one channel is contiguous in both layouts, so
// `contiguous(ChannelsLast)` returns it unchanged, with NCHW strides; cuDNN
// then treats it as NCHW. This gives it channels-last strides (a view of the
// same memory) so convolutions, batch norm and pooling take their NHWC
// kernels from the first layer on.
at::Tensor restride_single_channel(const at::Tensor& t) {
  if (t.dim() != 4 || t.size(1) != 1 || !t.is_contiguous() || t.stride(1) == 1) {
    return t;
  }
  const int64_t h = t.size(2);
  const int64_t w = t.size(3);
  return t.as_strided(t.sizes(), {h * w, 1, w, 1}, t.storage_offset());
}

}  // namespace

extern "C" {

char* esper_contiguous_channels_last(const void* tensor, void** out) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr, "channels_last: null tensor");
  const auto& t = *static_cast<const at::Tensor*>(tensor);
  TORCH_CHECK(t.dim() == 4, "channels_last: a 4-D tensor is needed, got ", t.dim(), " dimensions");
  *out = new at::Tensor(restride_single_channel(t.contiguous(at::MemoryFormat::ChannelsLast)));
  ESPER_CATCH
}

char* esper_set_channels_last_(void* tensor, int32_t* changed) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr, "set_channels_last_: null tensor");
  auto& t = *static_cast<at::Tensor*>(tensor);
  *changed = 0;
  if (t.dim() != 4) {
    return nullptr;
  }
  c10::NoGradGuard no_grad;
  auto converted = restride_single_channel(t.contiguous(at::MemoryFormat::ChannelsLast));
  if (converted.strides() == t.strides()) {
    return nullptr;
  }
  t.set_data(converted);
  auto& grad = t.mutable_grad();
  if (grad.defined()) {
    grad = restride_single_channel(grad.contiguous(at::MemoryFormat::ChannelsLast));
  }
  *changed = 1;
  ESPER_CATCH
}

char* esper_is_channels_last(const void* tensor, int32_t* result) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr, "is_channels_last: null tensor");
  const auto& t = *static_cast<const at::Tensor*>(tensor);
  *result = t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast) ? 1 : 0;
  ESPER_CATCH
}

char* esper_set_grads_to_none(void* const* tensors, int64_t n) {
  ESPER_TRY
  TORCH_CHECK(n >= 0, "set_grads_to_none: negative count");
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(tensors[i] != nullptr, "set_grads_to_none: null tensor");
    static_cast<at::Tensor*>(tensors[i])->mutable_grad().reset();
  }
  ESPER_CATCH
}

char* esper_pin_memory(const void* tensor, void** out) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr, "pin_memory: null tensor");
  const auto& t = *static_cast<const at::Tensor*>(tensor);
  // No device argument (deprecated in libtorch 2.11): the page-locked memory
  // belongs to the current accelerator, i.e. the calling thread's current
  // CUDA device, so a process working on cuda:N never touches GPU 0.
  *out = new at::Tensor(t.is_pinned() ? t : t.pin_memory());
  ESPER_CATCH
}

char* esper_is_pinned(const void* tensor, int32_t* pinned) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr, "is_pinned: null tensor");
  *pinned = static_cast<const at::Tensor*>(tensor)->is_pinned() ? 1 : 0;
  ESPER_CATCH
}

}  // extern "C"
