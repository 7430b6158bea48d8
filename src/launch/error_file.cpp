#include "shardtrain/launch/error_file.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

namespace shardtrain::launch {

void record_error(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  try {
    nlohmann::json j;
    j["message"] = {{"message", message}, {"extraInfo", {{"timestamp", std::to_string(std::time(nullptr))}}}};
    std::ofstream out(path, std::ios::trunc);
    out << j.dump() << "\n";
  } catch (...) {
    // nothing to be done on the way out
  }
}

std::optional<std::string> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    const nlohmann::json& m = j.at("message");
    if (m.is_string()) return m.get<std::string>();  // {"message": TEXT} also occurs
    return m.at("message").get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace shardtrain::launch
