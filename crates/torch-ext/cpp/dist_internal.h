// dist_internal.h: what dist.cpp and dist_nccl.cpp share (C++ only, not part
// of the C ABI in esper_torch_ext.h).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace esper {

// Builds libtorch's ProcessGroupNCCL over `store`, bound to CUDA device
// `device_index`, with `timeout` on every collective. Kept in its own source
// file because the NCCL headers are heavy and need nccl.h on the include path.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    int device_index, std::chrono::milliseconds timeout);

}  // namespace esper
