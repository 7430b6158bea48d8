#include "ckpt/save_plan.h"

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <functional>
#include <map>
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
#include "shardtrain/optim/optimizer_state.h"

namespace shardtrain::ckpt {
namespace {

// Every parameter's optimizer steps, by name (those with state).
std::map<std::string, int64_t> optimizer_steps(const CheckpointModel& model) {
  std::map<std::string, int64_t> steps;
  auto& state = model.optimizer->state();
  for (const auto& [name, p] : named_parameters(*model.root)) {
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it != state.end()) steps[name] = optim::state_step(*it->second);
  }
  return steps;
}

// Rank r hashes the files at positions r, r + W, ... of the sorted listing (the page cache still holds what was just
// written); the entries are gathered and sorted into one manifest, returned on every rank. A file that cannot be
// read fails it on every rank (dist::AgreedFailure).
Manifest describe_checkpoint(const std::string& dir, const TrainerState& state, const dist::Communicator& world) {
  nlohmann::json mine = nlohmann::json::array();
  std::string failed;
  try {
    const std::vector<std::string> files = checkpoint_files(dir);
    std::vector<std::string> share;
    for (size_t i = static_cast<size_t>(world.rank()); i < files.size(); i += static_cast<size_t>(world.size())) {
      share.push_back(files[i]);
    }
    for (const ManifestFile& f : describe_files(dir, share)) mine.push_back({f.path, f.size, f.xxh3});
  } catch (const std::runtime_error& e) {
    failed = e.what();
  }
  if (const std::string first = dist::first_failure(world, dist::failure_text(world, failed)); !first.empty()) {
    throw dist::AgreedFailure(first);
  }
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


// "the checkpoint of step 100 was not saved: " and why.
std::string not_saved(int64_t step, const std::string& why) {
  return "the checkpoint of step " + std::to_string(step) + " was not saved: " + why;
}

// One part of a save, done by the ranks `part` runs on, then agreed: when it failed on any rank, every rank removes
// nothing but the leader removes the .partial directory, and all throw CheckpointWriteFailed with the first
// failing rank's reason.
class SaveSteps {
 public:
  SaveSteps(const dist::Communicator& world, std::string tmp, int64_t step)
      : world_(world), tmp_(std::move(tmp)), step_(step) {}

  void run(const std::function<void()>& part) const {
    std::string first;
    try {
      part();
    } catch (const dist::AgreedFailure& e) {  // the others threw it too
      first = e.what();
    } catch (const c10::Error& e) {  // LibTorch's, with no backtrace in the message
      first = dist::first_failure(world_, dist::failure_text(world_, e.what_without_backtrace()));
    } catch (const std::exception& e) {
      first = dist::first_failure(world_, dist::failure_text(world_, e.what()));
    }
    if (first.empty()) first = dist::first_failure(world_, "");  // a rank whose part failed waits for the verdict
    if (first.empty()) return;
    if (world_.rank() == 0) {
      try {
        io::remove_tree(tmp_);
      } catch (const std::runtime_error&) {
        // the .partial stays; the next save or prune removes it
      }
    }
    throw CheckpointWriteFailed(not_saved(step_, first) +
                                " (its partial files were removed; earlier checkpoints are untouched)");
  }

 private:
  const dist::Communicator& world_;
  std::string tmp_;
  int64_t step_;
};

std::vector<PlannedFile> as_planned(const std::vector<fsdp::StateDictFile>& files) {
  std::vector<PlannedFile> out;
  for (const fsdp::StateDictFile& f : files) out.push_back({f.path, f.contents});
  return out;
}

void write_file(const PlannedFile& f) {
  io::make_directories(io::parent_directory(f.path));
  if (const auto* pickle = std::get_if<c10::IValue>(&f.contents)) {
    io::save_pickle(f.path, *pickle);
  } else if (const auto* text = std::get_if<std::string>(&f.contents)) {
    io::write_file_atomic(f.path, std::vector<char>(text->begin(), text->end()));
  } else if (const auto* tensors = std::get_if<NamedTensors>(&f.contents)) {
    io::write_safetensors(f.path, *tensors);
  } else {
    const auto& merged = std::get<ExportMerged>(f.contents);
    const std::map<std::string, at::Tensor> full = merged_model_state(merged.model_dir);
    NamedTensors named;
    for (const auto& [ours, hf] : merged.hf_names) named.emplace_back(hf, full.at(ours));
    io::write_safetensors(f.path, named);
  }
}

// When `found` (this rank's non_finite_state, or "") is not empty on some rank: the leader removes `partial` (when
// given) and every rank throws NonFiniteState with the first such rank's. Collective over `world`.
void refuse(int64_t step, const std::string& found, const dist::Communicator& world, const std::string& partial) {
  const std::string bad = dist::first_failure(world, dist::failure_text(world, found));
  if (bad.empty()) return;
  if (world.rank() == 0 && !partial.empty()) io::remove_tree(partial);
  throw NonFiniteState(not_saved(step, bad));
}

}  // namespace

std::string non_finite_state(const CheckpointModel& model) {
  for (const auto& [name, p] : named_parameters(*model.root)) {
    if (const int64_t bad = non_finite_count(p.detach()); bad > 0) return non_finite_text(name, bad, p.numel());
  }
  for (const auto& [key, tensors] : moments(model)) {
    for (const auto& [name, t] : tensors) {
      if (const int64_t bad = non_finite_count(t.tensor); bad > 0) {
        return non_finite_text(name + "::" + key, bad, t.tensor.numel());
      }
    }
  }
  return "";
}

void refuse_non_finite(const SavePlan& plan, const std::string& found, const dist::Communicator& world) {
  refuse(plan.step, found, world, plan.partial);
}

SavePlan plan_save(const std::string& dir, const TrainerState& given, const CheckpointModel& model,
                   const dist::Communicator& world, bool check_finite) {
  // A diverged model is not saved where it would be taken for a good one (and let pruning remove a good one).
  if (check_finite) refuse(given.step, non_finite_state(model), world, /*partial=*/"");
  SavePlan plan;
  plan.step = given.step;
  plan.final_path = dir + "/" + step_directory_name(given.step);
  plan.partial = plan.final_path + kPartial;
  const std::string& tmp = plan.partial;
  const bool leader = world.rank() == 0;
  const SaveSteps steps(world, tmp, given.step);
  steps.run([&] {
    if (!leader) return;
    if (io::path_exists(plan.final_path)) {
      const std::string owner = run_id_of(plan.final_path);
      if (owner != given.run_id) {
        throw std::runtime_error(plan.final_path + " is " +
                                 (owner.empty() ? "a checkpoint whose manifest does not read"
                                                : "run " + owner + "'s checkpoint") +
                                 ", not this run's (" + given.run_id + "): it is not replaced");
      }
    }
    io::make_directories(dir);
    io::remove_tree(tmp);  // a crashed attempt at the same step
    io::make_directories(tmp);
  });

  plan.state = given;
  TrainerState& state = plan.state;
  state.optimizer_steps = optimizer_steps(model);
  if (pp_size_of(model) > 1) {  // every stage's, for a load at any layout (each rank holds its own stages')
    const std::string mine = nlohmann::json(state.optimizer_steps).dump();
    for (const std::string& text : dist::all_gather_text(*model.pp_group, mine)) {
      for (const auto& [name, count] : nlohmann::json::parse(text).get<std::map<std::string, int64_t>>()) {
        state.optimizer_steps[name] = count;
      }
    }
  }
  const fsdp::ParamStates states = moments(model);
  // A replicated model split by tensor parallelism or into pipeline stages (DDP beside it) is written as its slices
  // or stages too, by one replica: the first (data-parallel index 0, ckpt::in_first_replica). Each stage's layout
  // file by the stage's first rank.
  const bool split = tp_size_of(model) > 1, staged = pp_size_of(model) > 1;
  const bool slice_writer = !model.sharded && (split || staged) && in_first_replica(model, world.rank());
  const bool stage_leader = staged ? model.pp_group->global_ranks().front() == 0 : leader;
  std::map<std::string, at::Tensor> full;  // state_dict_type = full without tensor or pipeline parallelism
  if (!model.hf_names.empty() && !split && !staged && model.sharded) {
    full = fsdp::full_state_dict(model.root, /*rank0_only=*/true);  // collective
  }
  // Shards, then metadata; the export merged from model/ last, a phase every rank agrees over only where there is one.
  const bool merged_export = !model.hf_names.empty() && (split || staged);
  plan.phases.resize(merged_export ? 3 : 2);
  std::vector<PlannedFile>& first = plan.phases[0];
  steps.run([&] {
    fsdp::StateDictFiles model_files;
    if (model.sharded) {
      model_files = fsdp::sharded_state_files(model.root, state_dir(tmp + "/model", model), states);
    } else if (slice_writer) {
      model_files = fsdp::whole_state_files(model.root, state_dir(tmp + "/model", model), states);
    }
    first = as_planned(model_files.shards);
    plan.phases[1] = as_planned(model_files.metadata);  // after every rank's shards
    if (stage_leader && split) {
      first.push_back({stage_dir(tmp + "/model", model) + "/tensor_parallel.json", tp_layout_json(model, states)});
    }
    if (leader && staged) first.push_back({tmp + "/model/pipeline.json", pipeline_json(model)});
    if (!model.sharded && !split && !staged && leader) {
      auto dict = new_dict();
      // On their device: io::save_pickle copies one storage at a time to the host as it writes.
      for (const auto& [name, p] : named_parameters(*model.root)) dict.insert(name, p.detach());
      for (const auto& b : model.root->named_buffers()) dict.insert(b.key(), b.value().detach());
      for (const auto& [key, tensors] : states) {
        for (const auto& [name, t] : tensors) dict.insert(name + "::" + key, t.tensor.detach());
      }
      first.push_back({tmp + "/model.pt", c10::IValue(dict)});
    }
    auto rng = new_dict();
    for (auto& [key, generator] : default_generators()) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng.insert(key, generator.get_state());
    }
    first.push_back({rng_file(tmp, world.rank()), c10::IValue(rng)});
    if (!model.hf_names.empty() && leader) {
      if (merged_export) {
        // Each tensor-parallel rank's slices and each stage's entries, merged from the files every rank has
        // written in the phases before: the whole model on the leader, no collective.
        plan.phases[2].push_back({tmp + "/model.safetensors", ExportMerged{tmp + "/model", model.hf_names}});
      } else {
        if (!model.sharded) {  // one replica's own tensors
          for (const auto& [name, p] : named_parameters(*model.root)) full[name] = p.detach().cpu();
          for (const auto& b : model.root->named_buffers()) full[b.key()] = b.value().detach().cpu();
        }
        NamedTensors named;
        for (const auto& [ours, hf] : model.hf_names) named.emplace_back(hf, full.at(ours));
        first.push_back({tmp + "/model.safetensors", std::move(named)});
      }
    }
    if (leader) first.push_back({tmp + "/trainer.json", trainer_state_json(state)});
  });
  return plan;
}

std::string write_save(const SavePlan& plan, const dist::Communicator& writers) {
  const SaveSteps steps(writers, plan.partial, plan.step);
  for (const std::vector<PlannedFile>& phase : plan.phases) {
    steps.run([&] {
      for (const PlannedFile& f : phase) write_file(f);
    });
  }
  Manifest manifest;
  steps.run([&] { manifest = describe_checkpoint(plan.partial, plan.state, writers); });  // collective
  steps.run([&] {
    if (writers.rank() != 0) return;
    write_manifest(plan.partial, manifest);
    io::sync_path(plan.partial);
    io::remove_tree(plan.final_path);  // this run's own checkpoint of the step (a resume from an older one redoes it)
    io::rename_durable(plan.partial, plan.final_path);
  });
  return plan.final_path;
}

std::string save_checkpoint(const std::string& dir, const TrainerState& given, const CheckpointModel& model,
                            const dist::Communicator& world) {
  return write_save(plan_save(dir, given, model, world), world);
}

}  // namespace shardtrain::ckpt
