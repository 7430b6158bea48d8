// A file mapped into memory, private and copy-on-write, for loads whose tensors are views of the file (torch.load's
// mmap=True): pages are read from the page cache as a tensor is touched (reclaimable, not the process's own
// memory), and a write to a loaded tensor changes only this process's copy of that page. Shared by io::load_pickle
// and io::load_torch_state_dict.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::io {

class MappedFile {
 public:
  // Maps `path` whole; mapped() is false when it cannot be (missing, empty, a file system without mmap): the caller
  // then reads instead.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  bool mapped() const { return addr_ != nullptr; }
  size_t size() const { return size_; }
  char* at(size_t offset) const { return addr_ + offset; }

 private:
  char* addr_ = nullptr;
  size_t size_ = 0;
};

// The bytes at `offset` in the mapping as a storage's CPU data, keeping the mapping alive (unmapped when the last
// storage over it is freed).
at::DataPtr mapped_bytes(const std::shared_ptr<MappedFile>& file, size_t offset);

// A file's bytes for loads whose tensors are views of them: the file mapped, or where it cannot be, read whole.
struct FileBytes {
  std::shared_ptr<MappedFile> mapped;
  std::shared_ptr<std::vector<char>> read;  // set when the file could not be mapped
  const char* data() const { return read ? read->data() : mapped->at(0); }
  size_t size() const { return read ? read->size() : mapped->size(); }
  at::DataPtr at(size_t offset) const;  // as mapped_bytes, keeping whichever holds them alive
};
// Throws std::runtime_error naming `path` when it cannot be read either way.
FileBytes file_bytes(const std::string& path);

}  // namespace shardtrain::io
