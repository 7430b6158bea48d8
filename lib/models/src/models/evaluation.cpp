#include "models/evaluation.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "models/entities.h"
#include "shardtrain/distributed/communicator.h"

namespace shardtrain::models {

void check_class_labels(const at::Tensor& labels, int64_t classes, bool multi_label, const std::string& who) {
  if (!labels.defined()) throw std::runtime_error(who + ": a batch without labels (every sample needs one)");
  if (multi_label) {
    if (labels.dim() != 2 || labels.size(1) != classes || !labels.is_floating_point()) {
      throw std::runtime_error(who + ": a multi-label classifier of " + std::to_string(classes) + " classes needs " +
                               "each sample's set of them, and the batch holds " +
                               (labels.dim() == 1 ? "one class or score per sample" : "labels of another shape"));
    }
    return;  // 0/1 by construction (the loader's)
  }
  if (labels.dim() == 2) {
    throw std::runtime_error(who + ": the batch holds sets of classes, and the classifier picks one (data.multi_label "
                             "makes one for sets)");
  }
  if (classes == 1) {  // a regression
    if (!labels.is_floating_point()) {
      throw std::runtime_error(who + ": a regression (one label) needs scores, and the batch holds class ids");
    }
    return;
  }
  if (labels.is_floating_point()) {
    throw std::runtime_error(who + ": " + std::to_string(classes) + " classes need class ids, and the batch holds "
                             "scores");
  }
  const int64_t top = labels.max().item<int64_t>(), bottom = labels.min().item<int64_t>();
  if (top >= classes || bottom < 0) {
    throw std::runtime_error(who + ": label " + std::to_string(top >= classes ? top : bottom) + " is outside its " +
                             std::to_string(classes) + " classes");
  }
}

void check_token_labels(const at::Tensor& labels, int64_t classes, const std::string& who) {
  if (!labels.defined() || labels.dim() != 2 || labels.is_floating_point()) {
    throw std::runtime_error(who + ": a token classifier needs a class per token, (batch, tokens) ids, and the batch "
                             "holds " + (labels.defined() ? "a label per sample" : "none"));
  }
  const at::Tensor scored = labels.masked_select(labels != -100);
  if (scored.numel() == 0) return;
  const int64_t top = scored.max().item<int64_t>(), bottom = scored.min().item<int64_t>();
  if (top >= classes || bottom < 0) {
    throw std::runtime_error(who + ": label " + std::to_string(top >= classes ? top : bottom) + " is outside its " +
                             std::to_string(classes) + " classes");
  }
}

EvalMode::EvalMode(torch::nn::Module& model) : model_(model), was_training_(model.is_training()) { model.eval(); }

EvalMode::~EvalMode() {
  if (was_training_) model_.train();
}

int64_t whole_batches(const EvalInputs& in) {
  const int64_t per_step = in.world->size() * in.batch_size;
  const int64_t wanted = in.max_samples > 0 ? std::min(in.max_samples, in.source_size) : in.source_size;
  const int64_t used = wanted / per_step * per_step;
  if (used == 0) {
    throw std::invalid_argument("eval: " + std::to_string(wanted) + " held-out samples are fewer than one batch on "
                                "every rank (" + std::to_string(per_step) + ")");
  }
  return used;
}

std::map<std::string, double> evaluate_token_loss(
    torch::nn::Module& model, const EvalInputs& in,
    const std::function<std::pair<at::Tensor, int64_t>(const data::Batch&)>& token_losses) {
  const int64_t used = whole_batches(in), per_step = in.world->size() * in.batch_size;
  const EvalMode mode(model);
  // (summed loss, predicted tokens), float64 on the device (NCCL reduces device tensors only).
  at::Tensor totals = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(in.device));
  for (int64_t start = 0; start < used; start += per_step) {
    const auto [loss, tokens] = token_losses(in.loader->build(data::SampleKind::TEXT, start).to(in.device, in.floats));
    totals[0] += loss.detach().to(at::kDouble);
    totals[1] += static_cast<double>(tokens);
  }
  in.world->all_reduce(totals, dist::ReduceOp::SUM).wait();
  const at::Tensor host = totals.cpu();
  const double loss = host[0].item<double>() / std::max(1.0, host[1].item<double>());
  return {{"eval_loss", loss}, {"perplexity", std::exp(loss)}, {"eval_tokens", host[1].item<double>()},
          {"eval_samples", static_cast<double>(used)}};
}

namespace {

// Each value's rank (1-based) in `v`, ties given the mean of the ranks they span (scipy.stats.rankdata).
std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> ranks(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = (static_cast<double>(i + j) + 2) / 2;
    i = j + 1;
  }
  return ranks;
}

// Pearson's correlation of x and y; 0 where either is constant (scipy says nan).
double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const auto n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx), syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

