// libFuzzer: untrusted bytes as an Arrow IPC file (data::open_arrow_ipc, what Hugging Face datasets' .arrow files are
// read with), then every value of every column read as each kind: a damaged file throws std::runtime_error when
// opened or when a column of another kind is asked for, and no read leaves the input.
#include <stdexcept>
#include <string_view>

#include "data/formats/table_files.h"
#include "fuzz_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so that ASan sees a read past the end.
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    shardtrain::fuzz::read_every_value(*shardtrain::data::open_arrow_ipc(bytes, "fuzz.arrow"));
  } catch (const std::runtime_error&) {
  }
  return 0;
}
