// Tensor parallelism (Megatron-LM; PyTorch's parallelize_module with ColwiseParallel, RowwiseParallel,
// SequenceParallel and loss parallelism): the layers of a model split over a group of ranks that see the same
// batch, each rank holding a slice of every projection. A family's recipe says how its modules split, as data
// (ModelRecipe::tp_plan): a list of rules, module path -> style. tensor_parallelize() applies it to a built model,
// before any data parallelism (FSDP then shards each rank's slices over the data-parallel ranks).
//
// Within a transformer layer (Megatron's split, t = the group size):
//   attention  x -> [enter] -> q, k, v column-wise (heads / t each) -> attention -> o row-wise -> [leave]
//   MLP        x -> [enter] -> gate, up column-wise (width / t) -> SwiGLU -> down row-wise -> [leave]
// where enter is tp::copy_to_group and leave an all-reduce of the partial products (tp::reduce_from_group), or with
// sequence parallelism (activations between the regions sharded on the sequence dimension, dim 1 of (B, T, C))
// tp::gather_along and tp::reduce_scatter_along. Random draws (dropout) inside a region, and under sequence
// parallelism in the whole layer, are each rank's own (tp/rng_fork.h); elsewhere the group draws alike. The token
// embedding is split by vocabulary rows (each rank looks up the ids it holds, zero elsewhere, then the same
// reduction as a row-wise projection) and the LM head by vocabulary rows too, its cross-entropy computed over the
// split logits (losses.h VocabShard), never gathered.
//
// A vocabulary need not divide by t: its rows are split as evenly as they can be (tp/split.h), as DTensor splits an
// uneven size; every other split dimension (heads, widths) must divide.
//
// Parameters that stay whole on every rank (norms, a row-wise projection's bias) get the whole gradient on each
// rank when their input is replicated; when it is this rank's sequence slice (sequence parallelism), or its heads'
// values only (Qwen3's per-head q_norm), each rank's gradient is a part of the sum: TensorParallel::
// reduce_gradients() sums them over the group after backward. So it does for a key/value head held by several ranks
// (grouped-query attention with fewer key/value heads than ranks: Megatron's replication), over the ranks holding it.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/optim/row_sharding.h"
#include "shardtrain/tp/split.h"

