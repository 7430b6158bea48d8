// tokenizer.json's models: WordPiece (greedy longest match), BPE (ranked merges; byte fallback, unknown-token
// fusing, ignore_merges as Llama 3 sets it), Unigram (Viterbi over the pieces' log-probabilities) and WordLevel.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "hf_pipeline.h"
#include "unicode_text.h"

namespace shardtrain::data::hf {
namespace {

// A vocabulary: token -> id, and id -> token. Ids may leave holes (a file's ids are any u32), so neither table is
// sized by the largest id.
class Vocab {
 public:
  void add(const std::string& token, int64_t id) {
    ids_[token] = id;
    tokens_[id] = token;
    size_ = std::max(size_, id + 1);
  }
  std::optional<int64_t> id_of(const std::string& token) const {
    const auto it = ids_.find(token);
    return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  std::optional<std::string> token_of(int64_t id) const {
    const auto it = tokens_.find(id);
    return it == tokens_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  int64_t size() const { return size_; }  // one past the largest id
  int64_t required(const std::string& token, const char* what) const {
    const auto id = id_of(token);
    if (!id) throw std::invalid_argument(std::string(what) + " '" + token + "' is not in the model's vocabulary");
    return *id;
  }

 private:
  std::unordered_map<std::string, int64_t> ids_;
  std::unordered_map<int64_t, std::string> tokens_;
  int64_t size_ = 0;
};

Vocab vocab_of_object(const Json& v) {
  Vocab vocab;
  for (const auto& [token, id] : v.items()) vocab.add(token, hf::id(id, "the vocabulary's id of '" + token + "'"));
  return vocab;
}

std::string byte_token(unsigned char b) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "<0x%02X>", b);
  return buffer;
}

class ModelBase : public Model {
 public:
  std::optional<int64_t> id_of(const std::string& token) const override { return vocab_.id_of(token); }
  std::optional<std::string> token_of(int64_t id) const override { return vocab_.token_of(id); }
  int64_t size() const override { return vocab_.size(); }

 protected:
  Vocab vocab_;
};

class WordPiece final : public ModelBase {
 public:
  explicit WordPiece(const Json& j)
      : prefix_(option<std::string>(j, "continuing_subword_prefix", "##")),
        max_chars_(option<int64_t>(j, "max_input_chars_per_word", 100)) {
    vocab_ = vocab_of_object(j.at("vocab"));
    unk_ = vocab_.required(option<std::string>(j, "unk_token", "[UNK]"), "WordPiece unk_token");
  }
  void tokenize(const std::string& word, std::vector<int64_t>& ids) const override {
    const auto chars = unicode::from_utf8(word);
    if (static_cast<int64_t>(chars.size()) > max_chars_) {
      ids.push_back(unk_);
      return;
    }
    std::vector<int64_t> pieces;
    size_t start = 0;
    while (start < chars.size()) {
      size_t end = chars.size();
      std::optional<int64_t> found;
      for (; end > start; --end) {
        std::string candidate = unicode::to_utf8(unicode::Codepoints(chars.begin() + static_cast<long>(start),
                                                                     chars.begin() + static_cast<long>(end)));
        if (start > 0) candidate = prefix_ + candidate;
        if ((found = vocab_.id_of(candidate))) break;
      }
      if (!found) {
        ids.push_back(unk_);
        return;
      }
      pieces.push_back(*found);
      start = end;
    }
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  }

