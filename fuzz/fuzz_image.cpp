// libFuzzer: untrusted image bytes (PNG, JPEG, ...) through data::decode_image with a pixel limit of 4 M, then a
// resize of what decoded. Undecodable or too large images must throw data::DecodeError.
#include "fuzz_input.h"
#include "shardtrain/data/formats/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const shardtrain::data::Image image = shardtrain::data::decode_image(bytes, 4'000'000);
    if (image.width * image.height <= 1'000'000) shardtrain::data::resize(image, 7, 5);
  } catch (const shardtrain::data::DecodeError&) {
  }
  return 0;
}
