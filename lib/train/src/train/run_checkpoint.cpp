#include "train/run_checkpoint.h"

#include <functional>
#include <stdexcept>

#include "shardtrain/distributed/text_exchange.h"
#include "shardtrain/io/files.h"
#include "train/resume_check.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/util/random_id.h"

namespace shardtrain::train {
namespace {

using config::Resume;

std::string count_of(size_t n) { return std::to_string(n) + (n == 1 ? " checkpoint" : " checkpoints"); }

// checkpoint.resume: false takes the directory: refused while it holds checkpoints, unless checkpoint.overwrite.
void claim_checkpoint_dir(const config::Config& c, const dist::Communicator& world, const log::Logger& logger) {
  if (c.checkpoint.dir.empty()) return;
  const std::vector<std::string> existing = ckpt::list_checkpoints(c.checkpoint.dir);
  if (existing.empty()) return;
  if (!c.checkpoint.overwrite) {
    std::string newest = existing.back();
    try {
      const ckpt::TrainerState s = ckpt::read_trainer_state(existing.back());
      newest += ", step " + std::to_string(s.step) + " of " + s.flavor;
    } catch (const std::runtime_error&) {
      newest += ", unreadable";
    }
    throw std::invalid_argument(
        "checkpoint.dir: '" + c.checkpoint.dir + "' already holds " + count_of(existing.size()) +
        " of an earlier run (the newest " + newest + "). Continue it with --resume, write this run elsewhere with " +
        "--checkpoint.dir=DIR, or remove them with --checkpoint.overwrite=true");
  }
  world.barrier().wait();  // every rank has listed them before they go
  if (world.rank() == 0) {
    for (const std::string& path : existing) io::remove_tree(path);
  }
  world.barrier().wait();
  logger.info("checkpoint.overwrite: removed " + count_of(existing.size()) + " of an earlier run from " +
              c.checkpoint.dir);
}

// A fresh run's id: the launcher's job id (the same in every restart of the job), else 16 random hex digits.
// Rank 0's, so that every rank agrees. Collective.
std::string new_run_id(const dist::DistEnv& env, const dist::Communicator& world) {
  return dist::broadcast_text(world, env.job_id.empty() ? util::random_id() : env.job_id, 0);
}

// A checkpoint loaded, and where.
struct Loaded {
  std::string path;
  ckpt::TrainerState state;
};

// Loads the newest checkpoint of `candidates` (oldest first) that verifies and that `accept` does not refuse (it
// throws); the skipped ones are logged as `doing`'s, and their reasons added to `why`. nullopt when none verifies.
// Collective.
std::optional<Loaded> load_newest(const std::string& doing, const std::vector<std::string>& candidates,
                                  const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                                  const dist::Communicator& world, const log::Logger& logger,
                                  const std::function<void(const ckpt::TrainerState&)>& accept, std::string& why) {
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    try {
      Loaded loaded{*it, ckpt::load_checkpoint(*it, model, world, accept)};
      if (scaler && loaded.state.loss_scale > 0) {
        scaler->load_state(loaded.state.loss_scale, loaded.state.loss_scale_growth_tracker);
      }
      return loaded;
    } catch (const ckpt::CheckpointDamaged& e) {
      logger.warning(doing + ": skipped: " + e.what());
      why += std::string("\n  ") + e.what();
    }
  }
  return std::nullopt;
}

// Loads the newest checkpoint of `candidates` (oldest first) that verifies; the skipped ones are logged. nullopt
// when there are none; throws std::invalid_argument when none verifies, or when the newest that verifies was
// trained with a config that differs in a way the run may not (resume_check.h).
std::optional<RunPosition> resume_newest(const config::Config& c, const std::vector<std::string>& candidates,
                                         const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                                         const dist::Communicator& world, const log::Logger& logger,
                                         bool auto_batch) {
  if (candidates.empty()) return std::nullopt;
  ResumeChanges changes;
  const auto accept = [&](const ckpt::TrainerState& s) {
    if (s.config_yaml.empty()) {  // written without its config: the flavor at least
      if (s.flavor != c.model.flavor) {
        throw std::invalid_argument("checkpoint.resume: a checkpoint of " + s.flavor + ", the config trains " +
                                    c.model.flavor);
      }
      return;
    }
    changes = check_resume(s.config_yaml, c, "the checkpoint of step " + std::to_string(s.step), auto_batch);
  };
  std::string why;
  const std::optional<Loaded> loaded =
      load_newest("checkpoint.resume", candidates, model, scaler, world, logger, accept, why);
  if (!loaded) {
    throw std::invalid_argument("checkpoint.resume: none of the " + count_of(candidates.size()) + " in '" +
                                c.checkpoint.dir + "' verifies (`shardtrain checkpoint verify` checks them):" + why);
  }
  const ckpt::TrainerState& s = loaded->state;
  logger.info("resumed from " + loaded->path + " at step " + std::to_string(s.step) +
              (s.world_size == world.size() ? "" : " (another world size: RNG not restored)"));
  if (!changes.allowed.empty()) {
    logger.warning("resumed with changed settings (checkpoint.allow_changes): " + describe_changes(changes.allowed));
  }
  if (!changes.free.empty()) logger.info("  changed since the checkpoint: " + describe_changes(changes.free));
  RunPosition at;
  at.step = s.step;
  at.loader.step = s.loader_step, at.loader.consumed = s.loader_consumed;
  at.run_id = s.run_id;
  return at;
}

}  // namespace

