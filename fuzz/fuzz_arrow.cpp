// libFuzzer: untrusted bytes as an Arrow IPC file (data::ArrowTable, what Hugging Face datasets' .arrow files are
// read with), then every value of every column read as each kind: a damaged file throws std::runtime_error when
// opened or when a column of another kind is asked for, and no read leaves the input.
#include <stdexcept>
#include <string_view>

#include "data/arrow_ipc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so that ASan sees a read past the end.
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const shardtrain::data::ArrowTable table(bytes, "fuzz.arrow");
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
