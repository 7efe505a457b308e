// graph.cpp: at::cuda::CUDAGraph behind a C ABI, plus the clean-abort path
// that keeps the process usable for eager execution after a failed capture.
//
// The capture body itself never runs here: Rust calls capture_begin, runs the
// body, then capture_end or capture_abort. No Rust callback is invoked from C++,
// so no panic can unwind through these frames.
#include "esper_torch_ext.h"
#include "error.h"
#include "stream_pack.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

namespace {

// CUDAGraph keeps the bookkeeping we need for a clean abort (capture device,
// memory pool id, generator states) in protected members; a subclass is the
// supported way to reach them without relying on member layout.
struct EsperGraph : public at::cuda::CUDAGraph {
  // keep_graph: the captured cudaGraph_t stays until capture_end has read
  // its node summary; instantiate() runs right after (see
  // esper_graph_capture_end), so replays behave as with keep_graph=false.
  EsperGraph() : at::cuda::CUDAGraph(/*keep_graph=*/true) {}

  // One line per node kind and kernel name, "count\tname", of the last
  // completed capture.
  std::string summary;

  void summarise() {
    summary.clear();
    cudaGraph_t graph = raw_cuda_graph();
    size_t count = 0;
    if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    std::vector<cudaGraphNode_t> nodes(count);
    if (cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    std::map<std::string, size_t> kinds;
    for (auto node : nodes) {
      cudaGraphNodeType type;
      if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
        (void)cudaGetLastError();
        kinds["?"]++;
        continue;
      }
      if (type == cudaGraphNodeTypeKernel) {
        cudaKernelNodeParams params{};
        const char* name = nullptr;
        if (cudaGraphKernelNodeGetParams(node, &params) == cudaSuccess && params.func != nullptr &&
            cudaFuncGetName(&name, params.func) == cudaSuccess && name != nullptr) {
          kinds[std::string("kernel ") + name]++;
        } else {
          (void)cudaGetLastError();
          kinds["kernel (unnamed: launched through the driver API)"]++;
        }
      } else if (type == cudaGraphNodeTypeMemcpy) {
        kinds["memcpy"]++;
      } else if (type == cudaGraphNodeTypeMemset) {
        kinds["memset"]++;
      } else if (type == cudaGraphNodeTypeEmpty) {
        kinds["empty"]++;
      } else {
        kinds["other node type " + std::to_string(static_cast<int>(type))]++;
      }
    }
    for (const auto& [name, n] : kinds) {
      summary += std::to_string(n) + "\t" + name + "\n";
    }
  }

  // Takes the CUDA generators out of capture mode (see abort_capture, 3.).
  void release_generators() {
    for (auto& entry : captured_generator_states_) {
      entry.first->capturing_ = false;
      entry.first->offset_intragraph_ = 0;
    }
  }

  // Undo what capture_begin did when capture_end could not finish. Best
  // effort: every step runs even when an earlier one fails; the first failure
  // message is kept for the caller.
  std::string abort_capture(const c10::cuda::CUDAStream& stream) {
    std::string first_error;
    auto note = [&first_error](const std::string& message) {
      if (first_error.empty()) {
        first_error = message;
      }
    };

    // 1. End the CUDA stream capture if it is still open (capture_end throws
    //    before calling cudaStreamEndCapture when the current stream changed).
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      const cudaError_t end_status = cudaStreamEndCapture(stream.stream(), &partial);
      if (partial != nullptr) {
        (void)cudaGraphDestroy(partial);
      }
      if (end_status != cudaSuccess) {
        note(std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end_status));
      }
    }

    // 2. Stop routing allocations to the private pool. capture_end does this
    //    only after a successful cudaStreamEndCapture; when it already ran,
    //    these throw "not currently recording" and are ignored.
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(capture_dev_, mempool_id_);
    } catch (...) {
    }
    try {
      at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_);
    } catch (...) {
    }

    // 3. Take the CUDA RNG out of capture mode, otherwise eager random ops
    //    after the failure would keep using graph-relative Philox offsets.
    //    CUDAGeneratorState::capture_epilogue is not exported from
    //    libtorch_cuda; what it does at the end of a capture is clear this
    //    public flag (the returned increment only matters to a finished graph).
    //    The graph-relative offset is reset too: a random op queued during
    //    the failed capture (e.g. the Philox state flash attention takes)
    //    leaves it non-zero, and the next eager random op would then fail
    //    "Offset increment outside graph capture encountered unexpectedly".
    for (auto& entry : captured_generator_states_) {
      entry.first->capturing_ = false;
      entry.first->offset_intragraph_ = 0;
    }

    // 4. Drop this capture's reference on the memory pools. reset() only does
    //    so after a completed capture (capture_ended_), so there is no double
    //    release.
    if (!capture_ended_) {
      try {
        c10::cuda::CUDACachingAllocator::releasePool(capture_dev_, mempool_id_);
      } catch (const c10::Error& error) {
        note(error.what_without_backtrace());
      }
      try {
        at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_);
      } catch (...) {
      }
    }

    // 5. Clear the non-sticky error a failed capture leaves behind so the next
    //    eager kernel launch check does not report it.
    (void)cudaGetLastError();

    // 6. Destroy whatever graph / executable exists.
    try {
      reset();
    } catch (const c10::Error& error) {
      note(error.what_without_backtrace());
    }
    return first_error;
  }

  at::cuda::MempoolId_t pool_id() const { return mempool_id_; }
};