std::string keep_global_batch(config::Config& c, const dist::DistEnv& env) {
  if (!env.elastic || c.checkpoint.dir.empty() || c.train.batch_size == config::kAutoBatch) return "";
  // The newest checkpoint start_run will try: its own job's after a restart that began afresh, else any.
  std::vector<std::string> candidates;
  for (const std::string& path : ckpt::list_checkpoints(c.checkpoint.dir)) {
    if (c.checkpoint.resume != Resume::NEVER || ckpt::run_id_of(path) == env.job_id) candidates.push_back(path);
  }
  if (candidates.empty() || (c.checkpoint.resume == Resume::NEVER && env.restart_count == 0)) return "";
  ckpt::TrainerState saved;
  config::Config then;
  try {
    saved = ckpt::read_trainer_state(candidates.back());
    then = config::parse_config(saved.config_yaml, candidates.back() + "/trainer.json", {});
  } catch (const std::exception&) {
    return "";  // resuming will say what is wrong with it
  }
  const int64_t model_split = c.parallel.tp_size * c.parallel.pp_size;
  const int64_t then_split = then.parallel.tp_size * then.parallel.pp_size;
  if (saved.world_size == env.world_size || model_split < 1 || then_split < 1) return "";
  const int64_t then_ranks = saved.world_size / then_split, ranks = env.world_size / model_split;
  const int64_t global = then.train.batch_size * then.train.grad_accum * then_ranks;
  const std::string head = "elastic: resuming at " + std::to_string(env.world_size) + " ranks from a checkpoint of " +
                           std::to_string(saved.world_size) + ": ";
  if (ranks < 1 || global % (c.train.batch_size * ranks) != 0) {
    return head + "its global batch of " + std::to_string(global) + " does not split into " + std::to_string(ranks) +
           " data-parallel ranks x train.batch_size " + std::to_string(c.train.batch_size) +
           ", so train.grad_accum stays " + std::to_string(c.train.grad_accum) + " and a step is " +
           std::to_string(c.train.batch_size * c.train.grad_accum * ranks) + " samples";
  }
  const int64_t accum = global / (c.train.batch_size * ranks);
  if (accum == then.train.grad_accum) return "";
  const std::string text = head + "train.grad_accum " + std::to_string(then.train.grad_accum) + " -> " +
                           std::to_string(accum) + " keeps the global batch at " + std::to_string(global) + " samples";
  c.train.grad_accum = accum;
  c.checkpoint.allow_changes.push_back("train.grad_accum");
  return text;
}

