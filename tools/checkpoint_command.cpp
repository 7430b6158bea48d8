// `shardtrain checkpoint export`, `shardtrain checkpoint verify` and `shardtrain checkpoint list`.

#include <cstdio>
#include <iostream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/hf/export.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/plan/planner.h"

namespace shardtrain::cli {
namespace {

const char* kCheckpointUsage =
    "usage: shardtrain checkpoint export CHECKPOINT --out model.safetensors [--dtype fp32|bf16|fp16]\n"
    "                                    [--allow-non-finite]\n"
    "       shardtrain checkpoint export CHECKPOINT --hf OUT_DIR [--max-shard-size 5GB] [--dtype ...]\n"
    "       shardtrain checkpoint export CHECKPOINT --peft OUT_DIR [--dtype ...]\n"
    "       shardtrain checkpoint verify PATH\n"
    "       shardtrain checkpoint list DIR\n"
    "export: merges a checkpoint's shards (any world size, FSDP or DDP) into one safetensors file with\n"
    "        Hugging Face names. CHECKPOINT is a step-* directory, or a checkpoint.dir (its newest one).\n"
    "        Or weights from elsewhere: a PyTorch distributed checkpoint (the directory dcp.save wrote),\n"
    "        the directory Accelerate's save_state fills, a pytorch_model.bin: its model's tensors under\n"
    "        the names they were saved with; with --hf, the model of the config.json beside them (or in\n"
    "        the directory above), every tensor of it required.\n"
    "        NaN or Inf weights are refused unless --allow-non-finite.\n"
    "        --hf: a Hugging Face model directory that transformers' from_pretrained loads: config.json,\n"
    "        model.safetensors (or shards of at most --max-shard-size and model.safetensors.index.json)\n"
    "        and the run's tokenizer files. A LoRA run (model.lora) exports the model with its adapters\n"
    "        merged (--out and --hf), or with --peft the adapter alone as PEFT's save_pretrained writes it\n"
    "        (adapter_config.json, adapter_model.safetensors) for PeftModel.from_pretrained.\n"
    "verify: checks every file of a checkpoint (PATH a step-* directory), or of each checkpoint in a\n"
    "        checkpoint.dir, against its manifest (size and XXH3 checksum), and that no weight or\n"
    "        optimizer state holds NaN or Inf (a diverged run's). Exit 1 when one fails.\n"
    "list:   the checkpoints in DIR with their step, world size and run.\n";

// One line per checkpoint: "ok" with what it holds, or what is wrong. Returns 0 when every one verifies.
int verify_command(const std::string& path) {
  const bool one = io::path_exists(path + "/" + ckpt::kManifestName) || io::path_exists(path + "/trainer.json");
  const std::vector<std::string> paths = one ? std::vector<std::string>{path} : ckpt::list_checkpoints(path);
  if (paths.empty()) throw std::invalid_argument("'" + path + "' is neither a checkpoint nor a directory holding one");
  int damaged = 0;
  for (const std::string& p : paths) {
    const std::string problem = ckpt::verify_checkpoint_files(p);
    if (!problem.empty()) {
      std::cout << p << "  DAMAGED: " << problem << "\n";
      ++damaged;
      continue;
    }
    const ckpt::Manifest m = ckpt::read_manifest(p);
    int64_t bytes = 0;
    for (const auto& f : m.files) bytes += f.size;
    std::printf("%s  ok  step %lld, %zu files, %.1f MB, world %lld, run %s\n", p.c_str(),
                static_cast<long long>(m.step), m.files.size(), static_cast<double>(bytes) / 1e6,
                static_cast<long long>(m.world_size), m.run_id.c_str());
    std::fflush(stdout);
  }
  if (damaged > 0) std::cout << damaged << " of " << paths.size() << " checkpoint(s) do not verify\n";
  return damaged > 0 ? 1 : 0;
}

}  // namespace

int run_checkpoint_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kCheckpointUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "export") {
    const Args a = parse_args(rest, {"out", "dtype", "hf", "max-shard-size", "peft"}, {"allow-non-finite"});
    if (a.positionals.size() != 1) throw std::invalid_argument("export takes one CHECKPOINT");
    const std::string out = a.get("out", ""), hf = a.get("hf", ""), peft = a.get("peft", "");
    if (!out.empty() + !hf.empty() + !peft.empty() != 1) {
      throw std::invalid_argument("export writes one of --out FILE (one safetensors file), --hf DIR (a model "
                                  "directory) or --peft DIR (a LoRA run's adapter): give one of them");
    }
    if (a.has("max-shard-size") && hf.empty()) throw std::invalid_argument("--max-shard-size goes with --hf DIR");
    std::string path = a.positionals[0];
    ckpt::ExportOptions options;
    options.allow_non_finite = a.has("allow-non-finite");
    const std::string d = a.get("dtype", "");
    if (d == "bf16") options.dtype = at::kBFloat16;
    else if (d == "fp16") options.dtype = at::kHalf;
    else if (d == "fp32") options.dtype = at::kFloat;
    else if (!d.empty()) throw std::invalid_argument("--dtype: '" + d + "' is not one of fp32, bf16, fp16");
    const int64_t max_shard = memory::parse_memory_size(a.get("max-shard-size", "5GB"));
    if (!io::path_exists(path + "/trainer.json")) {
      const auto latest = ckpt::latest_checkpoint(path);
      if (!latest && (io::has_weight_files(path) || (io::path_exists(path) && !io::is_directory(path)))) {
        if (!peft.empty()) throw std::invalid_argument("--peft: '" + path + "' is not a shardtrain checkpoint");
        // Not ours: a distributed checkpoint, Accelerate's save_state, a pytorch_model.bin... (io::WeightFiles).
        if (!hf.empty()) {
          std::cout << hf::export_from_weights(path, hf, options, max_shard) << std::endl;
          return 0;
        }
        const io::WeightFiles files(path);
        const auto tensors = hf::read_weights(files, {}, options);
        io::write_safetensors(out, tensors);
        std::cout << "checkpoint export: " << path << (files.note().empty() ? "" : " (" + files.note() + ")")
                  << " -> " << out << ", " << tensors.size() << " tensors\n";
        return 0;
      }
      if (!latest) throw std::invalid_argument("'" + path + "' is neither a checkpoint nor a directory holding one");
      path = *latest;
    }
    if (!hf.empty()) {
      std::cout << hf::export_directory(path, hf, options, max_shard) << std::endl;
      return 0;
    }
    if (!peft.empty()) {
      std::cout << hf::export_peft_adapter(path, peft, options) << std::endl;
      return 0;
    }
    std::cout << hf::export_model_file(path, out, options) << std::endl;
    return 0;
  }
  if (args[0] == "verify") {
    if (rest.size() != 1) throw std::invalid_argument("verify takes one PATH");
    return verify_command(rest[0]);
  }
  if (args[0] == "list") {
    if (rest.size() != 1) throw std::invalid_argument("list takes one DIR");
    for (const auto& p : ckpt::list_checkpoints(rest[0])) {
      try {
        const auto s = ckpt::read_trainer_state(p);
        std::cout << p << "  step " << s.step << "  world " << s.world_size << "  " << s.flavor << " " << s.strategy
                  << "  run " << s.run_id << "\n";
      } catch (const std::runtime_error& e) {
        std::cout << p << "  unreadable: " << e.what() << "\n";
      }
    }
    return 0;
  }
  std::cerr << "shardtrain checkpoint: unknown sub-command '" << args[0] << "'\n" << kCheckpointUsage;
  return 2;
}

}  // namespace shardtrain::cli
