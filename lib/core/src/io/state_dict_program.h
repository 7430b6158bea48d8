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

// The same for a program whose value is one tensor (what torch.save(tensor) writes: each chunk of a PyTorch
// distributed checkpoint). Throws as above, and for a value that is not a tensor.
at::Tensor run_tensor_program(const std::string& path, const char* program, size_t size, const StorageOf& storage_of);

// Whether `bytes` begin as torch.save's legacy format does (PROTO, then the pickled magic number).
bool is_legacy_torch_save(const char* bytes, size_t size);

// A file in torch.save's legacy format (PyTorch before 1.6, or _use_new_zipfile_serialization=False), whole in
// `bytes`: five pickles — the magic number, the protocol version (1001), the system's information (little-endian
// checked), the state dict (its storages named by key), the storages' keys — then each storage as its element
// count (int64) and its elements. `bytes_at(offset)` gives a storage the file's bytes at that offset (a view of the
// mapped file: they may be unaligned, which x86 and ARM64 load). Throws as run_state_dict_program, and naming a
// storage whose count differs from its tensors' or that the file ends inside.
std::vector<std::pair<std::string, at::Tensor>> run_legacy_state_dict(
    const std::string& path, const char* bytes, size_t size, const std::function<at::DataPtr(size_t)>& bytes_at);

}  // namespace shardtrain::io