EsperGraph* as_graph(void* graph) {
  TORCH_CHECK(graph != nullptr, "null CUDA graph");
  return static_cast<EsperGraph*>(graph);
}

}  // namespace

extern "C" {

char* esper_graph_pool_handle(uint64_t* first, uint64_t* second) {
  ESPER_TRY
  const auto handle = at::cuda::graph_pool_handle();
  *first = static_cast<uint64_t>(handle.first);
  *second = static_cast<uint64_t>(handle.second);
  ESPER_CATCH
}

char* esper_graph_new(void** out) {
  ESPER_TRY
  *out = new EsperGraph();
  ESPER_CATCH
}

void esper_graph_free(void* graph) {
  try {
    delete static_cast<EsperGraph*>(graph);
  } catch (...) {
    // ~CUDAGraph only warns; nothing to report to.
  }
}

char* esper_graph_capture_begin(void* graph, uint64_t pool_first, uint64_t pool_second,
                                int32_t capture_mode) {
  ESPER_TRY
  TORCH_CHECK(capture_mode == cudaStreamCaptureModeGlobal ||
                  capture_mode == cudaStreamCaptureModeThreadLocal ||
                  capture_mode == cudaStreamCaptureModeRelaxed,
              "invalid stream capture mode ", capture_mode);
  at::cuda::MempoolId_t pool{static_cast<at::cuda::CaptureId_t>(pool_first),
                             static_cast<at::cuda::CaptureId_t>(pool_second)};
  EsperGraph* esper_graph = as_graph(graph);
  try {
    esper_graph->capture_begin(pool, static_cast<cudaStreamCaptureMode>(capture_mode));
  } catch (...) {
    // capture_begin puts the CUDA generators into capture mode before it asks
    // the allocator for the pool; when that (or the stream capture) throws,
    // take them out again, or every later eager random op misbehaves.
    esper_graph->release_generators();
    throw;
  }
  ESPER_CATCH
}

char* esper_graph_capture_end(void* graph) {
  ESPER_TRY
  EsperGraph* esper_graph = as_graph(graph);
  esper_graph->capture_end();
  esper_graph->summarise();
  esper_graph->instantiate();
  ESPER_CATCH
}

char* esper_graph_summary(void* graph, char** out) {
  ESPER_TRY
  *out = esper::copy_string(as_graph(graph)->summary);
  ESPER_CATCH
}

char* esper_graph_capture_abort(void* graph, EsperStream stream) {
  ESPER_TRY
  EsperGraph* esper_graph = as_graph(graph);
  const auto capture_stream = esper::unpack_stream(stream);
  std::string end_error;
  // Prefer CUDAGraph's own capture_end: when the capture is still valid it
  // does all the bookkeeping, and the resulting (partial) graph is then simply
  // reset. It needs the capture stream to be current.
  try {
    c10::cuda::setCurrentCUDAStream(capture_stream);
    esper_graph->capture_end();
  } catch (const c10::Error& error) {
    end_error = error.what_without_backtrace();
  } catch (const std::exception& error) {
    end_error = error.what();
  }
  const std::string abort_error = esper_graph->abort_capture(capture_stream);
  (void)end_error;  // Expected after an invalidated capture; not a cleanup failure.
  TORCH_CHECK(abort_error.empty(), "cleaning up the aborted capture: ", abort_error);
  ESPER_CATCH
}

char* esper_graph_replay(void* graph) {
  ESPER_TRY
  as_graph(graph)->replay();
  ESPER_CATCH
}

char* esper_graph_pool(void* graph, uint64_t* first, uint64_t* second) {
  ESPER_TRY
  // Same check as CUDAGraph::pool(), without needing a non-const graph.
  const auto pool = as_graph(graph)->pool_id();
  TORCH_CHECK(pool.first != 0 || pool.second != 0, "graph has no memory pool yet (not captured)");
  *first = static_cast<uint64_t>(pool.first);
  *second = static_cast<uint64_t>(pool.second);
  ESPER_CATCH
}

char* esper_graph_reset(void* graph) {
  ESPER_TRY
  as_graph(graph)->reset();
  ESPER_CATCH
}

char* esper_stream_is_capturing(EsperStream stream, int32_t* capturing) {
  ESPER_TRY
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t result = cudaStreamIsCapturing(esper::unpack_stream(stream).stream(), &status);
  TORCH_CHECK(result == cudaSuccess, "cudaStreamIsCapturing failed: ", cudaGetErrorString(result));
  *capturing = status == cudaStreamCaptureStatusNone ? 0 : 1;
  ESPER_CATCH
}

}  // extern "C"
