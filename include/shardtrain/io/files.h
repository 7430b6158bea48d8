// Files that are never half-written, with POSIX calls only (libtorch.so exports std::filesystem functions that
// crash when they interpose libstdc++'s: docs/notes/libtorch-2.11.md). Errors throw std::runtime_error naming the
// path and the system's reason.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::io {

// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename over `path`, fsync of
// the directory. Readers see the old file or the new one, never a part.
void write_file_atomic(const std::string& path, const std::vector<char>& bytes);
std::vector<char> read_file(const std::string& path);
bool path_exists(const std::string& path);
// mkdir -p.
void make_directories(const std::string& path);
// Removes a directory tree (or a file); a missing path is not an error.
void remove_tree(const std::string& path);

}  // namespace shardtrain::io
