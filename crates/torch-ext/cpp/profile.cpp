// profile.cpp: the CUDA kernels (and copies) a stretch of work ran, from
// libtorch's Kineto profiler (CUPTI), aggregated by name. Kernels replayed
// from a captured graph are reported one by one like eager launches.
#include "esper_torch_ext.h"
#include "error.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <map>
#include <set>
#include <string>
#include <utility>

namespace {

torch::profiler::impl::ProfilerConfig config() {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO);
}

std::set<torch::profiler::impl::ActivityType> activities() {
  return {torch::profiler::impl::ActivityType::CUDA};
}

}  // namespace

extern "C" {

char* esper_kernel_profile_start() {
  ESPER_TRY
  torch::autograd::profiler::prepareProfiler(config(), activities());
  torch::autograd::profiler::enableProfiler(config(), activities());
  ESPER_CATCH
}

char* esper_kernel_profile_stop(char** out) {
  ESPER_TRY
  *out = nullptr;
  auto result = torch::autograd::profiler::disableProfiler();
  TORCH_CHECK(result != nullptr, "kernel profile: the profiler returned no result");
  std::map<std::string, std::pair<uint64_t, uint64_t>> totals;
  for (const auto& event : result->events()) {
    if (event.deviceType() != c10::DeviceType::CUDA) {
      continue;
    }
    auto& total = totals[event.name()];
    total.first += 1;
    total.second += event.durationNs();
  }
  std::string text;
  for (const auto& [name, total] : totals) {
    std::string clean = name;
    for (char& c : clean) {
      if (c == '\t' || c == '\n') {
        c = ' ';
      }
    }
    text += clean + '\t' + std::to_string(total.first) + '\t' + std::to_string(total.second) + '\n';
  }
  *out = esper::copy_string(text);
  ESPER_CATCH
}

}  // extern "C"
