#include "shardtrain/data/pipeline/packed_texts.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/checksum.h"
#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

constexpr size_t kKeptErrors = 8;
constexpr int64_t kChunk = 64;  // documents a counting thread takes at a time

// A cache file is the stream's ids (uint32, this machine's byte order: little-endian on x86-64 and aarch64), then
// its key, the first errors joined by newlines, then this trailer (written last: a file is only renamed into
// place whole, so a trailer that reads names a whole file).
constexpr char kMagic[8] = {'S', 'T', 'P', 'A', 'C', 'K', '1', '\n'};
struct Trailer {
  char magic[8];
  uint64_t documents, tokens, skipped, key_bytes, errors_bytes;
};
static_assert(sizeof(Trailer) == 48, "the trailer is 48 bytes, no padding");

// The trailer of a whole stream file (its magic, and sizes that add up to the file's); nullopt for anything else.
std::optional<Trailer> whole_trailer(const io::ReadOnlyFile& file) {
  Trailer t{};
  const auto size = static_cast<uint64_t>(file.size());
  if (size < sizeof t) return std::nullopt;
  file.read(file.size() - static_cast<int64_t>(sizeof t), sizeof t, reinterpret_cast<char*>(&t));
  const uint64_t limit = uint64_t{1} << 60;  // no sum below overflows
  if (std::memcmp(t.magic, kMagic, sizeof kMagic) != 0 || t.tokens >= limit || t.key_bytes >= limit ||
      t.errors_bytes >= limit || 4 * t.tokens + t.key_bytes + t.errors_bytes + sizeof t != size) {
    return std::nullopt;
  }
  return t;
}

// What a stream depends on, the cache file's name hashed from it: the tokenizer, the fields read and every file
// of the source by path, size and modification time. Not the block length: blocks are cut when read.
std::string cache_key(const SampleSource& source, const Tokenizer& tokenizer, std::optional<int64_t> eos) {
  std::string key = "shardtrain packed texts 1\ntokenizer " + io::to_hex(tokenizer.fingerprint()) + " " +
                    std::to_string(tokenizer.vocab_size()) + "\neos " + (eos ? std::to_string(*eos) : "none") +
                    "\nfields";
  for (const std::string& field : source.fields().text) key += " " + field;
  key += "\n";
  for (const std::string& file : source.files()) key += "file " + io::file_identity(file) + "\n";
  return key;
}

// A tokenized row with an id the tokenizer does not have: the whole dataset is another tokenizer's, so the run
// stops (what a damaged document does not do).
class ForeignIds : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace

struct PackedTexts::Chunk {
  std::vector<int64_t> counts;  // tokens per document (0 for one left out)
  std::vector<uint32_t> ids;    // theirs, end to end
  std::vector<std::string> errors;  // why documents were left out
};

PackedTexts::PackedTexts(std::shared_ptr<const SampleSource> source, std::shared_ptr<const Tokenizer> tokenizer,
                         Options options)
    : source_(std::move(source)),
      tokenizer_(std::move(tokenizer)),
      length_(options.length),
      keep_bytes_(options.keep_bytes) {
  if (!source_ || !tokenizer_) throw std::invalid_argument("PackedTexts: a text source and a tokenizer are needed");
  if (length_ < 1) {
    throw std::invalid_argument("PackedTexts: blocks of " + std::to_string(length_) + " tokens; expected 1 or more");
  }
  if (options.append_eos) {
    eos_ = tokenizer_->eos_id();
    if (!eos_) {
      throw std::invalid_argument("data.packing_eos: the tokenizer (" + tokenizer_->describe() + ") has no end-of-"
                                  "text token (eos_token in tokenizer_config.json, </s>, <|endoftext|>)");
    }
  }
  if (options.cache_dir.empty()) {
    count_into_memory(options, nullptr);
  } else {
    use_cache(options);
  }
}

PackedTexts::~PackedTexts() = default;