// A regression (one output): every held-out prediction and score gathered (each rank writes its rows' slots of a
// zeroed vector, then a sum), then run_glue's STS-B metrics over them.
std::map<std::string, double> evaluate_regression(const EvalInputs& in, data::SampleKind kind,
                                                  const std::function<at::Tensor(const data::Batch&)>& logits_of,
                                                  int64_t used) {
  const dist::Communicator& world = *in.world;
  const int64_t per_step = world.size() * in.batch_size;
  const auto options = at::TensorOptions().dtype(at::kDouble).device(in.device);
  at::Tensor predicted = at::zeros({used}, options), truth = at::zeros({used}, options);
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = in.loader->build(kind, start).to(in.device, in.floats);
    check_class_labels(b.labels, 1, false, "eval");
    const int64_t first = start + world.rank() * in.batch_size;  // this rank's rows (EpochSampler::rank_positions)
    predicted.slice(0, first, first + in.batch_size).copy_(logits_of(b).squeeze(1).to(at::kDouble));
    truth.slice(0, first, first + in.batch_size).copy_(b.labels.to(at::kDouble));
  }
  world.all_reduce(predicted, dist::ReduceOp::SUM).wait();
  world.all_reduce(truth, dist::ReduceOp::SUM).wait();
  const at::Tensor p = predicted.cpu(), t = truth.cpu();
  const std::vector<double> x(p.data_ptr<double>(), p.data_ptr<double>() + used),
      y(t.data_ptr<double>(), t.data_ptr<double>() + used);
  std::map<std::string, double> out;
  out["pearson"] = pearson(x, y);
  out["spearmanr"] = pearson(ranks_of(x), ranks_of(y));
  out["eval_loss"] = (p - t).pow(2).mean().item<double>();  // mean squared error, the training loss
  out["eval_samples"] = static_cast<double>(used);
  return out;
}

// Multi-label: per output a yes (logit > 0) or no against the sample's set; counts of true positives, predicted and
// true yeses, samples wholly right, and the summed binary cross-entropy, summed over the ranks.
std::map<std::string, double> evaluate_multi_label(const EvalInputs& in, data::SampleKind kind, int64_t classes,
                                                   const std::function<at::Tensor(const data::Batch&)>& logits_of,
                                                   int64_t used) {
  const dist::Communicator& world = *in.world;
  const int64_t per_step = world.size() * in.batch_size;
  at::Tensor totals = at::zeros({5}, at::TensorOptions().dtype(at::kDouble).device(in.device));
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = in.loader->build(kind, start).to(in.device, in.floats);
    check_class_labels(b.labels, classes, true, "eval");
    const at::Tensor logits = logits_of(b).to(at::kFloat), truth = b.labels.to(at::kFloat);
    const at::Tensor predicted = (logits > 0).to(at::kFloat);
    totals[0] += (predicted * truth).sum().to(at::kDouble);
    totals[1] += predicted.sum().to(at::kDouble);
    totals[2] += truth.sum().to(at::kDouble);
    totals[3] += (predicted == truth).all(1).sum().to(at::kDouble);
    totals[4] += at::binary_cross_entropy_with_logits(logits, truth, {}, {}, at::Reduction::Sum).to(at::kDouble);
  }
  world.all_reduce(totals, dist::ReduceOp::SUM).wait();
  const at::Tensor t = totals.cpu();
  const double hits = t[0].item<double>(), predicted = t[1].item<double>(), truth = t[2].item<double>();
  std::map<std::string, double> out;
  out["f1"] = predicted + truth > 0 ? 2 * hits / (predicted + truth) : 0.0;  // micro: 2 tp / (2 tp + fp + fn)
  out["accuracy"] = t[3].item<double>() / static_cast<double>(used);
  out["eval_loss"] = t[4].item<double>() / static_cast<double>(used * classes);
  out["eval_samples"] = static_cast<double>(used);
  return out;
}

}  // namespace

