// The weights of a Hugging Face checkpoint, in one safetensors file or sharded across several with an index
// (model.safetensors.index.json: {"weight_map": {tensor name: shard file name}}), read as one: a tensor is found by
// name in whichever file holds it, and a rank reads only the rows it needs from that file.
//
//   SafetensorsFiles w("path/to/model_dir");   // model.safetensors, or the index and its shards
//   w.read_rows("bert.embeddings.word_embeddings.weight", first_row, rows);
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/io/safetensors.h"

namespace shardtrain::io {

class SafetensorsFiles {
 public:
  // `path`: a .safetensors file, a *.index.json, or a directory holding model.safetensors or
  // model.safetensors.index.json. Throws std::runtime_error naming the file for a directory with neither, an index
  // that is not JSON or has no weight_map, a shard that is missing, or a tensor the index places in a shard that
  // does not hold it (or that two shards both hold).
  explicit SafetensorsFiles(const std::string& path);

  const std::string& path() const { return path_; }  // the file or index read
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  at::Tensor read(const std::string& name) const;
  at::Tensor read_rows(const std::string& name, int64_t first_row, int64_t rows) const;

 private:
  const SafetensorsReader& file_of(const std::string& name) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> file_index_;  // tensor name -> files_[i]
};

// Writes `tensors` into directory `dir` as transformers' save_pretrained does: model.safetensors when their bytes
// are at most `max_shard_bytes`, else shards model-00001-of-0000N.safetensors filled in the given order (a new one
// when the next tensor would pass the limit; a tensor larger than the limit alone in its own) and
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}}). Every file holds
// the metadata {"format": "pt"} transformers checks. Each file is written atomically, the index last. Returns the
// names of the files written.
std::vector<std::string> write_safetensors_files(const std::string& dir,
                                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                 int64_t max_shard_bytes);

}  // namespace shardtrain::io
