// The disk tier's file (io/scratch_file.h): asynchronous reads and writes through io_uring round-trip what was
// written, more requests than the queue holds, in any order; O_DIRECT where the filesystem has it; the file's name
// gone while it is open; bad directories, sizes and alignments named.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <vector>

#include "shardtrain/io/files.h"
#include "shardtrain/io/scratch_file.h"
#include "support/expect_error.h"
#include "support/scratch.h"

namespace shardtrain::io {
namespace {

constexpr int64_t kBlock = ScratchFile::kAlignment;

void fill(const AlignedBuffer& b, int seed) {
  for (int64_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
}

bool same(const AlignedBuffer& a, const AlignedBuffer& b) { return std::memcmp(a.data(), b.data(), a.size()) == 0; }

TEST(ScratchFile, WritesAndReadsBackAsynchronously) {
  testing::TempDir dir("scratch_file_");
  ScratchFile f = ScratchFile::create(dir.path, "state", 64 * kBlock, /*queue_depth=*/4);
  EXPECT_TRUE(f.direct()) << "ext4 takes O_DIRECT";
  EXPECT_FALSE(path_exists(f.path())) << "the name is unlinked once the file is open";
  // 16 writes of 4 blocks each through a queue of 4: the oldest are waited for as it fills.
  std::vector<AlignedBuffer> written;
  for (int i = 0; i < 16; ++i) {
    written.emplace_back(4 * kBlock);
    fill(written.back(), i);
    f.write(written.back().data(), 4 * kBlock, i * 4 * kBlock);
  }
  f.wait_all();
  std::vector<AlignedBuffer> read;
  std::vector<uint64_t> tickets;
  for (int i = 15; i >= 0; --i) {
    read.emplace_back(4 * kBlock);
    tickets.push_back(f.read(read.back().data(), 4 * kBlock, i * 4 * kBlock));
  }
  for (int k = 0; k < 16; ++k) {
    f.wait(tickets[k]);
    EXPECT_TRUE(same(read[k], written[15 - k])) << "request " << k;
  }
}

// tmpfs took O_DIRECT from Linux 6.6 on; before, and on filesystems that still refuse it, the file is buffered.
TEST(ScratchFile, OnTmpfs) {
  if (!path_exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const int64_t bytes = 8 * kBlock;
  ScratchFile f = ScratchFile::create("/dev/shm", "scratch_file_test", bytes);
  std::cout << "tmpfs: " << (f.direct() ? "O_DIRECT" : "buffered (no O_DIRECT)") << "\n";
  AlignedBuffer out(bytes), in(bytes);
  fill(out, 3);
  f.wait(f.write(out.data(), bytes, 0));
  f.wait(f.read(in.data(), bytes, 0));
  EXPECT_TRUE(same(in, out));
}

TEST(ScratchFile, BadInputIsNamed) {
  testing::TempDir dir("scratch_file_");
  testing::expect_error<std::invalid_argument>(
      [&] { ScratchFile::create(dir.path + "/missing", "state", kBlock); }, {"missing", "expected an existing directory"});
  write_file_atomic(dir.path + "/plain", {'x'});
  testing::expect_error<std::invalid_argument>([&] { ScratchFile::create(dir.path + "/plain", "state", kBlock); },
                                               {"plain", "not a directory"});
  if (::geteuid() != 0) {  // root writes anywhere
    make_directories(dir.path + "/locked");
    ::chmod((dir.path + "/locked").c_str(), 0500);
    testing::expect_error<std::invalid_argument>([&] { ScratchFile::create(dir.path + "/locked", "state", kBlock); },
                                                 {"locked", "not writable"});
  }
  testing::expect_error<std::runtime_error>([&] { ScratchFile::create(dir.path, "state", 1LL << 60); },
                                            {"free", "needed"});
  ScratchFile f = ScratchFile::create(dir.path, "state", 4 * kBlock);
  AlignedBuffer b(2 * kBlock);
  testing::expect_error<std::invalid_argument>([&] { f.write(b.data() + 1, kBlock, 0); }, {"multiples of 4096"});
  testing::expect_error<std::invalid_argument>([&] { f.write(b.data(), 100, 0); }, {"100 bytes"});
  testing::expect_error<std::invalid_argument>([&] { f.read(b.data(), 2 * kBlock, 3 * kBlock); }, {"beyond"});
}

}  // namespace
}  // namespace shardtrain::io
