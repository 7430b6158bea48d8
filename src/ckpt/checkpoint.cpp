#include "shardtrain/ckpt/checkpoint.h"

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/distributed/text_exchange.h"
#include "shardtrain/fsdp/state_dict.h"
#include "shardtrain/io/checksum.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/optim/optimizer_state.h"

namespace shardtrain::ckpt {
namespace {

constexpr const char* kPartial = ".partial";

// The default generators a run draws from (dropout, masks drawn on the device): the CPU's and, on a machine with
// GPUs, each device's, keyed "cpu", "cuda:0", ...
std::vector<std::pair<std::string, at::Generator>> default_generators() {
  std::vector<std::pair<std::string, at::Generator>> out = {{"cpu", at::detail::getDefaultCPUGenerator()}};
  if (at::hasCUDA()) {
    for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(at::getNumGPUs()); ++i) {
      out.emplace_back("cuda:" + std::to_string(i), at::globalContext().defaultGenerator(c10::Device(at::kCUDA, i)));
    }
  }
  return out;
}

std::string rng_file(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "/rng-rank%05d.pt", rank);
  return dir + name;
}

bool is_step_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("step-", 0) != 0) return false;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

std::vector<char> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// name -> parameter, and the optimizer state tensors of the parameters that have state.
std::map<std::string, at::Tensor> named_parameters(const torch::nn::Module& root) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : root.named_parameters()) out.emplace(p.key(), p.value());
  return out;
}

fsdp::ParamStates moments(const CheckpointModel& model) {
  fsdp::ParamStates states;
  auto& state = model.optimizer->state();
  for (const auto& [name, p] : named_parameters(*model.root)) {
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    for (auto& [key, tensor] : optim::state_tensors(*it->second, p)) states[key][name] = std::move(tensor);
  }
  return states;
}

std::map<std::string, int64_t> optimizer_steps(const CheckpointModel& model) {
  std::map<std::string, int64_t> steps;
  auto& state = model.optimizer->state();
  for (const auto& [name, p] : named_parameters(*model.root)) {
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it != state.end()) steps[name] = optim::state_step(*it->second);
  }
  return steps;
}

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }


// Rank r hashes the files at positions r, r + W, ... of the sorted listing (the page cache still holds what was just
// written); the entries are gathered and sorted into one manifest, returned on every rank.
Manifest describe_checkpoint(const std::string& dir, const TrainerState& state, const dist::Communicator& world) {
  const std::vector<std::string> files = checkpoint_files(dir);
  std::vector<std::string> share;
  for (size_t i = static_cast<size_t>(world.rank()); i < files.size(); i += static_cast<size_t>(world.size())) {
    share.push_back(files[i]);
  }
  nlohmann::json mine = nlohmann::json::array();
  for (const ManifestFile& f : describe_files(dir, share)) mine.push_back({f.path, f.size, f.xxh3});
  Manifest m;
  m.run_id = state.run_id, m.step = state.step, m.world_size = world.size();
  m.config_hash = io::to_hex(io::checksum_bytes(state.config_yaml));
  for (const std::string& text : dist::all_gather_text(world, mine.dump())) {
    for (const auto& f : nlohmann::json::parse(text)) {
      m.files.push_back({f[0].get<std::string>(), f[1].get<int64_t>(), f[2].get<uint64_t>()});
    }
  }
  std::sort(m.files.begin(), m.files.end(), [](const ManifestFile& a, const ManifestFile& b) { return a.path < b.path; });
  return m;
}

}  // namespace

