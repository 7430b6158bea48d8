// Numerics against Hugging Face transformers: tests/reference/hf_reference.py builds each family's debug flavor in
// transformers with random weights, saves them as safetensors and records a batch and the outputs; here the same
// weights are loaded into shardtrain's model (through the family's name map) and the outputs must agree to 1e-5 of
// the reference's largest magnitude (float32). The directory comes from SHARDTRAIN_HF_REFERENCE (set by ctest).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "shardtrain/models/bert.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"
#include "shardtrain/models/zoo.h"
#include "support/expect_error.h"

namespace shardtrain::models {
namespace {

using shardtrain::testing::expect_error;

constexpr double kRelative = 1e-5;

std::string reference_dir() {
  const char* dir = std::getenv("SHARDTRAIN_HF_REFERENCE");
  if (dir == nullptr) throw std::runtime_error("SHARDTRAIN_HF_REFERENCE is not set (ctest sets it)");
  return dir;
}

// The family's reference: weights loaded into `model`, and the recorded batch/outputs.
struct Reference {
  explicit Reference(const std::string& family) : dir(reference_dir() + "/" + family), file(dir + "/io.safetensors") {}
  at::Tensor operator[](const std::string& name) const { return file.read(name); }
  std::string dir;
  io::SafetensorsReader file;
};

void expect_close(const at::Tensor& ours, const at::Tensor& reference, const std::string& what) {
  ASSERT_TRUE(ours.defined()) << what << " not computed";
  ASSERT_EQ(ours.sizes(), reference.sizes()) << what;
  const double scale = reference.abs().max().item<double>();
  const double diff = (ours.to(at::kFloat) - reference.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LE(diff, kRelative * scale) << what << ": max |ours - reference| = " << diff << ", reference scale " << scale;
}

template <class Model>
Model load(Model model, const Reference& ref, const NameMap& names) {
  load_weights(*model, ref.dir + "/model.safetensors", names);
  model->eval();
  return model;
}

TEST(HfParity, Bert) {
  Reference ref("bert");
  Bert model = load(Bert(bert_flavor("bert-debug")), ref, bert_names());
  BertOutputs out = model->run(ref["input_ids"], ref["attention_mask"], ref["token_type_ids"], ref["labels"]);
  expect_close(out.hidden, ref["hidden"], "hidden states");
  expect_close(out.pooled, ref["pooled"], "pooled output");
  expect_close(out.logits, ref["logits"], "MLM logits");
  expect_close(out.loss, ref["loss"], "MLM loss");
  // The head at the labelled positions only: transformers' loss, and its logits' rows there.
  BertOutputs labelled = model->run(ref["input_ids"], ref["attention_mask"], ref["token_type_ids"], ref["labels"],
                                    /*labelled_only=*/true);
  expect_close(labelled.loss, ref["loss"], "MLM loss, head at the labelled positions");
  const at::Tensor rows = (ref["labels"].reshape({-1}) != -100).nonzero().squeeze(1);
  expect_close(labelled.logits, ref["logits"].reshape({-1, ref["logits"].size(-1)}).index_select(0, rows),
               "MLM logits at the labelled positions");
}

TEST(HfParity, Vit) {
  Reference ref("vit");
  Vit model = load(Vit(vit_flavor("vit-debug")), ref, vit_names());
  VitOutputs out = model->run(ref["pixels"], ref["labels"]);
  expect_close(out.hidden, ref["hidden"], "hidden states");
  expect_close(out.logits, ref["logits"], "logits");
  expect_close(out.loss, ref["loss"], "loss");
  // The last layer at the CLS token only: transformers' logits and loss, its CLS hidden state.
  VitOutputs cls = model->run(ref["pixels"], ref["labels"], /*cls_only=*/true);
  expect_close(cls.hidden, ref["hidden"].narrow(1, 0, 1), "CLS hidden state, last layer at the CLS token only");
  expect_close(cls.logits, ref["logits"], "logits, last layer at the CLS token only");
  expect_close(cls.loss, ref["loss"], "loss, last layer at the CLS token only");
}

TEST(HfParity, Llama) {
  Reference ref("llama");
  Llama model = load(Llama(llama_flavor("llama-debug")), ref, llama_names());
  LlamaOutputs out = model->run(ref["input_ids"], ref["attention_mask"], ref["labels"]);
  expect_close(out.logits, ref["logits"], "logits");
  expect_close(out.loss, ref["loss"], "causal LM loss");
  // The loss alone (labelled_only: the LM head at the positions that predict a label, fused with the
  // cross-entropy in chunks, no logits): transformers' loss.
  LlamaOutputs labelled = model->run(ref["input_ids"], ref["attention_mask"], ref["labels"], /*labelled_only=*/true);
  expect_close(labelled.loss, ref["loss"], "causal LM loss, head at the labelled positions");
  EXPECT_FALSE(labelled.logits.defined());
}

// A Llama-like decoder built from the reference's own config.json (model.from's path) and loaded from its file:
// transformers' logits and loss, and the loss alone through the head fused with the cross-entropy. Logits at the
// tokens; at the padding too unless a sliding window leaves a padded query no key at all (transformers' boolean
// mask gives such a row zeros, our additive one the mean of the values: neither reaches a token or the loss).
LlamaImpl& check_decoder(const std::string& name, ZooModel& built) {
  Reference ref(name);
  built = build_model(recipe_of_model(ref.dir));
  auto& llama = dynamic_cast<LlamaImpl&>(*built.module);
  load_weights(*built.module, ref.dir + "/model.safetensors", built.names);
  built.module->eval();
  LlamaOutputs out = llama.run(ref["input_ids"], ref["attention_mask"], ref["labels"]);
  const at::Tensor tokens = ref["attention_mask"].reshape({-1}).nonzero().squeeze(1);
  auto at_tokens = [&](const at::Tensor& logits) {
    return logits.reshape({-1, logits.size(-1)}).index_select(0, tokens);
  };
  expect_close(at_tokens(out.logits), at_tokens(ref["logits"]), name + " logits at the tokens");
  if (llama.config.sliding_window == 0) expect_close(out.logits, ref["logits"], name + " logits");
  expect_close(out.loss, ref["loss"], name + " causal LM loss");
  LlamaOutputs labelled = llama.run(ref["input_ids"], ref["attention_mask"], ref["labels"], /*labelled_only=*/true);
  expect_close(labelled.loss, ref["loss"], name + " causal LM loss, head at the labelled positions");
  return llama;
}

// Llama 3.2's shape (hf_reference.py's llama3_debug): "llama3" RoPE scaling, head_dim apart from hidden / heads,
// the head tied to the embedding (the file holds model.embed_tokens.weight alone), attention biases.
TEST(HfParity, Llama3ScaledRopeTiedHead) {
  ZooModel built;
  const LlamaImpl& llama = check_decoder("llama3", built);
  EXPECT_TRUE(llama.config.tie_word_embeddings);
  EXPECT_EQ(llama.config.rope_scaling.type, "llama3");
  EXPECT_EQ(llama.config.head_size(), 32);
  EXPECT_TRUE(llama.config.qkv_bias && llama.config.out_bias);
  EXPECT_TRUE(llama.lm_head.is_empty());
}

// MistralForCausalLM with a window of 8 positions over a batch of 48: each query sees its last 8 keys.
TEST(HfParity, MistralSlidingWindow) {
  ZooModel built;
  const LlamaImpl& mistral = check_decoder("mistral", built);
  EXPECT_EQ(built.family, "mistral");
  EXPECT_EQ(mistral.config.sliding_window, 8);
}

// Qwen2ForCausalLM: biases on q, k and v (none on o), the head tied.
TEST(HfParity, Qwen2QkvBiasTiedHead) {
  ZooModel built;
  const LlamaImpl& qwen = check_decoder("qwen2", built);
  EXPECT_EQ(built.family, "qwen2");
  EXPECT_TRUE(qwen.config.qkv_bias && !qwen.config.out_bias && qwen.config.tie_word_embeddings);
  EXPECT_TRUE(built.module->named_parameters().contains("layers.0.attn.q.bias"));
  EXPECT_FALSE(built.module->named_parameters().contains("layers.0.attn.o.bias"));
}

// Qwen3ForCausalLM: an RMSNorm over each head of q and k before RoPE, heads wider than hidden / heads, the head
// tied.
TEST(HfParity, Qwen3QkNormTiedHead) {
  ZooModel built;
  const LlamaImpl& qwen = check_decoder("qwen3", built);
  EXPECT_EQ(built.family, "qwen3");
  EXPECT_TRUE(qwen.config.qk_norm && qwen.config.tie_word_embeddings && !qwen.config.qkv_bias);
  EXPECT_EQ(qwen.config.head_size(), 32);
  EXPECT_TRUE(built.module->named_parameters().contains("layers.1.attn.k_norm.weight"));
}

// GPT2LMHeadModel from its config.json: Conv1D weights kept (in, out), c_attn's one product split into q, k and v,
// learned positions, gelu_new, the head tied to wte. Logits, the loss (also through the head at the labelled
// positions), and the loss's gradients of Conv1D weights and of the tied table.
TEST(HfParity, Gpt2Conv1DFusedQkvTiedHead) {
  Reference ref("gpt2");
  ZooModel built = build_model(recipe_of_model(ref.dir));
  EXPECT_EQ(built.family, "gpt2");
  auto& gpt2 = dynamic_cast<Gpt2Impl&>(*built.module);
  load_weights(*built.module, ref.dir + "/model.safetensors", built.names);
  built.module->eval();
  const auto params = built.module->named_parameters();
  EXPECT_EQ(params["layers.0.attn.qkv.weight"].sizes(), (at::IntArrayRef{64, 192}));  // (in, out), as the file's
  Gpt2Outputs out = gpt2.run(ref["input_ids"], ref["attention_mask"], ref["labels"]);
  expect_close(out.logits, ref["logits"], "logits");
  expect_close(out.loss, ref["loss"], "causal LM loss");
  out.loss.backward();
  expect_close(params["layers.0.attn.qkv.weight"].grad(), ref["grad_c_attn"], "c_attn's gradient");
  expect_close(params["layers.1.mlp.fc2.weight"].grad(), ref["grad_mlp_c_proj"], "mlp.c_proj's gradient");
  expect_close(params["embed.weight"].grad(), ref["grad_wte"], "wte's gradient (lookups and head)");
  Gpt2Outputs labelled = gpt2.run(ref["input_ids"], ref["attention_mask"], ref["labels"], /*labelled_only=*/true);
  expect_close(labelled.loss, ref["loss"], "causal LM loss, head at the labelled positions");
  EXPECT_FALSE(labelled.logits.defined());
}

TEST(HfParity, T5) {
  Reference ref("t5");
  T5 model = load(T5(t5_flavor("t5-debug")), ref, t5_names());
  T5Outputs out = model->run(ref["input_ids"], ref["attention_mask"], {}, ref["labels"]);
  expect_close(out.encoder_hidden, ref["encoder_hidden"], "encoder hidden states");
  expect_close(out.logits, ref["logits"], "logits");
  expect_close(out.loss, ref["loss"], "loss");
  // The loss alone (labelled_only: the tied head at the labelled positions, fused with the cross-entropy).
  T5Outputs labelled = model->run(ref["input_ids"], ref["attention_mask"], {}, ref["labels"], /*labelled_only=*/true);
  expect_close(labelled.loss, ref["loss"], "loss, head at the labelled positions");
  EXPECT_FALSE(labelled.logits.defined());
}

// The reference directories of the generating families, and the model of one, loaded, in eval mode.
const char* const kGeneratingFamilies[] = {"llama", "llama3", "mistral", "qwen2", "qwen3", "gpt2", "t5"};
ZooModel generating_model(const Reference& ref) {
  ZooModel built = build_model(recipe_of_model(ref.dir));
  load_weights(*built.module, ref.dir + "/model.safetensors", built.names);
  built.module->eval();
  return built;
}

// Greedy generation (a KV cache, tests/reference/hf_reference.py's greedy_generation) from left-padded prompts of
// 10, 4 and 7 tokens: transformers' generate() and ours make the same tokens, with no end-of-sequence token, and
// with row 0's 4th token as one (row 0 stops there and is padded; the batch stops when every row has).
TEST(HfParity, GreedyGenerationMakesTransformersTokens) {
  for (const std::string family : kGeneratingFamilies) {
    SCOPED_TRACE(family);
    Reference ref(family);
    ZooModel built = generating_model(ref);
    GenerationOptions options;
    options.max_new_tokens = 10, options.pad_token_id = 0;
    for (const char* name : {"gen_free", "gen_stopped"}) {
      if (std::string(name) == "gen_stopped") options.eos_token_ids = {ref["gen_eos"][0].item<int64_t>()};
      const auto decoder = built.recipe->text_decoder(*built.module);
      const Generated out = generate(*decoder, ref["gen_prompt_ids"], ref["gen_prompt_mask"], options);
      const at::Tensor wanted = ref[name];
      EXPECT_TRUE(at::equal(out.tokens, wanted)) << name << ": ours " << out.tokens << "\ntransformers' " << wanted;
    }
  }
}

// Beam search (3 beams, the KV caches reordered each step) from the same prompts, ended by a token it makes itself:
// each row's best hypothesis and its length as transformers' beam search makes them, with its defaults
// (length_penalty 1, early_stopping False: rows end as their running beams can no longer beat the finished ones)
// and with early_stopping "never" and length_penalty 2 (longer hypotheses favoured). Past a hypothesis' end
// transformers fills with the end token, we with the pad token.
TEST(HfParity, BeamSearchMakesTransformersHypotheses) {
  for (const std::string family : kGeneratingFamilies) {
    SCOPED_TRACE(family);
    Reference ref(family);
    ZooModel built = generating_model(ref);
    GenerationOptions options;
    options.max_new_tokens = 10, options.pad_token_id = 0, options.num_beams = 3;
    options.eos_token_ids = {ref["gen_beam_eos"][0].item<int64_t>()};
    for (const char* name : {"gen_beam", "gen_beam_never"}) {
      options.length_penalty = std::string(name) == "gen_beam" ? 1.0 : 2.0;
      options.early_stopping = std::string(name) == "gen_beam" ? "false" : "never";
      const Generated out = generate(*built.recipe->text_decoder(*built.module), ref["gen_prompt_ids"],
                                     ref["gen_prompt_mask"], options);
      const at::Tensor wanted = ref[name], lengths = ref[std::string(name) + "_lengths"];
      ASSERT_EQ(static_cast<int64_t>(out.lengths.size()), wanted.size(0)) << name;
      for (int64_t r = 0; r < wanted.size(0); ++r) {
        const int64_t n = lengths[r].item<int64_t>();
        EXPECT_EQ(out.lengths[static_cast<size_t>(r)], n) << name << " row " << r;
        ASSERT_GE(out.tokens.size(1), n) << name;
        EXPECT_TRUE(at::equal(out.tokens[r].narrow(0, 0, n), wanted[r].narrow(0, 0, n)))
            << name << " row " << r << ": ours " << out.tokens[r] << "\ntransformers' " << wanted[r];
        EXPECT_TRUE(out.tokens[r].narrow(0, n, out.tokens.size(1) - n).eq(0).all().item<bool>()) << name;
      }
    }
  }
}

// The scores transformers' logits processors leave (hf_reference.py's scores_reference): the repetition penalty
// alone (greedy), the sampling chain (penalty 1.3, temperature 0.7, top-k 20, top-p 0.8), top-p 0.5 alone; the
// same tokens dropped (-inf) and the same values kept.
TEST(HfParity, ScoresAsTransformersLogitsProcessors) {
  const io::SafetensorsReader file(reference_dir() + "/generation/scores.safetensors");
  const at::Tensor scores = file.read("scores"), sequences = file.read("sequences");
  auto expect_same = [](const at::Tensor& ours, const at::Tensor& theirs, const std::string& what) {
    EXPECT_TRUE(at::equal(at::isinf(ours), at::isinf(theirs))) << what << ": other tokens dropped";
    const at::Tensor kept = at::isfinite(theirs);
    expect_close(ours.masked_select(kept), theirs.masked_select(kept), what);
  };
  GenerationOptions greedy;
  greedy.repetition_penalty = 1.3;
  expect_same(process_scores(scores, sequences, greedy), file.read("penalized"), "repetition penalty");
  GenerationOptions sampled = greedy;
  sampled.do_sample = true, sampled.temperature = 0.7, sampled.top_k = 20, sampled.top_p = 0.8;
  expect_same(process_scores(scores, sequences, sampled), file.read("sampled"), "the sampling chain");
  GenerationOptions top_p;
  top_p.do_sample = true, top_p.top_k = 0, top_p.top_p = 0.5;
  expect_same(process_scores(scores, sequences, top_p), file.read("top_p_only"), "top-p alone");
}

TEST(HfParity, Flava) {
  Reference ref("flava");
  Flava model = load(Flava(flava_flavor("flava-debug")), ref, flava_names());
  EXPECT_TRUE(at::equal(model->image_codebook->tokens(ref["codebook_pixels"]), ref["codebook_tokens"]));
  // At chosen positions only (the last convolution as a product over their rows): the same tokens there.
  const at::Tensor chosen = ref["masked_patches"];
  EXPECT_TRUE(at::equal(model->image_codebook->tokens(ref["codebook_pixels"], chosen),
                        ref["codebook_tokens"].masked_fill(~chosen, -100)));
  const at::Tensor too_few = chosen.narrow(1, 0, 3);
  expect_error<std::invalid_argument>([&] { model->image_codebook->tokens(ref["codebook_pixels"], too_few); },
                                      {"positions must be"});

  FlavaBatch image_text{ref["input_ids"], ref["input_ids_masked"], ref["attention_mask"],
                        ref["pixels"],    ref["codebook_pixels"],  ref["masked_patches"],
                        ref["mlm_labels"], {},                     ref["itm_labels"]};
  FlavaOutputs mm = model->run(image_text);
  expect_close(mm.loss, ref["mm_loss"], "image-text total loss");
  expect_close(mm.itm, ref["mm_itm"], "ITM loss");
  expect_close(mm.global_contrastive, ref["mm_gc"], "global contrastive loss");
  expect_close(mm.mmm_image, ref["mm_mmm_image"], "MMM image loss");
  expect_close(mm.mmm_text, ref["mm_mmm_text"], "MMM text loss");
  expect_close(mm.itm_logits, ref["mm_itm_logits"], "ITM logits");
  expect_close(mm.logits_per_image, ref["mm_logits_per_image"], "contrastive logits");
  EXPECT_FALSE(mm.mim.defined() || mm.mlm.defined()) << "unimodal losses are for unimodal batches";

  FlavaBatch text_only;
  text_only.input_ids = ref["input_ids"], text_only.input_ids_masked = ref["input_ids_masked"];
  text_only.attention_mask = ref["attention_mask"], text_only.mlm_labels = ref["mlm_labels"];
  FlavaOutputs text = model->run(text_only);
  expect_close(text.mlm, ref["text_mlm"], "MLM loss");
  expect_close(text.loss, ref["text_loss"], "text-only total loss");

  FlavaBatch image_only;
  image_only.pixels = ref["pixels"], image_only.codebook_pixels = ref["codebook_pixels"];
  image_only.masked_patches = ref["masked_patches"];
  FlavaOutputs image = model->run(image_only);
  expect_close(image.mim, ref["image_mim"], "MIM loss");
  expect_close(image.loss, ref["image_loss"], "image-only total loss");
}

// Every tensor of `model`, by name.
std::map<std::string, at::Tensor> tensors_of(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out.emplace(p.key(), p.value().detach().clone());
  for (const auto& b : model.named_buffers()) out.emplace(b.key(), b.value().clone());
  return out;
}

// The model of `family`'s reference directory built from its `layout` subdirectory (model.from: its config.json)
// and loaded from that subdirectory's weights: exactly the safetensors file's values (`rounded_to`: the file's
// dtype, when it holds them rounded), the same tensors left aside (bert: the NSP head a masked-LM model has not).
void expect_loads_as_safetensors(const std::string& family, const std::string& layout,
                                 at::ScalarType rounded_to = at::kFloat) {
  SCOPED_TRACE(family + "/" + layout);
  const std::string dir = reference_dir() + "/" + family;
  ZooModel expected = build_model(recipe_of_model(dir));
  const LoadReport expected_report = load_weights(*expected.module, dir + "/model.safetensors", expected.names);
  ZooModel model = build_model(recipe_of_model(dir + "/" + layout));
  const LoadReport report = load_weights(*model.module, dir + "/" + layout, model.names);
  auto sorted = [](std::vector<std::string> names) {
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(sorted(report.initialized), sorted(expected_report.initialized));
  EXPECT_EQ(sorted(report.unused), sorted(expected_report.unused));
  EXPECT_TRUE(report.mismatched.empty());
  const auto want = tensors_of(*expected.module);
  const auto got = tensors_of(*model.module);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    const at::Tensor expect_value = t.is_floating_point() ? t.to(rounded_to).to(t.scalar_type()) : t;
    EXPECT_TRUE(at::equal(got.at(name), expect_value)) << name;
  }
}

// The same weights saved by Python's torch.save (hf_reference.py's save_torch: pytorch_model.bin as transformers
// wrote it before safetensors — the whole state_dict, an OrderedDict with _metadata and tied tensors under each
// name; nn.Parameters; plain-dict shards with pytorch_model.bin.index.json; the format of PyTorch before 1.6), and
// GPT-2's as the Hub keeps them, build the same model from their directory (model.from) and load exactly the
// safetensors file's values, in every family.
TEST(HfParity, TorchSaveFilesLoadAsTheirSafetensors) {
  // The layouts hf_reference.py writes for each family; one missing is a broken fixture, not a pass.
  // hub: GPT-2's weights as the Hub's openai-community/gpt2 holds them (no "transformer.", causal masks saved).
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"bert", {"torch", "torch-sharded", "torch-bf16", "torch-legacy"}},
      {"vit", {"torch"}}, {"llama", {"torch"}}, {"llama3", {"torch"}}, {"mistral", {"torch"}},
      {"qwen2", {"torch"}}, {"qwen3", {"torch"}}, {"gpt2", {"torch", "hub"}}, {"t5", {"torch", "torch-sharded"}},
      {"flava", {"torch"}}};
  for (const auto& [family, family_layouts] : layouts) {
    for (const std::string& layout : family_layouts) {
      const std::string dir = reference_dir() + "/" + family + "/" + layout;
      ASSERT_TRUE(io::path_exists(dir)) << dir << ": the fixture tests/reference/hf_reference.py writes is missing";
      expect_loads_as_safetensors(family, layout, layout == "torch-bf16" ? at::kBFloat16 : at::kFloat);
    }
  }
}

// The same weights in a distributed checkpoint an FSDP2 job saved with torch.distributed.checkpoint
// (tests/reference/dcp_reference.py): bert from 3 ranks, its model under "model" beside the optimizer's state and
// a step; t5 from 2 ranks with the model's tensors at the top and 2-D ones sharded along their columns; bert from
// one process under a torch.compile'd model's names (_orig_mod.); bert as Accelerate's save_state lays out an FSDP
// model. Each tensor is put together from its ranks' chunks, the optimizer's entries are not taken for weights,
// and the names lose the compiled wrapper's part.
TEST(HfParity, DistributedCheckpointsLoadAsTheirSafetensors) {
  for (const std::string family : {"bert", "t5"}) expect_loads_as_safetensors(family, "dcp");
  expect_loads_as_safetensors("bert", "dcp-compiled");
  // The directory Accelerate's save_state fills for an FSDP model: pytorch_model_fsdp_0/ (a distributed
  // checkpoint of {"model": state_dict}) or pytorch_model_fsdp.bin (the whole state dict).
  expect_loads_as_safetensors("bert", "accelerate-sharded");
  expect_loads_as_safetensors("bert", "accelerate-full");
  // A rank's rows that cross chunks (bert's word embeddings: 1000 rows saved by 3 ranks as 334 + 334 + 332) read
  // as the same rows of the whole tensor; t5's column chunks make each row of two pieces.
  for (const auto& tensor : {std::pair<std::string, std::string>{"bert", "bert.embeddings.word_embeddings.weight"},
                             {"t5", "shared.weight"}}) {
    const std::string& family = tensor.first;
    const std::string& name = tensor.second;  // a reference the lambda below can capture (a binding it cannot)
    const io::WeightFiles dcp(reference_dir() + "/" + family + "/dcp");
    const io::SafetensorsReader file(reference_dir() + "/" + family + "/model.safetensors");
    for (const auto& [first, rows] : {std::pair<int64_t, int64_t>{0, 1000}, {300, 100}, {333, 2}, {667, 333}, {5, 0}}) {
      EXPECT_TRUE(at::equal(dcp.read_rows(name, first, rows), file.read_rows(name, first, rows)))
          << family << " rows " << first << "+" << rows;
    }
    expect_error<std::out_of_range>([&] { dcp.read_rows(name, 900, 101); }, {name + "' has 1000 rows"});
    // Read into a tensor of the model's (load_weights' way: chunk by chunk, converted to its dtype).
    const at::Tensor into = at::empty({1000, 32}, at::kDouble);
    dcp.read_into(name, into);
    EXPECT_TRUE(at::equal(into, file.read(name).to(at::kDouble))) << family;
    expect_error<std::invalid_argument>([&] { dcp.read_into(name, at::empty({999, 32})); },
                                        {"read into a tensor of shape [999, 32]"});
  }
}

// Damaged copies of bert's checkpoint (dcp_reference.py's write_faults): each is refused, saying why, before or
// while its tensors are read — and metadata that would call os.system or make another class is never run.
TEST(HfParity, DamagedDistributedCheckpointsAreRefused) {
  const std::string faults = reference_dir() + "/bert/dcp-faults/";
  auto read_all = [](const std::string& dir) {
    const io::WeightFiles files(dir);
    for (const auto& e : files.entries()) files.read(e.name);
  };
  expect_error<std::runtime_error>([&] { read_all(faults + "missing-file"); }, {"data file __1_0.distcp is missing"});
  expect_error<std::runtime_error>([&] { read_all(faults + "truncated"); },
                                   {"__0_0.distcp: the chunk of '", "past the file's end"});
  expect_error<std::runtime_error>([&] { read_all(faults + "missing-chunk"); }, {"are not all in its chunks"});
  expect_error<std::runtime_error>([&] { read_all(faults + "compressed"); }, {"writer extension zstd"});
  expect_error<std::runtime_error>([&] { read_all(faults + "calls-code"); },
                                   {".metadata: cannot read its checkpoint metadata: the file calls posix.system"});
  expect_error<std::runtime_error>([&] { read_all(faults + "other-class"); },
                                   {"makes an object of class dcp_reference._Note"});
}

// Every published flavor's count, from shapes, equals transformers' own module's count.
TEST(HfParity, ParameterCounts) {
  std::ifstream file(reference_dir() + "/counts.json");
  ASSERT_TRUE(file.good());
  const nlohmann::json counts = nlohmann::json::parse(file);
  ASSERT_GE(counts.size(), 20u);
  for (auto it = counts.begin(); it != counts.end(); ++it) {
    EXPECT_EQ(count_flavor_parameters(it.key()), it.value().get<int64_t>()) << it.key();
  }
}

}  // namespace
}  // namespace shardtrain::models
