#include "shardtrain/io/weight_files.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/torch_state_dict.h"
#include "io/dcp_checkpoint.h"
#include "shardtrain/io/mapped_file.h"

namespace shardtrain::io {
namespace {

// The names transformers' from_pretrained looks for, in its order; then a PyTorch distributed checkpoint's; then
// what Accelerate's save_state writes for an FSDP model (fsdp_state_dict_type FULL_STATE_DICT: a torch.save file;
// SHARDED_STATE_DICT: a distributed checkpoint in a directory of its own).
constexpr const char* kWeightNames[] = {"model.safetensors",           "model.safetensors.index.json",
                                        "pytorch_model.bin",           "pytorch_model.bin.index.json",
                                        ".metadata",                   "pytorch_model_fsdp.bin",
                                        "pytorch_model_fsdp_0/.metadata"};
constexpr const char* kDcpMetadata = ".metadata";

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
  // A training checkpoint of shardtrain's (its trainer.json, or a checkpoint.dir of step-* ones) holds each rank's
  // rows under the model's own names: say how to make weights of it.
  bool checkpoint = std::filesystem::exists(std::filesystem::path(path) / "trainer.json");
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    checkpoint = checkpoint || entry.path().filename().string().rfind("step-", 0) == 0;
  }
  if (checkpoint) {
    throw std::runtime_error(path + ": a shardtrain training checkpoint, not a model's weights: `shardtrain "
                             "checkpoint export " + path + " --out model.safetensors` (or --hf DIR) writes them "
                             "(checkpoint.state_dict_type: full saves them beside it), and --resume continues its run");
  }
  throw std::runtime_error(path + ": a model directory needs model.safetensors, model.safetensors.index.json, "
                           "pytorch_model.bin or pytorch_model.bin.index.json (or .metadata, a PyTorch distributed "
                           "checkpoint's; or Accelerate's pytorch_model_fsdp.bin or pytorch_model_fsdp_0/)");
}

// The model's tensors in a distributed checkpoint, under the names its state dict gives them. A checkpoint saves
// what the program passed to dcp.save, flattened: `{"model": model_sd, "optim": optim_sd, "step": 3}` (FSDP2's and
// Accelerate's custom, torchtitan's) holds "model.<name>" and "optim.state.<name>.exp_avg" keys; a model state dict
// saved alone holds its names as they are. So: the entries under a top-level "model" when there are any, else every
// tensor but an optimizer's ("optim", "optimizer"). Wrapper modules' parts of a name (torch.compile's _orig_mod,
// checkpoint_wrapper's and FSDP1's) are dropped, as get_model_state_dict drops them.
// `note` says which entries were taken and how many were not.
std::vector<std::pair<std::string, const DcpTensor*>> model_tensors(const DcpMetadata& metadata,
                                                                    const std::string& where, std::string& note) {
  const bool nested = std::any_of(metadata.tensors.begin(), metadata.tensors.end(), [](const DcpTensor& t) {
    return t.path.size() > 1 && t.path[0] == "model";
  });
  std::vector<std::pair<std::string, const DcpTensor*>> out;
  std::map<std::string, std::string> seen;  // name -> the key it came from
  for (const DcpTensor& t : metadata.tensors) {
    const std::string& top = t.path.front();
    if (nested ? top != "model" || t.path.size() < 2 : top == "optim" || top == "optimizer") continue;
    std::string name;
    for (size_t k = nested ? 1 : 0; k < t.path.size(); ++k) name += (name.empty() ? "" : ".") + t.path[k];
    for (const char* wrapper : {"_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module."}) {
      for (size_t at = name.find(wrapper); at != std::string::npos && (at == 0 || name[at - 1] == '.');
           at = name.find(wrapper, at)) {
        name.erase(at, std::strlen(wrapper));
      }
    }
    auto [it, added] = seen.emplace(name, t.key);
    if (!added) throw std::runtime_error(where + ": '" + it->second + "' and '" + t.key + "' are both '" + name + "'");
    out.emplace_back(name, &t);
  }
  std::set<std::string> files;
  for (const DcpTensor& t : metadata.tensors) {
    for (const DcpChunk& c : t.chunks) files.insert(c.file);
  }
  const size_t left = metadata.tensors.size() + metadata.byte_items.size() - out.size();
  note = "a PyTorch distributed checkpoint (" + std::to_string(files.size()) + " data files): " +
         (nested ? "the entries under \"model\"" : "its tensors but an optimizer's") + ", " + std::to_string(left) +
         " other entries not read";
  return out;
}

// Rows [first_row, first_row + rows) of a tensor of `total` rows, or throws naming it.
void check_rows(const std::string& path, const std::string& name, int64_t total, int64_t first_row, int64_t rows) {
  if (rows < 0 || (rows > 0 && (first_row < 0 || first_row > total - rows))) {  // no rows: from anywhere
    throw std::out_of_range(path + ": tensor '" + name + "' has " + std::to_string(total) + " rows, rows [" +
                            std::to_string(first_row) + ", " + std::to_string(first_row + rows) + ") asked for");
  }
}

}  // namespace

