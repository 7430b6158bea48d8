// Loading a Hugging Face model's weights into the built model, one model directory per argument (config.json and
// weights in any form io::WeightFiles reads: model.safetensors, pytorch_model.bin, a distributed checkpoint):
// seconds to load (load_weights, the model already built; the fastest of --repeats, the file in the page cache
// after the first) and the bytes the load allocated above the model's own (the counting allocator's peak), as one
// RESULT line of JSON. bench/weights_vs_torch.py runs it beside PyTorch's own loading of the same files.
//
//   weights_bench [--repeats 3] DIR...
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"

int main(int argc, char** argv) {
  using namespace shardtrain;
  int repeats = 3;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::stoi(argv[++i]));
    } else {
      dirs.push_back(arg);
    }
  }
  if (dirs.empty()) {
    std::cerr << "usage: weights_bench [--repeats N] DIR...\n";
    return 2;
  }
  memory::install_cpu_memory_counter();
  std::string result = "{";
  for (const std::string& dir : dirs) {
    models::ZooModel model = models::build_model(models::recipe_of_model(dir));
    int64_t model_bytes = 0;
    for (const auto& p : model.module->parameters()) model_bytes += p.nbytes();
    double best = 1e30;
    int64_t extra = 0;
    for (int r = 0; r < repeats; ++r) {
      memory::reset_cpu_peak();
      const int64_t before = memory::cpu_memory_stats().current_bytes;
      const auto t0 = std::chrono::steady_clock::now();
      models::load_weights(*model.module, dir, model.names);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, seconds);
      extra = std::max(extra, memory::cpu_memory_stats().peak_bytes - before);
    }
    std::printf("%-60s %8.3f s  %9.1f MB above the model's %.1f MB\n", dir.c_str(), best, extra / 1e6,
                model_bytes / 1e6);
    char entry[512];
    std::snprintf(entry, sizeof(entry), "%s\"%s\": {\"seconds\": %.6f, \"extra_bytes\": %lld, \"model_bytes\": %lld}",
                  result.size() > 1 ? ", " : "", dir.c_str(), best, static_cast<long long>(extra),
                  static_cast<long long>(model_bytes));
    result += entry;
  }
  std::cout << "RESULT " << result << "}" << std::endl;
  return 0;
}
