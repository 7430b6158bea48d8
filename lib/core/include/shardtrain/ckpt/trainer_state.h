// trainer.json: where a run stood when its checkpoint was written (the model's tensors are in the files beside it).
// Parsed without LibTorch, so that the parser can be fuzzed on its own.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace shardtrain::ckpt {

struct TrainerState {
  int64_t step = 0;  // optimizer steps done
  int64_t loader_step = 0;
  std::array<int64_t, 3> loader_consumed = {0, 0, 0};  // data::LoaderState
  // AdamW's step count per parameter (absent: the parameter has had no update, so no state).
  std::map<std::string, int64_t> optimizer_steps;
  int64_t world_size = 1;
  // float16 training's loss scale (optim::GradScaler) and its clean steps in a row; 0: no scaler.
  double loss_scale = 0;
  int64_t loss_scale_growth_tracker = 0;
  std::string flavor, strategy;
  std::string run_id;       // the run that wrote it: kept across resumes and restarts (pruning keeps to its own)
  std::string config_yaml;  // the run's whole config, for the record
};

// trainer.json's text and back. parse throws std::runtime_error naming `where` and what is wrong (not JSON, another
// format, a missing or mistyped field).
std::string trainer_state_json(const TrainerState& state);
TrainerState parse_trainer_state(const std::string& json, const std::string& where);

}  // namespace shardtrain::ckpt