 private:
  std::string prefix_;
  int64_t max_chars_;
  int64_t unk_;
};

class Bpe final : public ModelBase {
 public:
  explicit Bpe(const Json& j)
      : prefix_(option<std::string>(j, "continuing_subword_prefix", "")),
        suffix_(option<std::string>(j, "end_of_word_suffix", "")),
        fuse_unk_(option(j, "fuse_unk", false)),
        byte_fallback_(option(j, "byte_fallback", false)),
        ignore_merges_(option(j, "ignore_merges", false)) {
    if (option(j, "dropout", 0.0) != 0.0) {
      throw std::invalid_argument("BPE dropout " + std::to_string(option(j, "dropout", 0.0)) +
                                  " is not supported (a training-time augmentation; 0 or null expected)");
    }
    vocab_ = vocab_of_object(j.at("vocab"));
    const std::string unk = option<std::string>(j, "unk_token", "");
    if (!unk.empty()) unk_ = vocab_.required(unk, "BPE unk_token");
    int64_t rank = 0;
    for (const Json& m : j.at("merges")) {
      std::string a, b;
      if (m.is_string()) {  // "a b" (files before tokenizers 0.20)
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos) throw std::invalid_argument("BPE merge '" + s + "' is not two tokens");
        a = s.substr(0, space), b = s.substr(space + 1);
      } else {
        a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
      }
      const int64_t left = vocab_.required(a, "BPE merge token"), right = vocab_.required(b, "BPE merge token");
      // the right token's continuation prefix ("##") is dropped in the merged token, as the library does
      const int64_t merged = vocab_.required(a + b.substr(std::min(prefix_.size(), b.size())), "BPE merge result");
      merges_.emplace(key(left, right), Merge{rank++, merged});
    }
  }

  void tokenize(const std::string& word, std::vector<int64_t>& ids) const override {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const auto id = vocab_.id_of(word)) {
        ids.push_back(*id);
        return;
      }
    }
    std::vector<int64_t> symbols;
    std::optional<int64_t> pending_unk;
    for (size_t at = 0; at < word.size();) {
      const size_t n = unicode::char_length(word, at);
      std::string s = word.substr(at, n);
      if (at > 0) s = prefix_ + s;
      if (at + n >= word.size()) s += suffix_;
      at += n;
      if (const auto id = vocab_.id_of(s)) {
        if (pending_unk) symbols.push_back(*pending_unk), pending_unk.reset();
        symbols.push_back(*id);
        continue;
      }
      if (byte_fallback_) {
        std::vector<int64_t> bytes;
        for (unsigned char b : s) {
          const auto id = vocab_.id_of(byte_token(b));
          if (!id) break;
          bytes.push_back(*id);
        }
        if (bytes.size() == s.size()) {
          symbols.insert(symbols.end(), bytes.begin(), bytes.end());
          continue;
        }
      }
      if (unk_) {
        if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
        pending_unk = *unk_;
      }
    }
    if (pending_unk) symbols.push_back(*pending_unk);
    // The lowest-ranked merge anywhere in the word first, leftmost on a tie, until none applies.
    for (;;) {
      size_t best = symbols.size();
      Merge best_merge{std::numeric_limits<int64_t>::max(), 0};
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = merges_.find(key(symbols[i], symbols[i + 1]));
        if (it != merges_.end() && it->second.rank < best_merge.rank) best = i, best_merge = it->second;
      }
      if (best == symbols.size()) break;
      symbols[best] = best_merge.id;
      symbols.erase(symbols.begin() + static_cast<long>(best) + 1);
    }
    ids.insert(ids.end(), symbols.begin(), symbols.end());
  }

 private:
  struct Merge {
    int64_t rank, id;
  };
  static uint64_t key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }

  std::string prefix_, suffix_;
  bool fuse_unk_, byte_fallback_, ignore_merges_;
  std::optional<int64_t> unk_;
  std::unordered_map<uint64_t, Merge> merges_;
};

// The segmentation of a piece with the highest total log-probability (Viterbi). A character no vocabulary entry
// starts with becomes the unknown token, scored 10 below the lowest piece; adjacent unknowns fuse into one.
class Unigram final : public ModelBase {
 public:
  explicit Unigram(const Json& j) : byte_fallback_(option(j, "byte_fallback", false)) {
    int64_t id = 0;
    for (const Json& entry : j.at("vocab")) {
      const std::string token = entry.at(0).get<std::string>();
      const double score = entry.at(1).get<double>();
      vocab_.add(token, id);
      scores_.push_back(score);
      min_score_ = std::min(min_score_, score);
      longest_ = std::max(longest_, token.size());
      ++id;
    }
    if (!j.contains("unk_id") || j.at("unk_id").is_null()) {
      unk_ = std::nullopt;
    } else {
      unk_ = integer(j.at("unk_id"), "Unigram unk_id");
      if (*unk_ < 0 || *unk_ >= id) {
        throw std::invalid_argument("Unigram unk_id " + std::to_string(*unk_) + " is outside the vocabulary of " +
                                    std::to_string(id));
      }
    }
  }

