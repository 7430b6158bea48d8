// Reading samples from data files the way the loader's workers do: data::SampleSource over the files, every sample
// read once in a seeded shuffled order (an epoch of the sampler), split over --threads threads. Prints one RESULT
// line of JSON: seconds to open (index) the files, seconds to read every sample, samples, those skipped (unreadable,
// as the loader skips them) and bytes read.
// bench/datasets_vs_hf.py runs it beside Hugging Face datasets' own random access to the same rows. With
// --tokenizer, each text sample is also tokenized to --length tokens (what the loader's workers do next; a tokenized
// dataset's rows need not be), to weigh reading tokens against tokenizing texts. With --pack as well, the texts
// are packed for causal LM (data::PackedTexts: counted on --threads threads, timed as count_s) and every block of
// --length tokens is read once in a shuffled order instead (what data.packing's loader reads); --keep-mib 0 reads
// each block by encoding its documents again, as a stream too large to keep in memory is read. --cache DIR is
// data.cache_dir: Parquet files are read from their Arrow copies there (the first run makes them, in open_s), and
// with --pack the stream is kept in a file there: the first run counts into it, a second reads it (count_s is then
// the time to find and check the file) and every block is a read of the file.
//
//   data_bench --kind text|image [--text a,b] [--label L] [--threads 2] [--cache DIR] [--tokenizer FILE
//              --length 128 [--pack [--keep-mib 1024]]] FILE...
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shardtrain/data/pipeline/packed_texts.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/tokenizers/tokenizer.h"

int main(int argc, char** argv) {
  using namespace shardtrain;
  data::SampleKind kind = data::SampleKind::TEXT;
  data::TextFields fields;
  int threads = 2;
  std::shared_ptr<const data::Tokenizer> tokenizer;
  int64_t length = 128;
  bool pack = false;
  int64_t keep_bytes = data::PackedTexts::Options().keep_bytes;
  std::string cache_dir;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--kind" && has_value) {
      kind = std::string(argv[++i]) == "image" ? data::SampleKind::IMAGE : data::SampleKind::TEXT;
    } else if (arg == "--text" && has_value) {
      fields.text.clear();
      std::stringstream list(argv[++i]);
      for (std::string f; std::getline(list, f, ',');) fields.text.push_back(f);
    } else if (arg == "--label" && has_value) {
      fields.label = argv[++i];
    } else if (arg == "--tokenizer" && has_value) {
      tokenizer = data::open_tokenizer(argv[++i]);
    } else if (arg == "--length" && has_value) {
      length = std::stoll(argv[++i]);
    } else if (arg == "--pack") {
      pack = true;
    } else if (arg == "--keep-mib" && has_value) {
      keep_bytes = std::stoll(argv[++i]) << 20;
    } else if (arg == "--cache" && has_value) {
      cache_dir = argv[++i];
    } else if (arg == "--threads" && has_value) {
      threads = std::max(1, std::stoi(argv[++i]));
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty() || (pack && !tokenizer)) {
    std::cerr << "usage: data_bench --kind text|image [--text a,b] [--label L] [--threads 2] [--cache DIR] "
                 "[--tokenizer FILE --length 128 [--pack [--keep-mib 1024]]] FILE...\n";
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto source = std::make_shared<const data::SampleSource>(files, kind, fields, cache_dir);
  const auto t1 = std::chrono::steady_clock::now();
  std::unique_ptr<data::PackedTexts> packed;
  if (pack) {
    data::PackedTexts::Options o;
    o.length = length, o.threads = threads, o.keep_bytes = keep_bytes, o.cache_dir = cache_dir;
    packed = std::make_unique<data::PackedTexts>(source, tokenizer, o);
  }
  const auto t1b = std::chrono::steady_clock::now();
  const int64_t items = packed ? packed->blocks() : source->size();
  std::vector<int64_t> order(static_cast<size_t>(items));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  std::atomic<int64_t> bytes{0}, next{0}, skipped{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      int64_t mine = 0;
      for (int64_t i = next++; i < items; i = next++) {
        if (packed) {
          mine += static_cast<int64_t>(8 * packed->block(order[static_cast<size_t>(i)]).size());
          continue;
        }
        data::RawSample s;
        try {
          s = source->read(order[static_cast<size_t>(i)]);
        } catch (const std::runtime_error&) {  // a null text, a damaged page: skipped and counted, as the loader does
          ++skipped;
          continue;
        }
        if (tokenizer && !s.tokenized) {
          const data::Encoding e = source->pairs() ? tokenizer->encode_pair(s.text, s.text_pair, length)
                                                  : tokenizer->encode(s.text, length);
          mine += static_cast<int64_t>(8 * e.ids.size());
        }
        mine += static_cast<int64_t>(s.text.size() + s.text_pair.size() + s.image.size() +
                                     8 * (s.input_ids.size() + s.token_type_ids.size()));
      }
      bytes += mine;
    });
  }
  for (auto& t : workers) t.join();
  const auto t2 = std::chrono::steady_clock::now();
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("RESULT {\"open_s\": %.4f, \"count_s\": %.4f, \"read_s\": %.4f, \"samples\": %lld, "
              "\"skipped\": %lld, \"blocks\": %lld, \"tokens\": %lld, \"bytes\": %lld, \"counted\": %s}\n",
              seconds(t0, t1), seconds(t1, t1b), seconds(t1b, t2), static_cast<long long>(source->size()),
              static_cast<long long>(skipped.load()), static_cast<long long>(packed ? packed->blocks() : 0),
              static_cast<long long>(packed ? packed->tokens() : 0), static_cast<long long>(bytes.load()),
              packed && !packed->counted() ? "false" : "true");
  return 0;
}
