#include "shardtrain/memory/memory_size.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace shardtrain::memory {

int64_t parse_memory_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }), unit.end());
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return std::tolower(ch); });
  // A bare number is refused rather than read as bytes: "--gpu-memory 80" means 80 GB to whoever types it.
  if (used > 0 && unit.empty()) {
    throw std::invalid_argument("memory size '" + text + "' has no unit: write " + text + "GiB, " + text + "GB, " +
                                text + "MiB or, for bytes, " + text + "B");
  }
  const std::pair<const char*, double> units[] = {
      {"b", 1},          {"kb", 1e3},         {"mb", 1e6},           {"gb", 1e9},   {"tb", 1e12},
      {"kib", 1024}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}, {"k", 1024}, {"m", 1048576.0},
      {"g", 1073741824.0}, {"t", 1099511627776.0}};
  for (const auto& [name, scale] : units) {
    if (used > 0 && unit == name && value > 0) return static_cast<int64_t>(value * scale);
  }
  throw std::invalid_argument("memory size '" + text + "' (expected a positive number with a unit: 40GiB, 80GB, "
                              "512MiB, or bytes as 4096B)");
}

std::string memory_size_text(int64_t bytes) {
  if (bytes <= 0) return "";
  const std::pair<const char*, int64_t> units[] = {{"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30},
                                                   {"MiB", int64_t{1} << 20}, {"KiB", int64_t{1} << 10},
                                                   {"TB", 1'000'000'000'000}, {"GB", 1'000'000'000},
                                                   {"MB", 1'000'000},         {"KB", 1'000}};
  const std::string plain = std::to_string(bytes) + "B";
  std::string shortest = plain;
  for (const auto& [name, scale] : units) {  // the shortest text; a unit rather than bytes, binary before decimal
    if (bytes % scale != 0) continue;
    const std::string text = std::to_string(bytes / scale) + name;
    if (text.size() < shortest.size() || (text.size() == shortest.size() && shortest == plain)) shortest = text;
  }
  return shortest;
}

std::string readable_size(int64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", b / (1024.0 * 1024));
  }
  return text;
}

}  // namespace shardtrain::memory
