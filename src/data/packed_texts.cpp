#include "shardtrain/data/packed_texts.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "shardtrain/data/source.h"
#include "shardtrain/data/tokenizer.h"

namespace shardtrain::data {
namespace {

constexpr size_t kKeptErrors = 8;
constexpr int64_t kChunk = 64;  // documents a counting thread takes at a time

// A tokenized row with an id the tokenizer does not have: the whole dataset is another tokenizer's, so the run
// stops (what a damaged document does not do).
class ForeignIds : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace

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
  const int64_t n = source_->size();
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  // the memory the kept ids take (a vector per document too); over keep_bytes, no more are kept
  std::atomic<int64_t> kept_bytes{static_cast<int64_t>(n * sizeof(std::vector<uint32_t>))};
  std::atomic<bool> keeping{kept_bytes <= options.keep_bytes};
  std::vector<std::vector<uint32_t>> kept(keeping ? static_cast<size_t>(n) : 0);
  // Threads take chunks of documents in turn; the first error that is not a damaged document (an id outside the
  // vocabulary) stops them all and is rethrown.
  std::atomic<int64_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable finished;
  std::exception_ptr fatal;
  const int64_t thread_count = std::max<int64_t>(1, options.threads);
  int64_t running = thread_count;  // under `mutex`
  auto count = [&] {
    for (int64_t first; !stop && (first = next.fetch_add(kChunk)) < n;) {
      for (int64_t d = first; d < std::min(n, first + kChunk) && !stop; ++d) {
        try {
          const Document doc = document(d);
          const auto size = static_cast<int64_t>(doc.ids.size());
          counts[static_cast<size_t>(d)] = size;
          if (keeping && (kept_bytes += 4 * size) <= options.keep_bytes) {
            kept[static_cast<size_t>(d)].assign(doc.ids.begin(), doc.ids.end());  // ids < vocab_size < 2^32
          } else {
            keeping = false;
          }
        } catch (const ForeignIds&) {
          std::lock_guard<std::mutex> lock(mutex);
          if (!fatal) fatal = std::current_exception();
          stop = true;
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mutex);
          ++skipped_;
          if (first_errors_.size() < kKeptErrors) first_errors_.push_back(e.what());
        }
        ++done;
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    --running;
    finished.notify_all();
  };
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < thread_count; ++t) threads.emplace_back(count);
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
  starts_.assign(1, 0);
  starts_.reserve(static_cast<size_t>(n) + 1);
  for (int64_t c : counts) starts_.push_back(starts_.back() + c);
  if (keeping) kept_ = std::move(kept);
  if (tokens() == 0) {
    throw std::invalid_argument("PackedTexts: the " + std::to_string(n) + " documents hold no tokens" +
                                (first_errors_.empty() ? "" : " (the first unreadable: " + first_errors_[0] + ")"));
  }
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
  return doc;
}

std::vector<int64_t> PackedTexts::block(int64_t i) const {
  if (i < 0 || i >= blocks()) {
    throw std::out_of_range("PackedTexts: block " + std::to_string(i) + " of " + std::to_string(blocks()));
  }
  const int64_t begin = i * length_, end = std::min(begin + length_, tokens());
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  // the last document starting at or before `begin` (a run of empty ones ends there), then those starting before end
  auto d = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
  for (; d < documents() && starts_[static_cast<size_t>(d)] < end; ++d) {
    const int64_t first = starts_[static_cast<size_t>(d)], last = starts_[static_cast<size_t>(d) + 1];
    if (first == last) continue;  // empty or left out
    const auto from = std::max(begin, first) - first, to = std::min(end, last) - first;
    if (!kept_.empty()) {
      const std::vector<uint32_t>& ids = kept_[static_cast<size_t>(d)];
      out.insert(out.end(), ids.begin() + from, ids.begin() + to);
      continue;
    }
    const Document doc = document(d);
    if (static_cast<int64_t>(doc.ids.size()) != last - first) {
      throw std::runtime_error(doc.key + ": " + std::to_string(doc.ids.size()) + " tokens now, " +
                               std::to_string(last - first) + " when the texts were packed (the file changed)");
    }
    out.insert(out.end(), doc.ids.begin() + from, doc.ids.begin() + to);
  }
  return out;
}

std::string PackedTexts::describe() const {
  std::string s = "packed: " + std::to_string(tokens()) + " tokens of " + std::to_string(documents()) +
                  " documents in " + std::to_string(blocks()) + " blocks of " + std::to_string(length_);
  if (const int64_t rest = tokens() % length_; rest != 0) s += " (the last " + std::to_string(rest) + " tokens)";
  char size[64];
  std::snprintf(size, sizeof size, "%.1f MiB", static_cast<double>(kept() ? 4 * tokens() : keep_bytes_) / (1 << 20));
  s += kept() ? std::string(", in memory (") + size + ")"
              : std::string(", encoded again per block (its ids would take over ") + size + ")";
  if (skipped_ > 0) s += ", " + std::to_string(skipped_) + " unreadable documents left out";
  return s;
}

}  // namespace shardtrain::data
