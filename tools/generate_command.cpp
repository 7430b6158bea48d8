// `shardtrain generate MODEL [PROMPT...]`: the command line of generate::Generator (shardtrain/generate/
// generator.h): the options from the arguments over generation_config.json, the prompts from the arguments and a
// file, and rank 0 printing each completion (or JSON records, or a file) and the rate.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/generate/generator.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/hf_cache.h"
#include "shardtrain/models/generation.h"

namespace shardtrain::cli {
namespace {

const char* kGenerateUsage =
    "usage: shardtrain generate MODEL [PROMPT...] [--prompts FILE] [options]\n"
    "Continues each prompt with a causal language model (llama, mistral, qwen2, qwen3, gpt2) or T5, as\n"
    "transformers' generate() does: greedy, sampled with --do-sample, or beam search with --num-beams; a KV cache\n"
    "keeps each step to one token.\n"
    "MODEL: a Hugging Face model directory (config.json, the weights, the tokenizer's files; what `shardtrain\n"
    "checkpoint export --hf` writes of a run), or a model name in the Hugging Face cache. Defaults come from its\n"
    "generation_config.json where it has one, else transformers' defaults.\n"
    "  --prompts FILE            more prompts: one a line, or a .jsonl file's \"prompt\" (else \"text\", \"input\")\n"
    "  --max-new-tokens N        tokens to generate at most per prompt (20)\n"
    "  --do-sample / --greedy    sample the next token, or take the most likely (greedy)\n"
    "  --temperature T           sampling: the scores divided by T (1.0)\n"
    "  --top-k K                 sampling: the K most likely tokens only, 0 = all (50)\n"
    "  --top-p P                 sampling: the most likely tokens that make up probability P (1.0)\n"
    "  --repetition-penalty R    a token already in the sequence is R times less likely (1.0: none)\n"
    "  --num-beams K             beam search over K hypotheses a prompt (greedy; 1: none)\n"
    "  --length-penalty L        beam search: a finished hypothesis scores log-probability / length^L (1.0)\n"
    "  --early-stopping E        beam search: false (transformers' heuristic), true (at K finished), never\n"
    "  --seed S                  sampling's seed (0)\n"
    "  --batch-size N            prompts generated together (8)\n"
    "  --adapter DIR             a LoRA adapter over MODEL (PEFT's save_pretrained, `shardtrain checkpoint export\n"
    "                            --peft`), its adapters applied as in training, unmerged\n"
    "  --dtype D                 float32, bfloat16 or float16: the weights and the computation (float32)\n"
    "  --device D                cpu, cuda, cuda:N (cpu); under a launcher cuda, each rank on cuda:LOCAL_RANK\n"
    "  --json                    one JSON record a prompt: prompt, completion, tokens, finished (ended by an\n"
    "                            end-of-sequence token)\n"
    "  --out FILE                the results into FILE (written whole at the end) instead of standard output\n"
    "Under `shardtrain launch --nproc-per-node N -- shardtrain generate ...` (or torchrun, srun) the model is sharded\n"
    "over the N ranks, which take the batches in turn and step together; rank 0 writes the results, in order.\n";

// One prompt a line; a .jsonl file's records by their "prompt" (else "text", else "input").
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--prompts: cannot read '" + path + "'");
  const bool jsonl = path.size() > 6 && path.substr(path.size() - 6) == ".jsonl";
  std::vector<std::string> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!jsonl) {
      prompts.push_back(line);
      continue;
    }
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument(path + ":" + std::to_string(number) + ": not a JSON record");
    }
    const char* key = record.contains("prompt") ? "prompt" : record.contains("text") ? "text" : "input";
    if (!record.contains(key) || !record[key].is_string()) {
      throw std::invalid_argument(path + ":" + std::to_string(number) +
                                  ": no \"prompt\", \"text\" or \"input\" string");
    }
    prompts.push_back(record[key].get<std::string>());
  }
  return prompts;
}

