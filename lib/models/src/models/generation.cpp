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

void KvCaches::reorder(const at::Tensor& rows) {
  for (const auto& c : caches_) {
    if (!c->keys.defined()) continue;
    const at::Tensor on = rows.to(c->keys.device());
    c->keys = c->keys.index_select(0, on), c->values = c->values.index_select(0, on);  // (B, kvH, P, D)
  }
}

void TextDecoder::reorder(const at::Tensor&) {
  throw std::invalid_argument("generation: this decoder cannot reorder its rows, which beam search needs");
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
  if (o.num_beams < 1) refuse("num_beams", static_cast<double>(o.num_beams), "at least 1");
  if (o.num_beams > 1 && o.do_sample) {
    throw std::invalid_argument("generation: num_beams " + std::to_string(o.num_beams) +
                                " with do_sample: beam sampling is not implemented (greedy beam search, or sampling "
                                "with num_beams 1)");
  }
  if (o.early_stopping != "true" && o.early_stopping != "false" && o.early_stopping != "never") {
    throw std::invalid_argument("generation: early_stopping '" + o.early_stopping +
                                "': expected true, false or never");
  }
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

// `here`, or with `synced` whether it holds on any rank of that group (a collective).
bool on_any_rank(bool here, const std::optional<dist::Communicator>& synced) {
  if (!synced || synced->size() == 1) return here;
  at::Tensor flag = at::full({1}, here ? 1.0f : 0.0f, at::TensorOptions().device(synced->device()));
  synced->all_reduce(flag, dist::ReduceOp::MAX).wait();
  return flag.item<float>() > 0;
}

// (B, K, ...) rows of `t` chosen per batch row by `index` (B, N) into (B, N, ...): transformers' _gather_beams.
at::Tensor gather_beams(const at::Tensor& t, const at::Tensor& index) {
  at::Tensor i = index;
  while (i.dim() < t.dim()) i = i.unsqueeze(-1);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[1] = index.size(1);
  return t.gather(1, i.expand(sizes));
}

// Beam search as transformers' _beam_search (greedy): every step the best 2K (more with several end tokens)
// continuations of a row's K running hypotheses by summed log-probability; those ending (an end token, or the
// length limit) join the row's K best finished ones, scored by sum / length^length_penalty, the best K others run
// on. Rows are B * K in the decoder, row b's beams at b * K + k.
Generated beam_search(TextDecoder& decoder, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                      const GenerationOptions& o, const std::function<void(int64_t)>& on_step) {
  constexpr double kNone = -1.0e9;  // transformers' score of an impossible hypothesis
  const int64_t B = prompt_ids.size(0), K = o.num_beams;
  const at::Tensor ids = prompt_ids.repeat_interleave(K, 0), mask = prompt_mask.repeat_interleave(K, 0);
  const at::Tensor start = decoder.sequences_at_start(ids);  // (B * K, L0)
  const int64_t L0 = start.size(1), max_length = L0 + o.max_new_tokens;
  const int64_t keep = std::max<int64_t>(2, 1 + static_cast<int64_t>(o.eos_token_ids.size())) * K;
  const auto longs = start.options().dtype(at::kLong), floats = start.options().dtype(at::kFloat);
  at::Tensor running = at::full({B, K, max_length}, o.pad_token_id, longs);
  running.narrow(2, 0, L0).copy_(start.view({B, K, L0}));
  at::Tensor finished_seqs = running.clone();
  at::Tensor running_scores = at::zeros({B, K}, floats);
  running_scores.narrow(1, 1, K - 1).fill_(kNone);  // the first step continues one beam a row, not K copies
  at::Tensor finished_scores = at::full({B, K}, kNone, floats);
  at::Tensor finished_lengths = at::zeros({B, K}, longs);  // generated tokens of each finished hypothesis
  at::Tensor is_finished = at::zeros({B, K}, longs.dtype(at::kBool));
  at::Tensor improvable = at::ones({B, 1}, longs.dtype(at::kBool));
  const at::Tensor top_k_mask = at::arange(keep, longs) < K;  // (keep): the K best may finish
  at::Tensor logits = decoder.start(ids, mask);
  for (int64_t cur = L0;;) {
    const at::Tensor flat = running.narrow(2, 0, cur).reshape({B * K, cur});
    at::Tensor log_probs = process_scores(at::log_softmax(logits.to(at::kFloat), -1), flat, o);  // (B * K, V)
    const int64_t V = log_probs.size(1);
    const at::Tensor summed = (log_probs.view({B, K, V}) + running_scores.unsqueeze(2)).view({B, K * V});
    auto [top_scores, top_index] = at::topk(summed, keep);  // (B, keep)
    const at::Tensor parent = at::div(top_index, V, "floor"), token = top_index.remainder(V);
    at::Tensor candidates = gather_beams(running, parent);  // (B, keep, max_length)
    candidates.select(2, cur).copy_(token);
    at::Tensor ends = at::full({B, keep}, cur + 1 >= max_length, longs.dtype(at::kBool));
    for (int64_t eos : o.eos_token_ids) ends = ends | (token == eos);

    // The K best that did not end run on.
    const at::Tensor running_candidates = top_scores + ends.to(at::kFloat) * kNone;
    const at::Tensor next_index = std::get<1>(at::topk(running_candidates, K));
    running = gather_beams(candidates, next_index);
    running_scores = gather_beams(running_candidates, next_index);
    const at::Tensor next_parent = gather_beams(parent, next_index);  // (B, K): the beam each continues

    // Those of the K best that ended join the finished ones, ranked by their length-normalised score.
    const at::Tensor just_ended = ends & top_k_mask.unsqueeze(0);
    const int64_t generated = cur + 1 - L0;
    at::Tensor ended_scores = top_scores / std::pow(static_cast<double>(generated), o.length_penalty);
    if (o.early_stopping == "true") ended_scores += (is_finished.all(1, true)).to(at::kFloat) * kNone;
    ended_scores = ended_scores + (~improvable).to(at::kFloat) * kNone + (~just_ended).to(at::kFloat) * kNone;
    const at::Tensor merged_scores = at::cat({finished_scores, ended_scores}, 1);
    const at::Tensor best = std::get<1>(at::topk(merged_scores, K));
    finished_seqs = gather_beams(at::cat({finished_seqs, candidates}, 1), best);
    finished_scores = gather_beams(merged_scores, best);
    finished_lengths = gather_beams(at::cat({finished_lengths, at::full({B, keep}, generated, longs)}, 1), best);
    is_finished = gather_beams(at::cat({is_finished, just_ended}, 1), best);

    decoder.reorder((next_parent + at::arange(B, longs).unsqueeze(1) * K).view({B * K}));
    ++cur;
    // Can a running beam still beat the worst finished one? (transformers' _check_early_stop_heuristic)
    const double best_length = o.early_stopping == "never" && o.length_penalty > 0 ? max_length - L0 : cur - L0;
    const at::Tensor best_running = running_scores.narrow(1, 0, 1) / std::pow(best_length, o.length_penalty);
    const at::Tensor worst_finished =
        at::where(is_finished, std::get<0>(finished_scores.min(1, true)), at::full({B, 1}, kNone, floats));
    improvable = improvable & (best_running > worst_finished).any(1, true);
    if (on_step) on_step(generated);
    const bool go_on = improvable.any().item<bool>() &&
                       !(o.early_stopping == "true" && is_finished.all().item<bool>()) &&
                       !ends.all().item<bool>();
    if (!on_any_rank(go_on, o.synced)) break;
    logits = decoder.next(running.select(2, cur - 1).reshape({B * K}));
  }
  // Each row's best finished hypothesis (finished_scores is sorted: topk), its tokens after the start.
  const at::Tensor lengths = finished_lengths.select(1, 0).contiguous().cpu();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor tokens = finished_seqs.select(1, 0).narrow(1, L0, longest).clone();  // (B, longest)
  const at::Tensor after = at::arange(longest, longs).unsqueeze(0) >= lengths.to(tokens.device()).unsqueeze(1);
  tokens.masked_fill_(after, o.pad_token_id);
  return {tokens, std::vector<int64_t>(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + B)};
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
  if (o.num_beams > 1) return beam_search(decoder, prompt_ids, prompt_mask, o, on_step);
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
    if (step + 1 == o.max_new_tokens || !on_any_rank(unfinished.any().item<bool>(), o.synced)) break;
    logits = decoder.next(next);
  }
  const at::Tensor counted = lengths.cpu().contiguous();
  return {at::stack(made, 1), std::vector<int64_t>(counted.data_ptr<int64_t>(), counted.data_ptr<int64_t>() + rows)};
}

}  // namespace shardtrain::models
