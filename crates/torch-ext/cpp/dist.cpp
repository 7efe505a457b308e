// dist.cpp: c10d process groups for data-parallel training.
//
// A group is a TCPStore rendezvous (rank 0 serves it) plus one libtorch
// backend: ProcessGroupGloo for CPU tensors, ProcessGroupNCCL for CUDA
// tensors. Collectives are in place and wait with the group's timeout, so a
// peer that died turns into an error message here instead of a hang.
#include "esper_torch_ext.h"
#include "error.h"
#include "dist_internal.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace {

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
};

c10d::ReduceOp reduce_op(int32_t op) {
  switch (op) {
    case 0:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case 1:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case 2:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    default:
      TORCH_CHECK(false, "unknown reduce op code ", op);
  }
}

void finish(const c10::intrusive_ptr<c10d::Work>& work, const Group& group,
            const char* what) {
  // Gloo runs the collective on its own threads and wait() blocks the caller
  // up to the timeout; NCCL's wait() only orders the caller's current stream
  // after the collective (its watchdog enforces the timeout).
  bool done = work->wait(group.timeout);
  TORCH_CHECK(done, what, " did not complete within ", group.timeout.count(), " ms");
}

}  // namespace

extern "C" {

char* esper_dist_new(const char* host, int32_t port, int32_t rank, int32_t world_size,
                     int32_t backend, int32_t device_index, int64_t timeout_ms,
                     int32_t listen_fd, void** out) {
  ESPER_TRY
  TORCH_CHECK(host != nullptr, "host is null");
  TORCH_CHECK(world_size >= 1, "world size must be at least 1, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  TORCH_CHECK(port > 0 && port < 65536, "port ", port, " outside 1..65535");
  TORCH_CHECK(timeout_ms > 0, "timeout must be positive");
  auto timeout = std::chrono::milliseconds(timeout_ms);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(port);
  store_options.isServer = rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(world_size);
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  if (listen_fd >= 0) {
    // Rank 0 serves a socket its launcher already bound and listens on, so
    // no other process can take the port between the launcher choosing it
    // and the store serving it. The store takes the descriptor over.
    TORCH_CHECK(rank == 0, "only rank 0 serves the store, not rank ", rank);
    store_options.masterListenFd = listen_fd;
  }
  auto group = std::make_unique<Group>();
  group->timeout = timeout;
  group->store = c10::make_intrusive<c10d::TCPStore>(std::string(host), store_options);
  if (backend == 0) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(std::string(host)));
    options->threads = 2;
    group->backend =
        c10::make_intrusive<c10d::ProcessGroupGloo>(group->store, rank, world_size, options);
  } else if (backend == 1) {
    group->backend =
        esper::make_nccl_backend(group->store, rank, world_size, device_index, timeout);
  } else {
    TORCH_CHECK(false, "unknown backend code ", backend);
  }
  *out = group.release();
  ESPER_CATCH
}

void esper_dist_free(void* group) {
  auto* g = static_cast<Group*>(group);
  if (g == nullptr) {
    return;
  }
  // Leave the group cleanly (NCCL: finish the watchdog and destroy the
  // communicators) before the store goes; a failure here has nowhere to go.
  try {
    if (g->backend) {
      g->backend->shutdown();
    }
  } catch (...) {
  }
  delete g;
}

char* esper_dist_all_reduce(void* group, void* tensor, int32_t op) {
  ESPER_TRY
  auto* g = static_cast<Group*>(group);
  std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = reduce_op(op);
  options.timeout = g->timeout;
  finish(g->backend->allreduce(tensors, options), *g, "all-reduce");
  ESPER_CATCH
}

char* esper_dist_broadcast(void* group, void* tensor, int32_t root) {
  ESPER_TRY
  auto* g = static_cast<Group*>(group);
  std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = g->timeout;
  finish(g->backend->broadcast(tensors, options), *g, "broadcast");
  ESPER_CATCH
}

char* esper_dist_barrier(void* group) {
  ESPER_TRY
  auto* g = static_cast<Group*>(group);
  c10d::BarrierOptions options;
  options.timeout = g->timeout;
  finish(g->backend->barrier(options), *g, "barrier");
  ESPER_CATCH
}

}  // extern "C"
