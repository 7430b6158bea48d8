#include "models/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace shardtrain::models {

namespace {

std::string joined(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "'" : ", '") + v + "'";
  return out;
}

}  // namespace

HfConfig::HfConfig(std::string where, std::shared_ptr<const nlohmann::json> json)
    : where_(std::move(where)), json_(std::move(json)) {}

HfConfig HfConfig::read(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(file)) file /= "config.json";
  std::ifstream in(file);
  if (!fs::is_regular_file(file) || !in) {
    throw std::invalid_argument("no Hugging Face config at '" + path +
                                "' (expected a config.json, or a model directory holding one)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string());
}

HfConfig HfConfig::parse(const std::string& text, const std::string& where) {
  auto json = std::make_shared<nlohmann::json>(nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false));
  if (json->is_discarded() || !json->is_object()) {
    throw std::invalid_argument(where + " is not a JSON object (expected a Hugging Face config.json)");
  }
  return HfConfig(where, std::move(json));
}

bool HfConfig::has(const std::string& key) const { return json_->contains(key) && !json_->at(key).is_null(); }

namespace {

template <class T, class Check>
T value_or(const nlohmann::json& json, const std::string& where, const std::string& key, T fallback, Check is_type,
           const char* expected) {
  if (!json.contains(key) || json.at(key).is_null()) return fallback;
  const auto& v = json.at(key);
  if (!is_type(v)) {
    throw std::invalid_argument(where + ": '" + key + "' is " + v.dump() + " (expected " + expected + ")");
  }
  return v.get<T>();
}

}  // namespace

int64_t HfConfig::integer(const std::string& key, int64_t fallback) const {
  return value_or<int64_t>(*json_, where_, key, fallback, [](const auto& v) { return v.is_number_integer(); },
                           "an integer");
}

double HfConfig::number(const std::string& key, double fallback) const {
  return value_or<double>(*json_, where_, key, fallback, [](const auto& v) { return v.is_number(); }, "a number");
}

std::string HfConfig::text(const std::string& key, const std::string& fallback) const {
  return value_or<std::string>(*json_, where_, key, fallback, [](const auto& v) { return v.is_string(); },
                               "a string");
}

bool HfConfig::flag(const std::string& key, bool fallback) const {
  return value_or<bool>(*json_, where_, key, fallback, [](const auto& v) { return v.is_boolean(); },
                        "true or false");
}

std::vector<std::string> HfConfig::texts(const std::string& key) const {
  if (!has(key)) return {};
  const auto& v = json_->at(key);
  std::vector<std::string> out;
  if (v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_string(); })) {
    for (const auto& e : v) out.push_back(e.get<std::string>());
    return out;
  }
  throw std::invalid_argument(where_ + ": '" + key + "' is " + v.dump() + " (expected a list of strings)");
}

int64_t HfConfig::entries(const std::string& key) const {
  if (!has(key)) return 0;
  const auto& v = json_->at(key);
  if (!v.is_object() && !v.is_array()) {
    throw std::invalid_argument(where_ + ": '" + key + "' is " + v.dump() + " (expected an object or a list)");
  }
  return static_cast<int64_t>(v.size());
}

std::vector<std::string> HfConfig::labels(const std::string& key) const {
  if (!has(key)) return {};
  const auto& v = json_->at(key);
  std::vector<std::string> out(v.is_object() ? v.size() : 0);
  std::vector<bool> seen(out.size(), false);
  for (auto it = v.begin(); v.is_object() && it != v.end(); ++it) {
    size_t id = out.size();
    try {
      size_t used = 0;
      id = static_cast<size_t>(std::stoul(it.key(), &used));
      if (used != it.key().size()) id = out.size();
    } catch (const std::exception&) {
    }
    if (id >= out.size() || seen[id] || !it.value().is_string()) break;
    out[id] = it.value().get<std::string>();
    seen[id] = true;
  }
  if (!v.is_object() || std::find(seen.begin(), seen.end(), false) != seen.end()) {
    throw std::invalid_argument(where_ + ": '" + key + "' is " + v.dump().substr(0, 80) +
                                " (expected an object of names by id, \"0\" to \"N-1\")");
  }
  return out;
}

HfConfig HfConfig::section(const std::string& key) const {
  const std::string where = where_ + ": " + key;
  if (!has(key)) return HfConfig(where, std::make_shared<nlohmann::json>(nlohmann::json::object()));
  const auto& v = json_->at(key);
  if (!v.is_object()) throw std::invalid_argument(where_ + ": '" + key + "' is " + v.dump() + " (expected an object)");
  return HfConfig(where, std::make_shared<nlohmann::json>(v));
}

std::string HfConfig::value_text(const std::string& key) const {
  const auto& v = json_->at(key);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void HfConfig::require(const std::string& key, const std::vector<std::string>& supported,
                       const std::string& family) const {
  if (!has(key)) return;
  const std::string value = value_text(key);
  if (std::find(supported.begin(), supported.end(), value) != supported.end()) return;
  reject(key, "shardtrain's " + family + " implements " + joined(supported));
}

void HfConfig::reject(const std::string& key, const std::string& why) const {
  throw std::invalid_argument(where_ + ": '" + key + "' is " + (has(key) ? json_->at(key).dump() : "absent") + "; " +
                              why);
}

void hf_put_labels(nlohmann::json& config, const std::vector<std::string>& labels, bool multi_label) {
  config["id2label"] = nlohmann::json::object();
  config["label2id"] = nlohmann::json::object();
  for (size_t i = 0; i < labels.size(); ++i) {
    config["id2label"][std::to_string(i)] = labels[i];
    config["label2id"][labels[i]] = i;
  }
  if (labels.size() == 1) config["problem_type"] = "regression";  // what transformers infers for num_labels 1
  if (multi_label) config["problem_type"] = "multi_label_classification";
}

}  // namespace shardtrain::models
