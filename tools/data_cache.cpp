// `shardtrain data cache [DIR] [--prune | --clear]`: the packed token streams data.packing keeps in a cache directory
// (data/packed_texts.h) — each with its size, tokens, documents and the files it was counted from, and whether a
// start over those files would read it (current: they are as they were counted) — and their removal: --prune the
// streams no start will read again (a source changed or gone, a damaged file), --clear all of them; as datasets'
// cleanup_cache_files. A stream another process is counting (its lock held) is left alone.
#include <cstdio>
#include <iostream>
#include <stdexcept>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/data/packed_texts.h"
#include "shardtrain/io/files.h"

namespace shardtrain::cli {
namespace {

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// Removes a stream and its lock file, unless a process holds the lock (counting into it right now).
bool remove_stream(const std::string& path) {
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
  const std::vector<data::CachedStream> streams = data::cached_streams(dir);
  int64_t total = 0, removed = 0, freed = 0;
  for (const data::CachedStream& s : streams) {
    total += s.bytes;
    std::string line = s.path + "  " + mib(s.bytes);
    if (!s.whole) {
      line += "  damaged (not a whole stream file)";
    } else {
      line += "  " + std::to_string(s.tokens) + " tokens of " + std::to_string(s.documents) + " documents  " +
              (s.current ? "current" : "stale (a source changed or is gone)") + "  from " +
              (s.sources.empty() ? std::string("no file") : s.sources.front()) +
              (s.sources.size() > 1 ? " and " + std::to_string(s.sources.size() - 1) + " more" : "");
    }
    const bool remove = a.has("clear") || (a.has("prune") && !(s.whole && s.current));
    if (remove) {
      if (remove_stream(s.path)) {
        ++removed, freed += s.bytes;
        line += "  removed";
      } else {
        line += "  in use (being counted), left";
      }
    }
    std::cout << line << "\n";
  }
  std::cout << "data cache: " << streams.size() << " packed streams in " << dir << ", " << mib(total);
  if (a.has("prune") || a.has("clear")) std::cout << "; removed " << removed << ", " << mib(freed) << " freed";
  std::cout << "\n";
  return 0;
}

}  // namespace shardtrain::cli
