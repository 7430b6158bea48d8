#include "shardtrain/ckpt/trainer_state.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

#include "shardtrain/util/json_integer.h"

namespace shardtrain::ckpt {
namespace {

constexpr const char* kFormat = "shardtrain.checkpoint.v1";

}  // namespace

std::string trainer_state_json(const TrainerState& s) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["step"] = s.step;
  j["loader"] = {{"step", s.loader_step}, {"consumed", s.loader_consumed}};
  j["optimizer_steps"] = s.optimizer_steps;
  j["world_size"] = s.world_size;
  if (s.loss_scale > 0) j["loss_scale"] = {{"scale", s.loss_scale}, {"growth_tracker", s.loss_scale_growth_tracker}};
  j["flavor"] = s.flavor;
  j["strategy"] = s.strategy;
  j["run_id"] = s.run_id;
  j["config"] = s.config_yaml;
  return j.dump(2);
}

TrainerState parse_trainer_state(const std::string& json, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(where + ": not JSON (" + e.what() + ")");
  }
  TrainerState s;
  try {
    if (!j.is_object() || j.value("format", "") != kFormat) {
      throw std::runtime_error(std::string("format '") + (j.is_object() ? j.value("format", "") : "") +
                               "', expected '" + kFormat + "'");
    }
    s.step = util::json_integer(j.at("step"), "step");
    s.loader_step = util::json_integer(j.at("loader").at("step"), "loader.step");
    const nlohmann::json& consumed = j.at("loader").at("consumed");
    if (!consumed.is_array() || consumed.size() != 3) throw std::runtime_error("loader.consumed: not 3 integers");
    for (size_t i = 0; i < 3; ++i) s.loader_consumed[i] = util::json_integer(consumed[i], "loader.consumed");
    const nlohmann::json& steps_of = j.at("optimizer_steps");
    if (!steps_of.is_object()) throw std::runtime_error("optimizer_steps: not an object");
    for (const auto& [name, steps] : steps_of.items()) {
      s.optimizer_steps[name] = util::json_integer(steps, "optimizer_steps." + name);
    }
    s.world_size = util::json_integer(j.at("world_size"), "world_size");
    if (j.contains("loss_scale")) {
      s.loss_scale = j.at("loss_scale").at("scale").get<double>();
      s.loss_scale_growth_tracker = util::json_integer(j.at("loss_scale").at("growth_tracker"), "growth_tracker");
    }
    s.flavor = j.at("flavor").get<std::string>();
    s.strategy = j.at("strategy").get<std::string>();
    s.run_id = j.value("run_id", "");
    s.config_yaml = j.value("config", "");
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  return s;
}

}  // namespace shardtrain::ckpt