void PackedTexts::count(const Options& options, const std::function<void(Chunk&)>& take) {
  const int64_t n = source_->size(), chunks = (n + kChunk - 1) / kChunk;
  // Threads take chunks of documents in turn and hand them over in order (one finished early waits in `early`);
  // the first error that is not a damaged document (an id outside the vocabulary) stops them all and is rethrown.
  std::atomic<int64_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable finished;
  std::map<int64_t, Chunk> early;  // under `mutex`, as the three below
  int64_t handed = 0;
  std::exception_ptr fatal;
  const int64_t thread_count = std::max<int64_t>(1, options.threads);
  int64_t running = thread_count;
  auto work = [&] {
    try {
      for (int64_t k; !stop && (k = next.fetch_add(1)) < chunks;) {
        Chunk chunk;
        for (int64_t d = k * kChunk; d < std::min(n, (k + 1) * kChunk) && !stop; ++d, ++done) {
          try {
            const Document doc = document(d);
            chunk.ids.insert(chunk.ids.end(), doc.ids.begin(), doc.ids.end());  // ids < vocab_size < 2^32
            chunk.counts.push_back(static_cast<int64_t>(doc.ids.size()));
          } catch (const ForeignIds&) {
            throw;
          } catch (const std::exception& e) {
            chunk.counts.push_back(0);
            chunk.errors.push_back(e.what());
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        early.emplace(k, std::move(chunk));
        for (auto it = early.find(handed); it != early.end() && !stop; it = early.find(++handed)) {
          take(it->second);
          early.erase(it);
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!fatal) fatal = std::current_exception();
      stop = true;
    }
    std::lock_guard<std::mutex> lock(mutex);
    --running;
    finished.notify_all();
  };
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < thread_count; ++t) threads.emplace_back(work);
  {
    std::unique_lock<std::mutex> lock(mutex);
    while (!finished.wait_for(lock, std::chrono::seconds(1), [&] { return running == 0; })) {
      if (!options.progress) continue;
      lock.unlock();
      options.progress(done, n);
      lock.lock();
    }
  }
  for (auto& t : threads) t.join();
  if (fatal) std::rethrow_exception(fatal);
}

void PackedTexts::count_into_memory(const Options& options, io::AtomicFile* file) {
  const int64_t n = source_->size();
  starts_.assign(1, 0);
  starts_.reserve(static_cast<size_t>(n) + 1);
  bool keeping = true;
  count(options, [&](Chunk& chunk) {
    for (int64_t size : chunk.counts) starts_.push_back(starts_.back() + size);
    for (std::string& e : chunk.errors) {
      if (first_errors_.size() < kKeptErrors) first_errors_.push_back(std::move(e));
    }
    skipped_ += static_cast<int64_t>(chunk.errors.size());
    keeping = keeping && 4 * static_cast<int64_t>(stream_.size() + chunk.ids.size()) <= options.keep_bytes;
    if (keeping) {
      stream_.insert(stream_.end(), chunk.ids.begin(), chunk.ids.end());
    } else if (!stream_.empty()) {
      std::vector<uint32_t>().swap(stream_);  // too large: encoded again per block instead
    }
    if (file && cache_problem_.empty()) {
      try {
        file->write(chunk.ids.data(), 4 * chunk.ids.size());
      } catch (const std::runtime_error& e) {
        cache_problem_ = e.what();  // a full disk: the run goes on without the file
      }
    }
  });
  documents_ = n, tokens_ = starts_.back(), counted_ = true;
  if (tokens_ == 0) {
    throw std::invalid_argument("PackedTexts: the " + std::to_string(n) + " documents hold no tokens" +
                                (first_errors_.empty() ? "" : " (the first unreadable: " + first_errors_[0] + ")"));
  }
}

bool PackedTexts::read_cache(const std::string& path, const std::string& key) {
  if (!io::path_exists(path)) return false;
  try {
    auto file = std::make_shared<const io::ReadOnlyFile>(path);
    const std::optional<Trailer> whole = whole_trailer(*file);
    if (!whole || whole->documents != static_cast<uint64_t>(source_->size()) || whole->skipped > whole->documents) {
      cache_note_ = "replaced " + path + ", which was not a whole stream file";
      return false;
    }
    const Trailer& t = *whole;
    const auto at = static_cast<int64_t>(4 * t.tokens);
    if (file->read(at, static_cast<int64_t>(t.key_bytes)) != key) return false;  // another stream of the same hash
    std::istringstream errors(file->read(at + static_cast<int64_t>(t.key_bytes), static_cast<int64_t>(t.errors_bytes)));
    first_errors_.clear();
    for (std::string line; std::getline(errors, line);) first_errors_.push_back(line);
    documents_ = static_cast<int64_t>(t.documents), tokens_ = static_cast<int64_t>(t.tokens);
    skipped_ = static_cast<int64_t>(t.skipped);
    file_ = std::move(file), cache_path_ = path;
    return true;
  } catch (const std::runtime_error& e) {
    cache_note_ = std::string("replaced an unreadable stream file: ") + e.what();
    return false;
  }
}

void PackedTexts::use_cache(const Options& options) {
  std::unique_ptr<io::FileLock> lock;
  std::string key, path;
  try {
    key = cache_key(*source_, *tokenizer_, eos_);
    path = options.cache_dir + "/packed-" + io::to_hex(io::checksum_bytes(key)) + ".tokens";
    if (read_cache(path, key)) return;
    io::make_directories(options.cache_dir);
    lock = std::make_unique<io::FileLock>(path + ".lock");
    // One process counts into the file; the others wait, showing its progress, then read the file. The lock goes
    // with its holder however that ends.
    for (auto shown = std::chrono::steady_clock::now(); !lock->try_lock();) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!options.progress || std::chrono::steady_clock::now() - shown < std::chrono::seconds(1)) continue;
      shown = std::chrono::steady_clock::now();
      long long done = 0, total = 0;
      if (std::sscanf(lock->read_note().c_str(), "%lld %lld", &done, &total) == 2) options.progress(done, total);
    }
    if (read_cache(path, key)) return;  // counted while this one waited
  } catch (const std::runtime_error& e) {  // no directory, no lock file: counted here alone
    cache_problem_ = e.what();
    count_into_memory(options, nullptr);
    return;
  }
  std::unique_ptr<io::AtomicFile> file;
  try {
    file = std::make_unique<io::AtomicFile>(path);
  } catch (const std::runtime_error& e) {
    cache_problem_ = e.what();
  }
  Options counting = options;
  counting.progress = [&](int64_t done, int64_t total) {
    try {
      lock->write_note(std::to_string(done) + " " + std::to_string(total));
    } catch (const std::runtime_error&) {  // the waiting show no progress, nothing else lost
    }
    if (options.progress) options.progress(done, total);
  };
  count_into_memory(counting, file.get());
  if (!file || !cache_problem_.empty()) return;
  try {
    std::string errors;
    for (const std::string& e : first_errors_) errors += e + "\n";
    Trailer t{};
    std::memcpy(t.magic, kMagic, sizeof kMagic);
    t.documents = static_cast<uint64_t>(documents_), t.tokens = static_cast<uint64_t>(tokens_);
    t.skipped = static_cast<uint64_t>(skipped_), t.key_bytes = key.size(), t.errors_bytes = errors.size();
    file->write(key.data(), key.size());
    file->write(errors.data(), errors.size());
    file->write(&t, sizeof t);
    file->commit();
    if (!read_cache(path, key)) throw std::runtime_error(path + " does not read back as written");
  } catch (const std::runtime_error& e) {
    cache_problem_ = e.what();
    return;
  }
  std::vector<uint32_t>().swap(stream_);  // the file's pages serve the blocks now
  std::vector<int64_t>().swap(starts_);
}

