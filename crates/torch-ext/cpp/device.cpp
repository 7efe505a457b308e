// device.cpp: CUDA devices, caching-allocator statistics, streams, events and
// the non-blocking tensor copy. Every entry point is wrapped in ESPER_TRY /
// ESPER_CATCH (see error.h).
#include "esper_torch_ext.h"
#include "error.h"
#include "stream_pack.h"

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

namespace esper {
char kOutOfMemoryMessage[] = "out of memory while reporting a C++ error";
}  // namespace esper

namespace {

void check_device(int32_t device) {
  const int32_t count = c10::cuda::device_count();
  TORCH_CHECK(device >= 0 && device < count, "CUDA device index ", device,
              " out of range (device count ", count, ")");
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    // Clear the (non-sticky) error so later kernel-launch checks do not
    // report it a second time.
    (void)cudaGetLastError();
    TORCH_CHECK(false, what, " failed: ", cudaGetErrorString(status));
  }
}

c10::cuda::CUDAEvent* as_event(void* event) {
  TORCH_CHECK(event != nullptr, "null CUDA event");
  return static_cast<c10::cuda::CUDAEvent*>(event);
}

}  // namespace

extern "C" {

void esper_free_string(char* message) {
  if (message != nullptr && message != esper::kOutOfMemoryMessage) {
    std::free(message);
  }
}

int32_t esper_cuda_device_count(void) {
  // c10::cuda::device_count is noexcept and returns 0 when there is no driver
  // or no device, which is what lets CPU-only machines take the fallback path.
  return static_cast<int32_t>(c10::cuda::device_count());
}

char* esper_cuda_current_device(int32_t* out) {
  ESPER_TRY
  *out = static_cast<int32_t>(c10::cuda::current_device());
  ESPER_CATCH
}

char* esper_cuda_set_device(int32_t device) {
  ESPER_TRY
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  ESPER_CATCH
}

char* esper_cuda_synchronize(int32_t device) {
  ESPER_TRY
  check_device(device);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  c10::cuda::device_synchronize();
  ESPER_CATCH
}

char* esper_cuda_set_sync_debug_mode(int32_t mode) {
  ESPER_TRY
  TORCH_CHECK(mode >= 0 && mode <= 2, "invalid sync debug mode ", mode);
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode));
  ESPER_CATCH
}

char* esper_cuda_get_sync_debug_mode(int32_t* mode) {
  ESPER_TRY
  *mode = static_cast<int32_t>(c10::cuda::warning_state().get_sync_debug_mode());
  ESPER_CATCH
}

char* esper_cuda_memory_stats(int32_t device, uint64_t* allocated_current,
                              uint64_t* allocated_peak, uint64_t* reserved_current) {
  ESPER_TRY
  check_device(device);
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  *allocated_current = static_cast<uint64_t>(stats.allocated_bytes[aggregate].current);
  *allocated_peak = static_cast<uint64_t>(stats.allocated_bytes[aggregate].peak);
  *reserved_current = static_cast<uint64_t>(stats.reserved_bytes[aggregate].current);
  ESPER_CATCH
}

char* esper_cuda_reset_peak_memory_stats(int32_t device) {
  ESPER_TRY
  check_device(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  ESPER_CATCH
}

char* esper_cuda_empty_cache(void) {
  ESPER_TRY
  c10::cuda::CUDACachingAllocator::emptyCache();
  ESPER_CATCH
}

char* esper_cuda_device_name(int32_t device, char** name) {
  ESPER_TRY
  check_device(device);
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  *name = esper::copy_string(properties.name);
  ESPER_CATCH
}

char* esper_cuda_device_capability(int32_t device, int32_t* major, int32_t* minor) {
  ESPER_TRY
  check_device(device);
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(major)");
  *major = value;
  check_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute(minor)");
  *minor = value;
  ESPER_CATCH
}

char* esper_cuda_runtime_versions(int32_t* runtime, int32_t* driver) {
  ESPER_TRY
  int value = 0;
  check_cuda(cudaRuntimeGetVersion(&value), "cudaRuntimeGetVersion");
  *runtime = value;
  value = 0;
  // Reports 0 (with success) when no driver is installed.
  check_cuda(cudaDriverGetVersion(&value), "cudaDriverGetVersion");
  *driver = value;
  ESPER_CATCH
}

// ---- streams ----

char* esper_stream_from_pool(int32_t device, int32_t high_priority, EsperStream* out) {
  ESPER_TRY
  check_device(device);
  *out = esper::pack_stream(
      c10::cuda::getStreamFromPool(high_priority != 0, static_cast<c10::DeviceIndex>(device)));
  ESPER_CATCH
}

char* esper_stream_current(int32_t device, EsperStream* out) {
  ESPER_TRY
  check_device(device);
  *out = esper::pack_stream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)));
  ESPER_CATCH
}

