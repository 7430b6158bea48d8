// `shardtrain estimate-memory MODEL`: Accelerate's table for a zoo flavor or a Hugging Face config.json, computed
// from the family's own modules built on the meta device (nothing allocated, any size); with a job, or a trainer
// config, the peak per rank by term.
#include <algorithm>
#include <iostream>
#include <set>
#include <sstream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/accelerate_estimate.h"
#include "shardtrain/config/config.h"
#include "shardtrain/plan/memory_model.h"
#include "shardtrain/train/trainer.h"

namespace shardtrain::cli {

namespace {

const char* kEstimateUsage =
    "usage: shardtrain estimate-memory MODEL [--dtypes DTYPE [DTYPE ...]]\n"
    "       shardtrain estimate-memory CONFIG.yaml [--json] [--section.key=value ...]\n"
    "MODEL: a flavor of `shardtrain models`, or a Hugging Face config.json (or a model directory holding one, or a\n"
    "model name such as google/t5-v1_1-xl found in the Hugging Face cache, as Accelerate takes it) of a supported\n"
    "family (model_type bert, vit, t5, llama, mistral, qwen2, qwen3, gpt2, flava), any size.\n"
    "Prints `accelerate estimate-memory`'s table, with its arithmetic and formatting: for transformers' base model\n"
    "of the config (AutoModel) in float32, the largest layer, the total size and training with Adam for a batch of\n"
    "one per dtype (float32, float16, bfloat16, int8, int4; default: float32 float16 int8 int4), then the stages of\n"
    "that training estimate (model, gradients, backward pass, optimizer step).\n"
    "\n"
    "With a job (any of these flags), the peak memory per rank of a real training step instead, by term. Each flag\n"
    "sets a key of the trainer's config (launch.num_processes, parallel.strategy, train.batch_size, ...: what\n"
    "`shardtrain train CONFIG --dry-run` estimates with those keys); the rest are the config's defaults:\n"
    "  --num-processes N   ranks (default 1)            --nnodes M          nodes (hybrid strategies shard in one)\n"
    "  --strategy S        full_shard | shard_grad_op | no_shard | hybrid_shard | hybrid_shard_zero2 | ddp\n"
    "  --mixed-precision P no | bf16 | fp16             --activation-checkpointing   every transformer layer\n"
    "  --every K           checkpoint every K-th layer  --grad-accum K      micro-batches per step\n"
    "  --sync-each-batch   reduce after each micro-batch (no full gradients kept between them)\n"
    "  --cpu-offload                                    --batch-size B      samples per rank (default 1)\n"
    "  --activation-offload  what each layer keeps for backward in host memory until its backward\n"
    "  --seq-len T         text tokens (default: the model's maximum)\n"
    "  --device D          auto | cpu | cuda (kernels differ in what they keep; default auto: cuda with a GPU)\n"
    "  --tp-size T         tensor parallelism over T of the ranks (--batch-size: per data-parallel rank)\n"
    "  --sequence-parallel the activations between its regions split on the sequence too\n"
    "  --lora R            LoRA: rank-R adapters, the base frozen (--lora-targets a,b: PEFT's target_modules;\n"
    "                      default the query and value projections; all-linear)\n"
    "  --json              the estimate as JSON\n"
    "\n"
    "A trainer config (CONFIG.yaml, as `shardtrain train` takes it, overrides too) gives the whole job: the model\n"
    "with its task's head, launch.num_processes, parallel.*, train.batch_size (auto: the batch it would pick),\n"
    "data.max_text_length; the same estimate as `shardtrain train CONFIG --dry-run`.\n"
    "docs/notes/memory-model.md says how each term is computed and how far it is from measurement.\n";

// `--dtypes a b c` (Accelerate's nargs="+") becomes `--dtypes=a,b,c` for parse_args.
std::vector<std::string> joined_dtypes(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] != "--dtypes") {
      out.push_back(argv[i]);
      continue;
    }
    std::string list;
    while (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) list += (list.empty() ? "" : ",") + argv[++i];
    out.push_back("--dtypes=" + list);
  }
  return out;
}

// `estimate-memory CONFIG.yaml [--json] [--section.key=value ...]`: the trainer's own plan of the job.
int estimate_config(const std::vector<std::string>& argv) {
  std::set<std::string> flags;
  const std::vector<std::string> overrides = config_overrides(argv, 1, {"--json"}, &flags);
  for (const std::string& o : overrides) {
    const std::string key = o.substr(2, o.find('=') - 2);
    if (key.find('.') == std::string::npos) {  // a job flag (--strategy, --batch-size): the config gives the job
      throw std::invalid_argument("--" + key + ": " + argv[0] + " gives the job; change it with its keys, e.g. "
                                  "--parallel.strategy=shard_grad_op --train.batch_size=8");
    }
  }
  const train::RunPlan plan = train::plan_run(config::load_config(argv[0], overrides));
  std::cout << (flags.count("--json") ? plan.json + "\n" : plan.text);
  return 0;
}

