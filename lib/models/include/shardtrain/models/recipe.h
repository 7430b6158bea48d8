// One recipe per model family: everything the rest of shardtrain knows about a family is reached through ModelRecipe,
// and nothing outside the family's own files (models/<family>.{h,cpp},
// lib/models/src/models/<family>/<family>_recipe.cpp) compares family names or casts to a family's class. The zoo
// (zoo.h) is a table of families, each turning a flavor name into a recipe.
//
// A recipe is one model of a family at one size (the family's config is inside it):
//   build, Hugging Face names, transformer layer class  what parallelize(), checkpoints and weights loading need
//   hf_base_model                                       transformers' base model as tensors (estimate-memory)
//   training_flops                                      the loop's TFLOP/s and MFU
//   text_decoder                                        generation (causal LMs, T5)
//   parallelize_hook                                    what a family needs from the data-parallel world (FLAVA's
//                                                       global contrastive loss gathers over it)
//   tasks / task(name)                                  what it trains on: each Task names the data it reads, its
//                                                       losses, and its evaluation
//
// Adding a family: see docs/notes/architecture.md ("Adding a model family"). What comes next slots in here, not in
// the trainer: a model from a Hugging Face config.json is another way to make a recipe (a new column of the zoo's
// table); an activation-memory estimate is another virtual of ModelRecipe; a new task is another Task of the family.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/models/activation_memory.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/hf_layout.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/models/weights.h"

namespace torch::nn {
class Module;
}
namespace shardtrain::dist {
class Communicator;
class DeviceMesh;
}  // namespace shardtrain::dist

namespace shardtrain::models {

class TextDecoder;  // models/generation.h

// What a task reads: which sources, and the sizes the data pipeline makes its samples in.
struct DataNeeds {
  std::array<bool, 3> kinds = {false, false, false};          // sources read: IMAGE_TEXT, TEXT, IMAGE
  bool mixes_kinds = false;    // each step's kind drawn with data.mix (FLAVA); else every source given, equally
  int64_t image_size = 0, patch_size = 0, codebook_size = 0;  // pixels; 0: no images / no codebook
  int64_t max_text_length = 0, vocab_size = 0;                // tokens; 0: no text
  int64_t num_labels = 0;                                     // classifier outputs (.cls labels)
  std::vector<std::string> class_names;  // a classifier's classes by id, when records name them (BERT's classify)
  bool multi_label = false;              // a sample's label is a set of the classes (a list in its record)
  bool word_labels = false;  // token classification: texts are words, each with one of the classes
  bool uses_mlm = false, uses_mim = false;                    // masked tokens / masked patches in the batch

  // The kind of the task's largest batches: image-text when it reads pairs, else text, else images (what memory
  // estimates and benchmarks size a step by).
  data::SampleKind largest_kind() const {
    if (kinds[0]) return data::SampleKind::IMAGE_TEXT;
    return kinds[1] ? data::SampleKind::TEXT : data::SampleKind::IMAGE;
  }
};

// The losses of one micro-batch.
struct Losses {
  at::Tensor total;                     // () what backward runs on
  std::map<std::string, double> parts;  // each loss's value by name ("mlm", "itm", ...), for the logs
};

// Held-out evaluation of a task: what Task::evaluate reads.
struct EvalInputs {
  const data::Loader* loader = nullptr;  // batches of the held-out source, masked as in training
  int64_t source_size = 0;               // samples in the held-out source
  int64_t max_samples = 0;               // 0: all
  int64_t batch_size = 0;                // per rank
  const dist::Communicator* world = nullptr;
  at::Device device = at::kCPU;           // where the model computes: batches go there
  at::ScalarType floats = at::kFloat;     // the model's dtype: the batches' pixels are cast to it
  // A pipeline's (the model holds this rank's stages): a text batch's summed token loss and its predicted tokens,
  // computed through every stage, in place of a causal LM's own forward; every pipeline rank calls it for the same
  // batches. Unset: the model's forward.
  std::function<std::pair<at::Tensor, int64_t>(const data::Batch&)> pipeline_token_loss;
};

// A training objective of a family: pretraining, classification, sequence to sequence, ...
class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;  // "pretraining", "masked_lm", ...
  virtual DataNeeds data_needs() const = 0;
  // Every loss compute_losses() can report, in a fixed order (the metrics' columns, the ranks' reduction order).
  virtual std::vector<std::string> loss_names() const = 0;
  // Forward pass and losses of one micro-batch on `model` (the recipe's module, however it was parallelized).
  // `seed` drives what the objective draws itself (T5's spans). Throws std::runtime_error on data it cannot use.
  virtual Losses compute_losses(torch::nn::Module& model, const data::Batch& batch, uint64_t seed) const = 0;
  // Some batches leave parameters without a gradient (FLAVA's text-only batch skips the image heads): DDP must
  // look for them (find_unused_parameters).
  virtual bool leaves_parameters_unused() const { return false; }
  // Modules (paths in the recipe's module tree, "mlm_head") no gradient reaches in a step of the task's largest
  // kind, the one the memory model walks: FLAVA's image-text step leaves out the unimodal MIM and MLM heads and the
  // poolers, BERT's masked LM its pooler. Their parameters get no gradient there (plan/memory_model.h).
  virtual std::vector<std::string> modules_without_gradient() const { return {}; }
  // Throws std::invalid_argument naming the objective when `local_batch` samples per rank (of `world_size`
  // ranks) are too few for it to mean anything (FLAVA's ITM negatives come from the same rank's batch).
  virtual void check_batch_size(int64_t local_batch, int64_t world_size) const;

