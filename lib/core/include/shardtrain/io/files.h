// Files that are never half-written, with POSIX calls only (libtorch.so exports std::filesystem functions that
// crash when they interpose libstdc++'s: docs/notes/libtorch-2.11.md). Errors throw std::runtime_error naming the
// path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
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
// The directory a path is in: "a/b" of "a/b/c", "/" of "/a", "." of a name without one.
std::string parent_directory(const std::string& path);
// Removes a directory tree (or a file); a missing path is not an error.
void remove_tree(const std::string& path);

bool is_directory(const std::string& path);
int64_t file_size(const std::string& path);
// "/abs/path 1048576 1732712345123456789": the absolute path (symbolic links resolved), size in bytes and
// modification time in nanoseconds, which change when the file does (make's rule), for keys of caches derived
// from it.
std::string file_identity(const std::string& path);
// The entries of a directory (no "." and ".."), sorted by name.
std::vector<std::string> list_directory(const std::string& path);
// rename(2) then fsync of the destination's directory: a directory renamed into place appears whole or not at all.
void rename_durable(const std::string& from, const std::string& to);
// fsync of a file or directory already written by other means.
void sync_path(const std::string& path);

// A file opened for reads at offsets (pread), shared by threads. Throws naming the path on errors; a read past the
// end is an error that says how many bytes were there.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(std::string path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly `size` bytes at `offset` into `out`.
  void read(int64_t offset, int64_t size, char* out) const;
  std::string read(int64_t offset, int64_t size) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// An exclusive advisory lock on `path` (created when missing), for processes of one machine sharing a cache:
// flock(2), released when the holder destroys it or exits, however it ends, so a crashed holder blocks nobody.
// The holder can leave a line of text in the file (its progress) for those waiting to show.
class FileLock {
 public:
  explicit FileLock(std::string path);  // opens the file; throws naming it when it cannot
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool try_lock();                       // takes the lock if no other process holds it
  void write_note(const std::string& line) const;  // over the file's first bytes (the holder)
  std::string read_note() const;                   // what the holder last wrote ("" at first)

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace shardtrain::io
