// The `.metadata` file of a PyTorch distributed checkpoint (torch.distributed.checkpoint, "DCP": what
// `dcp.save(state_dict, checkpoint_id=DIR)` writes from FSDP2, FSDP, DDP or torchtitan): a pickle of dataclasses
// saying, for every tensor of the saved state dict, its dtype and whole shape and the chunks it was saved in (each
// rank's shard: where it lies in the whole tensor, and which bytes of which `__<rank>_<k>.distcp` file hold it).
// Read by a restricted pickle machine (io/pickle_machine.h) that allows only DCP's own classes and the few torch
// globals they use, never running anything.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::io {

struct DcpChunk {
  std::vector<int64_t> offsets, sizes;  // the chunk's place in the whole tensor: per dimension, its first index and
                                        // its extent
  std::string file;                     // the data file holding it, relative to the checkpoint's directory
  uint64_t offset = 0, length = 0;      // its bytes in that file: a torch.save archive of the chunk
  std::vector<std::string> transforms;  // storage extensions applied to those bytes (compression); none by default
};

struct DcpTensor {
  std::string key;                // the flattened key: "model.layers.0.attn.q.weight"
  std::vector<std::string> path;  // the key's place in the saved nesting: {"model", "layers.0.attn.q.weight"}
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;      // the whole tensor's
  std::vector<DcpChunk> chunks;
};

struct DcpMetadata {
  std::vector<DcpTensor> tensors;       // in the file's order
  std::vector<std::string> byte_items;  // keys saved as pickled objects (a step count, an optimizer's lr...)
};

// Parses the metadata in `bytes` (the file `path`, named in messages). Throws std::runtime_error naming the path
// and the fault: a global outside DCP's classes, a tensor whose chunk has no storage entry or lies outside it, an
// unknown dtype, a truncated or malformed pickle.
DcpMetadata parse_dcp_metadata(const std::string& path, const char* bytes, size_t size);

}  // namespace shardtrain::io
