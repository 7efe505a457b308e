// jit_internal.h: a loaded run-time compiled kernel (jit.cpp) and its launch,
// shared by the shim's sources that launch such kernels themselves (nn*.cpp).
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace esper {

// A CUDA library loaded from a cubin and one kernel in it. `programmatic`:
// the kernel's body begins with the wait for its predecessor grid (the
// ESPER_PDL_ENTRY macro; src/pdl.rs), so it is launched with programmatic
// stream serialization and may be scheduled before that grid ends.
struct JitKernel {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  bool programmatic = false;
};

// Launches `kernel` (a JitKernel*) on `stream`, with programmatic stream
// serialization when the kernel waits for its predecessor first (one launch
// call either way: no attribute is an ordinary launch); throws c10::Error on
// failure.
inline void jit_launch(void* kernel, dim3 grid, dim3 block, unsigned shared, void** args,
                       cudaStream_t stream) {
  TORCH_CHECK(kernel != nullptr, "jit launch: null kernel");
  auto* k = static_cast<JitKernel*>(kernel);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = k->programmatic ? 1 : 0;
  cudaError_t status = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(k->kernel), args);
  TORCH_CHECK(status == cudaSuccess, "cudaLaunchKernelExC", k->programmatic ? " (programmatic)" : "",
              ": ", cudaGetErrorString(status));
}

}  // namespace esper
