// libFuzzer: untrusted bytes as a Parquet file (data::ParquetTable, what datasets on the Hugging Face Hub are read
// with), then every value of every column read as each kind: a damaged footer throws std::runtime_error when the
// table is opened, a damaged page when a value of its row group is read, and nothing reads outside the input or
// decompresses beyond what a page's header says.
#include <stdexcept>
#include <string_view>

#include "data/parquet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);  // exactly `size` bytes, for ASan
  try {
    const shardtrain::data::ParquetTable table(bytes, "fuzz.parquet");
    (void)table.metadata("huggingface");
    for (size_t c = 0; c < table.columns().size(); ++c) {
      for (int64_t row = 0; row < table.rows() && row < 4096; ++row) {
        try {
          (void)table.is_null(static_cast<int>(c), row);
          (void)table.bytes(static_cast<int>(c), row);
        } catch (const std::runtime_error&) {
        }
        try {
          (void)table.integer(static_cast<int>(c), row);
        } catch (const std::runtime_error&) {
        }
      }
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
