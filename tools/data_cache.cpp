// `shardtrain data cache [DIR] [--prune | --clear]`: what a cache directory keeps — the packed token streams of
// data.packing (data/pipeline/packed_texts.h), each with its size, tokens, documents and the files it was counted from,
// and the Arrow copies of Parquet files (data/formats/table_files.h), each with its source — whether a start would read
// each (current: its sources are as they were), and their removal: --prune those no start will read again (a source
// changed or gone, a damaged file), --clear all of them; as datasets' cleanup_cache_files. One another process is
// making (its lock held) is left alone.
#include <cstdio>
#include <iostream>
#include <stdexcept>

#include "cli_args.h"
#include "commands.h"
#include "data/formats/table_files.h"
#include "shardtrain/data/pipeline/packed_texts.h"
#include "shardtrain/io/files.h"

namespace shardtrain::cli {
namespace {

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// Removes a stream or a copy and its lock file, unless a process holds the lock (making it right now).
bool remove_entry(const std::string& path) {
  const std::string lock_path = path + ".lock";
  if (io::path_exists(lock_path)) {
    io::FileLock lock(lock_path);
    if (!lock.try_lock()) return false;
    io::remove_tree(lock_path);  // a process opening it from now on makes a new one (a whole file either way)
  }
  io::remove_tree(path);
  return true;
}

}  // namespace

int run_data_cache(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {}, {"prune", "clear"});
  if (a.positionals.size() > 1) throw std::invalid_argument("data cache takes at most one directory");
  if (a.has("prune") && a.has("clear")) throw std::invalid_argument("--prune and --clear: give one");
  const std::string dir = a.positionals.empty() ? data::default_cache_dir() : a.positionals[0];
  if (dir.empty()) throw std::invalid_argument("no cache directory: give one (no $SHARDTRAIN_CACHE, no home)");
  // One kind of entry: each listed, removed as --prune or --clear says, then their count and sizes.
  struct Entry {
    std::string path, what;  // what: its description after path and size
    int64_t bytes = 0;
    bool keep = false;  // whole and current: --prune leaves it
  };
  const auto report = [&](const std::vector<Entry>& entries, const std::string& kind) {
    int64_t total = 0, removed = 0, freed = 0;
    for (const Entry& e : entries) {
      total += e.bytes;
      std::string line = e.path + "  " + mib(e.bytes) + "  " + e.what;
      if (a.has("clear") || (a.has("prune") && !e.keep)) {
        if (remove_entry(e.path)) {
          ++removed, freed += e.bytes;
          line += "  removed";
        } else {
          line += "  in use (being made), left";
        }
      }
      std::cout << line << "\n";
    }
    std::cout << "data cache: " << entries.size() << " " << kind << " in " << dir << ", " << mib(total);
    if (a.has("prune") || a.has("clear")) std::cout << "; removed " << removed << ", " << mib(freed) << " freed";
    std::cout << "\n";
  };

  std::vector<Entry> streams;
  for (const data::CachedStream& s : data::cached_streams(dir)) {
    const std::string sources = (s.sources.empty() ? std::string("no file") : s.sources.front()) +
                                (s.sources.size() > 1 ? " and " + std::to_string(s.sources.size() - 1) + " more" : "");
    streams.push_back({s.path,
                       !s.whole ? "damaged (not a whole stream file)"
                                : std::to_string(s.tokens) + " tokens of " + std::to_string(s.documents) +
                                      " documents  " + (s.current ? "current" : "stale (a source changed or is gone)") +
                                      "  from " + sources,
                       s.bytes, s.whole && s.current});
  }
  report(streams, "packed streams");
  std::vector<Entry> copies;
  for (const data::TableCopy& c : data::table_copies(dir)) {
    copies.push_back({c.path,
                      !c.whole ? "damaged (not a whole Arrow copy)"
                               : std::string(c.current ? "current" : "stale (its source changed or is gone)") +
                                     "  of " + c.source,
                      c.bytes, c.whole && c.current});
  }
  report(copies, "Arrow copies of Parquet files");
  return 0;
}

}  // namespace shardtrain::cli
