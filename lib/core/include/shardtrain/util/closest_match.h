// "Did you mean ...?" for errors that name a value not in a known set (command-line options, model flavors,
// config keys): the candidate nearest by edit distance.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::util {

// Levenshtein distance: insertions, deletions and substitutions of one character each cost 1.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The first of `candidates` nearest to `name`; empty when there are none.
inline std::string closest_match(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& candidate : candidates) {
    const size_t d = edit_distance(name, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best;
}

}  // namespace shardtrain::util