std::string default_cache_dir() {
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value ? value : "");
  };
  if (!env("SHARDTRAIN_CACHE").empty()) return env("SHARDTRAIN_CACHE");
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/shardtrain";
  return env("HOME").empty() ? "" : env("HOME") + "/.cache/shardtrain";
}

std::vector<CachedStream> cached_streams(const std::string& dir) {
  std::vector<CachedStream> out;
  if (!io::is_directory(dir)) return out;
  for (const std::string& name : io::list_directory(dir)) {
    const bool stream = name.rfind("packed-", 0) == 0 && name.size() >= 14 &&
                        name.compare(name.size() - 7, 7, ".tokens") == 0;
    if (!stream) continue;
    CachedStream c;
    c.path = dir + "/" + name;
    try {
      const io::ReadOnlyFile file(c.path);
      c.bytes = file.size();
      const std::optional<Trailer> t = whole_trailer(file);
      c.whole = t.has_value();
      if (c.whole) {
        c.tokens = static_cast<int64_t>(t->tokens), c.documents = static_cast<int64_t>(t->documents);
        std::istringstream key(file.read(4 * c.tokens, static_cast<int64_t>(t->key_bytes)));
        c.current = true;
        for (std::string line; std::getline(key, line);) {
          if (line.rfind("file ", 0) != 0) continue;
          const std::string identity = line.substr(5);  // "path size mtime": the path may hold spaces
          const size_t mtime = identity.rfind(' '), bytes = identity.rfind(' ', mtime - 1);
          c.sources.push_back(identity.substr(0, bytes));
          try {
            c.current = c.current && io::file_identity(c.sources.back()) == identity;
          } catch (const std::runtime_error&) {  // gone
            c.current = false;
          }
        }
      }
    } catch (const std::runtime_error&) {
      c.whole = false;
    }
    out.push_back(std::move(c));
  }
  return out;
}

