// Files that are never half-written, with POSIX calls only (libtorch.so exports std::filesystem functions that
// crash when they interpose libstdc++'s: docs/notes/libtorch-2.11.md). Errors throw std::runtime_error naming the
// path and the system's reason.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace shardtrain::io {

// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename over `path`, fsync of
// the directory. Readers see the old file or the new one, never a part.
void write_file_atomic(const std::string& path, const std::vector<char>& bytes);

// The same for a file written in pieces (a multi-gigabyte safetensors file): write() appends to the temporary file,
// commit() makes it `path`. Destroyed without commit() (an exception midway), the temporary file is removed and
// `path` is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t size);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};
std::vector<char> read_file(const std::string& path);
bool path_exists(const std::string& path);
// mkdir -p.
void make_directories(const std::string& path);
// Removes a directory tree (or a file); a missing path is not an error.
void remove_tree(const std::string& path);

}  // namespace shardtrain::io
