// dist_nccl.cpp: libtorch's ProcessGroupNCCL, built for dist.cpp.
//
// Only compiled into the shim; the NCCL library itself is loaded through
// libtorch_cuda.so, which the wheel links against its bundled libnccl.
#include "dist_internal.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace esper {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    int device_index, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  // Binding the device makes the communicator eager: it is made here, at
  // rendezvous, so a missing peer fails now instead of inside the first
  // collective.
  backend->setBoundDeviceId(device);
  backend->eagerConnectSingleDevice(device);
  return backend;
}

}  // namespace esper