  // Held-out evaluation, for tasks that have one: the kind of samples it reads, then a collective over
  // inputs.world returning named metrics, and a phrase comparing the first and the last evaluation for the
  // run's closing line (", retrieval R@1 0.004 -> 0.396 ...").
  virtual bool has_evaluation() const { return false; }
  virtual data::SampleKind eval_kind() const { return data::SampleKind::IMAGE_TEXT; }
  virtual std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& inputs) const;
  virtual std::string describe_progress(const std::map<std::string, double>& first,
                                        const std::map<std::string, double>& last) const;
};

// What a task's head is made for, from the run's config.
struct TaskSetup {
  std::vector<std::string> labels;       // a classifier's classes, by id (data.labels)
  bool multi_label = false;              // each sample has a set of them (data.multi_label)
  std::optional<int64_t> first_sentinel;  // the tokenizer's <extra_id_0> (T5's span corruption), when it has one
  // The tokenizer's padding id: a causal LM's classifier keeps it as config.json's pad_token_id, by which
  // transformers' ...ForSequenceClassification finds each row's last token.
  std::optional<int64_t> pad_token_id;
};

// One model of a family at one size.
class ModelRecipe {
 public:
  virtual ~ModelRecipe() = default;
  virtual std::string family() const = 0;  // "flava", "bert", ...
  virtual std::string flavor() const = 0;  // "flava-350m", ...

  // The root module (an nn::Interceptable: the root unit of sharding). BuildOptions::on_layer sees every
  // transformer layer as it is built.
  virtual std::shared_ptr<torch::nn::Module> build(const BuildOptions& options) const = 0;
  virtual NameMap hf_names() const = 0;  // our parameter names to Hugging Face's
  // The transformer layer class: the default FSDP unit and activation-checkpoint region ("BertLayer").
  virtual std::string layer_class() const = 0;
  // Other module classes that are FSDP units of their own under the default wrap, outside the transformer layers
  // and never checkpointed: a large part of the root that not every step runs (FLAVA's frozen image codebook,
  // "FlavaImageCodebook": gathered only while it tokenizes images, never in text-only steps). Default none.
  virtual std::vector<std::string> extra_unit_classes() const { return {}; }
  // The classes of the modules at the model's two ends that are FSDP units of their own under the default wrap,
  // never checkpointed: the input embedding, which runs before every layer, and the output head, which runs after
  // them all (Llama: "LlamaEmbedding", "LlamaLMHead"; torchtitan shards them apart from the root too). Out of the
  // root, neither is held gathered from the start of forward to the end of backward: the embedding is gathered
  // for its forward and again for its backward (the last), the head for the loss and its backward (the first).
  // Empty names: they stay in the root (as a weight tied between the two must).
  struct EdgeUnits {
    std::string input, output;
  };
  virtual EdgeUnits edge_unit_classes() const { return {}; }
  // The parameters (our names) that are at once a lookup's table and the output head's weight (tie_table(): BERT's
  // word embeddings under the masked-LM head, T5's shared table, a tied Llama's): backward makes the head's dense
  // gradient first and holds it apart from .grad until the lookups' rows join it at the end. Default none.
  virtual std::vector<std::string> tied_tables() const { return {}; }
  // Why the model cannot be built as pipeline stages (BuildOptions::stages), or "" when it can (Llama's family with
  // a head of its own). Default: the family's stages are not written yet.
  virtual std::string pipeline_stages_refused() const;
  // extra_unit_classes() and the edge units' classes that are set: every unit of the default wrap but the layers.
  std::vector<std::string> own_unit_classes() const;
  // transformers' AutoModel of this model's config (the base model, without a task head) as its tensors, for
  // Accelerate's sizes (estimate-memory). Built from the family's own modules on the meta device.
  virtual HfModelLayout hf_base_model() const = 0;
  // transformers' config.json of this model (JSON text): model_type, architectures and every dimension, what
  // `shardtrain checkpoint export --hf` writes. The family's from-config.json reading of it gives back this model.
  virtual std::string hf_config_json() const = 0;

