// The pickle program of a torch.save state dict (an archive's data.pkl), run by a machine that knows only what a
// file of tensors needs. io::load_torch_state_dict reads the archive around it; fuzz/fuzz_state_dict_program.cpp
// feeds it programs directly.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain::io {

// The storage of record data/<key>, of `numel` elements of `dtype` (its bytes checked by the callee).
using StorageOf = std::function<at::Storage(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// The (name, tensor) entries of the dict the program builds, in its order; each storage is asked for once however
// many tensors view it. Throws std::runtime_error naming `path` (for messages only) and the fault: an opcode or a
// global outside the list io/torch_state_dict.h gives, a truncated or inconsistent program, a result that is not
// a dict of tensors, a tensor past its storage's end.
std::vector<std::pair<std::string, at::Tensor>> run_state_dict_program(const std::string& path, const char* program,
                                                                       size_t size, const StorageOf& storage_of);

}  // namespace shardtrain::io
