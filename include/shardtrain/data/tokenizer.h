// BERT's WordPiece tokenizer, tokenizing as Hugging Face's BertTokenizer does: clean-up (control characters out,
// whitespace to spaces), spaces around CJK ideographs; per word lower-casing and accent stripping (NFD, marks
// dropped) when `lowercase`; splitting at punctuation; then greedy longest-match-first sub-words ("##" marks a
// continuation), [UNK] for a word with no match or longer than 100 characters.
//
//   WordPieceTokenizer tok(load_vocab("vocab.txt"), /*lowercase=*/true);
//   auto ids = tok.encode("A red circle.", 32);   // [CLS] a red circle . [SEP] [PAD]...
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardtrain::data {

// vocab.txt: one token per line, the id is the line number. Throws naming the file when it cannot be read or
// lacks one of [PAD], [UNK], [CLS], [SEP], [MASK].
std::vector<std::string> load_vocab(const std::string& path);
void save_vocab(const std::vector<std::string>& vocab, const std::string& path);  // atomic

struct Encoding {
  std::vector<int64_t> ids;             // [CLS] tokens [SEP] then [PAD] up to the length asked for
  std::vector<int64_t> attention_mask;  // 1 for tokens, 0 for padding
  std::vector<int64_t> token_type_ids;  // 0 for the first sequence (and padding), 1 for a pair's second
  int64_t truncated = 0;                // tokens cut to fit the length asked for
};

class WordPieceTokenizer {
 public:
  WordPieceTokenizer(std::vector<std::string> vocab, bool lowercase);

  // The words and punctuation marks of `text` (BertTokenizer's BasicTokenizer).
  std::vector<std::string> basic_tokens(const std::string& text) const;
  // Sub-word tokens of `text`, without [CLS]/[SEP].
  std::vector<std::string> tokenize(const std::string& text) const;
  std::vector<int64_t> token_ids(const std::string& text) const;
  // [CLS] + ids + [SEP], truncated to `length` (the tokens are cut, [SEP] kept), padded with [PAD].
  Encoding encode(const std::string& text, int64_t length) const;
  // A sentence pair as BertTokenizerFast encodes it: [CLS] a [SEP] b [SEP], token type 1 from b on, padded to
  // `length`; truncated longest-first (the longer sequence loses tokens until both fit). An empty `second` gives
  // encode(first), as in transformers.
  Encoding encode_pair(const std::string& first, const std::string& second, int64_t length) const;

  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::string& token(int64_t id) const { return vocab_.at(static_cast<size_t>(id)); }
  int64_t id_of(const std::string& token) const;  // throws when absent
  int64_t pad_id() const { return pad_; }
  int64_t unk_id() const { return unk_; }
  int64_t cls_id() const { return cls_; }
  int64_t sep_id() const { return sep_; }
  int64_t mask_id() const { return mask_; }

 private:
  void word_pieces(const std::string& word, std::vector<std::string>& out) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t> ids_;
  bool lowercase_;
  int64_t pad_ = 0, unk_ = 0, cls_ = 0, sep_ = 0, mask_ = 0;
};

struct VocabOptions {
  int64_t size = 30522;       // at most this many tokens, special ones included
  int64_t min_frequency = 2;  // a merge needs a pair seen this often
  bool lowercase = true;
};

// Learns a WordPiece vocabulary from a corpus the way Hugging Face tokenizers' WordPieceTrainer does: words from
// the basic tokenizer, then byte-pair merges of characters ("##"-prefixed when they continue a word), most frequent
// pair first, until `size` tokens. Starts with [PAD] [UNK] [CLS] [SEP] [MASK], then every character.
std::vector<std::string> build_vocab(const std::vector<std::string>& texts, const VocabOptions& options);

}  // namespace shardtrain::data