namespace shardtrain::models {

struct ZooModel;
class ModelRecipe;
struct TransformerLayerOptions;

// A table split by vocabulary rows when given a shard (its rows [start, start + rows) of the whole vocabulary):
// an LM head (LlamaLMHead: VOCAB_HEAD) then computes its loss over the split logits (linear_cross_entropy with the
// shard) or gathers the logits whole; a table that the token lookups and the head share (a tied Llama's embed:
// VOCAB_TABLE) is read by its model through vocab_parallel_lookup and the same loss. sequence_parallel: the
// lookup's result is scattered over the sequence.
class VocabParallelTable {
 public:
  virtual ~VocabParallelTable() = default;
  std::optional<VocabShard> vocab_shard;
  bool sequence_parallel = false;
};

// lookup(local ids) over a table holding `rows` rows of the vocabulary from shard.start: ids (B, T) outside them
// look up row 0 and are zeroed, then the ranks' rows are summed over shard.group, or under sequence parallelism
// reduce-scattered over dim 1 (T must divide by the group: std::invalid_argument naming it otherwise).
at::Tensor vocab_parallel_lookup(const at::Tensor& ids, const VocabShard& shard, int64_t rows, bool sequence_parallel,
                                 const std::function<at::Tensor(const at::Tensor&)>& lookup);

// Logits (..., rows) over this rank's rows of the vocabulary -> (..., shard.vocab) over all of it, every rank's part
// in place (parts of unequal length too). Its backward keeps this rank's part of the gradient: what follows is
// computed alike on every rank (generation, a loss over whole logits).
at::Tensor gather_vocabulary(const at::Tensor& logits, const VocabShard& shard);

// How one module splits. "Split" parameters are sliced along the named dimension; "whole" ones stay whole.
enum class TpStyle {
  COLUMN,           // Linear: output features split (weight rows, bias); its input is already in the region
  FUSED_QKV,        // COLUMN of a Linear whose output is q, k and v side by side (GPT-2's c_attn): each third split
  ROW,              // Linear: input features split (weight columns), bias whole, output reduced (leave)
  ATTENTION,        // Attention: enter around it, its heads and key/value heads split (its q, k, v, o need rules);
                    // key/value heads fewer than the ranks (and dividing them) each held by ranks / heads ranks
  LAYER,            // a transformer layer: under sequence parallelism its random draws this rank's own (the
                    // dropout on its slice of the stream; tp/rng_fork.h); nothing without (its regions fork)
  ENTER,            // any interceptable module (MLP): enter around it
  HEAD_LOCAL,       // whole parameters that see this rank's heads only (q_norm, k_norm): gradients summed
  HEAD_TABLE,       // an embedding whose columns are the attention heads (T5's relative position bias, (buckets,
                    // heads)): columns split, its lookups this rank's heads' bias
  SEQUENCE,         // whole parameters of a module that runs on the sequence slice under sequence parallelism (a
                    // layer's norms); nothing changes without it
  SEQUENCE_GATHER,  // SEQUENCE, and its output gathered over the sequence (the final norm: what follows is whole)
  VOCAB_EMBEDDING,  // an embedding: weight rows (vocabulary) split, the lookup reduced (leave)
  VOCAB_HEAD,       // an LM head (hidden, targets) -> {logits | loss} with a (vocab, dim) weight: rows split, the
                    // loss over split logits (losses.h VocabShard), logits gathered on the last dimension
  VOCAB_TABLE,      // a table the lookups and the head share (VocabParallelTable): rows split, its model reads it
  WHOLE,            // whole parameters on a replicated input (a classifier's score): nothing changes
};
std::string to_string(TpStyle style);

// `module` is a path of the model's named_modules ("layers.*.attn.q"), '*' standing for one whole path segment
// (a layer's index), a final ".**" for the module and every module below it ("image_codebook.**"). A rule that
// matches no module is an error, so a plan says nothing its model lacks (but for a pipeline stage's model, which
// lacks what the other stages hold).
struct TpRule {
  std::string module;
  TpStyle style;
};
using TpPlan = std::vector<TpRule>;

// Whether a plan can split the sequence (sequence parallelism): an embedding split by vocabulary rows scatters its
// lookups over the sequence, where the layers' sequence-parallel regions begin.
bool splits_sequence(const TpPlan& plan);

// The rules of the zoo's transformer layers (models/blocks.h TransformerLayer) built with `layer` under `layers`
// ("layers.*"): the layer's own random stream under sequence parallelism, the norms on the sequence slice,
// attention split by heads (q, k, v column-wise, or their fused projection by thirds; o row-wise), a decoder's
// cross-attention alike (its context, the encoder's output, whole), the MLP entered with its first projections
// column-wise and its last row-wise (gate, up, down with SwiGLU; fc1, fc2 otherwise).
TpPlan transformer_layer_tp_plan(const std::string& layers, const TransformerLayerOptions& layer);

struct TensorParallelOptions {
  bool sequence_parallel = false;
  // The model holds some of a pipeline's stages (BuildOptions::stages): a rule may match none of its modules (the
  // embedding lives on the first stage, the final norm and the head on the last).
  bool pipeline_stage = false;
};

// What tensor_parallelize() did, and what a step needs from it.
class TensorParallel {
 public:
  // A parameter this rank holds the part `group().rank()` of (tp/split.h).
  struct Split {
    at::Tensor param;
    tp::SplitLayout layout;
    int64_t extent;  // the whole parameter's size along layout.dim
  };
  TensorParallel(dist::Communicator group, bool sequence_parallel, std::vector<Split> split,
                 std::vector<at::Tensor> summed, std::vector<std::string> lines, int64_t whole_parameters)
      : group_(std::move(group)), sequence_parallel_(sequence_parallel), split_(std::move(split)),
        summed_(std::move(summed)), lines_(std::move(lines)), whole_parameters_(whole_parameters) {}

