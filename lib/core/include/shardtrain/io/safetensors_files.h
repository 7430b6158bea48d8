// A model's weights written as transformers' save_pretrained writes them: one safetensors file, or shards and an
// index (model.safetensors.index.json: {"weight_map": {tensor name: shard file name}}). io::WeightFiles reads them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "shardtrain/io/safetensors.h"

namespace shardtrain::io {

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