  void tokenize(const std::string& piece, std::vector<int64_t>& ids) const override {
    if (piece.empty()) return;
    struct Best {
      double score = 0;
      int64_t id = 0;
      std::optional<size_t> start;
    };
    const size_t size = piece.size();
    std::vector<Best> best(size + 1);
    const double unk_score = min_score_ - 10.0;
    for (size_t start = 0; start < size;) {
      const double here = best[start].score;
      const size_t char_bytes = unicode::char_length(piece, start);
      bool single = false;
      for (size_t end = start + 1; end <= size && end - start <= longest_; ++end) {
        const auto id = vocab_.id_of(piece.substr(start, end - start));
        if (!id) continue;
        const double candidate = here + scores_[static_cast<size_t>(*id)];
        if (!best[end].start || candidate > best[end].score) best[end] = {candidate, *id, start};
        if (end - start == char_bytes) single = true;
      }
      if (!single) {
        if (!unk_) throw std::invalid_argument("Unigram: '" + piece + "' has a character outside the vocabulary "
                                               "and the model has no unk_id");
        Best& target = best[start + char_bytes];
        if (!target.start || here + unk_score > target.score) target = {here + unk_score, *unk_, start};
      }
      start += char_bytes;
    }
    std::vector<std::string> strings;  // right to left; unknowns fused
    std::string unknown;
    for (size_t end = size; end > 0;) {
      const Best& node = best[end];
      const size_t start = *node.start;
      if (unk_ && node.id == *unk_) {
        unknown = piece.substr(start, end - start) + unknown;
      } else {
        if (!unknown.empty()) strings.push_back(std::move(unknown)), unknown.clear();
        strings.push_back(piece.substr(start, end - start));
      }
      end = start;
    }
    if (!unknown.empty()) strings.push_back(std::move(unknown));
    for (auto it = strings.rbegin(); it != strings.rend(); ++it) {
      if (const auto id = vocab_.id_of(*it)) {
        ids.push_back(*id);
        continue;
      }
      if (byte_fallback_) {
        std::vector<int64_t> bytes;
        for (unsigned char b : *it) {
          const auto id = vocab_.id_of(byte_token(b));
          if (!id) break;
          bytes.push_back(*id);
        }
        if (bytes.size() == it->size()) {
          ids.insert(ids.end(), bytes.begin(), bytes.end());
          continue;
        }
      }
      ids.push_back(*unk_);
    }
  }

 private:
  bool byte_fallback_;
  std::vector<double> scores_;
  double min_score_ = std::numeric_limits<double>::infinity();
  size_t longest_ = 0;  // bytes of the longest piece
  std::optional<int64_t> unk_;
};

class WordLevel final : public ModelBase {
 public:
  explicit WordLevel(const Json& j) {
    vocab_ = vocab_of_object(j.at("vocab"));
    unk_ = vocab_.required(option<std::string>(j, "unk_token", "<unk>"), "WordLevel unk_token");
  }
  void tokenize(const std::string& word, std::vector<int64_t>& ids) const override {
    ids.push_back(vocab_.id_of(word).value_or(unk_));
  }

 private:
  int64_t unk_;
};

}  // namespace

std::unique_ptr<Model> make_model(const Json& j) {
  // Files from before models carried a "type" are BPE when they list merges.
  const std::string type = option<std::string>(j, "type", j.contains("merges") ? "BPE" : "");
  if (type == "WordPiece") return std::make_unique<WordPiece>(j);
  if (type == "BPE") return std::make_unique<Bpe>(j);
  if (type == "Unigram") return std::make_unique<Unigram>(j);
  if (type == "WordLevel") return std::make_unique<WordLevel>(j);
  throw std::invalid_argument("model type '" + type + "' is not supported (known: WordPiece, BPE, Unigram, WordLevel)");
}

}  // namespace shardtrain::data::hf
