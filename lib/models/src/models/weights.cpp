#include "shardtrain/models/weights.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/fsdp/state_dict.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/tensor_parallel.h"

namespace shardtrain::models {

namespace {

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The file's name for each (Hugging Face name, shape) the model wants, in order ("" for a head the file lacks, or
// with options.partial any tensor: report.initialized), after checking that every other one is there with that
// shape and that the file holds nothing else (but ignored names, and heads or with options.partial anything:
// report.unused), and that its shape is the model's (or with options.ignore_mismatched_sizes "" and
// report.mismatched). Throws std::runtime_error naming the file and the tensor.
std::vector<std::string> plan_load(const io::WeightFiles& file,
                                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted,
                                   const NameMap& names, const LoadOptions& options, const char* caller,
                                   LoadReport& report) {
  auto fail = [&](const std::string& what) {
    return std::runtime_error(std::string(caller) + " '" + file.path() + "': " + what);
  };
  // The base-model prefix Hugging Face drops or adds ("bert." when a BertModel is saved alone): find the file name.
  auto file_name_of = [&](const std::string& hf) -> std::string {
    std::vector<std::string> candidates = {hf};
    for (const auto& alias : names.aliases_of(hf)) candidates.push_back(alias);
    for (const auto& name : candidates) {
      if (file.find(name)) return name;
      const size_t dot = name.find('.');
      if (dot != std::string::npos && file.find(name.substr(dot + 1))) return name.substr(dot + 1);
    }
    return "";
  };
  std::set<std::string> used;
  std::vector<std::string> plan;
  for (const auto& [hf, shape] : wanted) {
    // An adapter file holds PEFT's names, and none of the base model's tensors (those are left as they are).
    const std::string peft = options.lora_adapter ? kPeftModelPrefix + hf : "";
    const std::string in_file = !options.lora_adapter ? file_name_of(hf) : file.find(peft) ? peft : "";
    if (in_file.empty() && options.lora_adapter && is_lora_tensor(hf)) {
      throw fail("adapter tensor '" + peft + "' of the model is missing from the file");
    }
    // Not in the file and left as they are: the base model in an adapter's load; an adapter in a base model's load
    // (new, initialised).
    if (in_file.empty() && (options.lora_adapter || is_lora_tensor(hf))) {
      plan.emplace_back();
      continue;
    }
    if (in_file.empty() && (options.partial || names.is_head(hf))) {
      report.initialized.push_back(hf);
      plan.emplace_back();
      continue;
    }
    if (in_file.empty()) throw fail("tensor '" + hf + "' of the model is missing from the file");
    const io::WeightEntry* e = file.find(in_file);
    if (e->shape != shape) {
      if (!options.ignore_mismatched_sizes) {
        throw fail("tensor '" + in_file + "' has shape " + shape_text(e->shape) + ", the model expects " +
                   shape_text(shape) + " (ignore_mismatched_sizes, model.ignore_mismatched_sizes in a trainer " +
                   "config, keeps the model's initialization for tensors whose shapes differ)");
      }
      report.mismatched.push_back(in_file + ": " + shape_text(e->shape) + " -> " + shape_text(shape));
      used.insert(in_file);
      plan.emplace_back();
      continue;
    }
    used.insert(in_file);
    plan.push_back(in_file);
  }
  for (const auto& e : file.entries()) {
    if (used.count(e.name) || names.is_ignored(e.name)) continue;
    if (options.lora_adapter) throw fail("tensor '" + e.name + "' in the adapter matches nothing in the model");
    if (!options.partial && !names.is_head(e.name)) {
      throw fail("tensor '" + e.name + "' in the file matches nothing in the model");
    }
    report.unused.push_back(e.name);
  }
  return plan;
}

}  // namespace

std::vector<std::pair<std::regex, std::string>> NameMap::compile(const Rules& rules) {
  std::vector<std::pair<std::regex, std::string>> out;
  for (const auto& [pattern, replacement] : rules) out.emplace_back(std::regex(pattern), replacement);
  return out;
}

NameMap::NameMap(const Rules& rules, const std::vector<std::string>& ignored, const Rules& aliases,
                 const std::vector<std::string>& heads, const std::vector<std::string>& transposed)
    : rules_(compile(rules)), aliases_(compile(aliases)) {
  for (const auto& pattern : ignored) ignored_.emplace_back(pattern);
  for (const auto& pattern : heads) heads_.emplace_back(pattern);
  for (const auto& pattern : transposed) transposed_.emplace_back(pattern);
}

namespace {

bool any_match(const std::string& name, const std::vector<std::regex>& patterns) {
  for (const auto& pattern : patterns) {
    if (std::regex_match(name, pattern)) return true;
  }
  return false;
}

}  // namespace

bool NameMap::is_head(const std::string& hf_name) const { return any_match(hf_name, heads_); }

bool NameMap::is_transposed(const std::string& hf_name) const { return any_match(hf_name, transposed_); }

std::vector<std::string> NameMap::aliases_of(const std::string& hf_name) const {
  std::vector<std::string> out;
  for (const auto& [pattern, replacement] : aliases_) {
    if (std::regex_match(hf_name, pattern)) out.push_back(std::regex_replace(hf_name, pattern, replacement));
  }
  return out;
}

std::string NameMap::to_hf(const std::string& name) const {
  for (const auto& [pattern, replacement] : rules_) {
    if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
  }
  return name;
}

bool NameMap::is_ignored(const std::string& hf_name) const { return any_match(hf_name, ignored_); }

std::vector<std::pair<std::string, std::string>> hf_names_of(const torch::nn::Module& model, const NameMap& names) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), names.to_hf(p.key()));
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), names.to_hf(b.key()));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> hf_named_tensors(const torch::nn::Module& model, const NameMap& names) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) tensors.emplace(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) tensors.emplace(b.key(), b.value());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [ours, hf] : hf_names_of(model, names)) out.emplace_back(hf, tensors.at(ours));
  return out;
}

