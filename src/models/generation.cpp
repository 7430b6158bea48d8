#include "shardtrain/models/generation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include "models/kv_cache.h"

namespace shardtrain::models {

KvCaches::KvCaches(torch::nn::Module& model) {
  for (const auto& m : model.modules()) {
    auto* attention = dynamic_cast<AttentionImpl*>(m.get());
    if (attention == nullptr) continue;
    if (attention->cache != nullptr) {
      for (AttentionImpl* a : modules_) a->cache = nullptr;
      throw std::invalid_argument("generation: the model is already generating (an attention module has a KV cache)");
    }
    caches_.push_back(std::make_unique<KvCache>());
    attention->cache = caches_.back().get();
    modules_.push_back(attention);
  }
  if (modules_.empty()) throw std::invalid_argument("generation: the model has no attention module to cache");
}

KvCaches::~KvCaches() {
  for (AttentionImpl* a : modules_) a->cache = nullptr;
}

void check_generation_options(const GenerationOptions& o) {
  auto refuse = [](const std::string& key, double value, const std::string& expected) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", value);
    throw std::invalid_argument("generation: " + key + " " + text + ": expected " + expected);
  };
  if (o.max_new_tokens < 1) refuse("max_new_tokens", static_cast<double>(o.max_new_tokens), "at least 1");
  if (o.do_sample && !(o.temperature > 0)) refuse("temperature", o.temperature, "above 0");
  if (o.top_k < 0) refuse("top_k", static_cast<double>(o.top_k), "0 (off) or more");
  if (!(o.top_p > 0 && o.top_p <= 1)) refuse("top_p", o.top_p, "in (0, 1]");
  if (!(o.repetition_penalty > 0)) refuse("repetition_penalty", o.repetition_penalty, "above 0");
}

at::Tensor process_scores(const at::Tensor& logits, const at::Tensor& sequences, const GenerationOptions& o) {
  at::Tensor s = logits.to(at::kFloat);  // (B, V)
  const double minus_inf = -std::numeric_limits<double>::infinity();
  if (o.repetition_penalty != 1.0) {
    const at::Tensor seen = s.gather(1, sequences);
    s = s.scatter(1, sequences, at::where(seen < 0, seen * o.repetition_penalty, seen / o.repetition_penalty));
  }
  if (!o.do_sample) return s;
  if (o.temperature != 1.0) s = s / o.temperature;
  if (o.top_k > 0) {
    const int64_t k = std::min(o.top_k, s.size(-1));
    const at::Tensor kth = std::get<0>(at::topk(s, k)).narrow(-1, k - 1, 1);  // (B, 1)
    s = s.masked_fill(s < kth, minus_inf);
  }
  if (o.top_p < 1.0) {
    // Ascending: drop the lowest tokens while their total probability stays within 1 - top_p; the highest stays.
    const auto [sorted, order] = at::sort(s, -1, /*descending=*/false);
    at::Tensor drop = sorted.softmax(-1).cumsum(-1) <= (1 - o.top_p);
    drop.narrow(-1, drop.size(-1) - 1, 1).fill_(false);
    s = s.masked_fill(drop.scatter(1, order, drop), minus_inf);
  }
  return s;
}

namespace {

// Whether a row of `unfinished` (B) is still generating here, or with `synced` on any rank of that group.
bool any_rank_unfinished(const at::Tensor& unfinished, const std::optional<dist::Communicator>& synced) {
  const bool here = unfinished.any().item<bool>();
  if (!synced || synced->size() == 1) return here;
  at::Tensor flag = at::full({1}, here ? 1.0f : 0.0f, at::TensorOptions().device(synced->device()));
  synced->all_reduce(flag, dist::ReduceOp::MAX).wait();
  return flag.item<float>() > 0;
}

}  // namespace

Generated generate(TextDecoder& decoder, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                   const GenerationOptions& o, const std::function<void(int64_t)>& on_step) {
  check_generation_options(o);
  if (prompt_ids.dim() != 2 || !prompt_mask.defined() || prompt_mask.sizes() != prompt_ids.sizes()) {
    throw std::invalid_argument("generate: prompt ids (B, T) and a mask of the same sizes expected, got ids " +
                                c10::str(prompt_ids.sizes()) + " and mask " +
                                (prompt_mask.defined() ? c10::str(prompt_mask.sizes()) : std::string("none")));
  }
  at::NoGradGuard no_grad;
  const int64_t rows = prompt_ids.size(0);
  at::Generator rng = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  at::Tensor sequences = decoder.sequences_at_start(prompt_ids);  // what the repetition penalty looks at
  at::Tensor unfinished = at::ones({rows}, prompt_ids.options().dtype(at::kBool));
  at::Tensor lengths = at::zeros({rows}, prompt_ids.options().dtype(at::kLong));  // each row's tokens up to its end
  std::vector<at::Tensor> made;
  at::Tensor logits = decoder.start(prompt_ids, prompt_mask);
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const at::Tensor scores = process_scores(logits, sequences, o);
    at::Tensor next;
    if (o.do_sample) {
      next = at::multinomial(scores.softmax(-1).cpu(), 1, false, rng).squeeze(1).to(prompt_ids.device());
    } else {
      next = scores.argmax(-1);
    }
    next = at::where(unfinished, next, at::full_like(next, o.pad_token_id));
    made.push_back(next);
    sequences = at::cat({sequences, next.unsqueeze(1)}, 1);
    lengths += unfinished.to(at::kLong);  // the token made counts, an end-of-sequence one too
    for (int64_t eos : o.eos_token_ids) unfinished = unfinished & (next != eos);
    if (on_step) on_step(step + 1);
    if (step + 1 == o.max_new_tokens || !any_rank_unfinished(unfinished, o.synced)) break;
    logits = decoder.next(next);
  }
  const at::Tensor counted = lengths.cpu().contiguous();
  return {at::stack(made, 1), std::vector<int64_t>(counted.data_ptr<int64_t>(), counted.data_ptr<int64_t>() + rows)};
}

}  // namespace shardtrain::models