std::string step_directory_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string save_checkpoint(const std::string& dir, const TrainerState& given, const CheckpointModel& model,
                            const dist::Communicator& world) {
  const std::string final_path = dir + "/" + step_directory_name(given.step);
  const std::string tmp = final_path + kPartial;
  const bool leader = world.rank() == 0;
  if (leader) {
    io::make_directories(dir);
    io::remove_tree(tmp);  // a crashed attempt at the same step
    io::make_directories(tmp);
  }
  world.barrier().wait();

  TrainerState state = given;
  state.optimizer_steps = optimizer_steps(model);
  const fsdp::ParamStates states = moments(model);
  if (model.sharded) {
    fsdp::save_sharded_state_dict(model.root, tmp + "/model", states);
  } else if (leader) {
    auto dict = new_dict();
    // On their device: io::save_pickle copies one storage at a time to the host as it writes.
    for (const auto& [name, p] : named_parameters(*model.root)) dict.insert(name, p.detach());
    for (const auto& b : model.root->named_buffers()) dict.insert(b.key(), b.value().detach());
    for (const auto& [key, tensors] : states) {
      for (const auto& [name, t] : tensors) dict.insert(name + "::" + key, t.tensor.detach());
    }
    io::save_pickle(tmp + "/model.pt", dict);
  }
  {
    auto rng = new_dict();
    for (auto& [key, generator] : default_generators()) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng.insert(key, generator.get_state());
    }
    io::save_pickle(rng_file(tmp, world.rank()), rng);
  }
  if (!model.hf_names.empty()) {
    std::map<std::string, at::Tensor> full;
    if (model.sharded) {
      full = fsdp::full_state_dict(model.root, /*rank0_only=*/true);  // collective
    } else if (leader) {
      for (const auto& [name, p] : named_parameters(*model.root)) full[name] = p.detach().cpu();
      for (const auto& b : model.root->named_buffers()) full[b.key()] = b.value().detach().cpu();
    }
    if (leader) {
      std::vector<std::pair<std::string, at::Tensor>> named;
      for (const auto& [ours, hf] : model.hf_names) named.emplace_back(hf, full.at(ours));
      io::write_safetensors(tmp + "/model.safetensors", named);
    }
  }
  world.barrier().wait();  // every rank's files are on disk
  if (leader) io::write_file_atomic(tmp + "/trainer.json", to_bytes(trainer_state_json(state)));
  world.barrier().wait();
  const Manifest manifest = describe_checkpoint(tmp, state, world);  // collective
  if (leader) {
    write_manifest(tmp, manifest);
    io::sync_path(tmp);
    io::remove_tree(final_path);  // a checkpoint of this step from an earlier run of the same directory
    io::rename_durable(tmp, final_path);
  }
  world.barrier().wait();
  return final_path;
}

TrainerState read_trainer_state(const std::string& path) {
  const std::string file = path + "/trainer.json";
  if (!io::path_exists(file)) {
    throw std::runtime_error("'" + path + "' is not a shardtrain checkpoint (no trainer.json)");
  }
  const std::vector<char> bytes = io::read_file(file);
  return parse_trainer_state(std::string(bytes.begin(), bytes.end()), file);
}

std::string verify_checkpoint(const std::string& path, const dist::Communicator& world) {
  const std::string mine = verify_files(path, world.rank(), world.size());
  for (const std::string& problem : dist::all_gather_text(world, mine)) {
    if (!problem.empty()) return problem;  // the lowest rank's
  }
  return "";
}

TrainerState load_checkpoint(const std::string& path, const CheckpointModel& model, const dist::Communicator& world) {
  const std::string problem = verify_checkpoint(path, world);
  if (!problem.empty()) throw CheckpointDamaged(path + " does not verify: " + problem);
  TrainerState state = read_trainer_state(path);
  c10::AutoGradMode no_grad(false);
  // Optimizer state for every parameter that had some, filled from the files below.
  const auto params = named_parameters(*model.root);
  for (const auto& [name, steps] : state.optimizer_steps) {
    auto it = params.find(name);
    if (it == params.end()) {
      throw std::runtime_error(path + ": optimizer state for '" + name + "', which the model does not have");
    }
    optim::install_empty_state(*model.optimizer, it->second, steps);
  }
  const fsdp::ParamStates states = moments(model);
  if (model.sharded) {
    if (!io::path_exists(path + "/model")) throw std::runtime_error(path + ": no sharded model (model/); saved with DDP?");
    fsdp::load_sharded_state_dict(model.root, path + "/model", states);
  } else {
    const std::string file = path + "/model.pt";
    if (!io::path_exists(file)) throw std::runtime_error(path + ": no model.pt; saved with FSDP?");
    const auto dict = io::load_pickle(file).toGenericDict();
    auto take = [&](const std::string& name, const at::Tensor& dst) {
      auto it = dict.find(name);
      if (it == dict.end()) throw std::runtime_error(file + ": no entry '" + name + "'");
      const at::Tensor src = it->value().toTensor();
      if (src.sizes() != dst.sizes()) {
        throw std::runtime_error(file + ": '" + name + "' has shape " + c10::str(src.sizes()) + ", the model's is " +
                                 c10::str(dst.sizes()));
      }
      dst.detach().copy_(src);
    };
    for (const auto& [name, p] : params) take(name, p);
    for (const auto& b : model.root->named_buffers()) take(b.key(), b.value());
    for (const auto& [key, tensors] : states) {
      for (const auto& [name, t] : tensors) take(name + "::" + key, t.tensor);
    }
  }
  // Generator states only mean the same thing at the same world size (each rank restores its own).
  if (state.world_size == world.size() && io::path_exists(rng_file(path, world.rank()))) {
    const auto rng = io::load_pickle(rng_file(path, world.rank())).toGenericDict();
    for (auto& [key, generator] : default_generators()) {
      if (!rng.contains(key)) continue;  // saved on a machine without this device
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng.at(key).toTensor());
    }
  }
  world.barrier().wait();
  return state;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  if (!io::is_directory(dir)) return out;
  for (const auto& name : io::list_directory(dir)) {  // sorted; zero-padded steps sort numerically
    if (is_step_name(name) && io::is_directory(dir + "/" + name)) out.push_back(dir + "/" + name);
  }
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string run_id_of(const std::string& path) {
  try {
    return read_manifest(path).run_id;
  } catch (const std::runtime_error&) {
    return "";
  }
}

