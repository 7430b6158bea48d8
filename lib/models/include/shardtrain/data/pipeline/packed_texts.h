// Causal language modelling's packed token stream, as transformers' run_clm groups texts: every document of a text
// source encoded whole (its tokenizer's special tokens included: Llama's <s>, none for GPT-2's byte-level BPE; with
// append_eos its end of text after each), end to end in the source's order, cut into blocks of `length` tokens. A block
// is one training row: a long document spans several blocks, short ones share a block (each attends to those before it
// in the row, as in run_clm). Nothing is cut away: the last block holds the remainder, padded by the loader (run_clm
// drops it, and the remainder of every 1000 texts it groups at once).
//
// Opening encodes every document once (a text source is tokenized for it, on `threads` threads; a tokenized
// dataset's rows are only read) into the stream of ids. With a cache directory the stream is a file there, named by
// a fingerprint of the source's files (path, size, modification time), its fields and the tokenizer's own
// fingerprint, written atomically: every later start over the same texts and tokenizer (a restart, the node's other
// ranks, another run, any block length) reads it instead of counting, and a block is a read of 4 bytes a token
// (the ranks of a node share the file's pages). One process counts while the others wait on a lock file beside it,
// showing its progress. Without a cache, or when the directory cannot be written, the ids are kept in memory up to
// keep_bytes; a larger stream keeps 8 bytes per document and a block is read by encoding again the documents it
// overlaps, so a document of k blocks is tokenized about k times an epoch.
//
//   PackedTexts::Options o;
//   o.length = 1024, o.threads = 4, o.cache_dir = "/home/me/.cache/shardtrain";
//   PackedTexts packed(source, tokenizer, o);
//   std::vector<int64_t> row = packed.block(17);  // 1024 token ids (fewer in the last block)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::io {
class AtomicFile;
class ReadOnlyFile;
}  // namespace shardtrain::io

namespace shardtrain::data {

class SampleSource;
class Tokenizer;

class PackedTexts {
 public:
  struct Options {
    int64_t length = 1024;  // tokens per block (the model's row: data.max_text_length)
    int64_t threads = 1;    // counting threads
    int64_t keep_bytes = int64_t{1} << 30;  // the most the stream's ids may take in memory (4 bytes a token)
    std::string cache_dir;  // where the stream is kept for later starts (created when missing); "": nowhere
    // The tokenizer's end of text after every document that does not end in it already (torchtitan's and
    // Megatron's separation of documents; run_clm's GPT-2 adds none). Throws std::invalid_argument when the
    // tokenizer has none.
    bool append_eos = false;
    // Called from the constructor's thread about once a second while counting, or while waiting for another
    // process counting into the cache: documents counted, of all.
    std::function<void(int64_t done, int64_t total)> progress;
  };

  // Throws std::invalid_argument for a length below 1 or a tokenized row holding an id outside `tokenizer`'s
  // vocabulary (a dataset tokenized by another tokenizer). A document that cannot be read is left out, counted in
  // skipped() with its reason (the first ones).
  PackedTexts(std::shared_ptr<const SampleSource> source, std::shared_ptr<const Tokenizer> tokenizer,
              Options options);
  ~PackedTexts();

  int64_t length() const { return length_; }
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  int64_t blocks() const { return (tokens() + length_ - 1) / length_; }
  int64_t skipped() const { return skipped_; }
  const std::vector<std::string>& first_errors() const { return first_errors_; }  // in document order
  enum class Where { CACHE_FILE, MEMORY, ENCODED_AGAIN };  // where a block's ids come from
  Where where() const;
  const std::string& cache_file() const { return cache_path_; }  // the stream's file; "" without a cache
  bool counted() const { return counted_; }  // this process counted the documents (not read from the cache)
  // "packed: 20500 tokens of 200 documents in 21 blocks of 1024 (the last 20 tokens), cached in
  // /home/me/.cache/shardtrain/packed-0123456789abcdef.tokens (0.1 MiB, counted by an earlier start)", for the
  // start-up log.
  std::string describe() const;

  // Block i's token ids: length() of them, fewer in the last block. Throws std::out_of_range for i outside
  // [0, blocks()), std::runtime_error naming the document when one reads differently than when it was counted
  // (its file changed) or the cache file when it holds an id outside the vocabulary (damaged).
  std::vector<int64_t> block(int64_t i) const;

 private:
  struct Document {
    std::string key;  // RawSample::key
    std::vector<int64_t> ids;
  };
  struct Chunk;
  Document document(int64_t d) const;
  // Encodes every document on options.threads threads, handing `take` their chunks in document order (under a
  // lock); rethrows the first error that is not one document's.
  void count(const Options& options, const std::function<void(Chunk&)>& take);
  void count_into_memory(const Options& options, io::AtomicFile* file);
  bool read_cache(const std::string& path, const std::string& key);
  void use_cache(const Options& options);

  std::shared_ptr<const SampleSource> source_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::optional<int64_t> eos_;  // appended to every document (Options::append_eos)
  int64_t length_;
  int64_t keep_bytes_;
  int64_t documents_ = 0, tokens_ = 0, skipped_ = 0;
  std::vector<std::string> first_errors_;
  bool counted_ = false;
  std::string cache_path_;
  std::string cache_problem_;  // why there is no file although a directory was given
  std::string cache_note_;     // what was wrong with a file found there (then replaced)
  std::shared_ptr<const io::ReadOnlyFile> file_;  // the cache file, when reading from it
  std::vector<uint32_t> stream_;  // the ids in memory (ids < vocab_size < 2^32); else empty
  std::vector<int64_t> starts_;   // encoding again: (documents + 1) where each document starts, then the end
};

// The default cache directory (as datasets' cache is found): $SHARDTRAIN_CACHE, else $XDG_CACHE_HOME/shardtrain, else
// ~/.cache/shardtrain; "" without a home.
std::string default_cache_dir();

// A stream file in a cache directory (`shardtrain data cache` lists them).
struct CachedStream {
  std::string path;
  int64_t bytes = 0;
  bool whole = false;  // its trailer reads and its sizes agree (else a damaged or foreign file; the rest unset)
  int64_t tokens = 0, documents = 0;
  std::vector<std::string> sources;  // the files it was counted from
  // Every source is still as it was counted (same path, size and modification time): a start over them reads it.
  bool current = false;
};
// The packed-*.tokens files of `dir`, sorted by name; none when it does not exist.
std::vector<CachedStream> cached_streams(const std::string& dir);

}  // namespace shardtrain::data
