#include "shardtrain/io/weight_files.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <stdexcept>

#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/torch_state_dict.h"

namespace shardtrain::io {
namespace {

// The names transformers' from_pretrained looks for, in its order.
constexpr const char* kWeightNames[] = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                        "pytorch_model.bin.index.json"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The file to open for `path`: itself, or the first weights file a directory holds.
std::string resolve(const std::string& path) {
  if (!std::filesystem::is_directory(path)) return path;
  for (const char* name : kWeightNames) {
    const std::string candidate = (std::filesystem::path(path) / name).string();
    if (std::filesystem::exists(candidate)) return candidate;
  }
  throw std::runtime_error(path + ": a model directory needs model.safetensors, model.safetensors.index.json, "
                           "pytorch_model.bin or pytorch_model.bin.index.json");
}

}  // namespace

// One file of weights: a safetensors file read on demand, or a torch.save state dict whose tensors are views of the
// file mapped copy-on-write (nothing read until a row is taken).
struct WeightFiles::File {
  explicit File(const std::string& file_path) : path(file_path) {
    if (is_torch_save_file(path)) {
      for (auto& [name, t] : load_torch_state_dict(path)) {
        entries.push_back({name, t.scalar_type(), t.sizes().vec()});
        tensors.emplace(name, std::move(t));
      }
    } else {
      safetensors = std::make_unique<SafetensorsReader>(path);
      for (const auto& e : safetensors->entries()) entries.push_back({e.name, e.dtype, e.shape});
    }
    for (size_t k = 0; k < entries.size(); ++k) position.emplace(entries[k].name, k);
  }

  const WeightEntry* find(const std::string& name) const {
    auto it = position.find(name);
    return it == position.end() ? nullptr : &entries[it->second];
  }

  at::Tensor read(const std::string& name) const {
    return safetensors ? safetensors->read(name) : tensors.at(name).contiguous();  // a saved view: its elements
  }

  at::Tensor read_rows(const std::string& name, int64_t first_row, int64_t rows) const {
    if (safetensors) return safetensors->read_rows(name, first_row, rows);
    const at::Tensor& t = tensors.at(name);
    const at::Tensor rowed = t.dim() == 0 ? t.reshape({1}) : t;
    const int64_t total = rowed.size(0);
    if (rows < 0 || (rows > 0 && (first_row < 0 || first_row + rows > total))) {  // no rows: from anywhere
      throw std::out_of_range(path + ": tensor '" + name + "' has " + std::to_string(total) + " rows, rows [" +
                              std::to_string(first_row) + ", " + std::to_string(first_row + rows) + ") asked for");
    }
    if (rows == 0) return rowed.narrow(0, 0, 0).contiguous();
    return rowed.narrow(0, first_row, rows).contiguous();
  }

  std::string path;
  std::unique_ptr<SafetensorsReader> safetensors;  // a safetensors file, or
  std::map<std::string, at::Tensor> tensors;       // a torch.save state dict's tensors
  std::vector<WeightEntry> entries;                // in the file's order
  std::map<std::string, size_t> position;          // name -> entries[k]
};

WeightFiles::~WeightFiles() = default;

WeightFiles::WeightFiles(const std::string& path) : path_(resolve(path)) {
  auto add = [&](const WeightEntry& e, size_t file) {
    index_[e.name] = entries_.size();
    entries_.push_back(e);
    file_of_.push_back(file);
  };
  if (!ends_with(path_, ".json")) {
    files_.push_back(std::make_unique<File>(path_));
    for (const auto& e : files_.front()->entries) add(e, 0);
    return;
  }
  nlohmann::json index;
  try {
    const std::vector<char> bytes = read_file(path_);
    index = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path_ + ": not a weights index (" + e.what() + ")");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw std::runtime_error(path_ + ": no \"weight_map\" object (an index maps each tensor to its shard file)");
  }
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  std::map<std::string, size_t> opened;  // shard file name -> files_[i]
  for (const auto& item : index["weight_map"].items()) {
    const std::string tensor = item.key();
    const nlohmann::json& shard = item.value();
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
      files_.push_back(std::make_unique<File>(shard_path));
      it = opened.emplace(file, files_.size() - 1).first;
    }
    const WeightEntry* e = files_[it->second]->find(tensor);
    if (e == nullptr) throw std::runtime_error(path_ + ": '" + tensor + "' is not in its shard " + file);
    add(*e, it->second);
  }
  // A shard holding a tensor the index does not list would be silently skipped: say so instead.
  for (const auto& f : files_) {
    for (const auto& e : f->entries) {
      if (!index_.count(e.name)) {
        throw std::runtime_error(path_ + ": '" + e.name + "' in " + f->path + " is not in the index's weight_map");
      }
    }
  }
}

const WeightEntry* WeightFiles::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const WeightFiles::File& WeightFiles::file_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::runtime_error(path_ + ": no tensor '" + name + "'");
  return *files_[file_of_[it->second]];
}

at::Tensor WeightFiles::read(const std::string& name) const { return file_of(name).read(name); }

at::Tensor WeightFiles::read_rows(const std::string& name, int64_t first_row, int64_t rows) const {
  return file_of(name).read_rows(name, first_row, rows);
}

bool has_weight_files(const std::string& dir) {
  for (const char* name : kWeightNames) {
    if (std::filesystem::exists(std::filesystem::path(dir) / name)) return true;
  }
  return false;
}

}  // namespace shardtrain::io
