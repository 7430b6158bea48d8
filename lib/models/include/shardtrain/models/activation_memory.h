// What a training step's forward keeps for backward, in bytes: the activation part of the memory model
// (plan/memory_model.h). Each family's recipe states it from its own forward (ModelRecipe::activation_bytes),
// counting the tensors autograd saves op by op in the module code (blocks.cpp, layers.cpp, the family's file):
// those are what stays alive between forward and backward.
#pragma once

#include <c10/core/ScalarType.h>

#include "shardtrain/parallel/vocabulary.h"

#include <cstdint>
#include <vector>

namespace shardtrain::models {

struct ActivationQuery {
  int64_t batch = 1;                         // samples per micro-batch (per rank)
  int64_t seq_len = 0;                       // text tokens; 0: the model's maximum
  at::ScalarType compute = at::kFloat;       // the dtype layers compute in (bf16/fp16 under mixed precision)
  parallel::Device device = parallel::Device::CPU;  // the kernels: CUDA's fused dropout keeps a 1-byte mask, the
                                                   // CPU's a full tensor
  bool training = true;                      // dropout active
  // Mixed precision by autocast around an unsharded model (DDP): parameters stay float32 and each op casts its
  // inputs (FSDP instead computes with parameters cast to `compute`).
  bool autocast = false;
  // What the data pipeline masks (data.*): the heads run on masked positions only.
  double mlm_probability = 0.15, mim_probability = 0.4, itm_negative_probability = 0.5;
  // Tensor parallelism (models/tensor_parallel.h) over `tp` ranks, as its rank 0 computes: inside a split region
  // (attention, the MLP) a rank holds its heads' and its share of the width; the activations between regions are
  // whole, or with sequence_parallel its slice of the sequence.
  int64_t tp = 1;
  bool sequence_parallel = false;
  // Float8 projections (train.fp8, models/float8.h): the MLP's output projection computes through its own forward,
  // not fused with the activation (blocks.cpp), so the activation and its product are kept beside their inputs.
  bool float8 = false;
  // LoRA (models/lora.h): the base model's weights need no gradient, and each layer's adapted projections carry
  // rank-r adapters. A frozen projection keeps no input for its weight's gradient (an adapter on it keeps that input
  // instead, and its (rows, r) product), a frozen RMSNorm no normalized copy, a frozen head no weight gradient made
  // in forward (linear_cross_entropy), and an adapter on the MLP's output projection unfuses the MLP (fused_mlp.h).
  struct Adapters {
    bool frozen = false;
    int64_t r = 0;
    double dropout = 0;
    int64_t qkv = 0, o = 0, mlp_in = 0, mlp_out = 0;  // adapted per layer: of q, k, v; o; fc1 or gate and up; fc2/down
  };
  Adapters adapters;
};

// One moment of a layer's backward: what is alive on top of the activations the layer kept, its parameters'
// gradients aside (negative where more of what it kept is freed by then than it holds beside), and how many of the
// layer's parameters have their gradient by then (-1: all of them).
struct BackwardMoment {
  int64_t transient = 0;
  int64_t gradient_elements = -1;
};

// One transformer layer as the estimate walks it.
struct LayerActivations {
  int64_t kept = 0;   // kept without checkpointing (its input included)
  int64_t input = 0;  // kept checkpointed: its input only
  // What its backward holds beside what it kept, moment by moment in the order they come (models/activation_model.h:
  // the MLP's output projection, then attention).
  std::vector<BackwardMoment> backward;
  // Parameters that run twice in one step (FLAVA's encoders: unmasked, then masked): the first run's layer
  // `runs_again`, the second's `ran_before`. Backward reaches the second run first; its gradients wait in
  // autograd's buffers until the first run's add into them (plan/step_phases.cpp: [Parameters run twice]).
  bool runs_again = false, ran_before = false;
};

struct ActivationBytes {
  // The transformer layers in forward order (T5's encoder's, then its decoder's; FLAVA's image and text encoders'
  // per pass, then its multimodal one's). Layers of one stack differ only where one computes fewer positions (ViT's
  // last, the CLS token the classifier reads).
  std::vector<LayerActivations> layers;
  int64_t outside_layers = 0;    // kept by embeddings, heads and the loss (logits' log-softmax)
  // The attention bias every layer reads (T5's position bias, a causal mask with padding or a window: made once
  // by the model, blocks.h): kept once, by checkpointing (a checkpointed layer keeps its inputs) or, when
  // bias_saved_by_attention, by the attention kernel itself (the fused kernels save their mask).
  int64_t layer_bias = 0;
  bool bias_saved_by_attention = false;
  // On top while a checkpointed layer computes its forward without gradients (the largest layer's temporaries).
  int64_t layer_forward_transient = 0;
  // On top while a layer computes its forward with gradients: its temporaries that backward does not need (SwiGLU's
  // silu(gate) and product, GELU's output; the largest layer's).
  int64_t layer_forward_unkept = 0;
  int64_t loss_kept = 0;         // the loss's part of outside_layers (freed first in backward)
  // Alive on top at the start of forward, before any layer keeps anything (FLAVA: the frozen codebook making the
  // MIM targets).
  int64_t start_transient = 0;
  int64_t loss_transient = 0;    // alive on top at the end of forward (logits and their copies)
  int64_t backward_transient = 0;  // alive on top at the start of backward (the loss's gradients)

  // What is kept outside the layers with checkpointing on or off: outside_layers and, when kept, layer_bias.
  int64_t kept_outside(bool checkpointed) const {
    return outside_layers + (checkpointed || bias_saved_by_attention ? layer_bias : 0);
  }
};

}  // namespace shardtrain::models
