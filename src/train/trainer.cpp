#include "shardtrain/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <regex>
#include <stdexcept>

#include "data/random.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/data/loader.h"
#include "shardtrain/dist/env.h"
#include "shardtrain/dist/mesh.h"
#include "shardtrain/dist/process_group.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/autocast.h"
#include "shardtrain/optim/grad_scaler.h"
#include "shardtrain/optim/param_groups.h"
#include "shardtrain/train/schedule.h"
#include "train/evaluate.h"
#include "train/metrics_log.h"
#include "train/objective.h"

namespace shardtrain::train {
namespace {

using config::Config;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Combinations that cannot mean what they say: refused up front with the reason, rather than trained otherwise.
void check_supported(const Config& c) {
  if (c.parallel.cpu_offload && c.parallel.strategy == config::Strategy::DDP) {
    throw std::invalid_argument("parallel.cpu_offload: true offloads the shards of an FSDP strategy; ddp keeps the "
                                "whole model on every device (use full_shard, or cpu_offload: false)");
  }
}

std::string family_of(const std::string& flavor) {
  for (const auto& f : models::list_flavors()) {
    if (f.flavor == flavor) return f.family;
  }
  models::layer_class_of(flavor);  // throws the zoo's "unknown flavor, did you mean"
  return "";
}

fsdp::ShardingStrategy fsdp_strategy(config::Strategy s) {
  switch (s) {
    case config::Strategy::FULL_SHARD: return fsdp::ShardingStrategy::FULL_SHARD;
    case config::Strategy::SHARD_GRAD_OP: return fsdp::ShardingStrategy::SHARD_GRAD_OP;
    case config::Strategy::NO_SHARD: return fsdp::ShardingStrategy::NO_SHARD;
    case config::Strategy::HYBRID_SHARD: return fsdp::ShardingStrategy::HYBRID_SHARD;
    case config::Strategy::HYBRID_SHARD_ZERO2: return fsdp::ShardingStrategy::HYBRID_SHARD_ZERO2;
    case config::Strategy::DDP: break;
  }
  throw std::logic_error("fsdp_strategy: DDP is not an FSDP strategy");
}

// The model, sharded or replicated as the config says.
struct Parallel {
  models::ZooModel model;
  std::optional<ddp::Ddp> ddp;
  bool sharded = false;
};

Parallel build_model(const Config& c, const dist::DeviceMesh& mesh, const at::Device& device) {
  models::BuildOptions build;
  build.tensors = build.tensors.device(device);
  build.init.seed = static_cast<uint64_t>(c.train.seed);
  build.init.std = c.model.init_std;
  Parallel p;
  if (c.parallel.strategy == config::Strategy::DDP) {
    p.model = models::build_model(c.model.flavor, build);
    // sync_module_states: rank 0 reads the file; replicate() hands its parameters to the others.
    const bool reads = !c.parallel.sync_module_states || mesh.world().rank() == 0;
    if (!c.model.init_weights.empty() && reads) {
      models::load_weights(*p.model.module, c.model.init_weights, p.model.names);
    }
    ddp::DdpOptions o;
    // FLAVA's batch kinds each leave some heads and poolers out of the loss.
    o.find_unused_parameters = p.model.family == "flava";
    o.bucket_cap_mb = c.parallel.bucket_cap_mb;
    o.gradient_as_bucket_view = c.parallel.gradient_as_bucket_view;
    if (c.parallel.activation_checkpointing) models::checkpoint_layers(p.model, 1, c.parallel.layer_classes);
    // Mixed precision without sharding: autocast around the model (parameters, gradients, optimizer float32).
    if (c.parallel.mixed_precision != config::Precision::NO) {
      nn::autocast_module(*p.model.module, device.type(),
                          c.parallel.mixed_precision == config::Precision::BF16 ? at::kBFloat16 : at::kHalf);
    }
    p.ddp = models::replicate_model(p.model, mesh, o);  // parameters are rank 0's from here on
    return p;
  }
  models::ParallelizeOptions o;
  o.strategy = fsdp_strategy(c.parallel.strategy);
  if (c.parallel.mixed_precision == config::Precision::BF16) {
    o.fsdp.mixed_precision.param_dtype = at::kBFloat16;
    o.fsdp.mixed_precision.reduce_dtype = at::kBFloat16;
  }
  if (c.parallel.mixed_precision == config::Precision::FP16) {
    // float16 gradients are scaled (see the GradScaler in train()); their sum over ranks is taken in float32,
    // where a scaled gradient cannot overflow.
    o.fsdp.mixed_precision.param_dtype = at::kHalf;
    o.fsdp.mixed_precision.reduce_dtype = at::kFloat;
  }
  o.fsdp.forward_prefetch = static_cast<int>(c.parallel.forward_prefetch);
  o.fsdp.limit_all_gathers = c.parallel.limit_all_gathers;
  o.fsdp.backward_prefetch = c.parallel.backward_prefetch == config::Prefetch::BACKWARD_PRE    ? fsdp::BackwardPrefetch::BACKWARD_PRE
                             : c.parallel.backward_prefetch == config::Prefetch::BACKWARD_POST ? fsdp::BackwardPrefetch::BACKWARD_POST
                                                                                               : fsdp::BackwardPrefetch::NONE;
  o.layer_classes = c.parallel.layer_classes;
  o.checkpoint_every = c.parallel.activation_checkpointing ? 1 : 0;
  o.fsdp.offload_params = c.parallel.cpu_offload;
  if (c.parallel.wrap == config::WrapPolicy::SIZE) o.policy = fsdp::wrap_by_size(c.parallel.min_params);
  if (c.parallel.wrap == config::WrapPolicy::NONE) {
    o.policy = fsdp::wrap_if([](const std::string&, torch::nn::Module&) { return false; });  // the root alone
  }
  const std::string own_layer = models::layer_class_of(c.model.flavor);
  const bool default_units = !o.policy && (o.layer_classes.empty() ||
                                           (o.layer_classes.size() == 1 && o.layer_classes[0] == own_layer));
  if (default_units) {
    p.model = models::build_parallel(c.model.flavor, mesh, o, build);  // each layer sharded as it is built
  } else {
    p.model = models::build_model(c.model.flavor, build);  // other units: the whole model first
    models::parallelize(p.model, mesh, o);
  }
  // Weights from a file into the sharded model: each rank reads its rows, or (sync_module_states) rank 0 reads
  // and broadcasts, for a file only rank 0 can see.
  if (!c.model.init_weights.empty()) {
    models::load_weights_sharded(p.model.module, c.model.init_weights, p.model.names,
                                 c.parallel.sync_module_states ? &mesh.world() : nullptr);
  }
  p.sharded = true;
  return p;
}

std::vector<torch::optim::OptimizerParamGroup> parameter_groups(const Config& c, torch::nn::Module& module) {
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
                   std::make_unique<torch::optim::AdamWOptions>(
                       torch::optim::AdamWOptions(c.optim.lr)
                           .betas({c.optim.betas[0], c.optim.betas[1]})
                           .eps(c.optim.eps)
                           .weight_decay(0))});
  return optim::param_groups_by_name(module, std::move(rules));
}

