// State dicts that Python's torch.save wrote: the pytorch_model.bin files (and pytorch_model-0000k-of-0000n.bin
// shards) of Hugging Face checkpoints saved before safetensors, and any `torch.save(model.state_dict(), path)` —
// zip archives, and the legacy format of PyTorch before 1.6 (its storages follow the pickles in the file).
//
// LibTorch's own unpickler cannot read the most common of them: a state dict is an OrderedDict carrying a
// `_metadata` attribute, and the BUILD that sets it fails there. This reader runs the pickle program itself, and
// like torch.load(weights_only=True) only what a file of tensors needs: dicts, lists, tuples, numbers and strings,
// tensors rebuilt from storages, nn.Parameter (its data is kept) — any other global is refused, so no file can make
// it run code. Tensors are views of the file mapped copy-on-write (torch.load's mmap=True): loading one reads only
// the pages of the rows taken.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace shardtrain::io {

// Whether `path` is a torch.save file (a zip archive, or the legacy format PyTorch wrote before 1.6, which many
// older checkpoints on the Hub are in), by its first bytes; false for a missing or short file.
bool is_torch_save_file(const std::string& path);

// The (name, tensor) entries of the state dict at `path`, in the file's order: CPU tensors in the file's dtypes,
// shapes and strides (a view keeps its storage offset; tensors saved sharing a storage share it here). Throws
// std::runtime_error naming the path and what was expected: a file that is not a torch.save archive or is
// truncated, a big-endian file, a pickle that is not a dict of tensors (naming the entry) or that calls a global
// outside the list above (naming it), a tensor past its storage's end.
std::vector<std::pair<std::string, at::Tensor>> load_torch_state_dict(const std::string& path);

}  // namespace shardtrain::io
