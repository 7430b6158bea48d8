// libFuzzer: untrusted bytes as a Parquet file (data::open_parquet, what datasets on the Hugging Face Hub are read
// with), then every value of every column read as each kind: a damaged footer throws std::runtime_error when the
// table is opened, a damaged page when a value of its row group is read, and nothing reads outside the input or
// decompresses beyond what a page's header says.
#include <stdexcept>
#include <string_view>

#include "data/formats/table_files.h"
#include "fuzz_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);  // exactly `size` bytes, for ASan
  try {
    shardtrain::fuzz::read_every_value(*shardtrain::data::open_parquet(bytes, "fuzz.parquet"));
  } catch (const std::runtime_error&) {
  }
  return 0;
}
