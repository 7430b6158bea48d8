// Named entities in a sequence of IOB tags, found as seqeval finds them by default (the conlleval rules transformers'
// run_ner scores with through `evaluate`'s seqeval): a chunk starts at B- (or S-, or an I-/E- whose type differs
// from the tag before) and ends before O, B-, S-, a change of type, or after E-/S-. Tags are the classes' names
// ("B-PER", "I-LOC", "O"); the type is what follows the first '-' after the prefix letter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::models {

struct Entity {
  std::string type;   // "PER"; "_" for a tag with nothing after its prefix
  int64_t first = 0;  // index of its first tag
  int64_t last = 0;   // index of its last tag (inclusive)
  bool operator==(const Entity& o) const { return type == o.type && first == o.first && last == o.last; }
};

// The entities of one sequence of tags, in order (seqeval's get_entities on one sequence).
std::vector<Entity> entities_of(const std::vector<std::string>& tags);

// Entity counts over many sequences, the sums seqeval's overall (micro) precision, recall and F1 are computed from.
struct EntityCounts {
  int64_t true_entities = 0, predicted = 0, correct = 0;  // correct: predicted with the same type and span
  void add(const std::vector<std::string>& truth, const std::vector<std::string>& predicted_tags);
};

}  // namespace shardtrain::models
