#include "models/t5/t5_seq2seq.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "models/evaluation.h"
#include "models/kv_cache.h"
#include "models/recipe_helpers.h"
#include "shardtrain/distributed/communicator.h"
#include "shardtrain/models/losses.h"

namespace shardtrain::models {
namespace {

// A batch of (input, target) pairs as encoder inputs and targets, each closed by the row's end-of-sequence token.
struct Seq2SeqRows {
  std::vector<std::vector<int64_t>> inputs, targets;
};

Seq2SeqRows split_rows(const data::Batch& b, const T5Config& config) {
  if (!b.token_type_ids.defined()) {
    throw std::runtime_error("seq2seq reads (input, target) records: set data.text_fields to their two fields, "
                             "e.g. [input, target]");
  }
  TextRows rows = text_rows(b, config);
  for (int s = 0; s < 2; ++s) {
    for (size_t r = 0; r < rows.eos.size(); ++r) rows.tokens[s][r].push_back(rows.eos[r]);
  }
  return {std::move(rows.tokens[0]), std::move(rows.tokens[1])};
}

// Length of the longest common subsequence of a and b (O(|a| |b|) dynamic programming, one row at a time).
size_t common_subsequence(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<size_t> row(b.size() + 1, 0), next(b.size() + 1, 0);
  for (int64_t x : a) {
    for (size_t j = 0; j < b.size(); ++j) next[j + 1] = x == b[j] ? row[j] + 1 : std::max(row[j + 1], next[j]);
    std::swap(row, next);
  }
  return row[b.size()];
}

class T5Seq2Seq : public Task {
 public:
  explicit T5Seq2Seq(const T5Config& config) : config_(config) {}
  std::string name() const override { return "seq2seq"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = 512, d.vocab_size = config_.vocab_size;  // relative positions: 512 is T5's training length
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"seq2seq"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    const Seq2SeqRows rows = split_rows(b, config_);
    const at::Device device = b.input_ids.device();
    const at::Tensor input_ids = padded_rows(rows.inputs, config_.pad_token_id, device);
    const at::Tensor mask = (input_ids != config_.pad_token_id).to(at::kLong);
    Losses out;
    const at::Tensor labels = padded_rows(rows.targets, kIgnoreIndex, device);
    out.total = module_as<T5Impl>(model, "t5").run(input_ids, mask, {}, labels, /*labelled_only=*/true).loss;
    out.parts["seq2seq"] = value_of(out.total);
    return out;
  }
  bool has_evaluation() const override { return true; }
  data::SampleKind eval_kind() const override { return data::SampleKind::TEXT; }
  std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& in) const override;
  std::string describe_progress(const std::map<std::string, double>& first,
                                const std::map<std::string, double>& last) const override {
    char text[160];
    std::snprintf(text, sizeof(text), ", eval loss %.4f -> %.4f, exact match %.3f -> %.3f, ROUGE-L %.3f -> %.3f",
                  first.at("eval_loss"), last.at("eval_loss"), first.at("exact_match"), last.at("exact_match"),
                  first.at("rouge_l"), last.at("rouge_l"));
    return text;
  }

