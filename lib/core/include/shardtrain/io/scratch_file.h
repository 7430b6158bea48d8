// A scratch file on a local disk read and written asynchronously through Linux's io_uring (its system calls
// directly: no library to install), for the disk tier of offloading (parallel.offload: nvme, optim/disk_adamw.h).
// Requests are queued and run by the kernel while the caller computes; wait() collects them.
//
//   io::ScratchFile f = io::ScratchFile::create("/nvme/scratch", "optimizer-rank0", 1 << 30);
//   f.write(buffer, 1 << 20, 0);     // starts; the buffer must stay untouched until waited for
//   f.read(other, 1 << 20, 1 << 20);
//   f.wait_all();                    // throws std::runtime_error naming the file, offset and reason on an I/O error
//
// The file is opened with O_DIRECT, so reads and writes go to the disk without the page cache (as DeepSpeed's
// ZeRO-Infinity does): buffers, offsets and lengths are multiples of kAlignment. On a filesystem that refuses
// O_DIRECT (tmpfs before Linux 6.6) it falls back to buffered I/O and direct() says so. Its name is unlinked as soon as it is open:
// the space is the process's until it closes the file, and a crash leaves nothing a later run could take for state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace shardtrain::io {

class ScratchFile {
 public:
  static constexpr int64_t kAlignment = 4096;

  // A file of `bytes` (allocated on the disk at once, so that a full disk fails here and not midway) in the
  // directory `dir`, named after `name`. Throws std::invalid_argument when `dir` does not exist, is not a directory
  // or is not writable, and std::runtime_error when it lacks the space (both numbers said) or io_uring is
  // unavailable (the system's reason: a kernel or container that forbids it).
  static ScratchFile create(const std::string& dir, const std::string& name, int64_t bytes, int queue_depth = 64);

  ScratchFile(ScratchFile&& other) noexcept;
  ScratchFile& operator=(ScratchFile&& other) noexcept;
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile();  // waits for what is in flight, then closes (the disk space is freed)

  // Start a transfer of `bytes` at `offset` (all three aligned; throws std::invalid_argument otherwise). Return a
  // ticket for wait(). When the queue is full, waits for the oldest request first.
  uint64_t write(const void* buffer, int64_t bytes, int64_t offset);
  uint64_t read(void* buffer, int64_t bytes, int64_t offset);
  // Until the request `ticket` is done (those before it may still run); wait_all(): every request.
  void wait(uint64_t ticket);
  void wait_all();

  int64_t size() const { return size_; }
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }

 private:
  struct Ring;
  ScratchFile(std::string path, int fd, int64_t size, bool direct, Ring* ring);
  uint64_t submit(bool write, void* buffer, int64_t bytes, int64_t offset);
  void reap(bool block);
  void close();

  std::string path_;  // as created (unlinked since)
  int fd_ = -1;
  int64_t size_ = 0;
  bool direct_ = false;
  Ring* ring_ = nullptr;  // io_uring's queues, mapped
};

// A zeroed host buffer for ScratchFile transfers, aligned to kAlignment: a CPU tensor's bytes (so the counting
// allocator files it in the tier of the scope it is made in, memory/memory_stats.h).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  at::Tensor bytes_;  // uint8 [size + kAlignment]: data_ is its first aligned byte
  char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace shardtrain::io
