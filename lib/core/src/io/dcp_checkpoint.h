// A PyTorch distributed checkpoint (torch.distributed.checkpoint, "DCP") read as whole tensors: each tensor's chunks
// — the shards its ranks saved, in `__<rank>_<k>.distcp` files beside `.metadata` — put back together, a rank
// reading only the chunks that hold its rows. io::WeightFiles reads a checkpoint directory through it.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

#include "io/dcp_metadata.h"
#include "shardtrain/io/mapped_file.h"

namespace shardtrain::io {

class DcpCheckpoint {
 public:
  // `dir`: the directory dcp.save wrote (holding `.metadata`). Throws std::runtime_error naming the path for a
  // directory without it and whatever parse_dcp_metadata refuses.
  explicit DcpCheckpoint(std::string dir);
  ~DcpCheckpoint();

  const std::string& dir() const { return dir_; }
  const DcpMetadata& metadata() const { return metadata_; }

  // Rows [first_row, first_row + rows) of dim 0 of `tensor` (one of metadata().tensors; a 0-dim tensor has one
  // row), contiguous, in its saved dtype, copied from the chunks that overlap them. Throws naming the tensor for
  // rows out of range, rows no chunk holds (or two chunks both hold), a chunk whose file is missing, truncated, or
  // holds another shape or dtype than the metadata says, or that was stored through a writer extension
  // (compression).
  at::Tensor read_rows(const DcpTensor& tensor, int64_t first_row, int64_t rows) const;
  // The same rows copied into `out` (shaped as read_rows' result; any dtype, converted), chunk by chunk: nothing
  // of their size allocated beside it. Throws as read_rows.
  void read_rows_into(const DcpTensor& tensor, int64_t first_row, int64_t rows, const at::Tensor& out) const;

 private:
  at::Tensor load_chunk(const DcpTensor& tensor, const DcpChunk& chunk) const;
  const FileBytes& data_file(const std::string& name) const;

  std::string dir_;
  DcpMetadata metadata_;
  mutable std::map<std::string, FileBytes> files_;  // data files mapped (or read) once each
};

}  // namespace shardtrain::io
