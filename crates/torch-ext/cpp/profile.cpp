// profile.cpp: the CUDA kernels (and copies) a stretch of work ran, from
// libtorch's Kineto profiler (CUPTI), aggregated by name. Kernels replayed
// from a captured graph are reported one by one like eager launches.
#include "esper_torch_ext.h"
#include "error.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <map>
#include <vector>
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

std::string clean(std::string name) {
  for (char& c : name) {
    if (c == '\t' || c == '\n') {
      c = ' ';
    }
  }
  return name;
}

char* esper_kernel_profile_stop(char** out, int64_t sample_len, char** sample) {
  ESPER_TRY
  *out = nullptr;
  *sample = nullptr;
  auto result = torch::autograd::profiler::disableProfiler();
  TORCH_CHECK(result != nullptr, "kernel profile: the profiler returned no result");
  std::map<std::string, std::pair<uint64_t, uint64_t>> totals;
  std::vector<const torch::autograd::profiler::KinetoEvent*> device_events;
  for (const auto& event : result->events()) {
    if (event.deviceType() != c10::DeviceType::CUDA) {
      continue;
    }
    device_events.push_back(&event);
    auto& total = totals[event.name()];
    total.first += 1;
    total.second += event.durationNs();
  }
  std::string text;
  for (const auto& [name, total] : totals) {
    text += clean(name) + '\t' + std::to_string(total.first) + '\t' + std::to_string(total.second) + '\n';
  }
  // A run of consecutive launches from the middle, in start order.
  std::sort(device_events.begin(), device_events.end(),
            [](const auto* a, const auto* b) { return a->startNs() < b->startNs(); });
  std::string run;
  const size_t len = static_cast<size_t>(std::max<int64_t>(sample_len, 0));
  const size_t first = device_events.size() > len ? (device_events.size() - len) / 2 : 0;
  for (size_t i = first; i < device_events.size() && i < first + len; ++i) {
    run += clean(device_events[i]->name()) + "\t1\t" + std::to_string(device_events[i]->durationNs()) + '\n';
  }
  *out = esper::copy_string(text);
  *sample = esper::copy_string(run);
  ESPER_CATCH
}

}  // extern "C"
