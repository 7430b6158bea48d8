#include "shardtrain/io/scratch_file.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>

namespace shardtrain::io {
namespace {

std::string reason(int error) { return std::strerror(error); }

// "12.3 GiB" (memory::readable_size is a layer above io).
std::string gib(int64_t bytes) {
  const int64_t t = bytes * 10 / (1LL << 30);
  return std::to_string(t / 10) + "." + std::to_string(t % 10) + " GiB";
}

int io_uring_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(syscall(__NR_io_uring_setup, entries, p));
}

int io_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return static_cast<int>(syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}

template <class T>
T* at_offset(void* base, uint32_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

// io_uring's two queues and the requests in flight. The submission queue's tail and the completion queue's head are
// ours to move, the kernel moves the others: loads of theirs acquire, stores of ours release.
struct ScratchFile::Ring {
  struct Request {
    bool write = false;
    char* buffer = nullptr;
    int64_t bytes = 0, offset = 0;  // what is left to transfer (a short transfer is continued)
  };

  int fd = -1;
  void* sq_map = nullptr;
  size_t sq_map_bytes = 0;
  void* cq_map = nullptr;  // the same mapping as sq_map when the kernel has IORING_FEAT_SINGLE_MMAP
  size_t cq_map_bytes = 0;
  io_uring_sqe* sqes = nullptr;
  size_t sqes_bytes = 0;
  unsigned *sq_tail = nullptr, *sq_mask = nullptr, *sq_array = nullptr;
  unsigned *cq_head = nullptr, *cq_tail = nullptr, *cq_mask = nullptr;
  io_uring_cqe* cqes = nullptr;
  unsigned entries = 0;
  std::map<uint64_t, Request> in_flight;  // by ticket
  uint64_t next_ticket = 1;

  ~Ring() {
    if (sqes) munmap(sqes, sqes_bytes);
    if (cq_map && cq_map != sq_map) munmap(cq_map, cq_map_bytes);
    if (sq_map) munmap(sq_map, sq_map_bytes);
    if (fd >= 0) ::close(fd);
  }

  static Ring* open(unsigned depth) {
    io_uring_params p{};
    const int fd = io_uring_setup(depth, &p);
    if (fd < 0) {
      throw std::runtime_error("the disk tier needs io_uring, which this kernel or container refuses (io_uring_setup: " +
                               reason(errno) + ")");
    }
    auto ring = std::make_unique<Ring>();
    ring->fd = fd;
    ring->entries = p.sq_entries;
    ring->sq_map_bytes = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    ring->cq_map_bytes = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) ring->sq_map_bytes = ring->cq_map_bytes = std::max(ring->sq_map_bytes, ring->cq_map_bytes);
    auto map = [fd](size_t bytes, off_t what) {
      void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, what);
      if (m == MAP_FAILED) throw std::runtime_error("io_uring: mapping its queues failed: " + reason(errno));
      return m;
    };
    ring->sq_map = map(ring->sq_map_bytes, IORING_OFF_SQ_RING);
    ring->cq_map = single ? ring->sq_map : map(ring->cq_map_bytes, IORING_OFF_CQ_RING);
    ring->sqes_bytes = p.sq_entries * sizeof(io_uring_sqe);
    ring->sqes = static_cast<io_uring_sqe*>(map(ring->sqes_bytes, IORING_OFF_SQES));
    ring->sq_tail = at_offset<unsigned>(ring->sq_map, p.sq_off.tail);
    ring->sq_mask = at_offset<unsigned>(ring->sq_map, p.sq_off.ring_mask);
    ring->sq_array = at_offset<unsigned>(ring->sq_map, p.sq_off.array);
    ring->cq_head = at_offset<unsigned>(ring->cq_map, p.cq_off.head);
    ring->cq_tail = at_offset<unsigned>(ring->cq_map, p.cq_off.tail);
    ring->cq_mask = at_offset<unsigned>(ring->cq_map, p.cq_off.ring_mask);
    ring->cqes = at_offset<io_uring_cqe>(ring->cq_map, p.cq_off.cqes);
    return ring.release();
  }

  // Queues one transfer (of at most 1 GiB: the request's length is 32 bits) and hands it to the kernel.
  void push(int file, uint64_t ticket, const Request& r) {
    const unsigned tail = *sq_tail;  // ours alone
    const unsigned index = tail & *sq_mask;
    io_uring_sqe& sqe = sqes[index];
    std::memset(&sqe, 0, sizeof sqe);
    sqe.opcode = r.write ? IORING_OP_WRITE : IORING_OP_READ;
    sqe.fd = file;
    sqe.addr = reinterpret_cast<uint64_t>(r.buffer);
    sqe.len = static_cast<uint32_t>(std::min<int64_t>(r.bytes, 1LL << 30));
    sqe.off = static_cast<uint64_t>(r.offset);
    sqe.user_data = ticket;
    sq_array[index] = index;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
    int submitted;
    do {
      submitted = io_uring_enter(fd, 1, 0, 0);
    } while (submitted < 0 && errno == EINTR);
    if (submitted < 0) throw std::runtime_error("io_uring_enter: " + reason(errno));
  }
};

ScratchFile::ScratchFile(std::string path, int fd, int64_t size, bool direct, Ring* ring)
    : path_(std::move(path)), fd_(fd), size_(size), direct_(direct), ring_(ring) {}

