// `shardtrain generate MODEL [PROMPT...]`: text continued by a causal language model or T5, as transformers'
// generate() continues it (models/generation.h), from a Hugging Face model directory — what `shardtrain checkpoint
// export --hf` writes of a run. Under a launcher (`shardtrain launch`, torchrun, srun) the model is sharded over
// the job's ranks (FULL_SHARD, each rank reading its rows of the weights), each rank continues batches of its own,
// stepping with the others (GenerationOptions::synced), and rank 0 writes every result in the prompts' order.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/config/config.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/distributed/text_exchange.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/hf_cache.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"

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

nlohmann::json read_json(const std::string& path) {
  if (!io::path_exists(path)) return nlohmann::json::object();
  const std::vector<char> bytes = io::read_file(path);
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path + ": not JSON (" + e.what() + ")");
  }
}

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

// The ids under `key` of generation_config.json, else config.json: a number, a list, or null.
std::vector<int64_t> token_ids(const nlohmann::json& generation, const nlohmann::json& config, const char* key) {
  for (const nlohmann::json* j : {&generation, &config}) {
    if (!j->contains(key) || (*j)[key].is_null()) continue;
    const nlohmann::json& v = (*j)[key];
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (v.is_array()) return v.get<std::vector<int64_t>>();
  }
  return {};
}