// Each job flag is a key of the trainer's config: the job is built from the config as `shardtrain train` builds
// it (train::plan_run), a flag an override. Switches set their key to true; --lora-targets is a list.
struct JobFlag {
  enum Value { TEXT, SWITCH, LIST };  // --flag V; --flag alone (the key true); --flag a,b (the key [a,b])
  const char* flag;
  const char* key;
  Value value = TEXT;
};
const std::vector<JobFlag> kJobFlags = {
    {"num-processes", "launch.num_processes"}, {"nnodes", "launch.num_machines"},
    {"strategy", "parallel.strategy"},         {"mixed-precision", "parallel.mixed_precision"},
    {"activation-checkpointing", "parallel.activation_checkpointing", JobFlag::SWITCH},
    {"every", "parallel.activation_checkpointing_every"},
    {"grad-accum", "train.grad_accum"},        {"sync-each-batch", "train.sync_each_batch", JobFlag::SWITCH},
    {"cpu-offload", "parallel.cpu_offload", JobFlag::SWITCH}, {"batch-size", "train.batch_size"},
    {"activation-offload", "parallel.activation_offload", JobFlag::SWITCH},
    {"seq-len", "data.max_text_length"},       {"device", "train.device"},
    {"lora", "model.lora.r"},                  {"lora-targets", "model.lora.target_modules", JobFlag::LIST},
    {"tp-size", "parallel.tp_size"},           {"sequence-parallel", "parallel.sequence_parallel", JobFlag::SWITCH}};

// The command line's flags: `base` and the job's, those taking a value or those standing alone.
std::vector<std::string> job_flags(std::vector<std::string> base, bool switches) {
  for (const JobFlag& f : kJobFlags) {
    if ((f.value == JobFlag::SWITCH) == switches) base.push_back(f.flag);
  }
  return base;
}

// The config overrides of a job given by flags: the model, a batch of one unless told (the estimate's default,
// not the trainer's), and each flag given. --every implies checkpointing.
std::vector<std::string> job_overrides(const std::string& model, const Args& args) {
  std::vector<std::string> overrides = {"--model.flavor=" + model, "--train.batch_size=1"};
  for (const JobFlag& f : kJobFlags) {
    if (!args.has(f.flag)) continue;
    const std::string value = f.value == JobFlag::SWITCH ? "true"
                              : f.value == JobFlag::LIST ? "[" + args.get(f.flag, "") + "]"
                                                         : args.get(f.flag, "");
    overrides.push_back(std::string("--") + f.key + "=" + value);
  }
  if (args.has("every")) overrides.push_back("--parallel.activation_checkpointing=true");
  if (args.has("lora-targets") && !args.has("lora")) throw std::invalid_argument("--lora-targets goes with --lora R");
  return overrides;
}

bool is_yaml(const std::string& path) {
  for (const char* ext : {".yaml", ".yml"}) {
    const std::string e(ext);
    if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

}  // namespace

int run_estimate_command(const std::vector<std::string>& argv) {
  if (!argv.empty() && is_yaml(argv[0])) return estimate_config(argv);
  const Args args = parse_args(joined_dtypes(argv), job_flags({"dtypes"}, false), job_flags({"help", "json"}, true));
  if (args.has("help")) {
    std::cout << kEstimateUsage;
    return 0;
  }
  if (args.positionals.size() != 1) {
    std::cerr << kEstimateUsage;
    throw std::invalid_argument("expected one MODEL (a flavor or a config.json), got " +
                                std::to_string(args.positionals.size()) + " arguments");
  }
  const std::string model = args.positionals[0];
  const std::vector<std::string> dtypes = split_commas(args.get("dtypes", "float32,float16,int8,int4"));
  if (dtypes.empty()) throw std::invalid_argument("--dtypes: expected at least one dtype");
  for (const auto& d : dtypes) plan::check_accelerate_dtype(d);

  if (std::any_of(kJobFlags.begin(), kJobFlags.end(), [&](const JobFlag& f) { return args.has(f.flag); }) ||
      args.has("json")) {
    const train::RunPlan plan = train::plan_run(config::parse_config("", "estimate-memory", job_overrides(model, args)));
    std::cout << (args.has("json") ? plan.json + "\n" : plan.text);
    return 0;
  }
  const auto recipe = models::recipe_of_model(model);
  const plan::ModelSizes sizes = plan::accelerate_sizes(recipe->hf_base_model());
  std::cout << plan::accelerate_table(model, sizes, dtypes) << "\n";
  const std::string stages = plan::adam_stages_table(model, sizes, dtypes);
  if (!stages.empty()) std::cout << "\n" << stages << "\n";
  return 0;
}

}  // namespace shardtrain::cli