char* esper_stream_default(int32_t device, EsperStream* out) {
  ESPER_TRY
  check_device(device);
  *out = esper::pack_stream(c10::cuda::getDefaultCUDAStream(static_cast<c10::DeviceIndex>(device)));
  ESPER_CATCH
}

char* esper_stream_set_current(EsperStream stream) {
  ESPER_TRY
  c10::cuda::setCurrentCUDAStream(esper::unpack_stream(stream));
  ESPER_CATCH
}

char* esper_stream_synchronize(EsperStream stream) {
  ESPER_TRY
  const auto cuda_stream = esper::unpack_stream(stream);
  c10::cuda::CUDAGuard guard(cuda_stream.device_index());
  // Deliberately the raw call: an explicit synchronisation asked for by the
  // caller must not trip sync-debug mode, which exists to flag the implicit
  // ones hidden inside tensor operations.
  check_cuda(cudaStreamSynchronize(cuda_stream.stream()), "cudaStreamSynchronize");
  ESPER_CATCH
}

char* esper_stream_query(EsperStream stream, int32_t* done) {
  ESPER_TRY
  *done = esper::unpack_stream(stream).query() ? 1 : 0;
  ESPER_CATCH
}

char* esper_stream_wait_stream(EsperStream waiter, EsperStream other) {
  ESPER_TRY
  const auto waiter_stream = esper::unpack_stream(waiter);
  const auto other_stream = esper::unpack_stream(other);
  // Record "everything queued on `other` so far" and make `waiter` wait for
  // it. The event may be destroyed right after: the wait was already enqueued.
  c10::cuda::CUDAEvent event(cudaEventDisableTiming);
  event.record(other_stream);
  event.block(waiter_stream);
  ESPER_CATCH
}

char* esper_stream_wait_event(EsperStream waiter, void* event) {
  ESPER_TRY
  as_event(event)->block(esper::unpack_stream(waiter));
  ESPER_CATCH
}

// ---- events ----

char* esper_event_new(int32_t enable_timing, void** out) {
  ESPER_TRY
  const unsigned int flags = enable_timing != 0 ? cudaEventDefault : cudaEventDisableTiming;
  *out = new c10::cuda::CUDAEvent(flags);
  ESPER_CATCH
}

void esper_event_free(void* event) {
  try {
    delete static_cast<c10::cuda::CUDAEvent*>(event);
  } catch (...) {
    // The destructor only warns; nothing sensible to do with a failure here.
  }
}

char* esper_event_record(void* event, EsperStream stream) {
  ESPER_TRY
  as_event(event)->record(esper::unpack_stream(stream));
  ESPER_CATCH
}

char* esper_event_synchronize(void* event) {
  ESPER_TRY
  as_event(event)->synchronize();
  ESPER_CATCH
}

char* esper_event_query(void* event, int32_t* done) {
  ESPER_TRY
  *done = as_event(event)->query() ? 1 : 0;
  ESPER_CATCH
}

char* esper_event_elapsed_ms(void* start, void* end, float* out) {
  ESPER_TRY
  *out = as_event(start)->elapsed_time(*as_event(end));
  ESPER_CATCH
}

// ---- copies ----

char* esper_copy_(void* dst, const void* src, int32_t non_blocking) {
  ESPER_TRY
  TORCH_CHECK(dst != nullptr && src != nullptr, "null tensor");
  auto* destination = static_cast<at::Tensor*>(dst);
  const auto* source = static_cast<const at::Tensor*>(src);
  destination->copy_(*source, non_blocking != 0);
  ESPER_CATCH
}

// The bytes of `src` into `dst` with one cudaMemcpyAsync on the current
// stream of the CUDA side's device: no allocator event, no dispatch, so it
// may be captured into a CUDA graph (a memcpy node). The Rust side checked
// layouts, sizes and that any host side is page-locked.
char* esper_memcpy_async(void* dst, const void* src) {
  ESPER_TRY
  TORCH_CHECK(dst != nullptr && src != nullptr, "null tensor");
  auto* destination = static_cast<at::Tensor*>(dst);
  const auto* source = static_cast<const at::Tensor*>(src);
  TORCH_CHECK(destination->is_contiguous() && source->is_contiguous(), "memcpy_async: not contiguous");
  TORCH_CHECK(destination->nbytes() == source->nbytes(), "memcpy_async: sizes differ");
  const at::Tensor& on_device = destination->is_cuda() ? *destination : *source;
  TORCH_CHECK(on_device.is_cuda(), "memcpy_async: neither side is on a CUDA device");
  c10::cuda::CUDAGuard guard(on_device.device());
  auto stream = c10::cuda::getCurrentCUDAStream(on_device.device().index());
  C10_CUDA_CHECK(cudaMemcpyAsync(destination->data_ptr(), source->data_ptr(), source->nbytes(),
                                 cudaMemcpyDefault, stream.stream()));
  ESPER_CATCH
}

}  // extern "C"
