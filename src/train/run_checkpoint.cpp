#include "train/run_checkpoint.h"

#include <stdexcept>

namespace shardtrain::train {

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
