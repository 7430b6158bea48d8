// A fresh identifier: 16 lowercase hex digits from the system's entropy source (std::random_device). Names a job
// (the launcher's SHARDTRAIN_JOB_ID) or a run (the checkpoints it owns) when nobody gave one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

namespace shardtrain::util {

inline std::string random_id() {
  std::random_device entropy;
  const uint64_t value = static_cast<uint64_t>(entropy()) << 32 | entropy();
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace shardtrain::util