std::map<std::string, double> evaluate_classifier(torch::nn::Module& model, const EvalInputs& in,
                                                  data::SampleKind kind, int64_t classes, bool multi_label,
                                                  const std::function<at::Tensor(const data::Batch&)>& logits_of) {
  const dist::Communicator& world = *in.world;
  const int64_t used = whole_batches(in), per_step = world.size() * in.batch_size;
  const EvalMode mode(model);
  if (multi_label) return evaluate_multi_label(in, kind, classes, logits_of, used);
  if (classes == 1) return evaluate_regression(in, kind, logits_of, used);
  // Per (true class, predicted class): counts, the confusion matrix; and the summed loss. float64 on the device.
  at::Tensor confusion = at::zeros({classes * classes}, at::TensorOptions().dtype(at::kDouble).device(in.device));
  at::Tensor loss_sum = at::zeros({1}, confusion.options());
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = in.loader->build(kind, start).to(in.device, in.floats);
    check_class_labels(b.labels, classes, false, "eval");
    const at::Tensor logits = logits_of(b).to(at::kFloat);
    loss_sum += at::cross_entropy_loss(logits, b.labels, {}, at::Reduction::Sum).to(at::kDouble);
    confusion.index_add_(0, b.labels * classes + logits.argmax(1), at::ones({b.labels.size(0)}, confusion.options()));
  }
  world.all_reduce(confusion, dist::ReduceOp::SUM).wait();
  world.all_reduce(loss_sum, dist::ReduceOp::SUM).wait();
  const at::Tensor m = confusion.cpu().view({classes, classes});  // rows: true class, columns: predicted
  const at::Tensor hits = m.diagonal(), truth = m.sum(1), predicted = m.sum(0);
  // F1 of a class: 2 tp / (2 tp + fp + fn) = 2 tp / (true + predicted). Macro: the mean over the classes that are
  // true or predicted somewhere (scikit-learn's f1_score(average="macro")).
  const at::Tensor seen = (truth + predicted) > 0;
  const at::Tensor f1 = 2 * hits / (truth + predicted).clamp_min(1);
  std::map<std::string, double> out;
  out["accuracy"] = hits.sum().item<double>() / static_cast<double>(used);
  out["f1"] = classes == 2 ? f1[1].item<double>() : f1.masked_select(seen).mean().item<double>();
  out["eval_loss"] = loss_sum.item<double>() / static_cast<double>(used);
  out["eval_samples"] = static_cast<double>(used);
  return out;
}

std::map<std::string, double> evaluate_token_classifier(
    torch::nn::Module& model, const EvalInputs& in, const std::vector<std::string>& classes,
    const std::function<at::Tensor(const data::Batch&)>& logits_of) {
  const dist::Communicator& world = *in.world;
  const int64_t used = whole_batches(in), per_step = world.size() * in.batch_size;
  const auto n = static_cast<int64_t>(classes.size());
  const EvalMode mode(model);
  EntityCounts entities;
  double right = 0, scored = 0, loss = 0;
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = in.loader->build(data::SampleKind::TEXT, start).to(in.device, in.floats);
    check_token_labels(b.labels, n, "eval");
    const at::Tensor logits = logits_of(b).to(at::kFloat);
    loss += at::cross_entropy_loss(logits.flatten(0, 1), b.labels.flatten(), {}, at::Reduction::Sum, -100)
                .item<double>();
    const at::Tensor truth = b.labels.cpu().contiguous(), predicted = logits.argmax(2).cpu().contiguous();
    const auto t = truth.accessor<int64_t, 2>(), p = predicted.accessor<int64_t, 2>();
    for (int64_t row = 0; row < truth.size(0); ++row) {  // a sample's scored tokens: its words' tags
      std::vector<std::string> truth_tags, predicted_tags;
      for (int64_t k = 0; k < truth.size(1); ++k) {
        if (t[row][k] == -100) continue;
        truth_tags.push_back(classes[static_cast<size_t>(t[row][k])]);
        predicted_tags.push_back(classes[static_cast<size_t>(p[row][k])]);
        right += t[row][k] == p[row][k];
      }
      scored += static_cast<double>(truth_tags.size());
      entities.add(truth_tags, predicted_tags);
    }
  }
  // (true entities, predicted entities, correct ones, tokens right, tokens scored, summed loss) over every rank
  at::Tensor totals = at::tensor({static_cast<double>(entities.true_entities), static_cast<double>(entities.predicted),
                                  static_cast<double>(entities.correct), right, scored, loss},
                                 at::kDouble).to(in.device);
  world.all_reduce(totals, dist::ReduceOp::SUM).wait();
  const at::Tensor host = totals.cpu();
  const double* v = host.data_ptr<double>();
  const double precision = v[1] > 0 ? v[2] / v[1] : 0.0, recall = v[0] > 0 ? v[2] / v[0] : 0.0;
  std::map<std::string, double> out;
  out["precision"] = precision;
  out["recall"] = recall;
  out["f1"] = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0.0;
  out["accuracy"] = v[4] > 0 ? v[3] / v[4] : 0.0;
  out["eval_loss"] = v[4] > 0 ? v[5] / v[4] : 0.0;
  out["eval_samples"] = static_cast<double>(used);
  return out;
}

std::string describe_classifier_progress(const std::map<std::string, double>& first,
                                         const std::map<std::string, double>& last) {
  char text[160];
  if (first.count("pearson")) {
    std::snprintf(text, sizeof(text), ", Pearson %.3f -> %.3f, Spearman %.3f -> %.3f, eval loss %.4f -> %.4f",
                  first.at("pearson"), last.at("pearson"), first.at("spearmanr"), last.at("spearmanr"),
                  first.at("eval_loss"), last.at("eval_loss"));
    return text;
  }
  std::snprintf(text, sizeof(text), ", accuracy %.3f -> %.3f, F1 %.3f -> %.3f, eval loss %.4f -> %.4f",
                first.at("accuracy"), last.at("accuracy"), first.at("f1"), last.at("f1"), first.at("eval_loss"),
                last.at("eval_loss"));
  return text;
}

}  // namespace shardtrain::models
