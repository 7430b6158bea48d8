// How a model of the zoo is built: where its parameters live, how they are initialised, and the hook that lets a
// model too large for one rank be sharded layer by layer while it is built.
//
//   models::BuildOptions build;
//   build.on_layer = [&](const std::string&, const std::shared_ptr<torch::nn::Module>& layer) {
//     fsdp::fully_shard(layer, group, fsdp_options);   // the full layer is freed here, its shard kept
//   };
//   auto model = models::Flava(models::flava_flavor("flava-10b"), build);   // peak: one layer + this rank's shards
//   fsdp::fully_shard(model.ptr(), group, fsdp_options);                   // the root takes what is left
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace shardtrain::models {

struct WeightInitOptions {
  uint64_t seed = 0;
  double std = 0.02;  // normal(0, std) for projections, embeddings and learned tokens
};

// A run of consecutive transformer layers: [first, first + count).
struct StageLayers {
  int64_t first = 0, count = 0;
};

struct BuildOptions {
  // dtype and device of the parameters; the meta device builds shapes only (nothing allocated, nothing initialised).
  at::TensorOptions tensors = at::TensorOptions().dtype(at::kFloat);
  WeightInitOptions init;
  // Called with each transformer layer (qualified name, module) once it is built and initialised, before the next
  // layer is built.
  std::function<void(const std::string& name, const std::shared_ptr<torch::nn::Module>& layer)> on_layer;
  // Pipeline parallelism (models/pipeline_stage.h): the runs of transformer layers this rank holds, each a stage of
  // its own, in order; no other layer is built. The input embedding is built when a run starts the stack, the final
  // norm and the head when one ends it. Only families whose ModelRecipe::pipeline_stages_refused() is empty. Empty:
  // the whole model.
  std::vector<StageLayers> stages;
};

// Initialises every parameter of `module` whose qualified name (`prefix` + its name inside `module`) does not start
// with one of `skip_prefixes`. Each parameter is drawn from its own generator seeded by (options.seed, qualified
// name), so the weights depend on the seed and the names only — not on the order layers are built, the device or
// the world size. Biases are zero, norm scales one, head-mixing matrices (DeepViT's reattn_weights) the identity,
// every other tensor normal(0, std). Meta tensors are left alone.
void init_parameters(torch::nn::Module& module, const std::string& prefix, const WeightInitOptions& options,
                     const std::vector<std::string>& skip_prefixes = {});

// The seed of the generator a parameter named `name` (its qualified name) is drawn from under `seed`.
uint64_t parameter_seed(uint64_t seed, const std::string& name);

// Sets a parameter to `value` (e.g. FLAVA's logit scale; call after finish_model). Meta tensors are left alone.
void fill_constant(at::Tensor& parameter, double value);

// What a model constructor calls for each transformer layer: initialise it, then hand it to options.on_layer.
// Records the name in `built` so the model's final init_parameters skips it.
void finish_layer(const BuildOptions& options, const std::string& name,
                  const std::shared_ptr<torch::nn::Module>& layer, std::vector<std::string>& built);

// Initialises what finish_layer did not (embeddings, heads, norms outside layers).
void finish_model(const BuildOptions& options, torch::nn::Module& model, const std::vector<std::string>& built);

// BuildOptions that build shapes only: float32 on the meta device, nothing allocated, nothing initialised.
BuildOptions meta_build();

// Parameters of `module` counted once each (tied tensors once), from shapes only.
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace shardtrain::models
