// The stages of a Hugging Face tokenizer.json, as the `tokenizers` library runs them (private to lib/models/src/data):
//
//   text -> added tokens split out -> Normalizer -> PreTokenizer (pieces) -> Model (ids per piece)
//        -> post-processor template ([CLS] A [SEP] ...) -> truncation, padding
//   ids -> tokens -> Decoder -> text
//
// Each stage is built from its JSON object by make_* and throws std::invalid_argument naming the "type" it does
// not know. Offsets are not tracked: shardtrain needs the ids, not the alignments, so every stage works on plain
// UTF-8 strings (a piece remembers only whether it starts the input, which Metaspace's "first" scheme asks).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::data {
class Regex;  // regex.h
}  // namespace shardtrain::data

namespace shardtrain::data::hf {

using Json = nlohmann::json;

struct Piece {
  std::string text;
  bool at_start = false;  // begins at the input's first byte
};

// How a split treats what its pattern matched (tokenizers' SplitDelimiterBehavior), for "the-final--countdown"
// split at "-": REMOVED [the, final, countdown]; ISOLATED [the, -, final, -, -, countdown]; MERGED_WITH_PREVIOUS
// [the-, final-, -, countdown]; MERGED_WITH_NEXT [the, -final, -, -countdown]; CONTIGUOUS [the, -, final, --, ...].
enum class Behavior { REMOVED, ISOLATED, MERGED_WITH_PREVIOUS, MERGED_WITH_NEXT, CONTIGUOUS };

// `piece` cut at `matches` (byte ranges, in order) under `behavior`; `invert` swaps matched and unmatched
// stretches. Empty results are dropped, as the library drops them.
std::vector<Piece> split(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches, Behavior behavior,
                         bool invert = false);

// A split or replace pattern of tokenizer.json: {"String": literal} or {"Regex": pattern}.
class Pattern {
 public:
  explicit Pattern(const Json& j);
  ~Pattern();
  // Non-overlapping matches, left to right, as byte ranges [begin, end).
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(const std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual void tokenize(const std::string& piece, std::vector<int64_t>& ids) const = 0;  // appends
  virtual std::optional<int64_t> id_of(const std::string& token) const = 0;
  virtual std::optional<std::string> token_of(int64_t id) const = 0;
  virtual int64_t size() const = 0;  // ids 0 .. size-1
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// Null JSON gives nullptr (the stage is absent).
std::unique_ptr<Normalizer> make_normalizer(const Json& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j);
std::unique_ptr<Model> make_model(const Json& j);
std::unique_ptr<Decoder> make_decoder(const Json& j);

// GPT-2's byte-to-character table: each byte is a printable character (the printable Latin-1 bytes stand for
// themselves, the others take U+0100 onwards), so any byte string is a string of visible characters.
const std::vector<std::string>& byte_chars();      // byte -> UTF-8 of its character
std::string bytes_to_chars(const std::string& bytes);
std::optional<std::string> chars_to_bytes(const std::string& text);  // nullopt when a character is not in the table

std::string base64_decode(const std::string& text);  // throws std::invalid_argument on a character outside base64

// `v` as an integer (an id, a type id); std::invalid_argument naming `what` and the value when it is another kind of
// number or not a number (a JSON float would not convert safely: 1e60 is outside int64).
inline int64_t integer(const Json& v, const std::string& what) {
  if (!v.is_number_integer()) throw std::invalid_argument(what + " is " + v.dump() + ", not an integer");
  return v.get<int64_t>();
}

// `v` as a token or type id: an integer in [0, 2^32), the u32 the tokenizers library stores ids as.
inline int64_t id(const Json& v, const std::string& what) {
  const int64_t i = integer(v, what);
  if (i < 0 || i > int64_t{0xFFFFFFFF}) {
    throw std::invalid_argument(what + " is " + std::to_string(i) + ", outside the ids 0 .. 4294967295");
  }
  return i;
}

// Reading a stage's options: the value at `key`, or `fallback` when absent or null.
template <typename T>
T option(const Json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<T>();
}

}  // namespace shardtrain::data::hf
