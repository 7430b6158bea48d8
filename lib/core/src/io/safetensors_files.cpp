#include "shardtrain/io/safetensors_files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <stdexcept>
#include <vector>

#include "shardtrain/io/files.h"

namespace shardtrain::io {

std::vector<std::string> write_safetensors_files(const std::string& dir,
                                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                 int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0) {
    throw std::invalid_argument("write_safetensors_files: max_shard_bytes is " + std::to_string(max_shard_bytes) +
                                " (expected a positive size)");
  }
  namespace fs = std::filesystem;
  make_directories(dir);
  auto bytes_of = [](const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); };
  // Shards in the given order, as save_pretrained fills them.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t total = 0, in_shard = 0;
  for (const auto& named : tensors) {
    const int64_t b = bytes_of(named.second);
    if (!shards.back().empty() && in_shard + b > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(named);
    in_shard += b, total += b;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], metadata);
    written.push_back("model.safetensors");
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      write_safetensors((fs::path(dir) / name).string(), shards[i], metadata);
      for (const auto& named : shards[i]) weight_map[named.first] = name;
      written.push_back(name);
    }
    const std::string index =
        nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
    write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(),
                      std::vector<char>(index.begin(), index.end()));
    written.push_back("model.safetensors.index.json");
  }
  // Weights of an earlier export in the other layout would be read instead of (or mixed with) these: remove them.
  static const std::regex weight_file(R"(model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, weight_file) && std::find(written.begin(), written.end(), name) == written.end()) {
      fs::remove(entry.path());
    }
  }
  return written;
}

}  // namespace shardtrain::io
