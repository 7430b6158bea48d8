// Regular expressions for tokenizer.json's split patterns, through Oniguruma (Debian's libonig-dev) with the Ruby
// syntax and UTF-8: the engine and settings Hugging Face's tokenizers use, so patterns such as GPT-2's
// `'s|'t| ?\p{L}+|\s+(?!\S)` match the same spans.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain::data {

class Regex {
 public:
  explicit Regex(const std::string& pattern);  // throws std::invalid_argument naming the pattern and the error
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The non-overlapping matches of `text`, left to right, as byte ranges [begin, end). An empty match right
  // after the previous match is skipped, as Rust's onig crate does.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace shardtrain::data
