#include "io/dcp_checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "shardtrain/io/files.h"
#include "shardtrain/io/mapped_file.h"
#include "io/torch_archive.h"

namespace shardtrain::io {
DcpCheckpoint::DcpCheckpoint(std::string dir) : dir_(std::move(dir)) {
  const std::string path = (std::filesystem::path(dir_) / ".metadata").string();
  if (!std::filesystem::exists(path)) {
    throw std::runtime_error(dir_ + ": no .metadata (a PyTorch distributed checkpoint's directory holds one)");
  }
  const std::vector<char> bytes = read_file(path);
  metadata_ = parse_dcp_metadata(path, bytes.data(), bytes.size());
}

DcpCheckpoint::~DcpCheckpoint() = default;

const FileBytes& DcpCheckpoint::data_file(const std::string& name) const {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second;
  const std::string path = (std::filesystem::path(dir_) / name).string();
  if (!std::filesystem::exists(path)) throw std::runtime_error(dir_ + ": data file " + name + " is missing");
  return files_.emplace(name, file_bytes(path)).first->second;
}

at::Tensor DcpCheckpoint::load_chunk(const DcpTensor& tensor, const DcpChunk& chunk) const {
  std::string where = "'" + tensor.key + "' at (";
  for (size_t d = 0; d < chunk.offsets.size(); ++d) where += (d ? ", " : "") + std::to_string(chunk.offsets[d]);
  const std::string what = dir_ + "/" + chunk.file + ": the chunk of " + where + ")";
  if (!chunk.transforms.empty()) {
    throw std::runtime_error(what + " was stored through the writer extension " + chunk.transforms.front() +
                             " (compression); only chunks saved plain, DCP's default, are read");
  }
  const FileBytes& file = data_file(chunk.file);
  const size_t size = file.size(), start = chunk.offset;
  if (start > size || chunk.length > size - start) {
    throw std::runtime_error(what + " lies past the file's end (" + std::to_string(size) + " bytes)");
  }
  if (chunk.length < 4 || std::memcmp(file.data() + start, "PK\x03\x04", 4) != 0) {
    throw std::runtime_error(what + " is not a torch.save archive (DCP's default serialization; checkpoints saved "
                             "with serialization_format=SAFETENSORS are not read)");
  }
  const at::Tensor out = load_saved_tensor(what, file.data() + start, chunk.length,
                                           [&](size_t offset) { return file.at(start + offset); });
  if (out.sizes().vec() != chunk.sizes || out.scalar_type() != tensor.dtype) {
    throw std::runtime_error(what + " holds a " + std::string(c10::toString(out.scalar_type())) + " tensor of shape " +
                             c10::str(out.sizes()) + ", its metadata a " + c10::toString(tensor.dtype) +
                             " chunk of shape " + c10::str(at::IntArrayRef(chunk.sizes)));
  }
  return out;
}

namespace {

// `rows` rows from `first_row` of a tensor of `total` (checked), the message naming it.
void check_rows(const std::string& dir, const DcpTensor& tensor, int64_t total, int64_t first_row, int64_t rows) {
  if (rows < 0 || (rows > 0 && (first_row < 0 || first_row > total - rows))) {
    throw std::out_of_range(dir + ": tensor '" + tensor.key + "' has " + std::to_string(total) + " rows, rows [" +
                            std::to_string(first_row) + ", " + std::to_string(first_row + rows) + ") asked for");
  }
}

}  // namespace

at::Tensor DcpCheckpoint::read_rows(const DcpTensor& tensor, int64_t first_row, int64_t rows) const {
  // A 0-dim tensor is one row of one element; its one chunk has no offsets.
  std::vector<int64_t> shape = tensor.size;
  if (shape.empty()) shape = {1};
  check_rows(dir_, tensor, shape[0], first_row, rows);
  // Rows inside one chunk that spans the other dimensions (a rank reading what it saved, at the same world size):
  // a view of that chunk's bytes in the mapped file, no copy.
  for (const DcpChunk& chunk : tensor.chunks) {
    if (tensor.size.empty() || rows == 0) break;
    bool spans = chunk.offsets[0] <= first_row && first_row + rows <= chunk.offsets[0] + chunk.sizes[0];
    for (size_t d = 1; d < tensor.size.size(); ++d) spans = spans && chunk.sizes[d] == tensor.size[d];
    if (spans) return load_chunk(tensor, chunk).narrow(0, first_row - chunk.offsets[0], rows).contiguous();
  }
  shape[0] = rows;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(tensor.dtype));
  read_rows_into(tensor, first_row, rows, out);
  return out;
}

void DcpCheckpoint::read_rows_into(const DcpTensor& tensor, int64_t first_row, int64_t rows,
                                   const at::Tensor& out) const {
  check_rows(dir_, tensor, tensor.size.empty() ? 1 : tensor.size[0], first_row, rows);
  std::vector<int64_t> shape = tensor.size.empty() ? std::vector<int64_t>{1} : tensor.size;
  shape[0] = rows;
  if (out.sizes().vec() != shape) {
    throw std::invalid_argument(dir_ + ": rows of '" + tensor.key + "' of shape " + c10::str(at::IntArrayRef(shape)) +
                                " read into a tensor of shape " + c10::str(out.sizes()));
  }
  if (out.numel() == 0) return;
  int64_t covered = 0;  // elements copied: each once when the chunks tile the tensor
  for (const DcpChunk& chunk : tensor.chunks) {
    const int64_t chunk_first = chunk.offsets.empty() ? 0 : chunk.offsets[0];
    const int64_t chunk_rows = chunk.sizes.empty() ? 1 : chunk.sizes[0];
    const int64_t lo = std::max(first_row, chunk_first), hi = std::min(first_row + rows, chunk_first + chunk_rows);
    if (hi <= lo || std::find(chunk.sizes.begin(), chunk.sizes.end(), 0) != chunk.sizes.end()) continue;
    at::Tensor piece = load_chunk(tensor, chunk);
    if (tensor.size.empty()) piece = piece.reshape({1});
    piece = piece.narrow(0, lo - chunk_first, hi - lo);
    at::Tensor into = out.narrow(0, lo - first_row, hi - lo);
    for (size_t d = 1; d < chunk.offsets.size(); ++d) into = into.narrow(d, chunk.offsets[d], chunk.sizes[d]);
    into.copy_(piece);
    covered += piece.numel();
  }
  if (covered != out.numel()) {
    throw std::runtime_error(
        dir_ + ": rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + rows) + ") of '" +
        tensor.key + "' are " + (covered < out.numel() ? "not all in its chunks" : "in more than one of its chunks") +
        " (" + std::to_string(covered) + " of " + std::to_string(out.numel()) + " elements found)");
  }
}

}  // namespace shardtrain::io