RunPosition start_run(const config::Config& c, const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                      const dist::Communicator& world, const dist::DistEnv& env, const log::Logger& logger,
                      bool auto_batch) {
  const std::vector<std::string> all = ckpt::list_checkpoints(c.checkpoint.dir);
  Resume mode = c.checkpoint.resume;
  std::vector<std::string> candidates = all;
  if (mode == Resume::NEVER && env.restart_count > 0 && !c.checkpoint.dir.empty()) {
    // Restart n of a job that started afresh: its own checkpoints (none when it failed before its first save).
    mode = Resume::AUTO;
    if (!env.job_id.empty()) {
      candidates.clear();
      for (const std::string& path : all) {
        if (ckpt::run_id_of(path) == env.job_id) candidates.push_back(path);
      }
    }
    logger.info("restart " + std::to_string(env.restart_count) + " of the job: " +
                (candidates.empty() ? "no checkpoint of its own yet, starting afresh"
                                    : "resuming from its newest checkpoint"));
  }
  if (mode != Resume::NEVER) {
    if (auto at = resume_newest(c, candidates, model, scaler, world, logger, auto_batch)) return *at;
    if (mode == Resume::ALWAYS) {
      throw std::invalid_argument("checkpoint.resume: no checkpoint in '" + c.checkpoint.dir + "'");
    }
  }
  claim_checkpoint_dir(c, world, logger);
  RunPosition fresh;
  fresh.run_id = new_run_id(env, world);
  return fresh;
}

std::optional<RolledBack> roll_back(const config::Config& c, const std::string& run_id,
                                    const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                                    const dist::Communicator& world, const log::Logger& logger) {
  std::vector<std::string> own;
  for (const std::string& path : ckpt::list_checkpoints(c.checkpoint.dir)) {
    if (ckpt::run_id_of(path) == run_id) own.push_back(path);
  }
  std::string why;
  const std::optional<Loaded> loaded = load_newest("rollback", own, model, scaler, world, logger, {}, why);
  if (!loaded) return std::nullopt;
  return RolledBack{loaded->path, loaded->state.step};
}

namespace {

// What trainer.json says of the run at `at`.
ckpt::TrainerState run_state(const config::Config& c, const RunPosition& at, const optim::GradScaler* scaler,
                             const dist::Communicator& world) {
  ckpt::TrainerState s;
  s.step = at.step, s.loader_step = at.loader.step, s.loader_consumed = at.loader.consumed;
  s.world_size = world.size(), s.flavor = c.model.flavor, s.strategy = parallel::to_string(c.parallel.strategy);
  s.run_id = at.run_id;
  s.config_yaml = config::to_yaml(c);
  if (scaler) s.loss_scale = scaler->scale_value(), s.loss_scale_growth_tracker = scaler->growth_tracker();
  return s;
}

// Run `run_id`'s checkpoints in `dir` beyond the newest `keep` removed by rank 0, every rank waiting for it (none
// lists them meanwhile). Collective over `group`.
void prune_run(const std::string& dir, int64_t keep, const std::string& run_id, const dist::Communicator& group) {
  if (group.rank() == 0) ckpt::prune_checkpoints(dir, keep, run_id);
  group.barrier().wait();
}

}  // namespace

std::string save_run(const config::Config& c, const RunPosition& at, const optim::GradScaler* scaler,
                     const ckpt::CheckpointModel& model, const dist::Communicator& world) {
  const std::string path = ckpt::save_checkpoint(c.checkpoint.dir, run_state(c, at, scaler, world), model, world);
  prune_run(c.checkpoint.dir, c.checkpoint.keep, at.run_id, world);
  return path;
}

ckpt::AsyncSaveStarted start_saving_run(const config::Config& c, const RunPosition& at,
                                        const optim::GradScaler* scaler, const ckpt::CheckpointModel& model,
                                        const dist::Communicator& world, ckpt::AsyncCheckpointer& writer) {
  return writer.save(c.checkpoint.dir, run_state(c, at, scaler, world), model, world,
                     [dir = c.checkpoint.dir, keep = c.checkpoint.keep, run_id = at.run_id](
                         const dist::Communicator& writers) { prune_run(dir, keep, run_id, writers); });
}

}  // namespace shardtrain::train
