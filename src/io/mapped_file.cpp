#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace shardtrain::io {

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    // PROT_WRITE with MAP_PRIVATE: a loaded tensor may be written (copy-on-write), never the file.
    void* addr = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (addr != MAP_FAILED) addr_ = static_cast<char*>(addr), size_ = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (addr_) ::munmap(addr_, size_);
}

at::DataPtr mapped_bytes(const std::shared_ptr<MappedFile>& file, size_t offset) {
  auto* owner = new std::shared_ptr<MappedFile>(file);
  return at::DataPtr(file->at(offset), owner, [](void* p) { delete static_cast<std::shared_ptr<MappedFile>*>(p); },
                     at::Device(at::kCPU));
}

}  // namespace shardtrain::io
