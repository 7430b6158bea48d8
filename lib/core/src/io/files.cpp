#include "shardtrain/io/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace shardtrain::io {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " '" + path + "': " + std::strerror(errno));
}


void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) fail("cannot open", path);
  if (::fsync(fd) != 0 && errno != EINVAL) {  // some file systems cannot fsync a directory
    ::close(fd);
    fail("cannot fsync", path);
  }
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) throw std::logic_error("AtomicFile::write after commit of '" + path_ + "'");
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", tmp_);
    }
    done += static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw std::logic_error("AtomicFile::commit twice for '" + path_ + "'");
  if (::fsync(fd_) != 0) fail("cannot fsync", tmp_);
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename " + tmp_ + " to", path_);
  committed_ = true;
  fsync_path(parent_directory(path_), O_RDONLY | O_DIRECTORY);
}

void write_file_atomic(const std::string& path, const std::vector<char>& bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

std::vector<char> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open", path);
  std::vector<char> bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      errno = saved;
      fail("cannot read", path);
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  ::close(fd);
  return bytes;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void make_directories(const std::string& path) {
  if (path.empty() || path_exists(path)) return;
  make_directories(parent_directory(path));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) fail("cannot create directory", path);
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* dir = ::opendir(path.c_str())) {
      while (dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") remove_tree(path + "/" + name);
      }
      ::closedir(dir);
    }
    if (::rmdir(path.c_str()) != 0) fail("cannot remove directory", path);
  } else if (::unlink(path.c_str()) != 0) {
    fail("cannot remove", path);
  }
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail("cannot stat", path);
  return static_cast<int64_t>(st.st_size);
}

std::string file_identity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail("cannot stat", path);
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) fail("cannot resolve", path);
  std::string id = real;
  std::free(real);
  const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id + " " + std::to_string(static_cast<int64_t>(st.st_size)) + " " + std::to_string(ns);
}

std::vector<std::string> list_directory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (!dir) fail("cannot list directory", path);
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

void rename_durable(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("cannot rename " + from + " to", to);
  fsync_path(parent_directory(to), O_RDONLY | O_DIRECTORY);
}

void sync_path(const std::string& path) { fsync_path(path, is_directory(path) ? O_RDONLY | O_DIRECTORY : O_RDONLY); }

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open", path_);
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    fail("cannot stat", path_);
  }
  size_ = static_cast<int64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read(int64_t offset, int64_t size, char* out) const {
  if (offset < 0 || size < 0 || offset + size > size_) {
    throw std::runtime_error("read of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                             " in '" + path_ + "', which has " + std::to_string(size_) + " bytes");
  }
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, out + done, static_cast<size_t>(size - done), offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", path_);
    }
    if (n == 0) throw std::runtime_error("'" + path_ + "' ended early (changed while read?)");
    done += n;
  }
}

std::string ReadOnlyFile::read(int64_t offset, int64_t size) const {
  std::string out(static_cast<size_t>(size), '\0');
  read(offset, size, out.data());
  return out;
}

FileLock::FileLock(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open lock file", path_);
}

FileLock::~FileLock() { ::close(fd_); }  // releases the lock

bool FileLock::try_lock() {
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return false;
    if (errno != EINTR) fail("cannot lock", path_);
  }
  return true;
}

void FileLock::write_note(const std::string& line) const {
  // padded to a fixed width, so a shorter line leaves nothing of a longer one behind
  std::string padded = line.substr(0, 127);
  padded.resize(127, ' ');
  padded += '\n';
  if (::pwrite(fd_, padded.data(), padded.size(), 0) != static_cast<ssize_t>(padded.size())) {
    fail("cannot write", path_);
  }
}

std::string FileLock::read_note() const {
  char text[128];
  const ssize_t n = ::pread(fd_, text, sizeof text, 0);
  if (n <= 0) return "";
  std::string line(text, static_cast<size_t>(n));
  line.erase(line.find_last_not_of(" \n") + 1);
  return line;
}

}  // namespace shardtrain::io