// generation_config.json's settings (transformers' defaults where it has none), then the command line's.
models::GenerationOptions generation_options(const std::string& dir, const Args& args, const data::Tokenizer& tok) {
  const nlohmann::json generation = read_json(dir + "/generation_config.json");
  const nlohmann::json config = read_json(dir + "/config.json");
  models::GenerationOptions o;
  auto number = [&generation](const char* key, auto& field) {
    if (generation.contains(key) && generation[key].is_number()) {
      field = generation[key].get<std::decay_t<decltype(field)>>();
    }
  };
  number("max_new_tokens", o.max_new_tokens);
  number("temperature", o.temperature);
  number("top_k", o.top_k);
  number("top_p", o.top_p);
  number("repetition_penalty", o.repetition_penalty);
  number("num_beams", o.num_beams);
  number("length_penalty", o.length_penalty);
  if (generation.contains("do_sample") && generation["do_sample"].is_boolean()) o.do_sample = generation["do_sample"];
  if (generation.contains("early_stopping")) {  // true, false or "never"
    const nlohmann::json& e = generation["early_stopping"];
    if (e.is_boolean()) o.early_stopping = e.get<bool>() ? "true" : "false";
    if (e.is_string()) o.early_stopping = e.get<std::string>();
  }
  o.eos_token_ids = token_ids(generation, config, "eos_token_id");
  if (o.eos_token_ids.empty() && tok.eos_id()) o.eos_token_ids = {*tok.eos_id()};
  const std::vector<int64_t> pad = token_ids(generation, config, "pad_token_id");
  o.pad_token_id = !pad.empty() ? pad[0] : !o.eos_token_ids.empty() ? o.eos_token_ids[0] : tok.pad_id();

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

at::Device parse_device(const std::string& name) {
  try {
    return at::Device(name);
  } catch (const c10::Error&) {
    throw std::invalid_argument("--device: '" + name + "' is not cpu, cuda or cuda:N");
  }
}

// Where generation runs: one process, or every rank of the launcher's job (`world`: its process group), each on
// its own device.
struct Place {
  dist::DistEnv env;
  at::Device device = at::kCPU;
  std::optional<dist::ProcessGroup> world;
};

Place place_of(const Args& args) {
  Place p;
  p.env = dist::read_dist_env(dist::process_env_lookup());
  const std::string name = args.get("device", "cpu");
  p.device = parse_device(name);
  if (!p.env.is_distributed()) return p;
  if (p.device.is_cuda() && p.device.has_index()) {
    throw std::invalid_argument("--device " + name + " under a launcher of " + std::to_string(p.env.world_size) +
                                " ranks: give --device cuda (each rank takes cuda:LOCAL_RANK)");
  }
  p.device = dist::rank_device(p.device.is_cuda(), p.env, "--device cuda");
  p.world = dist::ProcessGroup::init(p.env, dist::group_options_for(p.device, p.env));
  return p;
}

// The model with MODEL's weights (and --adapter's), whole, or sharded over the job's ranks (each reads its rows).
models::ZooModel load_model(std::shared_ptr<const models::ModelRecipe> recipe, const models::BuildOptions& build,
                            const std::string& dir, const Args& args, Place& place) {
  models::LoadOptions adapter;
  adapter.lora_adapter = true;
  const std::string adapter_file = args.has("adapter") ? models::lora_adapter_file(args.get("adapter", "")) : "";
  if (!place.world) {
    models::ZooModel model = models::build_model(std::move(recipe), build);
    models::load_weights(*model.module, dir, model.names);
    if (!adapter_file.empty()) models::load_weights(*model.module, adapter_file, model.names, adapter);
    return model;
  }
  const dist::DeviceMesh mesh = dist::DeviceMesh::create(*place.world, 1);
  models::ZooModel model = models::build_parallel(std::move(recipe), mesh, models::ParallelizeOptions{}, build);
  models::load_weights_sharded(model.module, dir, model.names);
  if (!adapter_file.empty()) {
    models::load_weights_sharded(model.module, adapter_file, model.names, std::nullopt, adapter);
  }
  return model;
}

// One prompt's result.
struct Completion {
  size_t prompt = 0;  // its place among the prompts
  std::string text;
  std::vector<int64_t> tokens;
  bool finished = false;  // ended by an end-of-sequence token
};

nlohmann::json completions_json(const std::vector<Completion>& done) {
  nlohmann::json out = nlohmann::json::array();
  for (const Completion& c : done) {
    out.push_back({{"prompt", c.prompt}, {"text", c.text}, {"tokens", c.tokens}, {"finished", c.finished}});
  }
  return out;
}

// Every rank's completions of one round, in rank order (rank r had the round's r-th batch): a collective.
std::vector<Completion> gathered(const std::vector<Completion>& mine, const Place& place) {
  if (!place.world) return mine;
  std::vector<Completion> all;
  for (const std::string& text : dist::all_gather_text(place.world->world(), completions_json(mine).dump())) {
    for (const nlohmann::json& j : nlohmann::json::parse(text)) {
      all.push_back({j["prompt"].get<size_t>(), j["text"].get<std::string>(), j["tokens"].get<std::vector<int64_t>>(),
                     j["finished"].get<bool>()});
    }
  }
  return all;
}

// The prompts' ids left-padded into (B, T) with their mask.
std::pair<at::Tensor, at::Tensor> left_padded(const std::vector<std::vector<int64_t>>& rows, int64_t pad) {
  size_t width = 1;
  for (const auto& r : rows) width = std::max(width, r.size());
  const auto shape = std::vector<int64_t>{static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)};
  at::Tensor ids = at::full(shape, pad, at::kLong), mask = at::zeros(shape, at::kLong);
  auto I = ids.accessor<int64_t, 2>();
  auto M = mask.accessor<int64_t, 2>();
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t first = width - rows[i].size();
    for (size_t j = 0; j < rows[i].size(); ++j) {
      I[static_cast<int64_t>(i)][static_cast<int64_t>(first + j)] = rows[i][j];
      M[static_cast<int64_t>(i)][static_cast<int64_t>(first + j)] = 1;
    }
  }
  return {ids, mask};
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

  const auto tokenizer = data::open_tokenizer(dir);
  models::GenerationOptions options = generation_options(dir, args, *tokenizer);
  const at::ScalarType dtype = parse_dtype(args.get("dtype", "float32"));
  Place place = place_of(args);
  const int ranks = place.env.world_size, rank = place.env.rank;
  if (place.world) options.synced = place.world->world();
  models::BuildOptions build;
  build.tensors = at::TensorOptions().dtype(dtype).device(place.device);
  auto recipe = models::recipe_of_model(dir);
  std::string adapted;
  if (args.has("adapter")) {
    const models::LoraSpec lora = config::read_peft_adapter(args.get("adapter", ""), "--adapter");
    recipe = models::with_lora(recipe, lora);
    adapted = ", adapter " + models::describe_lora(lora, models::lora_targets(*recipe, lora));
  }
  models::ZooModel model = load_model(recipe, build, dir, args, place);
  model.module->eval();
  const std::string sharded = ranks > 1 ? ", sharded over " + std::to_string(ranks) + " ranks" : "";
  if (rank == 0) {
    const std::string how = options.do_sample       ? "sampling"
                            : options.num_beams > 1 ? "beam search over " + std::to_string(options.num_beams)
                                                    : "greedy";
    std::fprintf(stderr, "generate: %s (%s%s%s), %s; %zu prompt(s), %s, at most %lld new tokens\n", dir.c_str(),
                 model.family.c_str(), adapted.c_str(), sharded.c_str(), tokenizer->describe().c_str(),
                 prompts.size(), how.c_str(), static_cast<long long>(options.max_new_tokens));
  }

  // Batches of `batch` prompts in order; round k gives batch k * ranks + r to rank r. A rank left without one in
  // the last round generates from the first batch again, unreported, so that every rank steps alike.
  const size_t batches = (prompts.size() + static_cast<size_t>(batch) - 1) / static_cast<size_t>(batch);
  const size_t rounds = (batches + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  const auto began = std::chrono::steady_clock::now();
  int64_t made = 0;
  std::ostringstream results;
  std::ostream& to = args.has("out") ? static_cast<std::ostream&>(results) : std::cout;
  for (size_t round = 0; round < rounds; ++round) {
    const size_t mine = round * static_cast<size_t>(ranks) + static_cast<size_t>(rank);
    const bool reported = mine < batches;
    const size_t first = (reported ? mine : 0) * static_cast<size_t>(batch);
    const size_t end = std::min(prompts.size(), first + static_cast<size_t>(batch));
    std::vector<std::vector<int64_t>> rows;
    for (size_t i = first; i < end; ++i) rows.push_back(tokenizer->encode(prompts[i], data::kWholeText).ids);
    auto [ids, mask] = left_padded(rows, tokenizer->pad_id());
    const auto decoder = model.recipe->text_decoder(*model.module);
    const bool shows = rank == 0 && isatty_stderr();
    auto progress = [&](int64_t step) {
      if (shows) {
        std::fprintf(stderr, "\rgenerate: prompts %zu-%zu of %zu, token %lld", first + 1, end, prompts.size(),
                     static_cast<long long>(step));
      }
    };
    const models::Generated out =
        models::generate(*decoder, ids.to(place.device), mask.to(place.device), options, progress);
    if (shows) std::fprintf(stderr, "\n");
    const at::Tensor tokens = out.tokens.cpu();
    std::vector<Completion> done;
    for (size_t i = first; reported && i < end; ++i) {
      const int64_t row = static_cast<int64_t>(i - first), length = out.lengths[static_cast<size_t>(row)];
      Completion c{i, "", std::vector<int64_t>(static_cast<size_t>(length)), false};
      for (int64_t j = 0; j < length; ++j) c.tokens[static_cast<size_t>(j)] = tokens[row][j].item<int64_t>();
      c.finished = length > 0 && std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(),
                                           c.tokens.back()) != options.eos_token_ids.end();
      c.text = tokenizer->decode(c.tokens, /*skip_special=*/true);
      done.push_back(std::move(c));
    }
    for (const Completion& c : gathered(done, place)) {
      made += static_cast<int64_t>(c.tokens.size());
      if (rank != 0) continue;
      if (args.has("json")) {
        to << nlohmann::json{{"prompt", prompts[c.prompt]}, {"completion", c.text}, {"tokens", c.tokens},
                             {"finished", c.finished}}
                  .dump()
           << "\n";
      } else {
        to << "[" << c.prompt + 1 << "] " << prompts[c.prompt] << "\n=> " << c.text << "\n";
      }
    }
    std::cout.flush();
  }
  if (rank != 0) return 0;
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
