// `shardtrain checkpoint export CHECKPOINT --hf OUT`: a checkpoint as a Hugging Face model directory that
// transformers' from_pretrained loads — config.json, the weights (one file, or shards and an index), and the
// tokenizer the run used.
#include "shardtrain/hf/export.h"

#include <ATen/ops/isfinite.h>
#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/config/config.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors_files.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "train/training_data.h"

namespace shardtrain::hf {
namespace {

namespace fs = std::filesystem;

// printf into a string, for the lines an export returns.
template <class... Args>
std::string format(const char* pattern, Args... args) {
  char text[1024];
  std::snprintf(text, sizeof(text), pattern, args...);
  return text;
}

// Runs a directory export; when it fails (a full disk, a permission), a directory it made is removed with what it
// wrote — each file is written atomically, so a directory that was there keeps only whole files.
template <class Write>
std::string into_directory(const std::string& out, Write&& write) {
  const bool existed = io::path_exists(out);
  try {
    return write();
  } catch (...) {
    if (!existed) {
      try {
        io::remove_tree(out);
      } catch (const std::runtime_error&) {
        // the error below is what matters; the directory is reported by it
      }
    }
    throw;
  }
}

// transformers' name of a dtype in config.json's torch_dtype.
std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}

void write_json(const fs::path& path, const nlohmann::json& json) {
  const std::string text = json.dump(2) + "\n";
  io::write_file_atomic(path.string(), std::vector<char>(text.begin(), text.end()));
}

// `config` written as out/config.json with torch_dtype the weights' (their first floating tensor's; float32 when
// none), and transformers 5's name for it, dtype, where the config has it. Returns that dtype.
at::ScalarType write_config(nlohmann::json& config, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const std::string& out) {
  at::ScalarType dtype = at::kFloat;
  for (const auto& [name, t] : tensors) {
    if (t.is_floating_point()) {
      dtype = t.scalar_type();
      break;
    }
  }
  config["torch_dtype"] = torch_dtype_name(dtype);
  if (config.contains("dtype")) config["dtype"] = torch_dtype_name(dtype);
  write_json(fs::path(out) / "config.json", config);
  return dtype;
}

// The tokenizer files a model directory may hold (transformers' and sentencepiece's names).
const char* kTokenizerFiles[] = {"tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
                                 "vocab.txt",       "vocab.json",            "merges.txt",
                                 "spiece.model",    "tokenizer.model",       "added_tokens.json"};

// The run's config, from the checkpoint's record of it; nullopt (and why, in `note`) when it does not read.
std::optional<config::Config> run_config(const ckpt::TrainerState& state, std::string& note) {
  try {
    return config::parse_config(state.config_yaml, "the checkpoint's config");
  } catch (const std::exception& e) {
    note = std::string("the checkpoint's config does not read (") + e.what() + ")";
    return std::nullopt;
  }
}

// The checkpoint's model: its flavor (or model directory) with the run's model.overrides and its task's head, when
// its config reads. The run's tokenizer, when it is here, gives the padding id a causal LM's classifier keeps.
std::shared_ptr<const models::ModelRecipe> recipe_of_run(const ckpt::TrainerState& state,
                                                         const std::optional<config::Config>& config) {
  if (!config) return models::recipe_of_model(state.flavor);
  models::TaskSetup setup{config->data.labels, config->data.multi_label, std::nullopt, std::nullopt};
  try {
    if (const auto tokenizer = train::open_run_tokenizer(*config)) setup.pad_token_id = tokenizer->pad_id();
  } catch (const std::invalid_argument&) {  // not here: export_tokenizer says so
  }
  return models::with_lora(models::recipe_for_task(models::recipe_of_model(state.flavor, config->model.overrides),
                                                   config->model.task, setup),
                           config->model.lora);
}

// The tokenizer files of directory `dir` copied into `out`; returns their names.
std::vector<std::string> copy_tokenizer_files(const fs::path& dir, const fs::path& out) {
  std::vector<std::string> written;
  for (const char* name : kTokenizerFiles) {
    const fs::path source = dir / name;
    if (!fs::exists(source)) continue;
    const bool in_place = fs::exists(out / name) && fs::equivalent(source, out / name);
    if (!in_place) fs::copy_file(source, out / name, fs::copy_options::overwrite_existing);
    written.push_back(name);
  }
  return written;
}

// The run's tokenizer into `out`: the one the config named (data.tokenizer or data.vocab), else the model
// directory's own files. A tokenizer.json or SentencePiece .model is copied with the transformers files beside it
// (tokenizer_config.json, ...); a bare WordPiece vocab.txt is written as a BertTokenizer. Returns the files written
// and, in `note`, why there are none (`note` arrives saying why `config` is absent, if it is).
std::vector<std::string> export_tokenizer(const ckpt::TrainerState& state, const std::optional<config::Config>& config,
                                          int64_t max_positions, const fs::path& out, std::string& note) {
  const std::string named = !config ? "" : !config->data.tokenizer.empty() ? config->data.tokenizer : config->data.vocab;
  if (named.empty()) {
    if (fs::is_directory(state.flavor)) {
      auto written = copy_tokenizer_files(state.flavor, out);
      if (!written.empty()) return written;
    }
    if (config) note = "the run named no data.tokenizer and its model directory holds none";
    return {};
  }
  const fs::path file = data::tokenizer_file(named);
  if (file.empty() || !fs::is_regular_file(file)) {
    note = "the run's tokenizer '" + named + "' is not here";
    return {};
  }
  if (file.extension() != ".txt") {  // tokenizer.json, *.model: the file and its directory's transformers files
    std::vector<std::string> written = copy_tokenizer_files(file.parent_path(), out);
    const std::string name = file.filename().string();
    if (std::find(written.begin(), written.end(), name) == written.end()) {
      fs::copy_file(file, out / name, fs::copy_options::overwrite_existing);
      written.push_back(name);
    }
    return written;
  }
  fs::copy_file(file, out / "vocab.txt", fs::copy_options::overwrite_existing);
  write_json(out / "tokenizer_config.json", {{"tokenizer_class", "BertTokenizer"},
                                             {"do_lower_case", config->data.lowercase},
                                             {"strip_accents", nullptr},
                                             {"tokenize_chinese_chars", true},
                                             {"model_max_length", max_positions}});
  write_json(out / "special_tokens_map.json", {{"pad_token", "[PAD]"},
                                               {"unk_token", "[UNK]"},
                                               {"cls_token", "[CLS]"},
                                               {"sep_token", "[SEP]"},
                                               {"mask_token", "[MASK]"}});
  return {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"};
}

// A checkpoint's run, read once for an export: its state, its config (nullopt and why, in `note`, when it does not
// read) and its model's recipe.
struct CheckpointRun {
  ckpt::TrainerState state;
  std::string note;
  std::optional<config::Config> config;
  std::shared_ptr<const models::ModelRecipe> recipe;
  bool lora() const { return config && config->model.lora.enabled(); }
};
CheckpointRun read_run(const std::string& checkpoint) {
  CheckpointRun r;
  r.state = ckpt::read_trainer_state(checkpoint);
  r.config = run_config(r.state, r.note);
  r.recipe = recipe_of_run(r.state, r.config);
  return r;
}

}  // namespace

std::vector<ckpt::ExportTensor> export_layout(const models::ModelRecipe& recipe) {
  const auto meta = recipe.build(models::meta_build());
  const auto params = meta->named_parameters(), buffers = meta->named_buffers();
  std::vector<ckpt::ExportTensor> layout;
  for (const auto& [ours, hf] : models::hf_names_of(*meta, recipe.hf_names())) {
    const at::Tensor* like = params.find(ours);
    if (!like) like = buffers.find(ours);
    layout.push_back({ours, hf, like->sizes().vec()});
  }
  return layout;
}

namespace {

// The checkpoint's model under Hugging Face names, a LoRA run's adapters merged into their weights.
std::vector<std::pair<std::string, at::Tensor>> read_model_tensors(const std::string& checkpoint,
                                                                   const CheckpointRun& run,
                                                                   const ckpt::ExportOptions& options) {
  auto tensors = ckpt::read_export_tensors(checkpoint, export_layout(*run.recipe), options);
  if (run.lora()) tensors = models::merge_lora(std::move(tensors), run.config->model.lora, run.recipe->hf_names());
  return tensors;
}

}  // namespace

std::string export_model_file(const std::string& checkpoint, const std::string& out,
                              const ckpt::ExportOptions& options) {
  const CheckpointRun run = read_run(checkpoint);
  if (run.lora()) {  // the adapters merged: the tensors whole in memory, as --hf holds them
    io::write_safetensors(out, read_model_tensors(checkpoint, run, options));
    return "checkpoint export: " + checkpoint + " -> " + out + " (LoRA adapters merged)";
  }
  ckpt::export_checkpoint(checkpoint, out, export_layout(*run.recipe), options);
  return "checkpoint export: " + checkpoint + " -> " + out;
}

std::string export_peft_adapter(const std::string& checkpoint, const std::string& out,
                                const ckpt::ExportOptions& options) {
  const CheckpointRun r = read_run(checkpoint);
  if (!r.lora()) {
    throw std::invalid_argument("--peft: " + checkpoint + " is not of a LoRA run (model.lora.r was 0" +
                                (r.config ? std::string(")") : "; " + r.note + ")") + "; export the model with --hf");
  }
  const config::Config& run = *r.config;
  const models::LoraTargets targets = models::lora_targets(*r.recipe, run.model.lora);
  std::vector<ckpt::ExportTensor> layout;  // the adapter's tensors alone are read, not the base model's
  for (const ckpt::ExportTensor& t : export_layout(*r.recipe)) {
    if (models::in_lora_adapter(t.file_name, targets)) layout.push_back(t);
  }
  const auto adapter = models::lora_adapter_tensors(ckpt::read_export_tensors(checkpoint, layout, options), targets);
  return into_directory(out, [&] {
    io::make_directories(out);
    io::write_safetensors((fs::path(out) / "adapter_model.safetensors").string(), adapter);
    const std::string base = run.model.from.empty() ? r.state.flavor : run.model.from;
    const std::string config = models::lora_adapter_config(run.model.lora, targets, run.model.task, base);
    write_json(fs::path(out) / "adapter_config.json", nlohmann::json::parse(config));
    return format("checkpoint export: %s -> %s (adapter_config.json, adapter_model.safetensors; %zu tensors; LoRA %s)",
                  checkpoint.c_str(), out.c_str(), adapter.size(),
                  models::describe_lora(run.model.lora, targets).c_str());
  });
}

std::string export_directory(const std::string& checkpoint, const std::string& out,
                             const ckpt::ExportOptions& options, int64_t max_shard_bytes) {
  const CheckpointRun r = read_run(checkpoint);
  const ckpt::TrainerState& state = r.state;
  std::string note = r.note;
  const std::optional<config::Config>& run = r.config;
  const auto& recipe = r.recipe;
  const auto tensors = read_model_tensors(checkpoint, r, options);
  return into_directory(out, [&] {
  io::make_directories(out);
  const std::vector<std::string> weights = io::write_safetensors_files(out, tensors, max_shard_bytes);

  // A model from a Hugging Face directory keeps that directory's config.json (every key of it, for the tools that
  // read more than shardtrain does) with the recipe's keys over it (a task's head: BertForMaskedLM fine-tuned into
  // BertForSequenceClassification with its id2label) unless model.overrides changed its size; a zoo flavor's is the
  // recipe's.
  const fs::path source_config = fs::is_directory(state.flavor) ? fs::path(state.flavor) / "config.json"
                                                                 : fs::path(state.flavor);
  nlohmann::json config = nlohmann::json::parse(recipe->hf_config_json());
  if (recipe->flavor() == state.flavor && fs::is_regular_file(source_config) && source_config.extension() == ".json") {
    const std::vector<char> bytes = io::read_file(source_config.string());
    nlohmann::json source = nlohmann::json::parse(bytes.begin(), bytes.end());
    source.merge_patch(config);
    config = std::move(source);
  }
  const at::ScalarType dtype = write_config(config, tensors, out);

  int64_t max_positions = 512;
  if (config.contains("max_position_embeddings") && config["max_position_embeddings"].is_number_integer()) {
    max_positions = config["max_position_embeddings"].get<int64_t>();
  }
  if (config.contains("text_config") && config["text_config"].contains("max_position_embeddings")) {
    max_positions = config["text_config"]["max_position_embeddings"].get<int64_t>();
  }
  const std::vector<std::string> tokenizer = export_tokenizer(state, run, max_positions, out, note);

  int64_t bytes = 0;
  for (const auto& [name, t] : tensors) bytes += static_cast<int64_t>(t.numel()) * t.element_size();
  std::string files = "config.json";
  for (const auto& f : weights) files += ", " + f;
  for (const auto& f : tokenizer) files += ", " + f;
  return format("checkpoint export: %s -> %s (%s; %zu tensors, %.1f MB in %s)", checkpoint.c_str(), out.c_str(),
                files.c_str(), tensors.size(), static_cast<double>(bytes) / 1e6, torch_dtype_name(dtype).c_str()) +
         (tokenizer.empty() ? "\n  no tokenizer files: " + note : "");
  });
}

std::vector<std::pair<std::string, at::Tensor>> read_weights(const io::WeightFiles& files,
                                                             const std::vector<std::string>& names,
                                                             const ckpt::ExportOptions& options) {
  std::vector<std::string> all;
  for (const io::WeightEntry& e : files.entries()) all.push_back(e.name);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const std::string& name : names.empty() ? all : names) {
    at::Tensor t = files.read(name);
    if (options.dtype && t.is_floating_point()) t = t.to(*options.dtype);
    if (!options.allow_non_finite && t.is_floating_point() && !at::isfinite(t).all().item<bool>()) {
      throw std::runtime_error(files.path() + ": '" + name + "' holds NaN or Inf values (--allow-non-finite writes "
                               "them)");
    }
    out.emplace_back(name, std::move(t));
  }
  return out;
}