// Peak dense FLOP/s of one rank: float32 matmuls on CPU, bf16 on CUDA, the best of a few runs.
double measure_peak_tflops(const at::Device& device) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto options = at::TensorOptions().device(device).dtype(device.is_cuda() ? at::kBFloat16 : at::kFloat);
  const at::Tensor a = at::randn({n, n}, options), b = at::randn({n, n}, options);
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const double t0 = seconds_now();
    at::Tensor c = a.matmul(b);
    if (device.is_cuda()) c.cpu();  // waits for the device
    const double t = seconds_now() - t0;
    if (i > 0) best = std::max(best, 2.0 * n * n * n / t / 1e12);  // the first run warms up
  }
  return best;
}

memory::MemoryStats memory_now(const at::Device& device) {
  return device.is_cuda() ? memory::cuda_memory_stats(device.index()) : memory::cpu_memory_stats();
}

// Running sums over one logging interval.
struct Interval {
  int64_t steps = 0;
  double loss = 0, grad_norm = 0;
  std::map<std::string, std::pair<double, int64_t>> parts;  // sum, steps that had it
  int64_t texts = 0, images = 0;                            // this rank, steps after warm-up
  double flops = 0, seconds = 0;                            // this rank, steps after warm-up

  void clear() { *this = Interval{}; }
};

}  // namespace

