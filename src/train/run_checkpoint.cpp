#include "train/run_checkpoint.h"

#include <stdexcept>

#include "shardtrain/io/files.h"

namespace shardtrain::train {

void claim_checkpoint_dir(const config::Config& c, const dist::Communicator& world, const log::Logger& logger) {
  if (c.checkpoint.dir.empty() || c.checkpoint.resume) return;
  const std::vector<std::string> existing = ckpt::list_checkpoints(c.checkpoint.dir);
  if (existing.empty()) return;
  const std::string count = std::to_string(existing.size()) + (existing.size() == 1 ? " checkpoint" : " checkpoints");
  if (!c.checkpoint.overwrite) {
    const ckpt::TrainerState newest = ckpt::read_trainer_state(existing.back());
    throw std::invalid_argument(
        "checkpoint.dir: '" + c.checkpoint.dir + "' already holds " + count + " of an earlier run (the newest " +
        existing.back() + ", step " + std::to_string(newest.step) + " of " + newest.flavor + "). Continue it with " +
        "--resume, write this run elsewhere with --checkpoint.dir=DIR, or remove them with " +
        "--checkpoint.overwrite=true");
  }
  world.barrier().wait();  // every rank has listed them before they go
  if (world.rank() == 0) {
    for (const std::string& path : existing) io::remove_tree(path);
  }
  world.barrier().wait();
  logger.info("checkpoint.overwrite: removed " + count + " of an earlier run from " + c.checkpoint.dir);
}

RunPosition resume_run(const config::Config& c, const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                       const dist::Communicator& world, const log::Logger& logger) {
  const auto latest = ckpt::latest_checkpoint(c.checkpoint.dir);
  if (!latest) throw std::invalid_argument("checkpoint.resume: no complete checkpoint in '" + c.checkpoint.dir + "'");
  const ckpt::TrainerState s = ckpt::load_checkpoint(*latest, model, world);
  if (s.flavor != c.model.flavor) {
    throw std::invalid_argument("checkpoint.resume: " + *latest + " is of " + s.flavor + ", the config trains " +
                                c.model.flavor);
  }
  if (scaler && s.loss_scale > 0) scaler->load_state(s.loss_scale, s.loss_scale_growth_tracker);
  logger.info("resumed from " + *latest + " at step " + std::to_string(s.step) +
              (s.world_size == world.size() ? "" : " (another world size: RNG not restored)"));
  RunPosition at;
  at.step = s.step;
  at.loader.step = s.loader_step, at.loader.consumed = s.loader_consumed;
  return at;
}

std::string save_run(const config::Config& c, const RunPosition& at, const optim::GradScaler* scaler,
                     const ckpt::CheckpointModel& model, const dist::Communicator& world) {
  ckpt::TrainerState s;
  s.step = at.step, s.loader_step = at.loader.step, s.loader_consumed = at.loader.consumed;
  s.world_size = world.size(), s.flavor = c.model.flavor, s.strategy = config::to_string(c.parallel.strategy);
  s.config_yaml = config::to_yaml(c);
  if (scaler) s.loss_scale = scaler->scale_value(), s.loss_scale_growth_tracker = scaler->growth_tracker();
  const std::string path = ckpt::save_checkpoint(c.checkpoint.dir, s, model, world);
  if (world.rank() == 0) ckpt::prune_checkpoints(c.checkpoint.dir, c.checkpoint.keep);
  world.barrier().wait();
  return path;
}

}  // namespace shardtrain::train
