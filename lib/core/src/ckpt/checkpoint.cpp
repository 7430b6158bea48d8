#include "shardtrain/ckpt/checkpoint.h"

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "ckpt/checkpoint_parts.h"
#include "ckpt/model_layout.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/distributed/text_exchange.h"
#include "shardtrain/fsdp/state_dict.h"
#include "shardtrain/io/checksum.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/optimizer_state.h"

namespace shardtrain::ckpt {
namespace {

bool is_step_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("step-", 0) != 0) return false;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

// The first tensor inside `value` (dicts, lists and tuples walked, a dict's key naming its value) that holds NaN or
// Inf, as non_finite_text says it; "" when none does.
std::string first_non_finite(const c10::IValue& value, const std::string& name) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    const int64_t bad = non_finite_count(t);
    return bad > 0 ? non_finite_text(name, bad, t.numel()) : "";
  }
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : name;
      std::string found = first_non_finite(item.value(), key);
      if (!found.empty()) return found;
    }
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) {
      std::string found = first_non_finite(item, name);
      if (!found.empty()) return found;
    }
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) {
      std::string found = first_non_finite(item, name);
      if (!found.empty()) return found;
    }
  }
  return "";
}

// The weights and optimizer state in the files at positions offset, offset + stride, ... of `dir`'s manifest-listed
// files that hold NaN or Inf, named ("model/shard-0-of-2.pt: 'w' holds 3 NaN or Inf values of 64 (...)"); ""
// when all are finite. The generators' states (rng-*.pt) are bytes, not values.
std::string non_finite_values(const std::string& dir, int offset, int stride) {
  const std::vector<std::string> files = checkpoint_files(dir);
  for (size_t i = static_cast<size_t>(offset); i < files.size(); i += static_cast<size_t>(stride)) {
    const std::string& rel = files[i];
    const std::string path = dir + "/" + rel;
    const auto ends_with = [&](const std::string& suffix) {
      return rel.size() >= suffix.size() && rel.compare(rel.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    std::string found;
    if (ends_with(".safetensors")) {
      const io::SafetensorsReader reader(path);
      for (const io::SafetensorsEntry& e : reader.entries()) {
        const at::Tensor t = reader.read(e.name);
        if (const int64_t bad = non_finite_count(t); bad > 0) {
          found = non_finite_text(e.name, bad, t.numel());
          break;
        }
      }
    } else if (ends_with(".pt") && rel.rfind("rng-", 0) != 0) {
      found = first_non_finite(io::load_pickle(path), rel);
    }
    if (!found.empty()) return rel + ": " + found + " (a diverged run's state)";
  }
  return "";
}

}  // namespace

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

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

int64_t non_finite_count(const at::Tensor& t) {
  if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return 0;
  // A finite sum has no NaN or Inf among its terms (either makes it so): one pass, no mask (30x faster than the
  // count on a CPU). A sum that is not finite (a NaN, or finite values overflowing) is counted exactly.
  const double sum = t.sum(t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).item<double>();
  if (std::isfinite(sum)) return 0;
  return t.numel() - at::isfinite(t).sum().item<int64_t>();
}

std::string non_finite_text(const std::string& name, int64_t bad, int64_t numel) {
  return "'" + name + "' holds " + std::to_string(bad) + " NaN or Inf values of " + std::to_string(numel);
}

std::string step_directory_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

TrainerState read_trainer_state(const std::string& path) {
  const std::string file = path + "/trainer.json";
  if (!io::path_exists(file)) {
    throw std::runtime_error("'" + path + "' is not a shardtrain checkpoint (no trainer.json)");
  }
  const std::vector<char> bytes = io::read_file(file);
  return parse_trainer_state(std::string(bytes.begin(), bytes.end()), file);
}

std::string verify_checkpoint_files(const std::string& path, int offset, int stride) {
  std::string problem = verify_files(path, offset, stride);
  if (!problem.empty()) return problem;
  try {
    return non_finite_values(path, offset, stride);
  } catch (const std::runtime_error& e) {  // a file that verified by its bytes but does not read as what it is
    return e.what();
  }
}

std::string verify_checkpoint(const std::string& path, const dist::Communicator& world) {
  const std::string mine = verify_checkpoint_files(path, world.rank(), world.size());
  for (const std::string& problem : dist::all_gather_text(world, mine)) {
    if (!problem.empty()) return problem;  // the lowest rank's
  }
  return "";
}

TrainerState load_checkpoint(const std::string& path, const CheckpointModel& model, const dist::Communicator& world,
                             const std::function<void(const TrainerState&)>& accept) {
  const std::string problem = verify_checkpoint(path, world);
  if (!problem.empty()) throw CheckpointDamaged(path + " does not verify: " + problem);
  TrainerState state = read_trainer_state(path);
  if (accept) accept(state);
  c10::AutoGradMode no_grad(false);
  // The checkpoint's state replaces the optimizer's whole (a rollback's model had state for parameters that the
  // checkpoint's may not).
  model.optimizer->state().clear();
  // Optimizer state for every parameter that had some, filled from the files below.
  const auto params = named_parameters(*model.root);
  // Offloaded, what loading allocates from here on — the optimizer state, and the files' tensors on their way into
  // the shards — is host memory, as it would be under a GPU.
  const memory::CpuTierScope tier(model.offloaded ? memory::CpuTier::HOST : memory::CpuTier::COMPUTE);
  for (const auto& [name, steps] : state.optimizer_steps) {
    auto it = params.find(name);
    if (it == params.end() && model.pp_group) continue;  // another stage's
    if (it == params.end()) {
      throw std::runtime_error(path + ": optimizer state for '" + name + "', which the model does not have");
    }
    optim::install_empty_state(*model.optimizer, it->second, steps);
  }
  const fsdp::ParamStates states = moments(model);
  // A replicated model without tensor parallelism (DDP's, a pipeline stage's too) reads model.pt when there is one
  // (the entries its parameters name), else the stages a DDP pipeline wrote (model/); every other model model/.
  const bool replicated = !model.sharded && tp_size_of(model) == 1;
  if (!replicated || !io::path_exists(path + "/model.pt")) {
    if (!io::path_exists(path + "/model")) {
      throw std::runtime_error(path + (replicated ? ": no model.pt or model/" : ": no sharded model (model/); saved "
                                                                                  "with DDP?"));
    }
    load_model_state(path + "/model", model, states);
  } else {
    const std::string file = path + "/model.pt";
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
    saved = merged_model_state(path + "/model");
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