ScratchFile ScratchFile::create(const std::string& dir, const std::string& name, int64_t bytes, int queue_depth) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    throw std::invalid_argument("disk tier directory '" + dir + "': " + reason(errno) +
                                " (expected an existing directory on a local disk)");
  }
  if (!S_ISDIR(st.st_mode)) throw std::invalid_argument("disk tier directory '" + dir + "' is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) {
    throw std::invalid_argument("disk tier directory '" + dir + "' is not writable: " + reason(errno));
  }
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    if (free_bytes < bytes) {
      throw std::runtime_error("disk tier directory '" + dir + "' has " + gib(free_bytes) + " free, " + gib(bytes) +
                               " needed (" + name + ")");
    }
  }
  const std::string path = dir + "/" + name + "." + std::to_string(::getpid()) + ".scratch";
  bool direct = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {  // the filesystem has no O_DIRECT (tmpfs): buffered, said by direct()
    direct = false;
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + reason(errno));
  ::unlink(path.c_str());
  if (bytes > 0 && ::posix_fallocate(fd, 0, bytes) != 0 && ::ftruncate(fd, bytes) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::runtime_error("cannot allocate " + gib(bytes) + " for " + path + ": " + reason(error));
  }
  Ring* ring = nullptr;
  try {
    ring = Ring::open(static_cast<unsigned>(queue_depth));
  } catch (...) {
    ::close(fd);
    throw;
  }
  return ScratchFile(path, fd, bytes, direct, ring);
}

ScratchFile::ScratchFile(ScratchFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_), direct_(other.direct_), ring_(other.ring_) {
  other.fd_ = -1, other.ring_ = nullptr;
}

ScratchFile& ScratchFile::operator=(ScratchFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_), fd_ = other.fd_, size_ = other.size_, direct_ = other.direct_;
    ring_ = other.ring_;
    other.fd_ = -1, other.ring_ = nullptr;
  }
  return *this;
}

ScratchFile::~ScratchFile() { close(); }

void ScratchFile::close() {
  if (ring_) {
    try {
      wait_all();
    } catch (...) {  // an I/O error nobody waited for: the file goes anyway
    }
    delete ring_;
    ring_ = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

uint64_t ScratchFile::submit(bool write, void* buffer, int64_t bytes, int64_t offset) {
  const auto aligned = [](int64_t v) { return v % kAlignment == 0; };
  if (!aligned(reinterpret_cast<int64_t>(buffer)) || !aligned(bytes) || !aligned(offset) || bytes <= 0) {
    throw std::invalid_argument(path_ + ": a transfer of " + std::to_string(bytes) + " bytes at offset " +
                                std::to_string(offset) + " (buffer, length and offset must be positive multiples of " +
                                std::to_string(kAlignment) + ")");
  }
  if (offset + bytes > size_) {
    throw std::invalid_argument(path_ + ": bytes " + std::to_string(offset) + "-" + std::to_string(offset + bytes) +
                                " are beyond its " + std::to_string(size_));
  }
  while (ring_->in_flight.size() >= ring_->entries) reap(true);
  const uint64_t ticket = ring_->next_ticket++;
  Ring::Request r{write, static_cast<char*>(buffer), bytes, offset};
  ring_->in_flight.emplace(ticket, r);
  ring_->push(fd_, ticket, r);
  return ticket;
}

uint64_t ScratchFile::write(const void* buffer, int64_t bytes, int64_t offset) {
  return submit(true, const_cast<void*>(buffer), bytes, offset);
}

uint64_t ScratchFile::read(void* buffer, int64_t bytes, int64_t offset) { return submit(false, buffer, bytes, offset); }

// Takes what has completed; with `block`, waits for one completion first. A short transfer is continued with the
// same ticket; a failed one throws (after its ticket is dropped).
void ScratchFile::reap(bool block) {
  if (block) {
    int got;
    do {
      got = io_uring_enter(ring_->fd, 0, 1, IORING_ENTER_GETEVENTS);
    } while (got < 0 && errno == EINTR);
    if (got < 0) throw std::runtime_error("io_uring_enter: " + reason(errno));
  }
  unsigned head = *ring_->cq_head;
  std::string error;
  while (head != __atomic_load_n(ring_->cq_tail, __ATOMIC_ACQUIRE)) {
    const io_uring_cqe cqe = ring_->cqes[head & *ring_->cq_mask];
    ++head;
    auto it = ring_->in_flight.find(cqe.user_data);
    if (it == ring_->in_flight.end()) continue;
    Ring::Request& r = it->second;
    if (cqe.res <= 0) {
      if (error.empty()) {
        error = std::string(r.write ? "writing " : "reading ") + std::to_string(r.bytes) + " bytes at offset " +
                std::to_string(r.offset) + " of " + path_ + ": " +
                (cqe.res == 0 ? std::string("end of file") : reason(-cqe.res));
      }
      ring_->in_flight.erase(it);
      continue;
    }
    r.buffer += cqe.res, r.bytes -= cqe.res, r.offset += cqe.res;
    if (r.bytes == 0) {
      ring_->in_flight.erase(it);
    } else {
      __atomic_store_n(ring_->cq_head, head, __ATOMIC_RELEASE);
      ring_->push(fd_, cqe.user_data, r);  // the rest (a transfer over 1 GiB, or a short one)
    }
  }
  __atomic_store_n(ring_->cq_head, head, __ATOMIC_RELEASE);
  if (!error.empty()) throw std::runtime_error(error);
}

void ScratchFile::wait(uint64_t ticket) {
  while (ring_->in_flight.count(ticket) != 0) reap(true);
}

void ScratchFile::wait_all() {
  while (!ring_->in_flight.empty()) reap(true);
}

AlignedBuffer::AlignedBuffer(int64_t bytes)
    : bytes_(at::zeros({bytes + ScratchFile::kAlignment}, at::kByte)), size_(bytes) {
  const auto at = reinterpret_cast<uintptr_t>(bytes_.data_ptr());
  const auto k = static_cast<uintptr_t>(ScratchFile::kAlignment);
  data_ = reinterpret_cast<char*>((at + k - 1) / k * k);
}

}  // namespace shardtrain::io
