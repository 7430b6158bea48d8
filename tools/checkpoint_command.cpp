// `shardtrain checkpoint export` and `shardtrain checkpoint list`.
#include <iostream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/io/files.h"

namespace shardtrain::cli {
namespace {

const char* kCheckpointUsage =
    "usage: shardtrain checkpoint export CHECKPOINT --out model.safetensors [--dtype fp32|bf16|fp16]\n"
    "       shardtrain checkpoint list DIR\n"
    "export: merges a checkpoint's shards (any world size, FSDP or DDP) into one safetensors file with\n"
    "        Hugging Face names. CHECKPOINT is a step-* directory, or a checkpoint.dir (its newest one).\n"
    "list:   the complete checkpoints in DIR with their step and world size.\n";

}  // namespace

int run_checkpoint_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kCheckpointUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "export") {
    const Args a = parse_args(rest, {"out", "dtype"}, {});
    if (a.positionals.size() != 1) throw std::invalid_argument("export takes one CHECKPOINT");
    const std::string out = a.get("out", "");
    if (out.empty()) throw std::invalid_argument("--out FILE is required");
    std::string path = a.positionals[0];
    if (!io::path_exists(path + "/trainer.json")) {
      const auto latest = ckpt::latest_checkpoint(path);
      if (!latest) throw std::invalid_argument("'" + path + "' is neither a checkpoint nor a directory holding one");
      path = *latest;
    }
    std::optional<at::ScalarType> dtype;
    const std::string d = a.get("dtype", "");
    if (d == "bf16") dtype = at::kBFloat16;
    else if (d == "fp16") dtype = at::kHalf;
    else if (d == "fp32") dtype = at::kFloat;
    else if (!d.empty()) throw std::invalid_argument("--dtype: '" + d + "' is not one of fp32, bf16, fp16");
    ckpt::export_checkpoint(path, out, dtype);
    std::cout << "checkpoint export: " << path << " -> " << out << "\n";
    return 0;
  }
  if (args[0] == "list") {
    if (rest.size() != 1) throw std::invalid_argument("list takes one DIR");
    for (const auto& p : ckpt::list_checkpoints(rest[0])) {
      const auto s = ckpt::read_trainer_state(p);
      std::cout << p << "  step " << s.step << "  world " << s.world_size << "  " << s.flavor << " " << s.strategy
                << "\n";
    }
    return 0;
  }
  std::cerr << "shardtrain checkpoint: unknown sub-command '" << args[0] << "'\n" << kCheckpointUsage;
  return 2;
}

}  // namespace shardtrain::cli
