// libFuzzer: an untrusted safetensors file through io::SafetensorsReader, then every tensor of at most 1 MiB read.
// A malformed file must throw std::runtime_error; anything else (a crash, a sanitizer report, another exception)
// is a bug.
#include <stdexcept>

#include "fuzz_input.h"
#include "shardtrain/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = shardtrain::fuzz::input_file(data, size, "x.safetensors");
  try {
    const shardtrain::io::SafetensorsReader reader(path);
    for (const auto& entry : reader.entries()) {
      if (entry.end - entry.begin <= (1u << 20)) reader.read(entry.name);
      if (!entry.shape.empty() && entry.shape[0] > 1) reader.read_rows(entry.name, 1, 1);
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
