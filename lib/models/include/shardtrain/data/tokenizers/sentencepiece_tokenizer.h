// A SentencePiece .model file (T5's spiece.model, Llama 2's tokenizer.model) through Google's own library
// (Debian's libsentencepiece), with the special tokens transformers' slow tokenizers put around a text: T5 ends
// it with </s>, Llama starts it with <s>. Which of the two is read from the tokenizer_config.json beside the file
// (add_bos_token, add_eos_token), or given.
#pragma once

#include <memory>

#include "shardtrain/data/tokenizers/tokenizer.h"

namespace shardtrain::data {

struct SentencePieceOptions {
  std::optional<bool> add_bos, add_eos;  // unset: tokenizer_config.json's, else no <s> and a closing </s> (T5)
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path, const SentencePieceOptions& options = {});
  ~SentencePieceTokenizer() override;

  std::vector<int64_t> token_ids(const std::string& text) const override;
  Encoding encode(const std::string& text, int64_t length) const override;
  // a </s> b </s> (T5) or <s> a <s> b (Llama), every token of type 0, cut longest-first.
  Encoding encode_pair(const std::string& first, const std::string& second, int64_t length) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const override;

  int64_t vocab_size() const override;
  std::optional<int64_t> find(const std::string& token) const override;
  int64_t pad_id() const override;
  std::optional<int64_t> mask_id() const override { return std::nullopt; }
  std::optional<int64_t> eos_id() const override;  // the model's </s>
  std::vector<int64_t> special_ids() const override;
  std::string describe() const override;
  uint64_t fingerprint() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::data
