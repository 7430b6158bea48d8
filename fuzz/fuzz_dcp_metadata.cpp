// libFuzzer: an untrusted `.metadata` of a PyTorch distributed checkpoint through io::parse_dcp_metadata (the
// restricted pickle machine with DCP's classes). A malformed input must throw std::runtime_error; anything else (a
// crash, a sanitizer report, another exception, a chunk accepted outside its tensor) is a bug.
#include <stdexcept>

#include "io/dcp_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain::io;
  try {
    const DcpMetadata metadata = parse_dcp_metadata("fuzz", reinterpret_cast<const char*>(data), size);
    for (const DcpTensor& t : metadata.tensors) {
      for (const DcpChunk& c : t.chunks) {
        if (c.offsets.size() != t.size.size() || c.sizes.size() != t.size.size()) __builtin_trap();
        for (size_t d = 0; d < t.size.size(); ++d) {
          if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > t.size[d] - c.sizes[d]) __builtin_trap();
        }
      }
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
