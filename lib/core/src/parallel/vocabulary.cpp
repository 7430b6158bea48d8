#include "shardtrain/parallel/vocabulary.h"

#include <stdexcept>
#include <utility>

namespace shardtrain::parallel {
namespace {

// Each name table is built on first use: the config's own tables are made from these during static
// initialisation, in whatever order the linker puts the translation units.
const std::vector<std::pair<std::string, Strategy>>& strategies() {
  static const std::vector<std::pair<std::string, Strategy>> table = {
      {"full_shard", Strategy::FULL_SHARD},     {"shard_grad_op", Strategy::SHARD_GRAD_OP},
      {"no_shard", Strategy::NO_SHARD},         {"hybrid_shard", Strategy::HYBRID_SHARD},
      {"hybrid_shard_zero2", Strategy::HYBRID_SHARD_ZERO2}, {"ddp", Strategy::DDP}};
  return table;
}
const std::vector<std::pair<std::string, Precision>>& precisions() {
  static const std::vector<std::pair<std::string, Precision>> table = {
      {"no", Precision::NO}, {"bf16", Precision::BF16}, {"fp16", Precision::FP16}};
  return table;
}
const std::vector<std::pair<std::string, Device>>& devices() {
  static const std::vector<std::pair<std::string, Device>> table = {
      {"auto", Device::AUTO}, {"cpu", Device::CPU}, {"cuda", Device::CUDA}};
  return table;
}

const std::vector<std::pair<std::string, Wrap>>& wraps() {
  static const std::vector<std::pair<std::string, Wrap>> table = {
      {"transformer", Wrap::TRANSFORMER}, {"size", Wrap::SIZE}, {"none", Wrap::NONE}};
  return table;
}

const std::vector<std::pair<std::string, Offload>>& offloads() {
  static const std::vector<std::pair<std::string, Offload>> table = {
      {"none", Offload::NONE}, {"cpu", Offload::CPU}, {"nvme", Offload::NVME}};
  return table;
}

const std::vector<std::pair<std::string, PipelineSchedule>>& pipeline_schedules() {
  static const std::vector<std::pair<std::string, PipelineSchedule>> table = {
      {"gpipe", PipelineSchedule::GPIPE},
      {"1f1b", PipelineSchedule::ONE_F_ONE_B},
      {"interleaved_1f1b", PipelineSchedule::INTERLEAVED_1F1B},
      {"zero_bubble", PipelineSchedule::ZERO_BUBBLE}};
  return table;
}

const std::vector<std::pair<std::string, Float8Recipe>>& float8_recipes() {
  static const std::vector<std::pair<std::string, Float8Recipe>> table = {{"tensorwise", Float8Recipe::TENSORWISE},
                                                                           {"rowwise", Float8Recipe::ROWWISE}};
  return table;
}

template <class E>
std::string name_in(const std::vector<std::pair<std::string, E>>& table, E value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  return "?";
}

template <class E>
E named_in(const std::vector<std::pair<std::string, E>>& table, const std::string& name, const char* what) {
  std::string all;
  for (const auto& [n, v] : table) {
    if (n == name) return v;
    all += (all.empty() ? "" : ", ") + n;
  }
  throw std::invalid_argument(std::string(what) + " '" + name + "' is not one of " + all);
}

template <class E>
std::vector<std::string> names_in(const std::vector<std::pair<std::string, E>>& table) {
  std::vector<std::string> out;
  for (const auto& entry : table) out.push_back(entry.first);
  return out;
}

}  // namespace

std::string to_string(Strategy s) { return name_in(strategies(), s); }
std::string to_string(Precision p) { return name_in(precisions(), p); }
std::string to_string(Device d) { return name_in(devices(), d); }
std::string to_string(Wrap w) { return name_in(wraps(), w); }
std::string to_string(Offload o) { return name_in(offloads(), o); }
Strategy strategy_named(const std::string& name) { return named_in(strategies(), name, "strategy"); }
Precision precision_named(const std::string& name) { return named_in(precisions(), name, "mixed precision"); }
Device device_named(const std::string& name) { return named_in(devices(), name, "device"); }
Wrap wrap_named(const std::string& name) { return named_in(wraps(), name, "wrap"); }
Offload offload_named(const std::string& name) { return named_in(offloads(), name, "offload"); }
std::string to_string(PipelineSchedule s) { return name_in(pipeline_schedules(), s); }
PipelineSchedule pipeline_schedule_named(const std::string& name) {
  return named_in(pipeline_schedules(), name, "pipeline schedule");
}
std::vector<std::string> pipeline_schedule_names() { return names_in(pipeline_schedules()); }
std::string to_string(Float8Recipe r) { return name_in(float8_recipes(), r); }
Float8Recipe float8_recipe_named(const std::string& name) { return named_in(float8_recipes(), name, "float8 recipe"); }
std::vector<std::string> float8_recipe_names() { return names_in(float8_recipes()); }
std::vector<std::string> strategy_names() { return names_in(strategies()); }
std::vector<std::string> precision_names() { return names_in(precisions()); }
std::vector<std::string> device_names() { return names_in(devices()); }
std::vector<std::string> wrap_names() { return names_in(wraps()); }
std::vector<std::string> offload_names() { return names_in(offloads()); }

bool is_hybrid(Strategy s) { return s == Strategy::HYBRID_SHARD || s == Strategy::HYBRID_SHARD_ZERO2; }
bool is_fsdp(Strategy s) { return s != Strategy::DDP; }

}  // namespace shardtrain::parallel
