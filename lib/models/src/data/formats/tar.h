// Tar archives as WebDataset shards use them: read by scanning the 512-byte headers once (no extraction), members
// then read at their offsets; written as plain ustar. POSIX ustar, GNU long names ('L') and pax path records ('x')
// are understood; other member types (directories, links) are skipped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::io {
class AtomicFile;
class ReadOnlyFile;
}  // namespace shardtrain::io

namespace shardtrain::data {

struct TarMember {
  std::string name;    // path inside the archive ("000123.jpg", "shard/000123.txt")
  int64_t offset = 0;  // of the member's data in the file
  int64_t size = 0;    // bytes
};

struct TarScan {
  std::vector<TarMember> members;  // regular files, in archive order, every one wholly inside the file
  // Empty when the archive was read to its end; else why the scan stopped early ("truncated: member 'x.jpg'
  // needs 4096 bytes at offset ..., the file has ...", "bad header checksum at offset ..."). The members before
  // that point are still listed.
  std::string error;
};

TarScan scan_tar(const io::ReadOnlyFile& file);

// Writes a tar atomically (io::AtomicFile): nothing appears at `path` until finish().
class TarWriter {
 public:
  explicit TarWriter(const std::string& path);
  ~TarWriter();
  // Names up to 255 bytes (ustar's prefix + name); longer ones throw std::invalid_argument.
  void add(const std::string& name, const std::string& bytes);
  void finish();

 private:
  std::unique_ptr<io::AtomicFile> file_;
};

}  // namespace shardtrain::data
