#include "shardtrain/generate/generator.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "shardtrain/config/config.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/text_exchange.h"
#include "shardtrain/io/files.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::generate {
namespace {

nlohmann::json read_json(const std::string& path) {
  if (!io::path_exists(path)) return nlohmann::json::object();
  const std::vector<char> bytes = io::read_file(path);
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path + ": not JSON (" + e.what() + ")");
  }
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

at::Device device_named(const std::string& name) {
  try {
    return at::Device(name);
  } catch (const c10::Error&) {
    throw std::invalid_argument("device '" + name + "' is not cpu, cuda or cuda:N");
  }
}

nlohmann::json completions_json(const std::vector<Completion>& done) {
  nlohmann::json out = nlohmann::json::array();
  for (const Completion& c : done) {
    out.push_back({{"prompt", c.prompt}, {"text", c.text}, {"tokens", c.tokens}, {"finished", c.finished}});
  }
  return out;
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

models::GenerationOptions generation_config(const std::string& dir, const data::Tokenizer& tok) {
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
  return o;
}

Generator::Generator(const GeneratorOptions& options, models::GenerationOptions generation)
    : options_(options), generation_(std::move(generation)), env_(dist::read_dist_env(dist::process_env_lookup())) {
  if (options_.batch_size < 1) {
    throw std::invalid_argument("batch size " + std::to_string(options_.batch_size) + ": expected at least 1");
  }
  models::check_generation_options(generation_);
  device_ = device_named(options_.device);
  if (env_.is_distributed()) {
    if (device_.is_cuda() && device_.has_index()) {
      throw std::invalid_argument("device " + options_.device + " under a launcher of " +
                                  std::to_string(env_.world_size) + " ranks: give cuda (each rank takes "
                                  "cuda:LOCAL_RANK)");
    }
    device_ = dist::rank_device(device_.is_cuda(), env_, "device cuda");
    world_ = dist::ProcessGroup::init(env_, dist::group_options_for(device_, env_));
    generation_.synced = world_->world();
  }
  tokenizer_ = data::open_tokenizer(options_.model);
  auto recipe = models::recipe_of_model(options_.model);
  std::string adapter_file;
  if (!options_.adapter.empty()) {
    const models::LoraSpec lora = config::read_peft_adapter(options_.adapter, "the adapter");
    recipe = models::with_lora(recipe, lora);
    adapted_ = ", adapter " + models::describe_lora(lora, models::lora_targets(*recipe, lora));
    adapter_file = models::lora_adapter_file(options_.adapter);
  }
  models::BuildOptions build;
  build.tensors = at::TensorOptions().dtype(options_.dtype).device(device_);
  models::LoadOptions adapter;
  adapter.lora_adapter = true;
  if (!world_) {  // whole
    model_ = models::build_model(std::move(recipe), build);
    models::load_weights(*model_.module, options_.model, model_.names);
    if (!adapter_file.empty()) models::load_weights(*model_.module, adapter_file, model_.names, adapter);
  } else {  // sharded: each rank reads its rows
    const dist::DeviceMesh mesh = dist::DeviceMesh::create(*world_, 1);
    model_ = models::build_parallel(std::move(recipe), mesh, models::ParallelizeOptions{}, build);
    models::load_weights_sharded(model_.module, options_.model, model_.names);
    if (!adapter_file.empty()) {
      models::load_weights_sharded(model_.module, adapter_file, model_.names, std::nullopt, adapter);
    }
  }
  model_.module->eval();
}

std::string Generator::describe() const {
  const std::string sharded = env_.world_size > 1 ? ", sharded over " + std::to_string(env_.world_size) + " ranks" : "";
  return options_.model + " (" + model_.family + adapted_ + sharded + "), " + tokenizer_->describe();
}

int64_t Generator::run(const std::vector<std::string>& prompts, const std::function<void(const Completion&)>& each,
                       const std::function<void(size_t, size_t, int64_t)>& progress) {
  const int ranks = env_.world_size, rank = env_.rank;
  const size_t batch = static_cast<size_t>(options_.batch_size);
  // Batches of `batch` prompts in order; round k gives batch k * ranks + r to rank r. A rank left without one in
  // the last round generates from the first batch again, unreported, so that every rank steps alike.
  const size_t batches = (prompts.size() + batch - 1) / batch;
  const size_t rounds = (batches + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  int64_t made = 0;
  for (size_t round = 0; round < rounds; ++round) {
    const size_t mine = round * static_cast<size_t>(ranks) + static_cast<size_t>(rank);
    const bool reported = mine < batches;
    const size_t first = (reported ? mine : 0) * batch;
    const size_t end = std::min(prompts.size(), first + batch);
    std::vector<std::vector<int64_t>> rows;
    for (size_t i = first; i < end; ++i) rows.push_back(tokenizer_->encode(prompts[i], data::kWholeText).ids);
    auto [ids, mask] = left_padded(rows, tokenizer_->pad_id());
    const auto decoder = model_.recipe->text_decoder(*model_.module);
    auto step = [&](int64_t token) {
      if (progress) progress(first, end, token);
    };
    const models::Generated out = models::generate(*decoder, ids.to(device_), mask.to(device_), generation_, step);
    const at::Tensor tokens = out.tokens.cpu();
    std::vector<Completion> done;
    for (size_t i = first; reported && i < end; ++i) {
      const int64_t row = static_cast<int64_t>(i - first), length = out.lengths[static_cast<size_t>(row)];
      Completion c{i, "", std::vector<int64_t>(static_cast<size_t>(length)), false};
      for (int64_t j = 0; j < length; ++j) c.tokens[static_cast<size_t>(j)] = tokens[row][j].item<int64_t>();
      c.finished = length > 0 && std::find(generation_.eos_token_ids.begin(), generation_.eos_token_ids.end(),
                                           c.tokens.back()) != generation_.eos_token_ids.end();
      c.text = tokenizer_->decode(c.tokens, /*skip_special=*/true);
      done.push_back(std::move(c));
    }
    // Every rank's completions of the round, in rank order (rank r had the round's r-th batch): a collective.
    std::vector<Completion> all = done;
    if (world_) {
      all.clear();
      for (const std::string& text : dist::all_gather_text(world_->world(), completions_json(done).dump())) {
        for (const nlohmann::json& j : nlohmann::json::parse(text)) {
          all.push_back({j["prompt"].get<size_t>(), j["text"].get<std::string>(),
                         j["tokens"].get<std::vector<int64_t>>(), j["finished"].get<bool>()});
        }
      }
    }
    for (const Completion& c : all) {
      made += static_cast<int64_t>(c.tokens.size());
      if (rank == 0 && each) each(c);
    }
  }
  return made;
}

}  // namespace shardtrain::generate
