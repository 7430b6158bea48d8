// The weights of a Hugging Face checkpoint, read as one set of named tensors whichever way it was saved:
// safetensors (model.safetensors) or torch.save (pytorch_model.bin, what transformers wrote before safetensors and
// what many checkpoints on the Hub still hold), in one file or sharded across several with an index
// ({model.safetensors,pytorch_model.bin}.index.json: {"weight_map": {tensor name: shard file name}}). A tensor is
// found by name in whichever file holds it, and a rank reads only the rows it needs from that file. A PyTorch
// distributed checkpoint (the directory torch.distributed.checkpoint.save wrote from FSDP2, FSDP or torchtitan)
// reads the same way: its model's tensors, each rank's rows put together from the chunks that hold them.
//
//   WeightFiles w("path/to/model_dir");   // the first of model.safetensors, its index, pytorch_model.bin, its index
//   w.read_rows("bert.embeddings.word_embeddings.weight", first_row, rows);
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::io {

struct WeightEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

class WeightFiles {
 public:
  // `path`: a weights file (safetensors or torch.save, told apart by their first bytes), an index (*.index.json),
  // or a directory holding one of the names above (transformers' order: safetensors first), or else a distributed
  // checkpoint's .metadata (the tensors under its top-level "model" when it has one, else all but an optimizer's;
  // the names without torch.compile's and wrappers' parts, as get_model_state_dict gives them), or what
  // Accelerate's save_state wrote for an FSDP model (pytorch_model_fsdp.bin, or the distributed checkpoint
  // pytorch_model_fsdp_0/). Throws
  // std::runtime_error naming the file for a directory with none, an index that is not JSON or has no weight_map,
  // a shard that is missing, a tensor the index places in a shard that does not hold it (or a shard tensor the
  // index does not list), and whatever SafetensorsReader or load_torch_state_dict refuse.
  explicit WeightFiles(const std::string& path);
  ~WeightFiles();
  WeightFiles(const WeightFiles&) = delete;
  WeightFiles& operator=(const WeightFiles&) = delete;

  const std::string& path() const { return path_; }  // the file or index read
  // For a distributed checkpoint, which of its entries are the weights and how many others were left ("a PyTorch
  // distributed checkpoint (3 data files): the entries under "model", 82 other entries not read"); else empty.
  const std::string& note() const { return note_; }
  const std::vector<WeightEntry>& entries() const { return entries_; }  // in the files' order
  const WeightEntry* find(const std::string& name) const;               // nullptr when absent
  // The tensor (CPU, its file dtype); from a torch.save file a view of the file mapped copy-on-write. Throws naming
  // it when absent.
  at::Tensor read(const std::string& name) const;
  // Rows [first_row, first_row + rows) of dim 0 (a 0-dim tensor has one row), contiguous, reading only their
  // bytes: what a rank of a sharded model reads. Throws naming the tensor when absent or the rows are out of range.
  at::Tensor read_rows(const std::string& name, int64_t first_row, int64_t rows) const;
  // The tensor copied into `out` (its shape; any dtype, converted): what read() gives, without a copy of it beside
  // `out` where read() would make one (a distributed checkpoint's tensor split across chunks). Throws as read(), and
  // std::invalid_argument for another shape.
  void read_into(const std::string& name, const at::Tensor& out) const;

 private:
  struct File;
  const File& file_of(const std::string& name) const;

  std::string path_, note_;
  std::vector<std::unique_ptr<File>> files_;
  std::vector<WeightEntry> entries_;
  std::map<std::string, size_t> index_;  // tensor name -> its place in entries_ and in file_of_
  std::vector<size_t> file_of_;          // entries_[k] is in files_[file_of_[k]]
};

// Whether directory `dir` holds weights WeightFiles reads (one of the names above).
bool has_weight_files(const std::string& dir);

}  // namespace shardtrain::io
