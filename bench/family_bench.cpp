// One side of bench/family_vs_hf.py: trains a model of the zoo, built from a Hugging Face model directory (the
// very weights transformers loads on the other side), on one recorded batch for N steps — forward, the family's
// loss, backward, AdamW (one fused kernel, the trainer's default) — and prints one RESULT line (JSON) on rank 0:
// median step time of the slowest rank, peak CPU bytes of the largest rank (our counting allocator) over the timed
// steps, overall and per phase (forward with the loss, backward, optimizer step with zero_grad), and every step's
// loss. Run under `shardtrain launch`.
//
//   family_bench --model DIR --batch FILE.safetensors [--mode plain|full_shard|shard_grad_op] [--checkpoint]
//                [--overlap-reduce-scatter on|off]   (FsdpOptions::overlap_reduce_scatter; unset: the default)
//                [--forward-prefetch N]   (FsdpOptions::forward_prefetch; unset: the default)
//                [--steps N] [--warmup K] [--profile FILE] [--logits]
//
// --logits: the text families compute their logits and the loss from them (run(..., labelled_only = false), as
// transformers' forward(labels=...) does) instead of the loss alone in chunks; the logits are dropped with the
// outputs, as `model(...).loss` drops them.
//
// --profile FILE: one more step after the timed ones under LibTorch's profiler (Kineto, CPU), its trace written
// as Chrome JSON to FILE (FILE.rank<r> when W > 1); bench/profile_compare.py sets it beside transformers'.
//
// The batch file holds the family's inputs under their data::Batch names (input_ids, attention_mask,
// input_ids_masked, mlm_labels, pixels, codebook_pixels, masked_patches, itm_labels, labels), the whole global
// batch: rank r trains rows [r B / W, (r + 1) B / W). The loss is the Hugging Face model's own on those inputs:
// BertForMaskedLM on the masked ids, ViTForImageClassification, T5ForConditionalGeneration with labels (teacher
// forcing), LlamaForCausalLM with labels = the ids, FlavaForPreTraining on whichever of text and image it is given.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/optim/adamw.h>

#include <functional>
#include <iostream>
#include <set>
#include <string>

#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/bert.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"
#include "shardtrain/optim/fused_adamw.h"
#include "bench_loop.h"

#include <optional>

namespace {

using namespace shardtrain;

struct Args {
  std::string model, batch, mode = "plain", profile;
  int64_t steps = 10, warmup = 2;
  bool checkpoint = false, logits = false;
  std::optional<bool> overlap_reduce_scatter;
  std::optional<int> forward_prefetch;
};

bool parse_on_off(const std::string& key, const std::string& v) {
  if (v == "on" || v == "off") return v == "on";
  throw std::invalid_argument(key + " '" + v + "': expected on or off");
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&] { return bench::option_value(argc, argv, i); };
    if (k == "--model") a.model = value();
    else if (k == "--batch") a.batch = value();
    else if (k == "--mode") a.mode = value();
    else if (k == "--steps") a.steps = std::stoll(value());
    else if (k == "--warmup") a.warmup = std::stoll(value());
    else if (k == "--checkpoint") a.checkpoint = true;
    else if (k == "--logits") a.logits = true;
    else if (k == "--profile") a.profile = value();
    else if (k == "--overlap-reduce-scatter") a.overlap_reduce_scatter = parse_on_off(k, value());
    else if (k == "--forward-prefetch") a.forward_prefetch = std::stoi(value());
    else throw std::invalid_argument("unknown option " + k);
  }
  if (a.model.empty() || a.batch.empty()) throw std::invalid_argument("--model DIR and --batch FILE are required");
  return a;
}

