// Hugging Face safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data, offsets
// relative to its start. Everything in the header is checked before any data is read, and every error names the
// file and the offending tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain::io {

struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
};

// A validated index of one file; tensors are read on demand (a rank reads only what it needs).
class SafetensorsReader {
 public:
  // Throws std::runtime_error naming `path` and the tensor when the header is malformed: length past the end of the
  // file, not JSON, unknown dtype, negative shape, offsets out of bounds, overlapping or not matching the shape.
  explicit SafetensorsReader(std::string path);
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;                // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t data_start() const { return data_start_; }  // the data section's offset in the file (8 + header length)
  // The tensor (CPU, its file dtype). Throws naming it when absent.
  at::Tensor read(const std::string& name) const;
  // Rows [first_row, first_row + rows) of dim 0 (a 0-dim tensor has one row), reading only their bytes: what a rank
  // of a sharded model reads. Throws naming the tensor when absent or when the rows are out of range.
  at::Tensor read_rows(const std::string& name, int64_t first_row, int64_t rows) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device; stored contiguous, in their dtype) atomically, header entries sorted by name.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The safetensors name of a dtype ("F32", "BF16", ...) and back; unknown names throw.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace shardtrain::io
