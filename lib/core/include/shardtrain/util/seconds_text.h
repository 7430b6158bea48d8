// A duration as a message says it: "2.5 s", to a tenth of a second (timeouts, waits, what a peer last did).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace shardtrain::util {

inline std::string seconds_text(std::chrono::duration<double> d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", d.count());
  return text;
}

}  // namespace shardtrain::util