TrainSummary train(const Config& c) {
  config::validate(c);
  check_supported(c);
  const dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
  const bool cuda = c.train.device == "cuda";
  const at::Device device = cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank)) : at::Device(at::kCPU);
  dist::InitOptions init;
  init.device = cuda ? dist::DeviceKind::CUDA : dist::DeviceKind::CPU;
  dist::ProcessGroup pg = dist::ProcessGroup::init(env, init);
  const dist::Communicator& world = pg.world();
  const bool leader = world.rank() == 0;
  if (!cuda) memory::install_cpu_memory_counter();

  // Model facts, data and tokenizer.
  const std::string family = family_of(c.model.flavor);
  if (!c.model.family.empty() && c.model.family != family) {
    throw std::invalid_argument("model.family: '" + c.model.family + "' but " + c.model.flavor + " is a " + family +
                                " flavor");
  }
  const ModelShape shape = model_shape(family, c.model.flavor);
  const std::array<const std::vector<std::string>*, 3> paths = {&c.data.image_text, &c.data.text, &c.data.image};
  const char* path_keys[] = {"data.image_text", "data.text", "data.image"};
  std::array<std::shared_ptr<const data::SampleSource>, 3> sources;
  bool any = false;
  for (size_t k = 0; k < 3; ++k) {
    if (!shape.kinds[k] || paths[k]->empty()) continue;
    sources[k] = std::make_shared<data::SampleSource>(*paths[k], static_cast<data::SampleKind>(k));
    any = true;
  }
  if (!any) {
    std::string wanted;
    for (size_t k = 0; k < 3; ++k) {
      if (shape.kinds[k]) wanted += std::string(wanted.empty() ? "" : " or ") + path_keys[k];
    }
    throw std::invalid_argument(c.model.flavor + " trains on " + wanted + ", and the config gives none");
  }
  std::shared_ptr<const data::WordPieceTokenizer> tokenizer;
  int64_t text_length = 0;
  if (shape.vocab_size > 0) {
    if (c.data.vocab.empty()) throw std::invalid_argument("data.vocab: " + c.model.flavor + " reads text; give a vocab.txt");
    tokenizer = std::make_shared<data::WordPieceTokenizer>(data::load_vocab(c.data.vocab), c.data.lowercase);
    if (tokenizer->vocab_size() > shape.vocab_size) {
      throw std::invalid_argument("data.vocab: '" + c.data.vocab + "' has " + std::to_string(tokenizer->vocab_size()) +
                                  " tokens, more than " + c.model.flavor + "'s vocabulary of " +
                                  std::to_string(shape.vocab_size));
    }
    text_length = c.data.max_text_length > 0 ? c.data.max_text_length : shape.max_text_length;
    if (text_length > shape.max_text_length) {
      throw std::invalid_argument("data.max_text_length: " + std::to_string(text_length) + " is more than " +
                                  c.model.flavor + "'s " + std::to_string(shape.max_text_length) + " positions");
    }
  }
  if (c.data.image_size > 0 && shape.image_size > 0 && c.data.image_size != shape.image_size) {
    throw std::invalid_argument("data.image_size: " + std::to_string(c.data.image_size) + ", but " + c.model.flavor +
                                " takes " + std::to_string(shape.image_size) + " pixels (0 = the model's)");
  }
  data::LoaderOptions lo;
  lo.seed = static_cast<uint64_t>(c.train.seed);
  lo.rank = world.rank(), lo.world = world.size();
  lo.batch_size = c.train.batch_size, lo.micro_batches = c.train.grad_accum;
  lo.workers = c.data.workers, lo.queue_depth = c.data.queue_depth;
  lo.mix = family == "flava" ? std::array<double, 3>{c.data.mix.image_text, c.data.mix.text, c.data.mix.image}
                             : std::array<double, 3>{1, 1, 1};
  lo.tokenizer = tokenizer, lo.text_length = text_length;
  lo.mlm_probability = shape.uses_mlm ? c.data.mlm_probability : 0;
  lo.image_size = shape.image_size, lo.patch_size = shape.patch_size, lo.codebook_size = shape.codebook_size;
  lo.mim_probability = shape.uses_mim ? c.data.mim_probability : 0;
  lo.image_mean = c.data.image_mean, lo.image_std = c.data.image_std;
  lo.itm_negative_probability = c.data.itm_negative_probability;

  // Model, optimizer.
  // Dropout draws from the default generators, seeded per rank (at::manual_seed seeds CPU and every GPU).
  at::manual_seed(data::hash_of(static_cast<uint64_t>(c.train.seed), static_cast<uint64_t>(world.rank())));
  const int64_t nodes = std::max(1, env.world_size / std::max(1, env.local_world_size));
  const bool hybrid = c.parallel.strategy == config::Strategy::HYBRID_SHARD ||
                      c.parallel.strategy == config::Strategy::HYBRID_SHARD_ZERO2;
  const dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, hybrid ? static_cast<int>(nodes) : 1);
  Parallel parallel = build_model(c, mesh, device);
  models::ZooModel& model = parallel.model;
  model.module->train();
  if (parallel.sharded) fsdp::set_reshard_after_backward(model.module, c.parallel.reshard_after_backward);
  torch::optim::AdamW optimizer(parameter_groups(c, *model.module),
                                torch::optim::AdamWOptions(c.optim.lr)
                                    .betas({c.optim.betas[0], c.optim.betas[1]})
                                    .eps(c.optim.eps)
                                    .weight_decay(c.optim.weight_decay));
  ckpt::CheckpointModel checkpointed{model.module, &optimizer, parallel.sharded,
                                     c.checkpoint.state_dict_type == config::StateDictType::FULL ? &model.names : nullptr};

  // Resume.
  TrainSummary summary;
  // float16: the loss is scaled before backward, and a step whose gradients overflowed on any rank is skipped.
  std::optional<optim::GradScaler> scaler;
  if (c.parallel.mixed_precision == config::Precision::FP16) scaler.emplace(optim::GradScalerOptions{}, &world);
  data::LoaderState loader_state;
  int64_t step = 0;
  if (c.checkpoint.resume) {
    const auto latest = ckpt::latest_checkpoint(c.checkpoint.dir);
    if (!latest) {
      throw std::invalid_argument("checkpoint.resume: no complete checkpoint in '" + c.checkpoint.dir + "'");
    }
    const ckpt::TrainerState s = ckpt::load_checkpoint(*latest, checkpointed, world);
    if (s.flavor != c.model.flavor) {
      throw std::invalid_argument("checkpoint.resume: " + *latest + " is of " + s.flavor + ", the config trains " +
                                  c.model.flavor);
    }
    step = s.step;
    loader_state.step = s.loader_step, loader_state.consumed = s.loader_consumed;
    if (scaler && s.loss_scale > 0) scaler->load_state(s.loss_scale, s.loss_scale_growth_tracker);
    if (leader) {
      std::printf("resumed from %s at step %lld%s\n", latest->c_str(), static_cast<long long>(step),
                  s.world_size == world.size() ? "" : " (another world size: RNG not restored)");
    }
  }
  summary.start_step = step;
  data::Loader loader(sources, lo, loader_state);

  std::shared_ptr<const data::SampleSource> eval_source;
  std::unique_ptr<data::Loader> eval_loader;
  if (family == "flava" && !c.data.eval.empty()) {
    eval_source = std::make_shared<data::SampleSource>(c.data.eval, data::SampleKind::IMAGE_TEXT);
    data::LoaderOptions eo = lo;
    eo.workers = 0, eo.micro_batches = 1, eo.itm_negative_probability = 0;  // masks as in training
    eval_loader = std::make_unique<data::Loader>(
        std::array<std::shared_ptr<const data::SampleSource>, 3>{eval_source, nullptr, nullptr}, eo);
  }
  auto evaluate = [&] {
    auto values = evaluate_flava(model, *eval_loader, eval_source->size(), c.train.eval_samples, c.train.batch_size, world);
    if (summary.first_eval.empty()) summary.first_eval = values;
    summary.last_eval = values;
    return values;
  };

  const double peak_tflops = c.log.peak_tflops > 0 ? c.log.peak_tflops : measure_peak_tflops(device);
  MetricsLog log(c.log, leader, c.train.steps, step);
  if (leader) {
    std::printf("training %s (%s) on %d rank%s, %s, %lld steps of %lld x %lld x %d samples, peak %.3g TFLOP/s/rank%s\n",
                c.model.flavor.c_str(), family.c_str(), world.size(), world.size() == 1 ? "" : "s",
                config::to_string(c.parallel.strategy).c_str(), static_cast<long long>(c.train.steps),
                static_cast<long long>(c.train.batch_size), static_cast<long long>(c.train.grad_accum), world.size(),
                peak_tflops, c.log.peak_tflops > 0 ? "" : " (measured)");
    long long checkpointed_layers = 0;
    for (const auto& item : model.module->named_modules()) checkpointed_layers += nn::is_checkpointed(*item.value());
    if (checkpointed_layers > 0) std::printf("  activation checkpointing: %lld layers\n", checkpointed_layers);
    if (c.parallel.cpu_offload) {
      std::printf("  cpu_offload: %s\n", cuda ? "shards, gradients and optimizer state in CPU memory"
                                             : "the model trains on the CPU already; nothing moves");
    }
    for (size_t k = 0; k < 3; ++k) {
      if (!sources[k]) continue;
      std::printf("  %s data: %lld samples in %zu files", data::kind_name(static_cast<data::SampleKind>(k)),
                  static_cast<long long>(sources[k]->size()), sources[k]->files().size());
      if (sources[k]->incomplete_samples()) std::printf(", %lld incomplete left out", static_cast<long long>(sources[k]->incomplete_samples()));
      std::printf("\n");
      for (const auto& p : sources[k]->scan_problems()) std::printf("  data problem: %s\n", p.c_str());
    }
    std::fflush(stdout);
  }
  if (eval_loader && step == 0) log.record_eval(step, evaluate());

  Interval interval;
  const int64_t warmup_until = step + c.log.warmup_steps;
  bool first_interval = true;
  std::string last_checkpoint;
  const auto& groups = optimizer.param_groups();
  const int64_t last_step = c.train.stop_at > 0 ? c.train.stop_at : c.train.steps;
  while (step < last_step) {
    const double t0 = seconds_now();
    const double lr = learning_rate(c.optim, step, c.train.steps);
    for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    const std::vector<data::Batch> batches = loader.next_step();
    double step_loss = 0, step_flops = 0;
    int64_t texts = 0, images = 0;
    std::map<std::string, double> step_parts;
    for (size_t m = 0; m < batches.size(); ++m) {
      const bool sync = m + 1 == batches.size() || c.train.sync_each_batch;
      if (parallel.sharded) fsdp::set_requires_gradient_sync(model.module, sync);
      else parallel.ddp->set_requires_gradient_sync(sync);
      data::Batch b = batches[m];
      for (at::Tensor* t : {&b.input_ids, &b.attention_mask, &b.input_ids_masked, &b.mlm_labels, &b.pixels,
                            &b.codebook_pixels, &b.masked_patches, &b.itm_labels, &b.labels}) {
        if (t->defined()) *t = t->to(device);
      }
      Losses losses = compute_losses(model, b, static_cast<uint64_t>(c.train.seed) ^ static_cast<uint64_t>(world.rank()) << 32);
      const double value = losses.total.detach().item<double>();
      if (!std::isfinite(value)) {
        throw std::runtime_error("the loss is " + std::to_string(value) + " at step " + std::to_string(step) +
                                 " (rank " + std::to_string(world.rank()) + "); lower optim.lr or check the data");
      }
      const at::Tensor share = losses.total / static_cast<double>(batches.size());
      (scaler ? scaler->scale(share) : share).backward();
      step_loss += value / static_cast<double>(batches.size());
      for (const auto& [k, v] : losses.parts) step_parts[k] += v / static_cast<double>(batches.size());
      step_flops += training_flops(family, c.model.flavor, b);
      texts += b.texts, images += b.images;
    }
    if (scaler) scaler->unscale(optimizer);  // clipping sees the true gradients
    double grad_norm;
    const double max_norm = c.train.max_grad_norm > 0 ? c.train.max_grad_norm : INFINITY;
    if (parallel.sharded) {
      grad_norm = fsdp::clip_grad_norm(model.module, max_norm);
    } else {
      std::vector<at::Tensor> with_grad;
      for (const auto& g : groups) {
        for (const auto& p : g.params()) {
          if (p.grad().defined()) with_grad.push_back(p);
        }
      }
      grad_norm = torch::nn::utils::clip_grad_norm_(with_grad, max_norm);
    }
    bool stepped = true;
    if (scaler) {
      stepped = scaler->step(optimizer);
      scaler->update();
    } else {
      optimizer.step();
    }
    optimizer.zero_grad();
    ++step;
    const double elapsed = seconds_now() - t0;

    interval.steps += 1;
    interval.loss += step_loss;
    if (stepped) interval.grad_norm += grad_norm;  // a skipped step's norm is inf or NaN
    for (const auto& [k, v] : step_parts) interval.parts[k].first += v, interval.parts[k].second += 1;
    if (step > warmup_until) {
      interval.texts += texts, interval.images += images;
      interval.flops += step_flops, interval.seconds += elapsed;
    }
    log.step_done(step, step_loss);

    const bool log_now = step % c.log.interval == 0 || step == last_step;
    if (log_now) {
      // Means over the ranks: loss, grad norm, each part; sums: items and FLOPs; max: seconds. One all-reduce each.
      const auto& names = loss_names();
      std::vector<double> sums = {interval.loss / interval.steps, static_cast<double>(interval.texts),
                                  static_cast<double>(interval.images), interval.flops};
      for (const auto& n : names) {
        auto it = interval.parts.find(n);
        sums.push_back(it == interval.parts.end() ? 0 : it->second.first / it->second.second);
        sums.push_back(it == interval.parts.end() ? 0 : 1);
      }
      at::Tensor reduced = at::tensor(sums, at::kDouble).to(device);
      world.all_reduce(reduced, dist::ReduceOp::SUM).wait();
      reduced = reduced.cpu();
      at::Tensor slowest = at::tensor({interval.seconds}, at::kDouble).to(device);
      world.all_reduce(slowest, dist::ReduceOp::MAX).wait();
      const double seconds = slowest.cpu().item<double>();
      const double peak_gib = static_cast<double>(memory_now(device).peak_bytes) / (1024.0 * 1024.0 * 1024.0);
      at::Tensor local_peak = at::zeros({world.size()}, at::kDouble);
      local_peak[world.rank()] = peak_gib;
      local_peak = local_peak.to(device);
      world.all_reduce(local_peak, dist::ReduceOp::SUM).wait();
      local_peak = local_peak.cpu();

      IntervalMetrics m;
      m.step = step;
      const double W = world.size();
      const auto r = reduced.accessor<double, 1>();
      m.loss = r[0] / W;
      for (size_t i = 0; i < names.size(); ++i) {
        const double had = r[4 + 2 * i + 1];
        if (had > 0) m.parts[names[i]] = r[4 + 2 * i] / had;
      }
      m.lr = lr, m.grad_norm = interval.grad_norm / interval.steps;
      if (seconds > 0) {
        m.texts_per_second = r[1] / seconds, m.images_per_second = r[2] / seconds;
        m.items_per_second = m.texts_per_second + m.images_per_second;
        m.tflops_per_rank = r[3] / W / seconds / 1e12;
        m.mfu = m.tflops_per_rank / peak_tflops;
      } else {
        m.items_per_second = m.texts_per_second = m.images_per_second = m.tflops_per_rank = m.mfu = NAN;
      }
      for (int64_t i = 0; i < world.size(); ++i) m.peak_memory_gib.push_back(local_peak[i].item<double>());
      log.record(m);
      if (first_interval) summary.first_loss = m.loss, first_interval = false;
      summary.last_loss = m.loss;
      interval.clear();
    }
    if (eval_loader && ((c.train.eval_interval > 0 && step % c.train.eval_interval == 0) || step == last_step)) {
      log.record_eval(step, evaluate());
    }
    if (!c.checkpoint.dir.empty() &&
        ((c.checkpoint.interval > 0 && step % c.checkpoint.interval == 0) || step == last_step)) {
      const data::LoaderState ls = loader.state();
      ckpt::TrainerState s;
      s.step = step, s.loader_step = ls.step, s.loader_consumed = ls.consumed;
      s.world_size = world.size(), s.flavor = c.model.flavor, s.strategy = config::to_string(c.parallel.strategy);
      s.config_yaml = config::to_yaml(c);
      if (scaler) s.loss_scale = scaler->scale_value(), s.loss_scale_growth_tracker = scaler->growth_tracker();
      last_checkpoint = ckpt::save_checkpoint(c.checkpoint.dir, s, checkpointed, world);
      if (leader) ckpt::prune_checkpoints(c.checkpoint.dir, c.checkpoint.keep);
      world.barrier().wait();
      log.message("checkpoint " + last_checkpoint);
    }
  }
  log.finish();
  const data::LoaderStats stats = loader.stats();
  summary.steps = step;
  summary.skipped_samples = stats.skipped;
  summary.last_checkpoint = last_checkpoint;
  if (stats.skipped > 0) {
    std::printf("rank %d: %lld unusable samples skipped (replaced by the next ones); first: %s\n", world.rank(),
                static_cast<long long>(stats.skipped), stats.first_errors.empty() ? "?" : stats.first_errors[0].c_str());
  }
  if (leader) {
    std::printf("done: %lld steps, loss %.4f -> %.4f", static_cast<long long>(step), summary.first_loss,
                summary.last_loss);
    if (!summary.last_eval.empty()) {
      std::printf(", retrieval R@1 %.3f -> %.3f (chance %.3f), ITM accuracy %.3f -> %.3f (chance 0.5)",
                  summary.first_eval["r1_image_to_text"], summary.last_eval["r1_image_to_text"],
                  1.0 / summary.last_eval["eval_samples"], summary.first_eval["itm_accuracy"],
                  summary.last_eval["itm_accuracy"]);
    }
    if (scaler) {
      std::printf(", loss scale %g (%lld steps skipped for overflowing gradients)", scaler->scale_value(),
                  static_cast<long long>(scaler->skipped_steps()));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return summary;
}

}  // namespace shardtrain::train
