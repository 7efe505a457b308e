// jit_internal.h: a loaded run-time compiled kernel (jit.cpp) and its launch,
// shared by the shim's sources that launch such kernels themselves (nn*.cpp).
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace esper {

// A CUDA library loaded from a cubin and one kernel in it.
struct JitKernel {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
};

// Launches `kernel` (a JitKernel*) on `stream`; throws c10::Error on failure.
inline void jit_launch(void* kernel, dim3 grid, dim3 block, unsigned shared, void** args,
                       cudaStream_t stream) {
  TORCH_CHECK(kernel != nullptr, "jit launch: null kernel");
  auto* k = static_cast<JitKernel*>(kernel);
  cudaError_t status = cudaLaunchKernel(reinterpret_cast<const void*>(k->kernel), grid, block,
                                        args, shared, stream);
  TORCH_CHECK(status == cudaSuccess, "cudaLaunchKernel: ", cudaGetErrorString(status));
}

}  // namespace esper
