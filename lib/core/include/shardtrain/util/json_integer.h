// Integers from JSON that may be damaged or hostile (checkpoint metadata). nlohmann's get<int64_t>() converts a
// float such as 1e300 with a cast whose overflow is undefined behaviour (found by fuzz_checkpoint_meta); this takes
// integers only and throws std::runtime_error naming `what` otherwise.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace shardtrain::util {

inline int64_t json_integer(const nlohmann::json& j, const std::string& what) {
  const bool too_large =
      j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!j.is_number_integer() || too_large) throw std::runtime_error(what + ": " + j.dump() + " is not an integer");
  return j.get<int64_t>();
}

}  // namespace shardtrain::util