  const dist::Communicator& group() const { return group_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // Sums over the group the gradients each rank has a part of (see above): after backward (and after data
  // parallelism's reduction), before clipping and the optimizer. Collective over the group; one all-reduce.
  void reduce_gradients() const;
  // Scales the gradients of every parameter of `root` so that their L2 norm over the whole model — each split
  // parameter's slices on every rank of the group, each whole one once — is at most max_norm; returns the norm
  // before clipping (torch.nn.utils.clip_grad_norm_). `shard_group`: the group over which data parallelism shards
  // the gradients (FSDP's; null when every data-parallel rank holds them whole: DDP, NO_SHARD, none). `stages`: a
  // pipeline's group (root holds this rank's stages; the norm spans every stage's), or null. After
  // reduce_gradients(). Collective over the groups.
  double clip_grad_norm(torch::nn::Module& root, double max_norm, const dist::Communicator* shard_group,
                        const dist::Communicator* stages = nullptr) const;
  // Each rule's modules and what each rank holds: "layers.*.attn.q (2 modules): column, weight (32, 64) of (64, 64)".
  const std::vector<std::string>& describe() const { return lines_; }
  // The parameters of the model before it was split (every rank's slices together).
  int64_t whole_parameters() const { return whole_parameters_; }
  // How `param` (a parameter of the model, by identity) is split; null for a whole one.
  const Split* split_of(const at::Tensor& param) const;
  // The same by name, for the split parameters among `root`'s.
  std::map<std::string, tp::SplitLayout> split_layouts(const torch::nn::Module& root) const;
  // The same for an optimizer whose statistics span whole parameters (optim::Adafactor).
  optim::TensorSplit tensor_split() const;

 private:
  dist::Communicator group_;
  bool sequence_parallel_;
  std::vector<Split> split_;         // the parameters each rank holds a slice of
  std::vector<at::Tensor> summed_;  // the parameters whose gradients reduce_gradients() sums
  std::vector<std::string> lines_;
  int64_t whole_parameters_;
};

// Splits `model` (built whole, the same on every rank of `group`: the same seed or weights) over `group` as its
// recipe's tp_plan() says. Throws std::invalid_argument before any collective when the family has no plan, a rule
// matches nothing, a parameter is under no rule (named), a size does not divide by the group (naming the
// dimension, e.g. "the 4 key/value heads of layers.0.attn", and the group sizes that would divide it). A LoRA
// adapter splits with its Linear (the factor on the split side as the weight, the other whole).
TensorParallel tensor_parallelize(ZooModel& model, const dist::Communicator& group,
                                  const TensorParallelOptions& options = {});

// The same while the model is built, a layer at a time (models::build_parallel with a tensor dimension): each
// transformer layer is split as soon as it exists (split_layer, from BuildOptions::on_layer), then the rest of the
// model (finish), so that a rank never holds more than one whole layer beside its slices. The same checks, each
// layer's before it changes.
class TensorParallelizer {
 public:
  TensorParallelizer(const ModelRecipe& recipe, dist::Communicator group, TensorParallelOptions options);
  void split_layer(const std::string& name, torch::nn::Module& layer);
  // `root`: the model (ZooModel::module).
  TensorParallel finish(torch::nn::Module& root);

 private:
  void split_modules(torch::nn::Module& subtree, const std::string& prefix, bool include_self);

  std::string flavor_;
  dist::Communicator group_;
  TensorParallelOptions options_;
  TpPlan plan_;
  std::vector<int> matched_;        // modules each rule split so far
  std::vector<std::string> held_;   // what each rule's modules hold, for describe()
  std::set<std::string> done_;      // module paths split
  std::set<const c10::TensorImpl*> counted_;  // parameters counted whole
  std::vector<TensorParallel::Split> split_;
  std::vector<at::Tensor> summed_;
  int64_t whole_parameters_ = 0;
};

}  // namespace shardtrain::models
