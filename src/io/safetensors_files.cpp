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
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The file to open for `path`: itself, or a directory's model.safetensors / model.safetensors.index.json.
std::string resolve(const std::string& path) {
  if (!std::filesystem::is_directory(path)) return path;
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {
    const std::string candidate = (std::filesystem::path(path) / name).string();
    if (std::filesystem::exists(candidate)) return candidate;
  }
  throw std::runtime_error(path + ": a model directory needs model.safetensors or model.safetensors.index.json");
}

}  // namespace

SafetensorsFiles::SafetensorsFiles(const std::string& path) : path_(resolve(path)) {
  if (!ends_with(path_, ".json")) {
    files_.push_back(std::make_unique<SafetensorsReader>(path_));
    entries_ = files_.front()->entries();
    for (const auto& e : entries_) file_index_[e.name] = 0;
    return;
  }
  nlohmann::json index;
  try {
    const std::vector<char> bytes = read_file(path_);
    index = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path_ + ": not a safetensors index (" + e.what() + ")");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw std::runtime_error(path_ + ": no \"weight_map\" object (an index maps each tensor to its shard file)");
  }
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  std::map<std::string, size_t> opened;  // shard file name -> files_[i]
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) throw std::runtime_error(path_ + ": the shard of '" + tensor + "' is not a file name");
    const std::string file = shard.get<std::string>();
    if (file.find('/') != std::string::npos || file == "..") {
      throw std::runtime_error(path_ + ": shard '" + file + "' of '" + tensor + "' is not a file beside the index");
    }
    auto it = opened.find(file);
    if (it == opened.end()) {
      const std::string shard_path = (dir / file).string();
      if (!std::filesystem::exists(shard_path)) {
        throw std::runtime_error(path_ + ": shard " + file + " (of '" + tensor + "') is missing");
      }
      files_.push_back(std::make_unique<SafetensorsReader>(shard_path));
      it = opened.emplace(file, files_.size() - 1).first;
    }
    const SafetensorsEntry* e = files_[it->second]->find(tensor);
    if (e == nullptr) throw std::runtime_error(path_ + ": '" + tensor + "' is not in its shard " + file);
    file_index_[tensor] = it->second;
    entries_.push_back(*e);
  }
  // A shard holding a tensor the index does not list would be silently skipped: say so instead.
  for (const auto& f : files_) {
    for (const auto& e : f->entries()) {
      if (!file_index_.count(e.name)) {
        throw std::runtime_error(path_ + ": '" + e.name + "' in " + f->path() + " is not in the index's weight_map");
      }
    }
  }
}

const SafetensorsEntry* SafetensorsFiles::find(const std::string& name) const {
  auto it = file_index_.find(name);
  return it == file_index_.end() ? nullptr : files_[it->second]->find(name);
}

const SafetensorsReader& SafetensorsFiles::file_of(const std::string& name) const {
  auto it = file_index_.find(name);
  if (it == file_index_.end()) throw std::runtime_error(path_ + ": no tensor '" + name + "'");
  return *files_[it->second];
}

at::Tensor SafetensorsFiles::read(const std::string& name) const { return file_of(name).read(name); }

at::Tensor SafetensorsFiles::read_rows(const std::string& name, int64_t first_row, int64_t rows) const {
  return file_of(name).read_rows(name, first_row, rows);
}

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
