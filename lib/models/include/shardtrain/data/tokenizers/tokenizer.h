// Tokenizers: the interface the data pipeline reads text through, and BERT's WordPiece over a vocab.txt. Hugging Face
// tokenizer.json files (WordPiece, BPE, Unigram) are data/tokenizers/hf_tokenizer.h, SentencePiece .model files
// data/tokenizers/sentencepiece_tokenizer.h; open_tokenizer picks the right one for a file or a model directory.
//
// BERT's WordPiece tokenizer over a vocab.txt, tokenizing as Hugging Face's BertTokenizer does: the tokenizer.json
// transformers builds for a vocab.txt, run by HfTokenizer — clean-up (control characters out, whitespace to
// spaces), spaces around CJK ideographs, accent stripping (NFD, marks dropped) and lower-casing when `lowercase`;
// splitting at whitespace and punctuation; then greedy longest-match-first sub-words ("##" marks a continuation),
// [UNK] for a word with no match or longer than 100 characters; [CLS] a [SEP] (b [SEP]).
//
//   WordPieceTokenizer tok(load_vocab("vocab.txt"), /*lowercase=*/true);
//   auto ids = tok.encode("A red circle.", 32);   // [CLS] a red circle . [SEP] [PAD]...
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardtrain::data {

// vocab.txt: one token per line, the id is the line number. Throws naming the file when it cannot be read or
// lacks one of [PAD], [UNK], [CLS], [SEP], [MASK].
std::vector<std::string> load_vocab(const std::string& path);
void save_vocab(const std::vector<std::string>& vocab, const std::string& path);  // atomic

// encode's and encode_pair's length for the whole text: nothing cut, no padding (causal LM packing:
// data/pipeline/packed_texts.h).
constexpr int64_t kWholeText = -1;

struct Encoding {
  std::vector<int64_t> ids;             // special tokens around the text's ([CLS] .. [SEP]), then padding

  std::vector<int64_t> attention_mask;  // 1 for tokens, 0 for padding
  std::vector<int64_t> token_type_ids;  // 0 for the first sequence (and padding), 1 for a pair's second
  std::vector<int64_t> sequence_ids;    // 0: the first text's tokens, 1: the second's, -1: special tokens, padding
  // encode_words only: the word each token comes from (its index in the words), -1 for special tokens and padding
  // (transformers' word_ids(), None there); else empty.
  std::vector<int64_t> word_ids;
  int64_t truncated = 0;                // tokens cut to fit the length asked for
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text` alone, with no special tokens.
  virtual std::vector<int64_t> token_ids(const std::string& text) const = 0;
  // The model's input for `text`: the tokenizer's special tokens around its ids (BERT's [CLS] .. [SEP], T5's
  // .. </s>, Llama's <s> ..), exactly `length` long: the text's tokens cut to fit (the special ones kept), then
  // padding (attention mask 0). `length` kWholeText: all of them, unpadded.
  virtual Encoding encode(const std::string& text, int64_t length) const = 0;
  // A sentence pair (BERT's [CLS] a [SEP] b [SEP]), cut longest-first to fit `length` as the tokenizers library
  // does: the shorter keeps up to half the budget, the longer the rest. An empty `second` gives encode(first).
  // `length` kWholeText: both whole, unpadded.
  virtual Encoding encode_pair(const std::string& first, const std::string& second, int64_t length) const = 0;
  // Text already split into words (a token-classification dataset's `tokens`: CoNLL-2003's ["EU", "rejects", ...]),
  // as transformers' tokenizer(words, is_split_into_words=True) encodes it: each word tokenized alone, the ids end to
  // end between the special tokens, cut to fit `length` then padded; word_ids says which word each token is of. A
  // word that gives no token (a control character alone) has none. Throws std::invalid_argument for a tokenizer that
  // cannot (SentencePiece's).
  virtual Encoding encode_words(const std::vector<std::string>& words, int64_t length) const;
  // Text of `ids`; special tokens (and padding) left out when `skip_special`.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const = 0;

  virtual int64_t vocab_size() const = 0;                                   // ids are 0 .. vocab_size-1
  virtual std::optional<int64_t> find(const std::string& token) const = 0;  // nullopt when absent
  virtual int64_t pad_id() const = 0;                 // what padding holds (a real token id; masked out anyway)
  virtual std::optional<int64_t> mask_id() const = 0;  // masked language modelling's [MASK], when there is one
  // The end of a text (transformers' eos_token: </s>, GPT-2's <|endoftext|>, Llama 3's <|end_of_text|>), when the
  // tokenizer has one; what packing puts between documents (data.packing_eos).
  virtual std::optional<int64_t> eos_id() const = 0;
  virtual std::vector<int64_t> special_ids() const = 0;  // never masked or replaced by MLM
  virtual std::string describe() const = 0;  // kind, file and size, for the start-up log
  // XXH3-64 of everything that decides the ids (the tokenizer file's bytes, the options read beside it, the
  // lower-casing): what a cache of its output (data/pipeline/packed_texts.h) is keyed by.
  virtual uint64_t fingerprint() const = 0;
};

// How a pair of n1 and n2 tokens is cut to fit `budget` (tokenizers' LongestFirst): the shorter keeps its
// length up to half the budget, the longer the rest. Returns the kept lengths.
std::pair<int64_t, int64_t> longest_first(int64_t n1, int64_t n2, int64_t budget);

// `e`'s tokens padded to `length` (kWholeText: not padded): attention mask 1 over the tokens and 0 after, ids
// `pad_id`, token type 0 and sequence id -1 over the padding (token types and sequence ids also where `e` left them
// unset).
void pad_encoding(Encoding& e, int64_t length, int64_t pad_id);

// `e`'s word ids from its sequence ids: the n-th token of the (first) text is of word word_of[n]; -1 elsewhere.
// `e` encodes the words' ids end to end (encode_words' implementations); word_of holds one entry per such id.
void set_word_ids(Encoding& e, const std::vector<int64_t>& word_of);

// Why a tokenized dataset's row `key` cannot be read by `t`: its token id `id` is outside t's vocabulary.
std::string foreign_id_error(const std::string& key, int64_t id, const Tokenizer& t);

// The tokenizer at `path`: a tokenizer.json (Hugging Face), a .model (SentencePiece), a vocab.txt (WordPiece, with
// `lowercase` as BertTokenizer's do_lower_case), a vocab.json with merges.txt beside it (GPT-2's byte-level BPE, as
// transformers converts those files), or a model directory holding one of them (looked for in that order, as
// transformers' AutoTokenizer prefers the fast tokenizer). Throws naming the path when none is there.
std::shared_ptr<const Tokenizer> open_tokenizer(const std::string& path, bool lowercase = true);
// The file open_tokenizer reads for `path`: `path` itself, or the one it picks in a directory; empty when the
// directory holds none.
std::string tokenizer_file(const std::string& path);

class HfTokenizer;

class WordPieceTokenizer final : public Tokenizer {
 public:
  WordPieceTokenizer(std::vector<std::string> vocab, bool lowercase);
  ~WordPieceTokenizer() override;

  // The words and punctuation marks of `text` (BertTokenizer's BasicTokenizer).
  std::vector<std::string> basic_tokens(const std::string& text) const;
  // Sub-word tokens of `text`, without [CLS]/[SEP].
  std::vector<std::string> tokenize(const std::string& text) const;
  std::vector<int64_t> token_ids(const std::string& text) const override;
  // [CLS] + ids + [SEP], truncated to `length` (the tokens are cut, [SEP] kept), padded with [PAD].
  Encoding encode(const std::string& text, int64_t length) const override;
  // [CLS] a [SEP] b [SEP] as BertTokenizerFast encodes it, token type 1 from b on.
  Encoding encode_pair(const std::string& first, const std::string& second, int64_t length) const override;
  Encoding encode_words(const std::vector<std::string>& words, int64_t length) const override;
  // Tokens joined by spaces, "##" continuations glued on, spaces before punctuation dropped.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const override;

  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
  std::optional<int64_t> find(const std::string& token) const override;
  int64_t pad_id() const override { return pad_; }
  std::optional<int64_t> mask_id() const override { return mask_; }
  std::optional<int64_t> eos_id() const override { return std::nullopt; }  // BERT's texts end in [SEP], no end
  std::vector<int64_t> special_ids() const override { return {pad_, unk_, cls_, sep_, mask_}; }
  std::string describe() const override;
  uint64_t fingerprint() const override;

  const std::string& token(int64_t id) const { return vocab_.at(static_cast<size_t>(id)); }
  int64_t id_of(const std::string& token) const;  // throws when absent
  int64_t unk_id() const { return unk_; }
  int64_t cls_id() const { return cls_; }
  int64_t sep_id() const { return sep_; }

 private:
  std::vector<std::string> vocab_;
  std::unique_ptr<HfTokenizer> hf_;
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