PackedTexts::Where PackedTexts::where() const {
  return file_ ? Where::CACHE_FILE : !stream_.empty() ? Where::MEMORY : Where::ENCODED_AGAIN;
}

PackedTexts::Document PackedTexts::document(int64_t d) const {
  RawSample raw = source_->read(d);
  const Tokenizer& t = *tokenizer_;
  Document doc{std::move(raw.key), {}};
  if (raw.tokenized) {  // the dataset's own ids, a pair's second after the first
    doc.ids = std::move(raw.input_ids);
    doc.ids.insert(doc.ids.end(), raw.pair_ids.begin(), raw.pair_ids.end());
    for (int64_t id : doc.ids) {
      if (id < 0 || id >= t.vocab_size()) throw ForeignIds(foreign_id_error(doc.key, id, t));
    }
  } else {
    doc.ids = (source_->pairs() ? t.encode_pair(raw.text, raw.text_pair, kWholeText) : t.encode(raw.text, kWholeText))
                  .ids;
  }
  if (eos_ && (doc.ids.empty() || doc.ids.back() != *eos_)) doc.ids.push_back(*eos_);
  return doc;
}

std::vector<int64_t> PackedTexts::block(int64_t i) const {
  if (i < 0 || i >= blocks()) {
    throw std::out_of_range("PackedTexts: block " + std::to_string(i) + " of " + std::to_string(blocks()));
  }
  const int64_t begin = i * length_, end = std::min(begin + length_, tokens());
  if (file_) {
    std::vector<uint32_t> ids(static_cast<size_t>(end - begin));
    file_->read(4 * begin, 4 * (end - begin), reinterpret_cast<char*>(ids.data()));
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] >= tokenizer_->vocab_size()) {
        throw std::runtime_error(cache_path_ + ": token " + std::to_string(begin + static_cast<int64_t>(k)) +
                                 " is id " + std::to_string(ids[k]) + ", beyond the tokenizer's " +
                                 std::to_string(tokenizer_->vocab_size()) +
                                 " (the file is damaged; delete it to count the texts again)");
      }
    }
    return std::vector<int64_t>(ids.begin(), ids.end());
  }
  if (!stream_.empty()) return std::vector<int64_t>(stream_.begin() + begin, stream_.begin() + end);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  // the last document starting at or before `begin` (a run of empty ones ends there), then those starting before end
  auto d = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
  for (; d < documents() && starts_[static_cast<size_t>(d)] < end; ++d) {
    const int64_t first = starts_[static_cast<size_t>(d)], last = starts_[static_cast<size_t>(d) + 1];
    if (first == last) continue;  // empty or left out
    const Document doc = document(d);
    if (static_cast<int64_t>(doc.ids.size()) != last - first) {
      throw std::runtime_error(doc.key + ": " + std::to_string(doc.ids.size()) + " tokens now, " +
                               std::to_string(last - first) + " when the texts were packed (the file changed)");
    }
    const auto from = std::max(begin, first) - first, to = std::min(end, last) - first;
    out.insert(out.end(), doc.ids.begin() + from, doc.ids.begin() + to);
  }
  return out;
}

std::string PackedTexts::describe() const {
  std::string s = "packed: " + std::to_string(tokens()) + " tokens of " + std::to_string(documents()) +
                  " documents in " + std::to_string(blocks()) + " blocks of " + std::to_string(length_);
  if (const int64_t rest = tokens() % length_; rest != 0) s += " (the last " + std::to_string(rest) + " tokens)";
  auto mib = [](int64_t bytes) {
    char text[64];
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return std::string(text);
  };
  switch (where()) {
    case Where::CACHE_FILE:
      s += ", cached in " + cache_path_ + " (" + mib(4 * tokens()) +
           (counted_ ? ", counted now" : ", counted by an earlier start or another process") + ")";
      if (!cache_note_.empty()) s += "; " + cache_note_;
      break;
    case Where::MEMORY:
      s += ", in memory (" + mib(4 * tokens()) + ")";
      break;
    case Where::ENCODED_AGAIN:
      s += ", encoded again per block (its ids would take over " + mib(keep_bytes_) + ")";
      break;
  }
  if (!cache_problem_.empty()) s += ", not cached (" + cache_problem_ + ")";
  if (eos_) s += ", an end of text after each document (id " + std::to_string(*eos_) + ")";
  if (skipped_ > 0) s += ", " + std::to_string(skipped_) + " unreadable documents left out";
  return s;
}

}  // namespace shardtrain::data