// generation_config.json's settings, then the command line's.
models::GenerationOptions generation_options(const std::string& dir, const Args& args, const data::Tokenizer& tok) {
  models::GenerationOptions o = generate::generation_config(dir, tok);
  if (args.has("do-sample") && args.has("greedy")) throw std::invalid_argument("--do-sample and --greedy: give one");
  if (args.has("do-sample")) o.do_sample = true;
  if (args.has("greedy")) o.do_sample = false;
  o.max_new_tokens = args.get_int("max-new-tokens", o.max_new_tokens);
  o.temperature = args.get_double("temperature", o.temperature);
  o.top_k = args.get_int("top-k", o.top_k);
  o.top_p = args.get_double("top-p", o.top_p);
  o.repetition_penalty = args.get_double("repetition-penalty", o.repetition_penalty);
  o.num_beams = args.get_int("num-beams", o.num_beams);
  o.length_penalty = args.get_double("length-penalty", o.length_penalty);
  o.early_stopping = args.get("early-stopping", o.early_stopping);
  o.seed = static_cast<uint64_t>(args.get_int("seed", 0));
  models::check_generation_options(o);
  return o;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16") return at::kHalf;
  throw std::invalid_argument("--dtype: '" + name + "' is not float32, bfloat16 or float16");
}

}  // namespace

int run_generate_command(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << kGenerateUsage;
    return argv.empty() ? 2 : 0;
  }
  const Args args = parse_args(argv,
                               {"prompts", "max-new-tokens", "temperature", "top-k", "top-p", "repetition-penalty",
                                "num-beams", "length-penalty", "early-stopping", "seed", "batch-size", "dtype",
                                "device", "out", "adapter"},
                               {"do-sample", "greedy", "json"});
  if (args.positionals.empty()) throw std::invalid_argument("no MODEL given\n" + std::string(kGenerateUsage));
  const std::string dir = io::resolve_hf_model(args.positionals[0], "MODEL");
  std::vector<std::string> prompts(args.positionals.begin() + 1, args.positionals.end());
  if (args.has("prompts")) {
    for (auto& p : read_prompts(args.get("prompts", ""))) prompts.push_back(std::move(p));
  }
  if (prompts.empty()) throw std::invalid_argument("no prompt: give PROMPT arguments or --prompts FILE");
  const int64_t batch = args.get_int("batch-size", 8);
  if (batch < 1) throw std::invalid_argument("--batch-size " + std::to_string(batch) + ": expected at least 1");

  generate::GeneratorOptions o;
  o.model = dir, o.adapter = args.get("adapter", ""), o.batch_size = batch;
  o.dtype = parse_dtype(args.get("dtype", "float32"));
  o.device = args.get("device", "cpu");
  const dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
  if (env.is_distributed() && o.device.rfind("cuda:", 0) == 0) {
    throw std::invalid_argument("--device " + o.device + " under a launcher of " + std::to_string(env.world_size) +
                                " ranks: give --device cuda (each rank takes cuda:LOCAL_RANK)");
  }
  const auto tokenizer = data::open_tokenizer(dir);
  generate::Generator generator(o, generation_options(dir, args, *tokenizer));
  const models::GenerationOptions& g = generator.generation();
  const bool leader = generator.rank() == 0;
  if (leader) {
    const std::string how = g.do_sample ? "sampling" : g.num_beams > 1 ? "beam search over " + std::to_string(g.num_beams)
                                                                        : "greedy";
    std::fprintf(stderr, "generate: %s; %zu prompt(s), %s, at most %lld new tokens\n", generator.describe().c_str(),
                 prompts.size(), how.c_str(), static_cast<long long>(g.max_new_tokens));
  }
  const auto began = std::chrono::steady_clock::now();
  std::ostringstream results;
  std::ostream& to = args.has("out") ? static_cast<std::ostream&>(results) : std::cout;
  const bool shows = leader && isatty_stderr();
  const int64_t made = generator.run(
      prompts,
      [&](const generate::Completion& c) {
        if (args.has("json")) {
          to << nlohmann::json{{"prompt", prompts[c.prompt]}, {"completion", c.text}, {"tokens", c.tokens},
                               {"finished", c.finished}}
                    .dump()
             << "\n";
        } else {
          to << "[" << c.prompt + 1 << "] " << prompts[c.prompt] << "\n=> " << c.text << "\n";
        }
        std::cout.flush();
      },
      [&](size_t first, size_t end, int64_t token) {
        if (shows) {
          std::fprintf(stderr, "\rgenerate: prompts %zu-%zu of %zu, token %lld", first + 1, end, prompts.size(),
                       static_cast<long long>(token));
        }
      });
  if (shows) std::fprintf(stderr, "\n");
  if (!leader) return 0;
  if (args.has("out")) {
    const std::string text = results.str();
    io::write_file_atomic(args.get("out", ""), std::vector<char>(text.begin(), text.end()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::fprintf(stderr, "generate: %lld tokens for %zu prompt(s) in %.2f s (%.1f tokens/s)\n",
               static_cast<long long>(made), prompts.size(), seconds, static_cast<double>(made) / seconds);
  return 0;
}

}  // namespace shardtrain::cli
