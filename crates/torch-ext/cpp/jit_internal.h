// jit_internal.h: a loaded run-time compiled kernel (jit.cpp) and its launch,
// shared by the shim's sources that launch such kernels themselves (nn*.cpp).
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace esper {

// A CUDA library loaded from a cubin and one kernel in it; `programmatic`
// when every kernel of its source waits for its predecessors itself
// (ESPER_PDL_ENTRY, sm_90+), so it may launch with programmatic dependent
// launch.
struct JitKernel {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  bool programmatic = false;
};

// Whether opted-in kernels launch with programmatic stream serialization
// now (jit.cpp: on unless ESPER_PDL=0, or esper_jit_set_programmatic(0)).
bool programmatic_launch_enabled();

// Launches `kernel` (a JitKernel*) on `stream`; throws c10::Error on failure.
inline void jit_launch(void* kernel, dim3 grid, dim3 block, unsigned shared, void** args,
                       cudaStream_t stream) {
  TORCH_CHECK(kernel != nullptr, "jit launch: null kernel");
  auto* k = static_cast<JitKernel*>(kernel);
  const void* function = reinterpret_cast<const void*>(k->kernel);
  if (k->programmatic && programmatic_launch_enabled()) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    cudaError_t status = cudaLaunchKernelExC(&config, function, args);
    TORCH_CHECK(status == cudaSuccess, "cudaLaunchKernelExC (programmatic): ",
                cudaGetErrorString(status));
    return;
  }
  cudaError_t status = cudaLaunchKernel(function, grid, block, args, shared, stream);
  TORCH_CHECK(status == cudaSuccess, "cudaLaunchKernel: ", cudaGetErrorString(status));
}

}  // namespace esper
