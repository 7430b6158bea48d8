// Causal language modelling's packed token stream, as transformers' run_clm groups texts: every document of a text
// source encoded whole (its tokenizer's special tokens included: Llama's <s>, none for GPT-2's byte-level BPE), end
// to end in the source's order, cut into blocks of `length` tokens. A block is one training row: a long document
// spans several blocks, short ones share a block (each attends to those before it in the row, as in run_clm).
// Nothing is cut away: the last block holds the remainder, padded by the loader (run_clm drops it, and the
// remainder of every 1000 texts it groups at once).
//
// Opening encodes every document once (a text source is tokenized for it, on `threads` threads; a tokenized
// dataset's rows are only read) and keeps the stream's ids in memory, 4 bytes a token, up to keep_bytes; a block
// is then a copy. A larger stream keeps 8 bytes per document and a block is read by encoding again the documents
// it overlaps, so a document of k blocks is tokenized about k times an epoch.
//
//   PackedTexts::Options o;
//   o.length = 1024, o.threads = 4;
//   PackedTexts packed(source, tokenizer, o);
//   std::vector<int64_t> row = packed.block(17);  // 1024 token ids (fewer in the last block)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::data {

class SampleSource;
class Tokenizer;

class PackedTexts {
 public:
  struct Options {
    int64_t length = 1024;  // tokens per block (the model's row: data.max_text_length)
    int64_t threads = 1;    // counting threads
    int64_t keep_bytes = int64_t{1} << 30;  // the most the stream's ids may take in memory (4 bytes a token)
    // Called from the constructor's thread about once a second while counting: documents counted, of all.
    std::function<void(int64_t done, int64_t total)> progress;
  };

  // Throws std::invalid_argument for a length below 1 or a tokenized row holding an id outside `tokenizer`'s
  // vocabulary (a dataset tokenized by another tokenizer). A document that cannot be read is left out, counted in
  // skipped() with its reason (the first ones).
  PackedTexts(std::shared_ptr<const SampleSource> source, std::shared_ptr<const Tokenizer> tokenizer,
              Options options);

  int64_t length() const { return length_; }
  int64_t documents() const { return static_cast<int64_t>(starts_.size()) - 1; }
  int64_t tokens() const { return starts_.back(); }
  int64_t blocks() const { return (tokens() + length_ - 1) / length_; }
  int64_t skipped() const { return skipped_; }
  bool kept() const { return !kept_.empty(); }  // the ids are in memory (else encoded again per block)
  const std::vector<std::string>& first_errors() const { return first_errors_; }
  // "packed: 20500 tokens of 200 documents in 21 blocks of 1024 (the last 20 tokens), in memory (0.1 MiB)", for
  // the start-up log.
  std::string describe() const;

  // Block i's token ids: length() of them, fewer in the last block. Throws std::out_of_range for i outside
  // [0, blocks()), std::runtime_error naming the document when one reads differently than when it was counted
  // (its file changed).
  std::vector<int64_t> block(int64_t i) const;

 private:
  struct Document {
    std::string key;  // RawSample::key
    std::vector<int64_t> ids;
  };
  Document document(int64_t d) const;

  std::shared_ptr<const SampleSource> source_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t length_;
  int64_t keep_bytes_;
  std::vector<int64_t> starts_;  // (documents + 1): where each document's tokens start in the stream; then the end
  std::vector<std::vector<uint32_t>> kept_;  // per document its ids, when the stream fits keep_bytes; else empty
  int64_t skipped_ = 0;
  std::vector<std::string> first_errors_;
};

}  // namespace shardtrain::data
