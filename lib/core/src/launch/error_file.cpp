#include "shardtrain/launch/error_file.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

namespace shardtrain::launch {

namespace {

std::optional<nlohmann::json> read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

void record_error(const std::string& message, const std::map<std::string, std::string>& extra) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  try {
    nlohmann::json info = {{"timestamp", std::to_string(std::time(nullptr))}};
    for (const auto& [key, value] : extra) info[key] = value;
    nlohmann::json j;
    j["message"] = {{"message", message}, {"extraInfo", info}};
    std::ofstream out(path, std::ios::trunc);
    out << j.dump() << "\n";
  } catch (...) {
    // nothing to be done on the way out
  }
}

std::optional<std::string> read_error_file(const std::string& path) {
  const std::optional<nlohmann::json> j = read_json(path);
  if (!j) return std::nullopt;
  try {
    const nlohmann::json& m = j->at("message");
    if (m.is_string()) return m.get<std::string>();  // {"message": TEXT} also occurs
    return m.at("message").get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::string> read_error_info(const std::string& path, const std::string& key) {
  const std::optional<nlohmann::json> j = read_json(path);
  if (!j) return std::nullopt;
  try {
    return j->at("message").at("extraInfo").at(key).get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace shardtrain::launch
