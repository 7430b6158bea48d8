#include "shardtrain/io/safetensors_files.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
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

}  // namespace shardtrain::io
