// One side of bench/pp_vs_torch.py: trains a Llama of the zoo through a pipeline (pp::Pipeline, each rank building
// its stage's layers only) for N steps and prints one RESULT line (JSON) on rank 0: the median step of the slowest
// rank, the peak bytes of the largest rank (our counting allocator), every step's loss, and the bubble measured on
// the busiest rank (1 - the seconds it computed / the step's) beside the schedule's own figure. Run under `shardtrain
// launch` with one rank per stage; the inputs are tp_bench's (--write-inputs: the model as a Hugging Face
// directory and every step's token ids).
//
//   pp_bench --inputs DIR --schedule gpipe|1f1b|interleaved_1f1b|zero_bubble --microbatches M
//            [--stages-per-rank V] [--steps N] [--warmup W]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <string>

#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/pp/pipeline.h"
#include "bench_loop.h"

namespace {

using namespace shardtrain;

struct Args {
  std::string inputs;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::ONE_F_ONE_B;
  int microbatches = 4, stages_per_rank = 1;
  int64_t steps = 8, warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&] { return bench::option_value(argc, argv, i); };
    if (k == "--inputs") a.inputs = value();
    else if (k == "--schedule") a.schedule = parallel::pipeline_schedule_named(value());
    else if (k == "--microbatches") a.microbatches = std::stoi(value());
    else if (k == "--stages-per-rank") a.stages_per_rank = std::stoi(value());
    else if (k == "--steps") a.steps = std::stoll(value());
    else if (k == "--warmup") a.warmup = std::stoll(value());
    else throw std::invalid_argument("unknown option " + k);
  }
  return a;
}

double max_over(const dist::Communicator& world, double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  world.all_reduce(t, dist::ReduceOp::MAX).wait();
  return t.item<double>();
}

int train(const Args& a) {
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::read_dist_env(dist::process_env_lookup()));
  const dist::Communicator& world = pg.world();
  const dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, 1, 1, 1, pg.world_size());
  pp::ScheduleShape shape;
  shape.kind = a.schedule, shape.ranks = mesh.pp_size(), shape.microbatches = a.microbatches;
  shape.stages_per_rank = a.stages_per_rank;
  const pp::Schedule schedule = pp::make_schedule(shape);
  const auto recipe = models::recipe_from_hf_config(a.inputs);
  const int64_t layers =
      std::dynamic_pointer_cast<models::LlamaImpl>(models::build_model(recipe, models::meta_build()).module)
          ->config.layers;
  const auto split = models::split_layers(layers, shape.stages());
  models::BuildOptions build;
  build.stages = models::stages_of_rank(shape, split, mesh.pp_rank());
  models::ZooModel model = models::build_model(recipe, build);
  models::LoadOptions partial;
  partial.partial = true;  // the other stages' tensors are theirs
  models::load_weights(*model.module, a.inputs + "/model.safetensors", model.names, partial);
  const at::Tensor all = io::load_pickle(a.inputs + "/ids.pt").toGenericDict().at("ids").toTensor();
  const int64_t rows = all.size(1) / a.microbatches;
  int64_t step = 0;
  auto text = [&](int m) {
    const at::Tensor ids = all[step].narrow(0, m * rows, rows);
    return models::MicrobatchText{at::Tensor(), ids};
  };
  models::Llama llama(std::dynamic_pointer_cast<models::LlamaImpl>(model.module));
  std::vector<std::unique_ptr<models::LlamaStage>> stages;
  std::map<int, pp::Stage*> mine;
  for (int s = 0, run = 0; s < shape.stages(); ++s) {
    if (shape.rank_of(s) != mesh.pp_rank()) continue;
    stages.push_back(std::make_unique<models::LlamaStage>(llama, run++, a.microbatches, text));
    mine[s] = stages.back().get();
  }
  pp::Pipeline pipeline(schedule, mesh.pp_group(), mine);
  torch::optim::AdamW adam(model.module->parameters(), torch::optim::AdamWOptions(1e-4));
  std::vector<double> step_ms, busy_fraction, losses;
  double peak = 0;
  for (step = 0; step < a.steps + a.warmup; ++step) {
    memory::reset_cpu_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const pp::StepResult r = pipeline.step([&](int m) { return all[step].narrow(0, m * rows, rows); });
    adam.step();
    adam.zero_grad();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    at::Tensor loss = at::full({1}, r.loss, at::kDouble);
    world.all_reduce(loss, dist::ReduceOp::SUM).wait();  // the last stage's
    losses.push_back(loss.item<double>());
    if (step < a.warmup) continue;
    step_ms.push_back(ms);
    busy_fraction.push_back(r.busy_seconds * 1000 / ms);
    peak = std::max(peak, static_cast<double>(memory::cpu_memory_stats().peak_bytes));
  }
  const double slowest = max_over(world, bench::median_ms(step_ms));
  const double largest = max_over(world, peak);
  // The busiest rank's idle share: the stages' imbalance leaves the others waiting besides, the bottleneck waits
  // only in the schedule's bubble (and for transfers).
  const double bubble = -max_over(world, bench::median_ms(busy_fraction) - 1);
  if (world.rank() == 0) {
    std::ostringstream out;
    out.precision(10);
    out << "RESULT {\"impl\": \"shardtrain\", \"schedule\": \"" << parallel::to_string(a.schedule)
        << "\", \"world\": " << world.size() << ", \"microbatches\": " << a.microbatches
        << ", \"step_ms\": " << slowest << ", \"peak_bytes\": " << largest << ", \"bubble\": " << bubble
        << ", \"nominal_bubble\": " << pp::nominal_bubble(shape) << ", \"losses\": [";
    for (size_t i = static_cast<size_t>(a.warmup); i < losses.size(); ++i) {
      out << (i > static_cast<size_t>(a.warmup) ? ", " : "") << losses[i];
    }
    out << "]}";
    std::cout << out.str() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    memory::install_cpu_memory_counter();
    return train(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "pp_bench: " << e.what() << std::endl;
    return 1;
  }
}
