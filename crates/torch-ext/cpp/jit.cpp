// Run-time compiled CUDA kernels: CUDA C source compiled by NVRTC into a
// cubin for one GPU architecture, loaded as a CUDA library, and launched on
// the current stream of a device (so a launch inside a graph capture is
// captured like any libtorch kernel).
//
// NVRTC is opened with dlopen when first needed (the torch wheel's
// nvidia-cuda-nvrtc package provides it), so nothing here needs a CUDA
// toolkit at build time and compilation works on a machine without a GPU.
// Loading and launching use the CUDA runtime's library API
// (cudaLibraryLoadData / cudaLibraryGetKernel / cudaLaunchKernel), which
// needs no explicit driver context.
#include "esper_torch_ext.h"

#include "error.h"
#include "jit_internal.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <mutex>
#include <string>
#include <vector>

namespace {

struct Nvrtc {
  void* handle = nullptr;
  std::string error;
  nvrtcResult (*create)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                        const char* const*) = nullptr;
  nvrtcResult (*compile)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*log_size)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*log)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*cubin)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*destroy)(nvrtcProgram*) = nullptr;
  const char* (*error_string)(nvrtcResult) = nullptr;
};

template <typename F>
bool bind(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

// NVRTC opens libnvrtc-builtins.so.<version> by name at compile time and
// does not look beside itself; the wheel keeps it in the same folder, which
// need not be on the library path. Loading it from there first makes
// NVRTC's own dlopen find it already loaded.
void preload_builtins(void* nvrtc_handle) {
  void* symbol = dlsym(nvrtc_handle, "nvrtcVersion");
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) {
    return;
  }
  std::string path(info.dli_fname);
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) {
    return;
  }
  const std::string folder = path.substr(0, slash);
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) {
    return;
  }
  const std::string prefix = "libnvrtc-builtins.so.";
  while (const dirent* entry = readdir(dir)) {
    const std::string name(entry->d_name);
    if (name.rfind(prefix, 0) == 0) {
      dlopen((folder + "/" + name).c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
  }
  closedir(dir);
}

const Nvrtc& nvrtc() {
  static Nvrtc lib;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
      lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib.handle != nullptr) {
        break;
      }
    }
    if (lib.handle == nullptr) {
      const char* reason = dlerror();
      lib.error = std::string("NVRTC is not available (libnvrtc.so.13 not found on the library path: ") +
                  (reason != nullptr ? reason : "no reason given") + ")";
      return;
    }
    preload_builtins(lib.handle);
    bool ok = bind(lib.handle, "nvrtcCreateProgram", &lib.create) &&
              bind(lib.handle, "nvrtcCompileProgram", &lib.compile) &&
              bind(lib.handle, "nvrtcGetProgramLogSize", &lib.log_size) &&
              bind(lib.handle, "nvrtcGetProgramLog", &lib.log) &&
              bind(lib.handle, "nvrtcGetCUBINSize", &lib.cubin_size) &&
              bind(lib.handle, "nvrtcGetCUBIN", &lib.cubin) &&
              bind(lib.handle, "nvrtcDestroyProgram", &lib.destroy) &&
              bind(lib.handle, "nvrtcGetErrorString", &lib.error_string);
    if (!ok) {
      lib.error = "NVRTC was found but lacks an expected entry point";
      lib.handle = nullptr;
    }
  });
  return lib;
}

struct Program {
  const Nvrtc& lib;
  nvrtcProgram program = nullptr;
  ~Program() {
    if (program != nullptr) {
      lib.destroy(&program);
    }
  }
};

}  // namespace

using esper::JitKernel;

extern "C" {

char* esper_jit_compile(const char* source, const char* name, int32_t major, int32_t minor,
                        uint8_t** cubin, uint64_t* cubin_len, char** log) {
  ESPER_TRY
  *cubin = nullptr;
  *cubin_len = 0;
  *log = nullptr;
  TORCH_CHECK(source != nullptr && name != nullptr, "jit compile: null source or name");
  TORCH_CHECK(major >= 5 && major < 100 && minor >= 0 && minor < 10,
              "jit compile: architecture sm_", major, minor, " is not one NVRTC knows");
  const Nvrtc& lib = nvrtc();
  TORCH_CHECK(lib.handle != nullptr, lib.error);
  Program program{lib};
  nvrtcResult status = lib.create(&program.program, source, name, 0, nullptr, nullptr);
  TORCH_CHECK(status == NVRTC_SUCCESS, "nvrtcCreateProgram: ", lib.error_string(status));
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  const char* options[] = {arch.c_str(), "--std=c++17", "--restrict"};
  status = lib.compile(program.program, 3, options);
  size_t log_size = 0;
  if (lib.log_size(program.program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    std::string text(log_size, '\0');
    if (lib.log(program.program, text.data()) == NVRTC_SUCCESS) {
      text.resize(log_size - 1);
      *log = esper::copy_string(text);
    }
  }
  TORCH_CHECK(status == NVRTC_SUCCESS, "nvrtcCompileProgram (", name, ", ", arch,
              "): ", lib.error_string(status));
  size_t size = 0;
  status = lib.cubin_size(program.program, &size);
  TORCH_CHECK(status == NVRTC_SUCCESS && size > 0, "nvrtcGetCUBINSize: ", lib.error_string(status));
  auto* out = static_cast<uint8_t*>(std::malloc(size));
  TORCH_CHECK(out != nullptr, "jit compile: out of memory for a ", size, "-byte cubin");
  status = lib.cubin(program.program, reinterpret_cast<char*>(out));
  if (status != NVRTC_SUCCESS) {
    std::free(out);
    TORCH_CHECK(false, "nvrtcGetCUBIN: ", lib.error_string(status));
  }
  *cubin = out;
  *cubin_len = size;
  ESPER_CATCH
}

void esper_jit_free_cubin(uint8_t* cubin) { std::free(cubin); }

char* esper_jit_load(const uint8_t* cubin, const char* name, int32_t programmatic, void** out) {
  ESPER_TRY
  *out = nullptr;
  TORCH_CHECK(cubin != nullptr && name != nullptr, "jit load: null cubin or name");
  auto kernel = std::make_unique<JitKernel>();
  kernel->programmatic = programmatic != 0;
  // A first use may come inside a graph capture (a step captured before any
  // eager run): loading a library is no stream work, so let this thread make
  // the call whatever the capture mode, then restore the mode.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t status =
      cudaLibraryLoadData(&kernel->library, cubin, nullptr, nullptr, 0, nullptr, nullptr, 0);
  cudaThreadExchangeStreamCaptureMode(&mode);
  TORCH_CHECK(status == cudaSuccess, "cudaLibraryLoadData: ", cudaGetErrorString(status));
  status = cudaLibraryGetKernel(&kernel->kernel, kernel->library, name);
  if (status != cudaSuccess) {
    cudaLibraryUnload(kernel->library);
    TORCH_CHECK(false, "cudaLibraryGetKernel(", name, "): ", cudaGetErrorString(status));
  }
  *out = kernel.release();
  ESPER_CATCH
}

void esper_jit_unload(void* kernel) {
  auto* k = static_cast<JitKernel*>(kernel);
  if (k != nullptr) {
    cudaLibraryUnload(k->library);
    delete k;
  }
}

char* esper_jit_launch(void* kernel, int32_t device, const uint32_t* grid, const uint32_t* block,
                       uint32_t shared, void** args) {
  ESPER_TRY
  TORCH_CHECK(kernel != nullptr, "jit launch: null kernel");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  esper::jit_launch(kernel, dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]),
                    shared, args, stream);
  ESPER_CATCH
}

}  // extern "C"
