// The error every family's flavor table throws for a name it does not have.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::models {

[[noreturn]] inline void throw_unknown_flavor(const std::string& family, const std::string& name,
                                              const std::vector<std::string>& flavors) {
  std::string known;
  for (const auto& f : flavors) known += " " + f;
  throw std::invalid_argument("unknown " + family + " flavor '" + name + "'; known:" + known);
}

}  // namespace shardtrain::models
