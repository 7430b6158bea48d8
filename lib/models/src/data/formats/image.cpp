#include "shardtrain/data/formats/image.h"

#include <ATen/ATen.h>
#include <stb_image.h>
#include <stb_image_resize.h>
#include <stb_image_write.h>

#include <limits>

namespace shardtrain::data {
namespace {

void append(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

void check_image(const Image& image, const char* what) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width * image.height * 3)) {
    throw std::invalid_argument(std::string(what) + ": image of " + std::to_string(image.width) + "x" +
                                std::to_string(image.height) + " with " + std::to_string(image.rgb.size()) +
                                " bytes of RGB (expected width * height * 3)");
  }
}

}  // namespace

Image decode_image(const std::string& bytes, int64_t max_pixels) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw DecodeError("image file of " + std::to_string(bytes.size()) + " bytes is too large to decode");
  }
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int size = static_cast<int>(bytes.size());
  int width = 0, height = 0, channels = 0;
  // The header alone first: its size decides whether the pixels are decoded at all.
  if (stbi_info_from_memory(data, size, &width, &height, &channels) &&
      static_cast<int64_t>(width) * height > max_pixels) {
    throw DecodeError("image of " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                      std::to_string(static_cast<int64_t>(width) * height) + " pixels is above data.max_image_pixels (" +
                      std::to_string(max_pixels) + "); not decoded");
  }
  stbi_uc* pixels = stbi_load_from_memory(data, size, &width, &height, &channels, 3);
  if (!pixels) {
    const char* reason = stbi_failure_reason();
    throw DecodeError(std::string("cannot decode image (") + (reason ? reason : "unknown reason") + ", " +
                      std::to_string(bytes.size()) + " bytes)");
  }
  if (width <= 0 || height <= 0) {  // stb accepts a GIF whose header says 0 rows (found by fuzz_image)
    stbi_image_free(pixels);
    throw DecodeError("image of " + std::to_string(width) + "x" + std::to_string(height) + " has no pixels (" +
                      std::to_string(bytes.size()) + " bytes)");
  }
  Image image;
  image.width = width, image.height = height;
  image.rgb.assign(pixels, pixels + static_cast<size_t>(width) * height * 3);
  stbi_image_free(pixels);
  return image;
}

std::string encode_png(const Image& image) {
  check_image(image, "encode_png");
  std::string out;
  if (!stbi_write_png_to_func(append, &out, static_cast<int>(image.width), static_cast<int>(image.height), 3,
                              image.rgb.data(), static_cast<int>(image.width * 3))) {
    throw std::runtime_error("PNG encoding failed");
  }
  return out;
}

std::string encode_jpeg(const Image& image, int quality) {
  check_image(image, "encode_jpeg");
  std::string out;
  if (!stbi_write_jpg_to_func(append, &out, static_cast<int>(image.width), static_cast<int>(image.height), 3,
                              image.rgb.data(), quality)) {
    throw std::runtime_error("JPEG encoding failed");
  }
  return out;
}

Image resize(const Image& image, int64_t width, int64_t height) {
  check_image(image, "resize");
  if (width <= 0 || height <= 0) {
    throw std::invalid_argument("resize to " + std::to_string(width) + "x" + std::to_string(height) +
                                ": sizes must be positive");
  }
  if (width == image.width && height == image.height) return image;
  Image out;
  out.width = width, out.height = height;
  out.rgb.resize(static_cast<size_t>(width * height * 3));
  if (!stbir_resize_uint8(image.rgb.data(), static_cast<int>(image.width), static_cast<int>(image.height), 0,
                          out.rgb.data(), static_cast<int>(width), static_cast<int>(height), 0, 3)) {
    throw std::runtime_error("image resize failed");
  }
  return out;
}

namespace {
// (3, H, W) float32 in [0, 1].
at::Tensor unit_tensor(const Image& image) {
  check_image(image, "to_tensor");
  auto hwc = at::from_blob(const_cast<uint8_t*>(image.rgb.data()), {image.height, image.width, 3}, at::kByte);
  return hwc.permute({2, 0, 1}).to(at::kFloat).div_(255.0).contiguous();
}
}  // namespace

at::Tensor to_normalized_tensor(const Image& image, const std::vector<double>& mean, const std::vector<double>& std) {
  if (mean.size() != 3 || std.size() != 3) throw std::invalid_argument("image mean and std need 3 values (R, G, B)");
  auto t = unit_tensor(image);
  for (int64_t c = 0; c < 3; ++c) t[c].sub_(mean[c]).div_(std[c]);
  return t;
}

at::Tensor to_codebook_tensor(const Image& image) {
  constexpr double kEps = 0.1;
  return unit_tensor(image).mul_(1 - 2 * kEps).add_(kEps);
}

}  // namespace shardtrain::data
