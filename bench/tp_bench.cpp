// One side of bench/tp_vs_torch.py: trains a Llama of the zoo with tensor parallelism (and FSDP over the
// data-parallel ranks) for N steps and prints one RESULT line (JSON) on rank 0, measured as every benchmark here
// (bench/bench_loop.h). Run under `shardtrain launch`.
//
//   tp_bench --write-inputs DIR --flavor F [--overrides k=v,...] --batch B --seq T --steps N
//       the model as a Hugging Face directory (DIR/config.json, DIR/model.safetensors) and the token ids of every
//       step (DIR/ids.pt: (steps + warmup, B, T) int64), one process
//   tp_bench --inputs DIR --tp T [--sequence-parallel]
//       world / T data-parallel ranks, each reading its rows of every step's batch; FSDP (full_shard, each decoder
//       layer a unit) over them when there are two or more
// PyTorch's side (bench/tp_reference.py) reads the same directory into transformers' LlamaForCausalLM.
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"
#include "bench_loop.h"

namespace {

using namespace shardtrain;

struct Args {
  std::string inputs, write_inputs, flavor = "llama-debug";
  std::map<std::string, double> overrides;
  int64_t batch = 8, seq = 256, steps = 10, warmup = 2, tp = 1;
  bool sequence_parallel = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&] { return bench::option_value(argc, argv, i); };
    if (k == "--inputs") a.inputs = value();
    else if (k == "--write-inputs") a.write_inputs = value();
    else if (k == "--flavor") a.flavor = value();
    else if (k == "--overrides") {
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) {
        const size_t eq = item.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("--overrides: '" + item + "' is not key=value");
        a.overrides[item.substr(0, eq)] = std::stod(item.substr(eq + 1));
      }
    } else if (k == "--batch") a.batch = std::stoll(value());
    else if (k == "--seq") a.seq = std::stoll(value());
    else if (k == "--steps") a.steps = std::stoll(value());
    else if (k == "--warmup") a.warmup = std::stoll(value());
    else if (k == "--tp") a.tp = std::stoll(value());
    else if (k == "--sequence-parallel") a.sequence_parallel = true;
    else throw std::invalid_argument("unknown option " + k);
  }
  return a;
}

int write_inputs(const Args& a) {
  const auto recipe = models::recipe_of_model(a.flavor, a.overrides);
  models::BuildOptions build;
  build.init.seed = 0;
  models::ZooModel model = models::build_model(recipe, build);
  io::make_directories(a.write_inputs);
  models::save_weights(*model.module, a.write_inputs + "/model.safetensors", model.names);
  std::ofstream(a.write_inputs + "/config.json") << recipe->hf_config_json();
  torch::manual_seed(0);
  const int64_t vocab = model.module->named_parameters()["embed.weight"].size(0);
  c10::Dict<std::string, at::Tensor> ids;
  ids.insert("ids", torch::randint(vocab, {a.steps + a.warmup, a.batch, a.seq}, torch::kLong));
  io::save_pickle(a.write_inputs + "/ids.pt", ids);
  return 0;
}

int train(const Args& a) {
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::read_dist_env(dist::process_env_lookup()));
  const int w = pg.world_size();
  const dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, 1, -1, static_cast<int>(a.tp));
  models::ZooModel model = models::build_model(models::recipe_from_hf_config(a.inputs));
  models::load_weights(*model.module, a.inputs + "/model.safetensors", model.names);
  const at::Tensor all = io::load_pickle(a.inputs + "/ids.pt").toGenericDict().at("ids").toTensor();
  std::optional<models::TensorParallel> tp;
  if (a.tp > 1) tp = models::tensor_parallelize(model, mesh.tp_group(), {a.sequence_parallel});
  if (mesh.data_size() > 1) models::parallelize(model, mesh, {});
  auto* llama = dynamic_cast<models::LlamaImpl*>(model.module.get());
  torch::optim::AdamW adam(model.module->parameters(), torch::optim::AdamWOptions(1e-4));
  const int64_t rows = all.size(1) / mesh.data_size();
  auto loss_of = [&](int64_t s) {
    const at::Tensor ids = all[s].narrow(0, mesh.data_rank() * rows, rows);
    return llama->run(ids, {}, ids, /*labelled_only=*/true).loss;
  };
  bench::StepLoop r = bench::run_steps(pg.world(), a.steps, a.warmup, loss_of, adam,
                                       [&] { if (tp) tp->reduce_gradients(); });
  const std::string fields = "\"impl\": \"shardtrain\", \"tp\": " + std::to_string(a.tp) + ", \"world\": " +
                             std::to_string(w) + ", \"sequence_parallel\": " +
                             (a.sequence_parallel ? "true" : "false");
  bench::print_result(pg.world(), fields, r, static_cast<size_t>(a.warmup));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    memory::install_cpu_memory_counter();
    const Args a = parse(argc, argv);
    return a.write_inputs.empty() ? train(a) : write_inputs(a);
  } catch (const std::exception& e) {
    std::cerr << "tp_bench: " << e.what() << std::endl;
    return 1;
  }
}