// The Hugging Face model's loss on `in` (a rank's rows), by family.
at::Tensor family_loss(const std::string& family, torch::nn::Module& m, const std::map<std::string, at::Tensor>& in,
                       bool logits) {
  const bool labelled_only = !logits;
  auto get = [&](const char* name) {
    auto it = in.find(name);
    return it == in.end() ? at::Tensor() : it->second;
  };
  if (family == "bert") {
    return dynamic_cast<models::BertImpl&>(m).run(get("input_ids_masked"), get("attention_mask"), {},
                                                  get("mlm_labels"), labelled_only).loss;
  }
  if (family == "vit") {
    return dynamic_cast<models::VitImpl&>(m).run(get("pixels"), get("labels"), /*cls_only=*/true).loss;
  }
  if (family == "t5") {
    return dynamic_cast<models::T5Impl&>(m)
        .run(get("input_ids"), get("attention_mask"), {}, get("labels"), labelled_only)
        .loss;
  }
  if (family == "llama") {
    return dynamic_cast<models::LlamaImpl&>(m)
        .run(get("input_ids"), get("attention_mask"), get("labels"), labelled_only)
        .loss;
  }
  if (family == "gpt2") {
    return dynamic_cast<models::Gpt2Impl&>(m)
        .run(get("input_ids"), get("attention_mask"), get("labels"), labelled_only)
        .loss;
  }
  if (family == "flava") {
    models::FlavaBatch b{get("input_ids"),  get("input_ids_masked"), get("attention_mask"),
                         get("pixels"),     get("codebook_pixels"),  get("masked_patches"),
                         get("mlm_labels"), {},                      get("itm_labels")};
    return dynamic_cast<models::FlavaImpl&>(m).run(b).loss;
  }
  throw std::invalid_argument("family_bench: no loss for family " + family);
}

// One training step under the Kineto CPU profiler, its trace saved to `path` (Chrome trace JSON).
void profile_step(const std::string& path, const std::function<at::Tensor()>& loss_of_step,
                  torch::optim::Optimizer& optimizer) {
  namespace prof = torch::profiler::impl;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
  const std::set<prof::ActivityType> cpu = {prof::ActivityType::CPU};
  torch::autograd::profiler::prepareProfiler(config, cpu);
  torch::autograd::profiler::enableProfiler(config, cpu);
  loss_of_step().backward();
  optimizer.step();
  optimizer.zero_grad();
  torch::autograd::profiler::disableProfiler()->save(path);
}

int run(const Args& a) {
  memory::install_cpu_memory_counter();
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::read_dist_env(dist::process_env_lookup()));
  const dist::Communicator& world = pg.world();
  const int w = world.size(), r = world.rank();

  models::ZooModel model = models::build_model(models::recipe_of_model(a.model));
  models::load_weights(*model.module, a.model, model.names);
  model.module->train();
  const dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, 1);
  if (a.mode == "full_shard" || a.mode == "shard_grad_op") {
    models::ParallelizeOptions options;
    options.strategy = a.mode == "full_shard" ? parallel::Strategy::FULL_SHARD
                                              : parallel::Strategy::SHARD_GRAD_OP;
    options.activation_checkpoint_every = a.checkpoint ? 1 : 0;
    options.fsdp.overlap_reduce_scatter = a.overlap_reduce_scatter;
    if (a.forward_prefetch) options.fsdp.forward_prefetch = *a.forward_prefetch;
    models::parallelize(model, mesh, options);
  } else if (a.mode == "plain") {
    if (w != 1) throw std::invalid_argument("--mode plain runs on one process");
    if (a.checkpoint) models::activation_checkpoint_layers(model, 1);
  } else {
    throw std::invalid_argument("--mode " + a.mode + ": expected plain, full_shard or shard_grad_op");
  }

  const io::SafetensorsReader file(a.batch);
  std::map<std::string, at::Tensor> batch;
  for (const auto& e : file.entries()) {
    at::Tensor t = file.read(e.name);
    const int64_t rows = t.size(0) / w;
    batch[e.name] = t.narrow(0, r * rows, rows).clone();
  }
  optim::FusedAdamW optimizer(model.module->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.01));

  auto loss_of_step = [&] { return family_loss(model.family, *model.module, batch, a.logits); };
  const bench::StepLoop result =
      bench::run_steps(world, a.steps, a.warmup, [&](int64_t) { return loss_of_step(); }, optimizer);
  if (!a.profile.empty()) profile_step(w == 1 ? a.profile : a.profile + ".rank" + std::to_string(r), loss_of_step,
                                       optimizer);
  bench::print_result(world, "\"impl\": \"shardtrain\", \"family\": \"" + model.family + "\", \"mode\": \"" +
                                 a.mode + "\", \"checkpoint\": " + (a.checkpoint ? "true" : "false") +
                                 ", \"logits\": " + (a.logits ? "true" : "false") +
                                 ", \"world\": " + std::to_string(w),
                      result);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "family_bench: " << e.what() << "\n";
    return 1;
  }
}
