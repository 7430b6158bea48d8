// A count as people read it: "1,234,567" (parameter counts in start-up lines).
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain::util {

inline std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n);
  const int first = n < 0 ? 1 : 0;  // after the sign
  for (int at = static_cast<int>(digits.size()) - 3; at > first; at -= 3) digits.insert(static_cast<size_t>(at), ",");
  return digits;
}

}  // namespace shardtrain::util