  // Model FLOPs of one training step (forward + backward) on `batch`: 3 x the forward's. Each family states its
  // formula. Throws std::invalid_argument for a batch kind the model does not read.
  virtual double training_flops(const data::Batch& batch) const = 0;

  // The bytes one micro-batch's forward keeps for backward (models/activation_memory.h). Throws
  // std::invalid_argument for a family whose activations are not modelled yet.
  virtual ActivationBytes activation_bytes(const ActivationQuery& query) const;

  // What generates text with `model` (this recipe's module, built and loaded, in one process): a decoder keeping a
  // KV cache in its attention modules while it lives (models/generation.h). Throws std::invalid_argument naming the
  // family for a model that does not generate text (the default; the causal LMs and T5 do).
  virtual std::unique_ptr<TextDecoder> text_decoder(torch::nn::Module& model) const;

  // How the model splits under tensor parallelism (models/tensor_parallel.h): a rule for every module that holds
  // parameters or changes under the split. Empty (the default): the family does not split.
  virtual TpPlan tp_plan() const { return {}; }

  // Called by parallelize(), build_parallel() and replicate_model() once the root is wrapped.
  virtual void parallelize_hook(torch::nn::Module& root, const dist::DeviceMesh& mesh) const;

  // The tasks this model trains on; the first is the default.
  virtual std::vector<std::string> tasks() const = 0;
  // The model that trains `task` when it is not this one: the same body with the task's head (BERT's classify: a
  // classifier over `setup.labels` in place of the masked-LM head), as transformers' AutoModelFor<Task> builds on
  // one config. Null: this model trains it as it is. Throws std::invalid_argument when the task needs what `setup`
  // lacks. Called through recipe_for_task.
  virtual std::shared_ptr<const ModelRecipe> with_task_head(const std::string& task, const TaskSetup& setup) const;
  // Throws std::invalid_argument naming the task and the family's tasks when `name` is not one (empty: default).
  std::unique_ptr<Task> task(const std::string& name = "") const;

 protected:
  virtual std::unique_ptr<Task> make_task(const std::string& name) const = 0;  // name is one of tasks()
};

// The model of `recipe` that trains `task` (empty: the default): recipe->with_task_head, or `recipe` itself. Throws
// std::invalid_argument naming the task and the family's tasks when `task` is not one.
std::shared_ptr<const ModelRecipe> recipe_for_task(std::shared_ptr<const ModelRecipe> recipe, const std::string& task,
                                                   const TaskSetup& setup);

// Per-layer forward FLOPs of a transformer layer over `tokens` tokens of attention width `width`, with `weights`
// multiply-adds per token in its projections: 2 * weights * tokens (each multiply-add is 2 FLOPs) plus attention's
// 4 * tokens^2 * width (scores Q K^T and their product with V, 2 * tokens^2 * width each).
inline double transformer_layer_flops(double weights, double tokens, double width) {
  return 2 * weights * tokens + 4 * tokens * tokens * width;
}

}  // namespace shardtrain::models
