#include "train/train_step.h"

#include <ATen/ATen.h>

#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <regex>

#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/anyprecision_adamw.h"
#include "shardtrain/optim/disk_adamw.h"
#include "shardtrain/optim/fused_adamw.h"
#include "shardtrain/optim/param_groups.h"

namespace shardtrain::train {
namespace {

torch::optim::AdamWOptions adamw_options(const config::OptimConfig& o, double weight_decay) {
  return torch::optim::AdamWOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(weight_decay);
}

optim::AnyPrecisionAdamWOptions anyprecision_options(const config::OptimConfig& o, double weight_decay) {
  optim::AnyPrecisionAdamWOptions a(o.lr);
  a.betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(weight_decay).use_kahan_summation(o.use_kahan_summation);
  a.momentum_dtype(scalar_type_of(o.momentum_dtype)).variance_dtype(scalar_type_of(o.variance_dtype));
  a.compensation_buffer_dtype(scalar_type_of(o.compensation_buffer_dtype)).fused(o.fused);
  return a;
}

optim::AdafactorOptions adafactor_options(const config::OptimConfig& o, double weight_decay) {
  optim::AdafactorOptions a(o.lr);
  a.eps1(o.adafactor_eps[0]).eps2(o.adafactor_eps[1]).clip_threshold(o.clip_threshold).decay_rate(o.decay_rate);
  a.beta1(o.beta1).weight_decay(weight_decay).scale_parameter(o.scale_parameter).relative_step(o.relative_step);
  a.warmup_init(o.warmup_init);
  return a;
}

torch::optim::SGDOptions sgd_options(const config::OptimConfig& o, double weight_decay) {
  return torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(weight_decay);
}

// optim.name's options with weight decay `weight_decay`.
std::unique_ptr<torch::optim::OptimizerOptions> options_of(const config::OptimConfig& o, double weight_decay) {
  if (o.name == config::OptimizerKind::SGD) {
    return std::make_unique<torch::optim::SGDOptions>(sgd_options(o, weight_decay));
  }
  if (o.name == config::OptimizerKind::ANYPRECISION_ADAMW) {
    return std::make_unique<optim::AnyPrecisionAdamWOptions>(anyprecision_options(o, weight_decay));
  }
  if (o.name == config::OptimizerKind::ADAFACTOR) {
    return std::make_unique<optim::AdafactorOptions>(adafactor_options(o, weight_decay));
  }
  return std::make_unique<torch::optim::AdamWOptions>(adamw_options(o, weight_decay));
}

// "nan", "inf" or "-inf" (a NaN's sign means nothing).
std::string value_text(double v) {
  if (std::isnan(v)) return "nan";
  char text[32];
  std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

// Forward and backward of one of M micro-batches; adds its loss and parts, divided by M, to `totals`. A loss that
// is not finite still goes backward: the other ranks' backward waits in the same collectives.
void forward_backward(StepParts& p, const data::Batch& host_batch, double M, StepTotals& totals) {
  const data::Batch b = host_batch.to(p.device, p.model.dtype());
  const models::Losses losses = p.task.compute_losses(*p.model.module(), b, p.seed);
  const double value = losses.total.detach().item<double>();
  const at::Tensor share = losses.total / M;
  (p.scaler ? p.scaler->scale(share) : share).backward();
  totals.loss += value / M;
  for (const auto& [k, v] : losses.parts) totals.parts[k] += v / M;
  totals.flops += p.recipe.training_flops(b);
  totals.texts += b.texts, totals.images += b.images;
}

// One of M micro-batches through the pipeline (its own microbatches inside), as forward_backward.
void pipeline_forward_backward(StepParts& p, const data::Batch& host_batch, bool sync, StepTotals& totals) {
  const data::Batch b = host_batch.to(p.device, p.model.dtype());
  const double value = p.pipeline->forward_backward(b, sync);  // already divided by M
  totals.loss += value;
  totals.parts[p.task.loss_names().front()] += value;  // a causal LM's one loss
  totals.flops += p.recipe.training_flops(b);
  totals.texts += b.texts, totals.images += b.images;
}

}  // namespace

std::string nonfinite_ranks(bool mine, const dist::Communicator& world) {
  if (world.size() == 1) return mine ? "rank 0" : "";
  at::Tensor flags = at::zeros({world.size()}, at::dtype(at::kFloat));
  if (mine) flags[world.rank()] = 1;
  flags = flags.to(world.device());
  world.all_reduce(flags, dist::ReduceOp::SUM).wait();
  const at::Tensor host = flags.cpu();
  std::vector<int> bad;
  for (int r = 0; r < world.size(); ++r) {
    if (host[r].item<float>() > 0) bad.push_back(r);
  }
  if (bad.empty()) return "";
  return static_cast<int>(bad.size()) == world.size() ? "every rank" : dist::ranks_text(bad);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::Config& c, const ParallelModel& model) {
  torch::nn::Module& module = *model.module();
  std::vector<std::regex> patterns;
  for (const auto& s : c.optim.no_decay) patterns.emplace_back(s);
  const bool exempt_1d = c.optim.no_decay_1d;
  std::vector<optim::NamedGroup> rules;
  rules.push_back({[patterns, exempt_1d](const std::string& name, const at::Tensor& p) {
                     if (exempt_1d && optim::no_weight_decay(name, p)) return true;
                     for (const auto& r : patterns) {
                       if (std::regex_search(name, r)) return true;
                     }
                     return false;
                   },
                   options_of(c.optim, 0)});
  auto groups = optim::param_groups_by_name(module, std::move(rules));
  const double decay = c.optim.weight_decay;
  if (c.optim.name == config::OptimizerKind::ANYPRECISION_ADAMW) {
    return std::make_unique<optim::AnyPrecisionAdamW>(std::move(groups), anyprecision_options(c.optim, decay));
  }
  if (c.optim.name == config::OptimizerKind::ADAFACTOR) {
    return std::make_unique<optim::Adafactor>(std::move(groups), adafactor_options(c.optim, decay),
                                              model.row_sharding(), model.tensor_split());
  }
  if (c.optim.name == config::OptimizerKind::SGD) {
    return std::make_unique<torch::optim::SGD>(std::move(groups), sgd_options(c.optim, decay));
  }
  if (c.parallel.offload == parallel::Offload::NVME) {  // AdamW's state on disk (the config allows adamw alone)
    return std::make_unique<optim::DiskAdamW>(std::move(groups), adamw_options(c.optim, decay),
                                              optim::DiskStateOptions{c.parallel.nvme_path, "optimizer"});
  }
  if (c.optim.fused) return std::make_unique<optim::FusedAdamW>(std::move(groups), adamw_options(c.optim, decay));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), adamw_options(c.optim, decay));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& g : optimizer.param_groups()) g.options().set_lr(lr);
}

