#include "shardtrain/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shardtrain/io/files.h"

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

at::DataPtr FileBytes::at(size_t offset) const {
  if (!read) return mapped_bytes(mapped, offset);
  auto* owner = new std::shared_ptr<std::vector<char>>(read);
  return at::DataPtr(read->data() + offset, owner,
                     [](void* p) { delete static_cast<std::shared_ptr<std::vector<char>>*>(p); },
                     at::Device(at::kCPU));
}

FileBytes file_bytes(const std::string& path) {
  FileBytes f{std::make_shared<MappedFile>(path), nullptr};
  if (!f.mapped->mapped()) f.read = std::make_shared<std::vector<char>>(read_file(path));
  return f;
}

}  // namespace shardtrain::io