void prune_checkpoints(const std::string& dir, int64_t keep, const std::string& run_id) {
  if (!io::is_directory(dir)) return;
  for (const auto& name : io::list_directory(dir)) {
    const std::string suffix = kPartial;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        is_step_name(name.substr(0, name.size() - suffix.size()))) {
      io::remove_tree(dir + "/" + name);
    }
  }
  if (keep <= 0) return;
  std::vector<std::string> own;
  for (const std::string& path : list_checkpoints(dir)) {
    if (!run_id.empty() && run_id_of(path) == run_id) own.push_back(path);
  }
  for (size_t i = 0; i + static_cast<size_t>(keep) < own.size(); ++i) io::remove_tree(own[i]);
}

std::vector<std::pair<std::string, at::Tensor>> read_export_tensors(const std::string& path,
                                                                    const std::vector<ExportTensor>& tensors,
                                                                    const ExportOptions& options) {
  const std::string problem = verify_files(path);
  if (!problem.empty()) throw std::runtime_error(path + " does not verify: " + problem);
  const TrainerState state = read_trainer_state(path);
  std::map<std::string, at::Tensor> saved;
  if (io::path_exists(path + "/model")) {
    saved = fsdp::read_sharded_state_dict(path + "/model");
  } else if (io::path_exists(path + "/model.pt")) {
    for (const auto& item : io::load_pickle(path + "/model.pt").toGenericDict()) {
      saved[item.key().toStringRef()] = item.value().toTensor();
    }
  } else {
    throw std::runtime_error(path + ": holds neither model/ nor model.pt");
  }
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const ExportTensor& t : tensors) {
    auto it = saved.find(t.name);
    if (it == saved.end()) throw std::runtime_error(path + ": no tensor '" + t.name + "' of " + state.flavor);
    if (it->second.sizes() != at::IntArrayRef(t.shape)) {
      throw std::runtime_error(path + ": '" + t.name + "' has shape " + c10::str(it->second.sizes()) + ", " +
                               state.flavor + "'s is " + c10::str(at::IntArrayRef(t.shape)));
    }
    at::Tensor value = options.dtype ? it->second.to(*options.dtype) : it->second;
    if (!options.allow_non_finite && value.is_floating_point()) {
      const int64_t bad = value.numel() - at::isfinite(value).sum().item<int64_t>();
      if (bad > 0) {
        const bool from_cast = options.dtype && at::isfinite(it->second).all().item<bool>();
        throw std::runtime_error(
            path + ": '" + t.name + "' holds " + std::to_string(bad) + " NaN or Inf values of " +
            std::to_string(value.numel()) +
            (from_cast ? " once cast to " + std::string(c10::toString(*options.dtype)) +
                             " (values beyond its range); export in a wider dtype"
                       : " (training diverged, or the checkpoint is damaged); export an earlier checkpoint") +
            ", or allow non-finite values (--allow-non-finite) to write it anyway");
      }
    }
    named.emplace_back(t.file_name, value);
  }
  return named;
}

void export_checkpoint(const std::string& path, const std::string& out, const std::vector<ExportTensor>& tensors,
                       const ExportOptions& options) {
  io::write_safetensors(out, read_export_tensors(path, tensors, options));
}

}  // namespace shardtrain::ckpt
