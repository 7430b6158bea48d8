// Text from a Hugging Face model directory (what `shardtrain checkpoint export --hf` writes of a run), as
// transformers' generate() makes it (models/generation.h), in one process or sharded over a launcher's ranks:
//
//   generate::GeneratorOptions o;
//   o.model = "runs/exported";                      // config.json, the weights, the tokenizer's files
//   models::GenerationOptions g = generate::generation_config(o.model, *data::open_tokenizer(o.model));
//   g.max_new_tokens = 32;                          // the caller's overrides, then models::check_generation_options
//   generate::Generator gen(o, g);
//   gen.run(prompts, [](const generate::Completion& c) { ... });   // rank 0 gets every completion, in order
//
// Under a launcher (RANK set) the model is sharded over the job's ranks (FULL_SHARD, each rank reading its rows of
// the weights and the adapter), each rank continues batches of its own, stepping with the others
// (GenerationOptions::synced), and rank 0 receives every result in the prompts' order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/zoo.h"

namespace shardtrain::generate {

struct GeneratorOptions {
  std::string model;                 // a Hugging Face model directory
  std::string adapter;               // a PEFT LoRA adapter directory over it, applied unmerged; "" for none
  at::ScalarType dtype = at::kFloat;  // the weights' and the computation's
  std::string device = "cpu";        // cpu, cuda, cuda:N; under a launcher cpu or cuda (each rank its own GPU)
  int64_t batch_size = 8;            // prompts generated together
};

// generation_config.json's settings of `dir` (its config.json's token ids where it has none; transformers' defaults
// for the rest): what a caller's overrides start from.
models::GenerationOptions generation_config(const std::string& dir, const data::Tokenizer& tokenizer);

// One prompt's result.
struct Completion {
  size_t prompt = 0;  // its place among the prompts
  std::string text;
  std::vector<int64_t> tokens;
  bool finished = false;  // ended by an end-of-sequence token
};

class Generator {
 public:
  // Reads the model (and the adapter), joining the launcher's job when there is one. Throws
  // std::invalid_argument naming a bad option.
  Generator(const GeneratorOptions& options, models::GenerationOptions generation);

  // "DIR (llama, sharded over 2 ranks), byte-level BPE tokenizer.json (...)": what generates.
  std::string describe() const;
  int rank() const { return env_.rank; }
  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  const models::GenerationOptions& generation() const { return generation_; }

  // Continues `prompts` in batches; rank 0 gets each completion through `each`, in the prompts' order, as a batch
  // completes (the other ranks get none); `progress` hears the token being generated on this rank's batch
  // (prompts first..end of all). Returns the tokens generated for every prompt. Collective under a launcher.
  int64_t run(const std::vector<std::string>& prompts, const std::function<void(const Completion&)>& each,
              const std::function<void(size_t first, size_t end, int64_t token)>& progress = {});

 private:
  GeneratorOptions options_;
  models::GenerationOptions generation_;
  dist::DistEnv env_;
  at::Device device_ = at::kCPU;
  std::optional<dist::ProcessGroup> world_;
  std::shared_ptr<const data::Tokenizer> tokenizer_;
  std::string adapted_;  // ", adapter ..." for describe()
  models::ZooModel model_;
};

}  // namespace shardtrain::generate