 private:
  T5Config config_;
};

// Teacher-forced loss per target token; then greedy decoding, one token at a time (the encoder's output of the
// loss pass reused, the decoder's earlier positions in its KV caches), up to the batch's longest target, each
// row's output cut at its first end-of-sequence token and compared with its target without it: exact match, and
// ROUGE-L's F-measure over tokens (2 P R / (P + R) of the longest common subsequence).
std::map<std::string, double> T5Seq2Seq::evaluate(torch::nn::Module& model, const EvalInputs& in) const {
  T5Impl& t5 = module_as<T5Impl>(model, "t5");
  const int64_t used = whole_batches(in), per_step = in.world->size() * in.batch_size;
  const EvalMode mode(model);
  double loss = 0, tokens = 0, exact = 0, rouge = 0;
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = in.loader->build(data::SampleKind::TEXT, start).to(in.device, in.floats);
    const Seq2SeqRows rows = split_rows(b, config_);
    const at::Tensor input_ids = padded_rows(rows.inputs, config_.pad_token_id, in.device);
    const at::Tensor mask = (input_ids != config_.pad_token_id).to(at::kLong);
    const at::Tensor labels = padded_rows(rows.targets, kIgnoreIndex, in.device);
    const double n = (labels != kIgnoreIndex).sum().item<double>();
    const T5Outputs scored = t5.run(input_ids, mask, {}, labels, /*labelled_only=*/true);
    loss += scored.loss.item<double>() * n;
    tokens += n;
    // Every rank decodes as many steps as the longest target of any rank: each step is a forward pass through
    // the root (decode_step), and a sharded one gathers parameters from every rank.
    at::Tensor longest_here = at::full({1}, labels.size(1), at::kLong).to(in.device);
    in.world->all_reduce(longest_here, dist::ReduceOp::MAX).wait();
    const int64_t longest = longest_here.item<int64_t>();
    at::Tensor decoded = at::full({input_ids.size(0), longest + 1}, config_.pad_token_id, input_ids.options());
    {
      const KvCaches caches(*t5.decoder);
      for (int64_t t = 0; t < longest; ++t) {
        const at::Tensor logits = t5.decode_step(decoded.narrow(1, t, 1), t, scored.encoder_hidden, mask);
        decoded.narrow(1, t + 1, 1).copy_(logits.select(1, -1).argmax(-1, true));
      }
    }
    const at::Tensor out = decoded.narrow(1, 1, longest).cpu().contiguous();
    for (size_t r = 0; r < rows.targets.size(); ++r) {
      const std::vector<int64_t>& target = rows.targets[r];
      const int64_t eos = target.back();
      std::vector<int64_t> wanted(target.begin(), target.end() - 1), got;
      for (int64_t t = 0; t < longest; ++t) {
        const int64_t token = out[static_cast<int64_t>(r)][t].item<int64_t>();
        if (token == eos) break;
        got.push_back(token);
      }
      exact += got == wanted ? 1 : 0;
      const double common = static_cast<double>(common_subsequence(got, wanted));
      if (common > 0) rouge += 2 * common / static_cast<double>(got.size() + wanted.size());
    }
  }
  at::Tensor totals = at::tensor({loss, tokens, exact, rouge}, at::kDouble).to(in.device);
  in.world->all_reduce(totals, dist::ReduceOp::SUM).wait();
  const at::Tensor t = totals.cpu();
  return {{"eval_loss", t[0].item<double>() / std::max(1.0, t[1].item<double>())},
          {"exact_match", t[2].item<double>() / static_cast<double>(used)},
          {"rouge_l", t[3].item<double>() / static_cast<double>(used)},
          {"eval_samples", static_cast<double>(used)}};
}

}  // namespace

TextRows text_rows(const data::Batch& b, const T5Config& config) {
  if (!b.sequence_ids.defined()) {
    throw std::invalid_argument("T5 reads a batch's texts through Batch::sequence_ids, which this batch lacks "
                                "(data::Loader sets it for every text batch)");
  }
  const at::Tensor ids = b.input_ids.cpu().contiguous(), seq = b.sequence_ids.cpu().contiguous(),
                   mask = b.attention_mask.cpu().contiguous();
  const auto I = ids.accessor<int64_t, 2>(), S = seq.accessor<int64_t, 2>(), M = mask.accessor<int64_t, 2>();
  TextRows rows;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    rows.tokens[0].emplace_back(), rows.tokens[1].emplace_back();
    int64_t last = -1;  // the row's last real token
    for (int64_t j = 0; j < ids.size(1); ++j) {
      if (M[r][j] == 0) continue;
      last = j;
      if (S[r][j] >= 0) rows.tokens[S[r][j] > 0 ? 1 : 0].back().push_back(I[r][j]);
    }
    rows.eos.push_back(last >= 0 && S[r][last] < 0 ? I[r][last] : config.eos_token_id);
  }
  return rows;
}

at::Tensor padded_rows(const std::vector<std::vector<int64_t>>& rows, int64_t pad, const at::Device& device) {
  size_t width = 1;
  for (const auto& r : rows) width = std::max(width, r.size());
  at::Tensor out = at::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, pad, at::kLong);
  auto O = out.accessor<int64_t, 2>();
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) O[static_cast<int64_t>(i)][static_cast<int64_t>(j)] = rows[i][j];
  }
  return out.to(device);
}

std::unique_ptr<Task> make_t5_seq2seq(const T5Config& config) { return std::make_unique<T5Seq2Seq>(config); }

}  // namespace shardtrain::models