LoadReport load_weights(torch::nn::Module& model, const std::string& path, const NameMap& names,
                        const LoadOptions& options) {
  io::WeightFiles file(path);
  auto tensors = hf_named_tensors(model, names);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (const auto& [hf, t] : tensors) wanted.emplace_back(hf, t.sizes().vec());
  LoadReport report;
  const std::vector<std::string> plan = plan_load(file, wanted, names, options, "load_weights", report);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].empty()) file.read_into(plan[i], tensors[i].second);
  }
  return report;
}

LoadReport load_weights_sharded(const std::shared_ptr<torch::nn::Module>& model, const std::string& path,
                                const NameMap& names, const std::optional<dist::Communicator>& from_rank0,
                                const LoadOptions& load_options, const TensorParallel* tp) {
  // Hugging Face names by tensor identity: a tied tensor goes by its first name, as in hf_names_of.
  std::map<const c10::TensorImpl*, std::string> hf_of;
  for (const auto& p : model->named_parameters()) hf_of.emplace(p.value().unsafeGetTensorImpl(), names.to_hf(p.key()));
  for (const auto& b : model->named_buffers()) hf_of.emplace(b.value().unsafeGetTensorImpl(), names.to_hf(b.key()));
  const std::vector<fsdp::RowSlot> slots = fsdp::row_slots(model);
  // How tensor parallelism splits each slot (null: whole), and the whole shape the file holds.
  const int64_t tp_size = tp != nullptr ? tp->group().size() : 1, tp_rank = tp != nullptr ? tp->group().rank() : 0;
  std::vector<const TensorParallel::Split*> splits;
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (const auto& slot : slots) {
    const TensorParallel::Split* split = tp != nullptr ? tp->split_of(slot.tensor) : nullptr;
    std::vector<int64_t> shape = slot.full_shape;
    if (split != nullptr) shape[static_cast<size_t>(split->layout.dim)] = split->extent;
    splits.push_back(split);
    wanted.emplace_back(hf_of.at(slot.tensor.unsafeGetTensorImpl()), shape);
  }
  const bool reader = !from_rank0 || from_rank0->rank() == 0;
  std::optional<io::WeightFiles> file;
  std::vector<std::string> plan;
  LoadReport report;
  std::string error;
  if (reader) {
    try {
      file.emplace(path);
      plan = plan_load(*file, wanted, names, load_options, "load_weights_sharded", report);
    } catch (const std::exception& e) {
      if (!from_rank0) throw;
      error = e.what();
    }
  }
  if (from_rank0) {  // rank 0 tells the others whether it can go on, so that none waits for tensors forever
    at::Tensor failed =
        at::full({1}, error.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt).device(from_rank0->device()));
    from_rank0->broadcast(failed, 0).wait();
    if (!error.empty()) throw std::runtime_error(error);
    if (failed.item<int>() != 0) {
      throw std::runtime_error("load_weights_sharded '" + path + "': rank 0 could not load the file (its error says "
                               "why)");
    }
    // Which slots rank 0 found no tensor for (heads, left initialized): every rank skips their broadcasts.
    at::Tensor fresh = at::zeros({static_cast<int64_t>(slots.size()) + 1},
                                 at::TensorOptions().dtype(at::kInt).device(from_rank0->device()));
    if (reader) {
      at::Tensor host = at::zeros({fresh.numel()}, at::kInt);
      auto flags = host.accessor<int, 1>();
      for (size_t i = 0; i < plan.size(); ++i) flags[static_cast<int64_t>(i)] = plan[i].empty() ? 1 : 0;
      fresh.copy_(host);
    }
    from_rank0->broadcast(fresh, 0).wait();
    if (!reader) {
      const at::Tensor host = fresh.cpu();
      auto flags = host.accessor<int, 1>();
      plan.assign(slots.size(), "-");  // rank 0 reads; only the empty entries matter here
      for (size_t i = 0; i < slots.size(); ++i) {
        if (flags[static_cast<int64_t>(i)] != 0) plan[i].clear();
      }
    }
  }
  std::map<const c10::TensorImpl*, size_t> index;
  for (size_t i = 0; i < slots.size(); ++i) index[slots[i].tensor.unsafeGetTensorImpl()] = i;
  fsdp::load_rows(model, [&](const fsdp::RowSlot& slot) -> at::Tensor {
    const size_t i = index.at(slot.tensor.unsafeGetTensorImpl());
    if (plan[i].empty()) return at::Tensor();  // not loaded (report): kept as initialized
    const TensorParallel::Split* split = splits[i];
    // This rank's part of the file's tensor (rows of a contiguous part read as rows; columns, or a fused bias's
    // sections, taken from what is read), then the rows this rank's shard holds.
    const int64_t local_rows = slot.full_shape.empty() ? 1 : slot.full_shape[0];
    auto part = [&](const at::Tensor& whole) {
      return split == nullptr ? whole : tp::slice_of(whole, split->layout, tp_rank, tp_size);
    };
    auto rows_of = [&](const at::Tensor& local) {
      return local.reshape({local_rows, -1}).narrow(0, slot.first_row, slot.rows);
    };
    if (!from_rank0) {
      if (split == nullptr || split->layout.dim > 0) return part(file->read_rows(plan[i], slot.first_row, slot.rows));
      if (split->layout.sections == 1) {
        const tp::SplitLayout& layout = split->layout;
        const int64_t start =
            tp::part_of(split->extent, layout.part_count(tp_size), layout.part_index(tp_rank, tp_size)).start;
        return file->read_rows(plan[i], start + slot.first_row, slot.rows);
      }
      return rows_of(part(file->read(plan[i])));
    }
    // On the group's device (NCCL broadcasts CUDA tensors), in the model's dtype.
    const auto options = slot.tensor.options().device(from_rank0->device()).requires_grad(false);
    at::Tensor full = reader ? file->read(plan[i]).to(options) : at::empty(wanted[i].second, options);
    from_rank0->broadcast(full, 0).wait();
    if (slot.rows == 0) return at::empty({0}, options);  // a rank past the last row (padding only)
    return rows_of(part(full));
  });
  return report;
}

void save_weights(const torch::nn::Module& model, const std::string& path, const NameMap& names,
                  std::optional<at::ScalarType> dtype) {
  auto tensors = hf_named_tensors(model, names);
  if (dtype) {
    for (auto& [name, t] : tensors) {
      if (t.is_floating_point()) t = t.to(*dtype);
    }
  }
  io::write_safetensors(path, tensors);
}

}  // namespace shardtrain::models