std::string export_from_weights(const std::string& path, const std::string& out, const ckpt::ExportOptions& options,
                                int64_t max_shard_bytes) {
  const fs::path source = fs::path(path).lexically_normal();
  fs::path config_dir = source;
  if (!fs::exists(config_dir / "config.json")) config_dir = (source / "..").lexically_normal();
  if (!fs::exists(config_dir / "config.json")) {
    throw std::invalid_argument("'" + path + "' has no config.json beside it (nor in the directory above): a model "
                                "directory needs the model's; copy it there");
  }
  const auto recipe = models::recipe_of_model(config_dir.string());
  const io::WeightFiles files(path);
  std::vector<std::string> names, missing;
  for (const ckpt::ExportTensor& e : export_layout(*recipe)) {
    const io::WeightEntry* w = files.find(e.file_name);
    if (w != nullptr && w->shape == e.shape) {
      names.push_back(e.file_name);
    } else {
      missing.push_back("'" + e.file_name + "'" + (w != nullptr ? " (another shape)" : ""));
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 4; ++i) list += (i ? ", " : "") + missing[i];
    throw std::runtime_error(path + ": not the model of " + (config_dir / "config.json").string() + ": " +
                             std::to_string(missing.size()) + " of its tensors are not in it in their shape (" + list +
                             (missing.size() > 4 ? ", ..." : "") + ")");
  }
  const auto tensors = read_weights(files, names, options);
  return into_directory(out, [&] {
  io::make_directories(out);
  const std::vector<std::string> weights = io::write_safetensors_files(out, tensors, max_shard_bytes);

  const std::vector<char> bytes = io::read_file((config_dir / "config.json").string());
  nlohmann::json config = nlohmann::json::parse(bytes.begin(), bytes.end());
  write_config(config, tensors, out);
  const std::vector<std::string> tokenizer = copy_tokenizer_files(config_dir, out);

  std::string written = "config.json";
  for (const auto& f : weights) written += ", " + f;
  for (const auto& f : tokenizer) written += ", " + f;
  return format("checkpoint export: %s -> %s (%s; %zu tensors of the model, %zu others left%s%s)", path.c_str(),
                out.c_str(), written.c_str(), tensors.size(), files.entries().size() - tensors.size(),
                files.note().empty() ? "" : "; ", files.note().c_str());
  });
}

}  // namespace shardtrain::hf
