// Side-stream work of a backward node (nn_internal.h's SideWork): a
// node queues work that nothing in the rest of the backward pass reads
// (a weight gradient a leaf's accumulator takes as it is) on a second
// stream, so it runs beside the main stream's chain of input gradients,
// and the streams that go on wait for it when the pass ends.

#include "nn_internal.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/engine.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace esper::nn {

namespace {

// The side stream of a main stream: its own non-blocking stream, made at
// its first use and kept for the process. Side work of two main streams
// (say, environments training on their own streams, one of them in a
// graph capture) never shares a stream, so one capture cannot take in
// another stream's work.
c10::cuda::CUDAStream side_stream(const c10::cuda::CUDAStream& main) {
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, cudaStream_t>, cudaStream_t> streams;
  const c10::DeviceIndex device = main.device_index();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find({device, main.stream()});
  if (found == streams.end()) {
    c10::cuda::CUDAGuard guard(device);
    // Making a stream is no stream work; relaxed, so a capture under way
    // on this thread is not invalidated by it.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaStream_t stream = nullptr;
    const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    C10_CUDA_CHECK(made);
    found = streams.emplace(std::make_pair(device, main.stream()), stream).first;
  }
  return c10::cuda::getStreamFromExternal(found->second, device);
}

}  // namespace

SideWork::SideWork(bool active, c10::DeviceIndex device)
    : main_(c10::cuda::getCurrentCUDAStream(device)),
      side_(active ? side_stream(main_) : main_),
      active_(active) {
  if (active_) {
    at::cuda::CUDAEvent ready;
    ready.record(main_);
    ready.block(side_);
  }
}

void SideWork::finish(const std::vector<at::Tensor>& keep) {
  if (!active_) {
    return;
  }
  active_ = false;
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(side_);
  // The storages (not the tensors: a gradient held here would not be
  // taken as it is by its accumulator) stay alive until the streams that
  // go on wait for the side work, so their memory is not handed out again
  // while the side stream still reads or writes it.
  std::vector<c10::Storage> storages;
  for (const auto& tensor : keep) {
    if (tensor.defined()) {
      storages.push_back(tensor.storage());
    }
  }
  const c10::cuda::CUDAStream main = main_;
  auto join = [done, main, storages = std::move(storages)]() mutable {
    done->block(main);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(main.device_index());
    if (current != main) {
      done->block(current);
    }
    storages.clear();
  };
  try {
    // Run when the backward pass ends, on the streams around the caller's
    // backward call.
    torch::autograd::Engine::get_default_engine().queue_callback(join);
  } catch (const std::exception&) {
    // Not inside a backward pass: join now.
    join();
  }
}

}  // namespace esper::nn
