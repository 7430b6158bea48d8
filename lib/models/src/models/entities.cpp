#include "models/entities.h"

#include <algorithm>

namespace shardtrain::models {
namespace {

// seqeval's end_of_chunk: whether a chunk of (prev, prev_type) ends before a tag (tag, type).
bool chunk_ends(char prev, char tag, const std::string& prev_type, const std::string& type) {
  if (prev == 'E' || prev == 'S') return true;
  if ((prev == 'B' || prev == 'I') && (tag == 'B' || tag == 'S' || tag == 'O')) return true;
  return prev != 'O' && prev != '.' && prev_type != type;
}

// seqeval's start_of_chunk: whether a chunk starts at (tag, type) after (prev, prev_type).
bool chunk_starts(char prev, char tag, const std::string& prev_type, const std::string& type) {
  if (tag == 'B' || tag == 'S') return true;
  if ((prev == 'E' || prev == 'S' || prev == 'O') && (tag == 'E' || tag == 'I')) return true;
  return tag != 'O' && tag != '.' && prev_type != type;
}

}  // namespace

std::vector<Entity> entities_of(const std::vector<std::string>& tags) {
  std::vector<Entity> out;
  char prev = 'O';
  std::string prev_type;
  int64_t begin = 0;
  for (size_t i = 0; i <= tags.size(); ++i) {  // one "O" past the end closes the last chunk
    const std::string tag_text = i < tags.size() ? tags[i] : "O";
    const char tag = tag_text.empty() ? ' ' : tag_text[0];
    // chunk[1:].split('-', maxsplit=1)[-1] or '_'
    const std::string rest = tag_text.size() > 1 ? tag_text.substr(1) : "";
    const size_t dash = rest.find('-');
    std::string type = dash == std::string::npos ? rest : rest.substr(dash + 1);
    if (type.empty()) type = "_";
    const auto at = static_cast<int64_t>(i);
    if (chunk_ends(prev, tag, prev_type, type)) out.push_back({prev_type, begin, at - 1});
    if (chunk_starts(prev, tag, prev_type, type)) begin = at;
    prev = tag, prev_type = type;
  }
  return out;
}

void EntityCounts::add(const std::vector<std::string>& truth, const std::vector<std::string>& predicted_tags) {
  const std::vector<Entity> t = entities_of(truth), p = entities_of(predicted_tags);
  true_entities += static_cast<int64_t>(t.size());
  predicted += static_cast<int64_t>(p.size());
  for (const Entity& e : p) correct += std::count(t.begin(), t.end(), e) > 0;
}

}  // namespace shardtrain::models
