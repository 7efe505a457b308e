// modes.cpp: process-wide precision flags (TF32, float32 matmul precision,
// cuDNN), and the thread-local modes tch cannot set: inference mode and
// autocast with a chosen dtype.
#include "esper_torch_ext.h"
#include "error.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>

namespace {

c10::DeviceType autocast_device(int32_t device_type) {
  TORCH_CHECK(device_type == static_cast<int32_t>(c10::DeviceType::CPU) ||
                  device_type == static_cast<int32_t>(c10::DeviceType::CUDA),
              "autocast supports CPU and CUDA only, got device type ", device_type);
  return static_cast<c10::DeviceType>(device_type);
}

}  // namespace

extern "C" {

// ---- precision ----

char* esper_set_allow_tf32(int32_t matmul, int32_t cudnn) {
  ESPER_TRY
  // The legacy setters keep the legacy and the fp32_precision views of the
  // same switch consistent (Context::allowTF32CuBLAS checks they agree).
  at::globalContext().setAllowTF32CuBLAS(matmul != 0);
  at::globalContext().setAllowTF32CuDNN(cudnn != 0);
  ESPER_CATCH
}

char* esper_get_allow_tf32(int32_t* matmul, int32_t* cudnn) {
  ESPER_TRY
  *matmul = at::globalContext().allowTF32CuBLAS() ? 1 : 0;
  *cudnn = at::globalContext().allowTF32CuDNN() ? 1 : 0;
  ESPER_CATCH
}

char* esper_set_float32_matmul_precision(int32_t precision) {
  ESPER_TRY
  switch (precision) {
    case 0:
      at::globalContext().setFloat32MatmulPrecision("highest");
      break;
    case 1:
      at::globalContext().setFloat32MatmulPrecision("high");
      break;
    case 2:
      at::globalContext().setFloat32MatmulPrecision("medium");
      break;
    default:
      TORCH_CHECK(false, "invalid float32 matmul precision ", precision);
  }
  ESPER_CATCH
}

char* esper_get_float32_matmul_precision(int32_t* precision) {
  ESPER_TRY
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST:
      *precision = 0;
      break;
    case at::Float32MatmulPrecision::HIGH:
      *precision = 1;
      break;
    case at::Float32MatmulPrecision::MEDIUM:
      *precision = 2;
      break;
  }
  ESPER_CATCH
}

char* esper_set_cudnn_flags(int32_t benchmark, int32_t deterministic) {
  ESPER_TRY
  if (benchmark >= 0) {
    at::globalContext().setBenchmarkCuDNN(benchmark != 0);
  }
  if (deterministic >= 0) {
    at::globalContext().setDeterministicCuDNN(deterministic != 0);
  }
  ESPER_CATCH
}

char* esper_get_cudnn_flags(int32_t* benchmark, int32_t* deterministic) {
  ESPER_TRY
  *benchmark = at::globalContext().benchmarkCuDNN() ? 1 : 0;
  *deterministic = at::globalContext().deterministicCuDNN() ? 1 : 0;
  ESPER_CATCH
}

// ---- inference mode ----

char* esper_inference_mode_enter(void** out) {
  ESPER_TRY
  *out = new c10::InferenceMode(/*enabled=*/true);
  ESPER_CATCH
}

void esper_inference_mode_exit(void* guard) {
  try {
    delete static_cast<c10::InferenceMode*>(guard);
  } catch (...) {
    // Restoring thread-local flags does not throw.
  }
}

int32_t esper_inference_mode_is_enabled(void) {
  return c10::InferenceMode::is_enabled() ? 1 : 0;
}

char* esper_tensor_is_inference(const void* tensor, int32_t* out) {
  ESPER_TRY
  TORCH_CHECK(tensor != nullptr, "null tensor");
  *out = static_cast<const at::Tensor*>(tensor)->is_inference() ? 1 : 0;
  ESPER_CATCH
}

// ---- autocast ----
//
// Mirrors torch.autocast.__enter__/__exit__: remember the previous enabled
// flag, dtype and cache flag; on exit, when the outermost autocast region
// closes, clear the cast cache, then restore the previous state.

char* esper_autocast_state(int32_t device_type, EsperAutocastState* out) {
  ESPER_TRY
  const auto device = autocast_device(device_type);
  out->enabled = at::autocast::is_autocast_enabled(device) ? 1 : 0;
  out->dtype = static_cast<int32_t>(at::autocast::get_autocast_dtype(device));
  out->cache_enabled = at::autocast::is_autocast_cache_enabled() ? 1 : 0;
  ESPER_CATCH
}

char* esper_autocast_enter(int32_t device_type, int32_t dtype, int32_t cache_enabled,
                           EsperAutocastState* previous) {
  ESPER_TRY
  const auto device = autocast_device(device_type);
  const auto scalar_type = static_cast<at::ScalarType>(dtype);
  TORCH_CHECK(scalar_type == at::kBFloat16 || scalar_type == at::kHalf,
              "autocast dtype must be bfloat16 or float16, got ", c10::toString(scalar_type));
  previous->enabled = at::autocast::is_autocast_enabled(device) ? 1 : 0;
  previous->dtype = static_cast<int32_t>(at::autocast::get_autocast_dtype(device));
  previous->cache_enabled = at::autocast::is_autocast_cache_enabled() ? 1 : 0;
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, scalar_type);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache_enabled != 0);
  ESPER_CATCH
}

char* esper_autocast_exit(int32_t device_type, EsperAutocastState previous) {
  ESPER_TRY
  const auto device = autocast_device(device_type);
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device, previous.enabled != 0);
  at::autocast::set_autocast_dtype(device, static_cast<at::ScalarType>(previous.dtype));
  at::autocast::set_autocast_cache_enabled(previous.cache_enabled != 0);
  ESPER_CATCH
}

}  // extern "C"
