// A Hugging Face tokenizer.json, encoding and decoding as the `tokenizers` library does: added tokens split out
// first, then the file's normalizer, pre-tokenizer and model (WordPiece, BPE with byte-level or byte-fallback
// alphabets, Unigram, WordLevel), its post-processor's template of special tokens, truncation and padding, and
// its decoder. tests/data/tokenizer_json_test.cpp holds it to the library on BERT-, GPT-2-, Llama 2/3- and T5-style
// files.
//
//   HfTokenizer tok("model_dir/tokenizer.json");
//   Encoding e = tok.encode("Hello there", 32);     // e.g. Llama 3: <|begin_of_text|> Hello there, padded
//   std::string back = tok.decode(e.ids);            // "Hello there"
#pragma once

#include <memory>

#include "shardtrain/data/tokenizers/tokenizer.h"

namespace shardtrain::data {

class HfTokenizer final : public Tokenizer {
 public:
  // Reads `path` and the tokenizer_config.json beside it, when there is one, for the pad and mask tokens
  // transformers would use. Throws std::invalid_argument naming the file and the stage or token it cannot use
  // (e.g. a pre-tokenizer type this implementation lacks).
  explicit HfTokenizer(const std::string& path);
  // A tokenizer.json's content already in memory (`name` stands for the file in messages), with the pad and mask
  // tokens given by name (empty: found as for a file without tokenizer_config.json).
  struct InMemory {
    std::string text, name, pad_token, mask_token;
  };
  explicit HfTokenizer(const InMemory& json);
  ~HfTokenizer() override;

  // The pieces the model tokenizes one by one: the text with its added tokens split out, normalized and
  // pre-tokenized (tokenizers' pre_tokenize_str after normalization).
  std::vector<std::string> pieces(const std::string& text) const;

  std::vector<int64_t> token_ids(const std::string& text) const override;
  Encoding encode(const std::string& text, int64_t length) const override;
  Encoding encode_pair(const std::string& first, const std::string& second, int64_t length) const override;
  // Each word through the normalizer, pre-tokenizer and model alone, as the tokenizers library encodes a
  // pre-tokenized input (a byte-level BPE's words get the space its add_prefix_space gives each).
  Encoding encode_words(const std::vector<std::string>& words, int64_t length) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const override;

  int64_t vocab_size() const override;  // the model's ids and the added tokens'
  std::optional<int64_t> find(const std::string& token) const override;
  int64_t pad_id() const override;
  std::optional<int64_t> mask_id() const override;
  // tokenizer_config.json's eos_token, else the first of </s>, <|endoftext|>, <|end_of_text|> it has.
  std::optional<int64_t> eos_id() const override;
  std::vector<int64_t> special_ids() const override;
  std::string describe() const override;
  uint64_t fingerprint() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::data
