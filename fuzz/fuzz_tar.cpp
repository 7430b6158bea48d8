// libFuzzer: an untrusted WebDataset shard through data::scan_tar, then every member it lists read at its offset.
// A damaged archive ends the scan with `error` set; the members listed must lie wholly inside the file.
#include <stdexcept>
#include <vector>

#include "data/formats/tar.h"
#include "fuzz_input.h"
#include "shardtrain/io/files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = shardtrain::fuzz::input_file(data, size, "x.tar");
  const shardtrain::io::ReadOnlyFile file(path);
  const shardtrain::data::TarScan scan = shardtrain::data::scan_tar(file);
  std::vector<char> bytes;
  for (const auto& member : scan.members) {
    if (member.offset < 0 || member.size < 0 || member.offset + member.size > file.size()) __builtin_trap();
    bytes.resize(static_cast<size_t>(member.size));
    file.read(member.offset, member.size, bytes.data());
  }
  return 0;
}
