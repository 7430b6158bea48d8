// A torch.save zip archive held in memory (a file mapped, or one of the archives inside a distributed checkpoint's
// data file): its program run by the restricted machine (io/state_dict_program.h), each storage a view of the
// archive's own bytes. io::load_torch_state_dict reads whole files through it; io/dcp_checkpoint.cpp each chunk.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <functional>
#include <string>

namespace shardtrain::io {

// The bytes at an offset of the archive as a storage's data, keeping what holds them alive.
using ArchiveBytes = std::function<at::DataPtr(size_t offset)>;

// The tensor torch.save(tensor) wrote as the archive in `bytes` (`size` of them). `what` names it in messages.
// Throws std::runtime_error naming it: not a readable archive, saved big-endian, a storage record missing, too
// small for its tensor or past the archive's end, and whatever run_tensor_program refuses.
at::Tensor load_saved_tensor(const std::string& what, const char* bytes, size_t size, const ArchiveBytes& data_at);

}  // namespace shardtrain::io
