// Images: decoding (PNG, JPEG, BMP, GIF, ... through stb_image), resizing, encoding (PNG, JPEG) and FLAVA's
// preprocessing into tensors. Pixels are 8-bit RGB, row-major, (height, width, 3).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::data {

struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3
};

// An image file that cannot be decoded (corrupt, truncated, not an image).
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Pillow's Image.MAX_IMAGE_PIXELS (its decompression-bomb limit): about 89 million pixels, 9459 x 9459.
inline constexpr int64_t kDefaultMaxImagePixels = 89478485;

// Any format stb_image reads; grey and alpha become RGB. Throws DecodeError with the decoder's reason, and without
// decoding when the header says width x height is above `max_pixels` (a 16000 x 16000 PNG of a few kilobytes
// would take 768 MB of RGB).
Image decode_image(const std::string& bytes, int64_t max_pixels = kDefaultMaxImagePixels);
std::string encode_png(const Image& image);
std::string encode_jpeg(const Image& image, int quality = 90);

// Resampled to width x height with stb_image_resize's cubic filters (Catmull-Rom enlarging, Mitchell shrinking),
// on the 8-bit values as stored (no sRGB linearisation, like PIL).
Image resize(const Image& image, int64_t width, int64_t height);

// (3, H, W) float32: (pixel / 255 - mean[c]) / std[c]. FlavaImageProcessor's rescale + normalize.
at::Tensor to_normalized_tensor(const Image& image, const std::vector<double>& mean, const std::vector<double>& std);
// (3, H, W) float32 for FLAVA's codebook: pixel / 255 mapped into [eps, 1 - eps] (DALL-E's map_pixels, eps = 0.1),
// as FlavaImageProcessor's codebook_do_map_pixels does.
at::Tensor to_codebook_tensor(const Image& image);

}  // namespace shardtrain::data