StepTotals train_step(StepParts& p, const config::Config& c, std::vector<data::Batch> batches) {
  StepTotals totals;
  const double M = static_cast<double>(batches.size());
  for (size_t m = 0; m < batches.size(); ++m) {
    const bool sync = m + 1 == batches.size() || c.train.sync_each_batch;
    if (p.pipeline) {
      pipeline_forward_backward(p, batches[m], sync, totals);
      continue;
    }
    p.model.set_gradient_sync(sync);
    forward_backward(p, std::move(batches[m]), M, totals);
  }
  p.model.finish_gradients();
  // Offloaded (an FSDP strategy), the step runs where the shards and their gradients are: the optimizer's state and
  // temporaries are the host's.
  const memory::CpuTierScope tier(c.parallel.offload != parallel::Offload::NONE ? memory::CpuTier::HOST
                                                                                : memory::CpuTier::COMPUTE);
  // Every rank learns whose loss was not finite before anyone steps: one rank's NaN skips the step everywhere.
  const std::string bad_ranks = nonfinite_ranks(!std::isfinite(totals.loss), p.world);
  if (p.scaler) p.scaler->unscale(p.optimizer);  // clipping sees the true gradients
  const double max_norm = c.train.max_grad_norm > 0 ? c.train.max_grad_norm : INFINITY;
  totals.grad_norm = p.model.clip_grad_norm(max_norm, p.optimizer.param_groups());  // the same on every rank
  if (!bad_ranks.empty()) {
    totals.nonfinite = "non-finite loss on " + bad_ranks;
  } else if (!std::isfinite(totals.grad_norm) && !p.scaler) {  // float16: an overflow, the loss scaler's to skip
    totals.nonfinite = "grad_norm " + value_text(totals.grad_norm);
  }
  if (!totals.nonfinite.empty()) {
    totals.stepped = false;
    if (p.scaler) p.scaler->skip_step(), p.scaler->update();
  } else if (p.scaler) {
    totals.stepped = p.scaler->step(p.optimizer);
    p.scaler->update();
  } else {
    p.optimizer.step();
  }
  p.optimizer.zero_grad();
  return totals;
}

}  // namespace shardtrain::train
