// A model's weights as a Hugging Face safetensors file, under the Hugging Face parameter names of its family.
// Our module tree names its parameters after our generic blocks ("layers.3.attn.q.weight"); a family's NameMap
// rewrites them to Hugging Face's ("bert.encoder.layer.3.attention.self.query.weight").
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace shardtrain::models {

class TensorParallel;  // models/tensor_parallel.h

// Ordered rewrite rules: the first rule whose regex matches the whole name gives its replacement (ECMAScript
// syntax, $1 for groups); a name no rule matches is kept. `ignored` are Hugging Face names a file may hold that the
// model does not load (tied copies, non-persistent buffers). `aliases` rewrite a Hugging Face name into the other
// name a tied tensor may be saved under (transformers keeps one of the two, not always the same one).
//
// Fine-tuning moves between a family's heads (a masked-LM checkpoint into a classifier): `heads` are the Hugging
// Face names of task heads. One the model has and the file lacks keeps its initialization; one the file has and the
// model lacks is left unused; loading reports both (LoadReport), as transformers' from_pretrained warns.
//
// `transposed` are the Hugging Face names of weights stored (in, out), Hugging Face's Conv1D (GPT-2): the model
// keeps them so too (LinearImpl's transposed), so files load and save as they are; what computes with a file's
// tensors by name (merging LoRA adapters: PEFT's fan_in_fan_out) asks is_transposed.
class NameMap {
 public:
  using Rules = std::vector<std::pair<std::string, std::string>>;
  NameMap() = default;
  NameMap(const Rules& rules, const std::vector<std::string>& ignored = {}, const Rules& aliases = {},
          const std::vector<std::string>& heads = {}, const std::vector<std::string>& transposed = {});
  std::string to_hf(const std::string& name) const;
  bool is_ignored(const std::string& hf_name) const;
  bool is_head(const std::string& hf_name) const;
  bool is_transposed(const std::string& hf_name) const;
  std::vector<std::string> aliases_of(const std::string& hf_name) const;

 private:
  static std::vector<std::pair<std::regex, std::string>> compile(const Rules& rules);
  std::vector<std::pair<std::regex, std::string>> rules_, aliases_;
  std::vector<std::regex> ignored_, heads_, transposed_;
};

// What a load left aside: the model's head tensors the file lacks (initialized, not loaded) and the file's head
// tensors the model lacks (not loaded), by Hugging Face name — any tensors with LoadOptions::partial; with
// LoadOptions::ignore_mismatched_sizes the tensors whose shapes differ (initialized, not loaded), as
// "name: [file's shape] -> [model's]".
struct LoadReport {
  std::vector<std::string> initialized, unused, mismatched;
};

struct LoadOptions {
  // The model was resized from the file's (model.overrides: fewer or more layers): as transformers' from_pretrained
  // with a changed config, any tensor the file lacks keeps its initialization and any the model lacks is left, both
  // reported; a shape that differs still throws.
  bool partial = false;
  // transformers' flag of that name: a tensor whose shape differs keeps its initialization instead of throwing.
  bool ignore_mismatched_sizes = false;
  // The file is a LoRA adapter as PEFT's save_pretrained writes it (models/lora.h): "base_model.model." + a Hugging
  // Face name, the adapters' tensors and the modules saved whole. Each adapter tensor of the model must be in it
  // and everything in it must be the model's; the model's other tensors are left as they are (the base model's).
  bool lora_adapter = false;
};

// Copies every parameter and buffer of `model` from the file (converting dtype, keeping the model's device). `path`:
// a safetensors or torch.save file (pytorch_model.bin), a sharded checkpoint's index, or a Hugging Face model
// directory holding either (io::WeightFiles). A file that holds a tied tensor under each of its names (older
// transformers saved the whole state_dict) loads it once: the family's NameMap ignores the copies.
// Validates the whole file against the model first, and throws std::runtime_error naming the tensor on: a
// parameter missing from the file, a shape that differs, a tensor in the file the model does not have (unless
// ignored or a head; with options.partial a missing or extra tensor of any kind is reported instead). A LoRA
// adapter's tensor (models/lora.h) the file lacks keeps its initialization, unreported: a base model has none. A model
// prefix Hugging Face drops when saving the base model alone ("bert.") is tried both ways.
LoadReport load_weights(torch::nn::Module& model, const std::string& path, const NameMap& names,
                        const LoadOptions& options = {});

// load_weights into a model sharded by fully_shard (parallelize, build_parallel), which never holds a parameter
// whole. Each rank reads only the rows it holds (a pread of their bytes) — or, with `from_rank0`
// (sync_module_states, for a file only rank 0 can see), rank 0 reads each tensor whole, one at a time, and
// broadcasts it over from_rank0, every rank keeping its rows. Validation as load_weights', against the full shapes;
// with from_rank0 the other ranks fail too, saying that rank 0 did. Collective when from_rank0 is given. With
// from_rank0 only rank 0's report is filled (it alone reads the file).
// With `tp` (the model split by tensor parallelism: models/tensor_parallel.h), a split parameter's file tensor is
// the whole one: each rank reads the rows of its slice (split by rows), or the rows it shards and of them its
// columns (split by columns); from_rank0 broadcasts the whole tensor and each rank keeps its slice's rows.
LoadReport load_weights_sharded(const std::shared_ptr<torch::nn::Module>& model, const std::string& path,
                                const NameMap& names,
                                const std::optional<dist::Communicator>& from_rank0 = std::nullopt,
                                const LoadOptions& load_options = {}, const TensorParallel* tp = nullptr);

// Writes every parameter (tied tensors once, under their first name) and persistent buffer of `model` in `dtype`
// (their own dtype when undefined) under Hugging Face names, atomically.
void save_weights(const torch::nn::Module& model, const std::string& path, const NameMap& names,
                  std::optional<at::ScalarType> dtype = std::nullopt);

// (our name, Hugging Face name) of every parameter (tied tensors once, under their first name) and buffer of
// `model`, in that order: what a Hugging Face file of the model holds.
std::vector<std::pair<std::string, std::string>> hf_names_of(const torch::nn::Module& model, const NameMap& names);

// (Hugging Face name, tensor) of every parameter and buffer of `model`, tied tensors once.
std::vector<std::pair<std::string, at::Tensor>> hf_named_tensors(const torch::nn::Module& model, const NameMap& names);

}  // namespace shardtrain::models
