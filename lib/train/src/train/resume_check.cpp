#include "train/resume_check.h"

#include <algorithm>
#include <stdexcept>

namespace shardtrain::train {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool in(const std::string& key, std::initializer_list<const char*> keys) {
  return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; });
}

// The model, its shape and its head: a checkpoint's tensors fit no other.
bool is_model_key(const std::string& key) {
  return in(key, {"model.flavor", "model.family", "model.overrides", "model.task", "model.from", "model.lora.r",
                  "model.lora.target_modules", "model.lora.modules_to_save", "train.task", "data.labels",
                  "data.multi_label"});
}

// What is trained, and on what: the same model on other settings is another run.
bool changes_the_run(const std::string& key) {
  if (starts_with(key, "optim.")) return true;
  if (starts_with(key, "data.")) {  // all but where and how fast the data is read, and the held-out set
    return !in(key, {"data.eval", "data.workers", "data.queue_depth", "data.cache_dir"});
  }
  return in(key, {"train.seed", "train.batch_size", "train.grad_accum", "train.steps", "train.max_grad_norm",
                  "model.dtype", "parallel.mixed_precision", "model.lora.lora_alpha", "model.lora.lora_dropout"});
}

bool allowed_by(const std::vector<std::string>& allow, const std::string& key) {
  return std::any_of(allow.begin(), allow.end(), [&](const std::string& a) {
    return a == "all" || a == key || starts_with(key, a + ".");
  });
}

std::string change_text(const config::KeyChange& c) { return c.path + " " + c.before + " -> " + c.after; }

}  // namespace

ResumeChanges check_resume(const std::string& saved_yaml, const config::Config& now, const std::string& checkpoint,
                           bool auto_batch) {
  ResumeChanges out;
  std::vector<std::string> refused;
  const std::vector<config::KeyChange> changes = config::changed_keys(saved_yaml, now);
  // DDP without tensor parallelism saves whole tensors (model.pt; a pipeline's stages as whole tensors under
  // model/), every other layout sharded slices (ckpt/checkpoint.h): a change of strategy or tensor-parallel size
  // between the two is refused, once. DDP reads either at any pipeline size.
  std::string saved_strategy = parallel::to_string(now.parallel.strategy);
  std::string saved_tp = std::to_string(now.parallel.tp_size), layout_change;
  for (const config::KeyChange& c : changes) {
    if (c.path != "parallel.strategy" && c.path != "parallel.tp_size") continue;
    (c.path == "parallel.strategy" ? saved_strategy : saved_tp) = c.before;
    layout_change += (layout_change.empty() ? "" : ", ") + change_text(c);
  }
  const bool saved_whole = saved_strategy == "ddp" && saved_tp == "1";
  if (saved_whole != (now.parallel.strategy == parallel::Strategy::DDP && now.parallel.tp_size == 1)) {
    refused.push_back(layout_change + " (the checkpoint holds " +
                      (saved_whole ? "DDP's whole model, not sharded slices" : "sharded slices, not DDP's whole model") +
                      ")");
  }
  for (const config::KeyChange& c : changes) {
    if (c.path == "checkpoint.resume" || c.path == "checkpoint.allow_changes") continue;  // how this resume was asked
    if (is_model_key(c.path)) {
      refused.push_back(change_text(c) + " (the model: the checkpoint's tensors are another model's)");
    } else if (c.path == "train.batch_size" && auto_batch) {
      out.free.push_back(c);  // auto chose it for this run's memory
    } else if (changes_the_run(c.path) && !allowed_by(now.checkpoint.allow_changes, c.path)) {
      refused.push_back(change_text(c) + " (changes the run: allow it with --checkpoint.allow_changes=[" + c.path +
                        "])");
    } else {
      (changes_the_run(c.path) ? out.allowed : out.free).push_back(c);
    }
  }
  if (!refused.empty()) {
    std::string text = "checkpoint.resume: " + checkpoint + " was trained with another config; changed:";
    for (const std::string& r : refused) text += "\n  " + r;
    text += "\nResume with the checkpoint's values, start afresh in another checkpoint.dir, or allow the run's "
            "changes by key (checkpoint.allow_changes: [optim.lr], a section [optim], or [all]).";
    throw std::invalid_argument(text);
  }
  return out;
}

std::string describe_changes(const std::vector<config::KeyChange>& changes) {
  std::string out;
  for (const config::KeyChange& c : changes) out += (out.empty() ? "" : ", ") + change_text(c);
  return out;
}

}  // namespace shardtrain::train