// One file of weights: a safetensors file or a torch.save state dict, whose tensors are views of the file mapped
// copy-on-write (nothing read until a row is taken, and then only its pages, from the page cache: no copy beside
// the one into the model), or a distributed checkpoint's .metadata (its tensors' chunks read as rows are taken).
struct WeightFiles::File {
  explicit File(const std::string& file_path) : path(file_path) {
    if (std::filesystem::path(path).filename() == kDcpMetadata) {
      dcp = std::make_unique<DcpCheckpoint>(std::filesystem::path(path).parent_path().string());
      for (const auto& [name, t] : model_tensors(dcp->metadata(), path, note)) {
        entries.push_back({name, t->dtype, t->size});
        dcp_tensors.emplace(name, t);
      }
    } else if (is_torch_save_file(path)) {
      for (auto& [name, t] : load_torch_state_dict(path)) {
        entries.push_back({name, t.scalar_type(), t.sizes().vec()});
        tensors.emplace(name, std::move(t));
      }
    } else {
      safetensors = std::make_unique<SafetensorsReader>(path);
      for (const auto& e : safetensors->entries()) entries.push_back({e.name, e.dtype, e.shape});
      mapped = std::make_shared<MappedFile>(path);  // unmapped (a file system without mmap): read instead
      if (!mapped->mapped() || mapped->size() < safetensors->data_start() + data_bytes()) mapped.reset();
    }
    for (size_t k = 0; k < entries.size(); ++k) position.emplace(entries[k].name, k);
  }

  const WeightEntry* find(const std::string& name) const {
    auto it = position.find(name);
    return it == position.end() ? nullptr : &entries[it->second];
  }

  at::Tensor read(const std::string& name) const {
    if (dcp) {
      const DcpTensor& t = *dcp_tensors.at(name);
      const at::Tensor whole = dcp->read_rows(t, 0, t.size.empty() ? 1 : t.size[0]);
      return t.size.empty() ? whole.reshape({}) : whole;
    }
    if (safetensors) {
      const SafetensorsEntry& e = *safetensors->find(name);
      if (!mapped) return safetensors->read(name);
      const int64_t total = e.shape.empty() ? 1 : e.shape[0];
      return safetensors_rows(e, 0, total).reshape(e.shape);
    }
    return tensors.at(name).contiguous();  // a saved view: its elements
  }

  void read_into(const std::string& name, const at::Tensor& out) const {
    if (!dcp) {
      const at::Tensor t = read(name);
      if (t.sizes() != out.sizes()) {
        throw std::invalid_argument(path + ": '" + name + "' of shape " + c10::str(t.sizes()) +
                                    " read into a tensor of shape " + c10::str(out.sizes()));
      }
      out.copy_(t);
      return;
    }
    const DcpTensor& t = *dcp_tensors.at(name);
    dcp->read_rows_into(t, 0, t.size.empty() ? 1 : t.size[0], t.size.empty() ? out.reshape({1}) : out);
  }

  at::Tensor read_rows(const std::string& name, int64_t first_row, int64_t rows) const {
    if (dcp) return dcp->read_rows(*dcp_tensors.at(name), first_row, rows);
    if (safetensors) {
      if (!mapped) return safetensors->read_rows(name, first_row, rows);
      const SafetensorsEntry& e = *safetensors->find(name);
      check_rows(path, name, e.shape.empty() ? 1 : e.shape[0], first_row, rows);
      return safetensors_rows(e, first_row, rows);
    }
    const at::Tensor& t = tensors.at(name);
    const at::Tensor rowed = t.dim() == 0 ? t.reshape({1}) : t;
    check_rows(path, name, rowed.size(0), first_row, rows);
    if (rows == 0) return rowed.narrow(0, 0, 0).contiguous();
    return rowed.narrow(0, first_row, rows).contiguous();
  }

  // The end of the safetensors file's last tensor, relative to its data section.
  uint64_t data_bytes() const {
    uint64_t end = 0;
    for (const auto& e : safetensors->entries()) end = std::max(end, e.end);
    return end;
  }

  // Rows of safetensors entry `e` (checked) as a view of the mapped file: a 0-dim tensor is one row.
  at::Tensor safetensors_rows(const SafetensorsEntry& e, int64_t first_row, int64_t rows) const {
    std::vector<int64_t> shape = e.shape.empty() ? std::vector<int64_t>{1} : e.shape;
    const uint64_t total = static_cast<uint64_t>(shape[0]);
    const uint64_t row_bytes = total == 0 ? 0 : (e.end - e.begin) / total;
    shape[0] = rows;
    const size_t offset = safetensors->data_start() + e.begin + row_bytes * static_cast<uint64_t>(first_row);
    at::Storage storage(at::Storage::use_byte_size_t(), row_bytes * static_cast<uint64_t>(rows),
                        mapped_bytes(mapped, rows == 0 ? 0 : offset), nullptr, /*resizable=*/false);
    return at::empty({0}, at::TensorOptions().dtype(e.dtype)).set_(storage, 0, shape);
  }

  std::string path;
  std::unique_ptr<SafetensorsReader> safetensors;  // a safetensors file (mapped, when it can be), or
  std::shared_ptr<MappedFile> mapped;
  std::map<std::string, at::Tensor> tensors;       // a torch.save state dict's tensors, or
  std::unique_ptr<DcpCheckpoint> dcp;              // a distributed checkpoint, its model's tensors named below
  std::map<std::string, const DcpTensor*> dcp_tensors;
  std::string note;                                // a distributed checkpoint's: what was taken
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
    note_ = files_.front()->note;
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

void WeightFiles::read_into(const std::string& name, const at::Tensor& out) const {
  file_of(name).read_into(name, out);
}

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
