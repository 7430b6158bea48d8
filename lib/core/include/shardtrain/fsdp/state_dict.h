// State dicts of a fully_shard'ed model: parameters and buffers by their named_parameters()/named_buffers() names.
//
// Sharded: each rank writes the rows it holds, no communication, to <dir>/shard-<k>-of-<S>.pt (S = shard group
// size; replicas of a hybrid or NO_SHARD model write once), then shard 0 writes <dir>/metadata.pt: a directory
// is a complete checkpoint when metadata.pt exists. Loading reads only the files holding this rank's rows, so a
// state saved at one world size loads at any other.
// Full: every parameter gathered whole, on CPU, by rank 0 (the others get an empty map), one file loadable by
// LibTorch's torch::pickle_load and by Python's torch.load with its defaults (a dict of tensors, written untyped:
// io/pickle_files.h). Loads at any world size.
// Every file is written atomically (io/files.h); a write that fails on one rank (a full disk) fails the save on every
// rank with that rank's reason ("rank 1: cannot write ...: No space left on device"), none left waiting for it.
// Loading checks names and shapes and names what does not match.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "shardtrain/optim/optimizer_state.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::fsdp {

// Per-parameter tensors that follow their parameter's sharding — an optimizer's state: state key ("exp_avg") ->
// parameter name -> the tensor as this rank holds it between steps and how it is split (optim::StateSplit: like
// the parameter, by the parameter's rows, or whole on every rank). They are saved next to the parameters as
// "<parameter>::<key>" and loaded in place into the tensors given, at any world size, like the parameters.
using ParamStates = std::map<std::string, std::map<std::string, optim::StateTensor>>;

void save_sharded_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                             const ParamStates& states = {});
void load_sharded_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                             const ParamStates& states = {});

// One file of a state dict as save_pickle writes it: its path and contents, whose tensors are the model's own
// (views of its shards and states: write them before the model changes, or copy them first).
struct StateDictFile {
  std::string path;
  c10::IValue contents;
};
// What a rank writes of a state dict directory: its shard files, then — once every rank's shards are on disk —
// the metadata that declares the directory whole.
struct StateDictFiles {
  std::vector<StateDictFile> shards, metadata;
};
// What save_sharded_state_dict would write from this rank, without writing (none on a hybrid model's other
// replicas): a checkpoint written later, or elsewhere (ckpt::AsyncCheckpointer). No communication.
StateDictFiles sharded_state_files(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                                   const ParamStates& states = {});
// The same for save_whole_state_dict.
StateDictFiles whole_state_files(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                                 const ParamStates& states = {});
// Writes them (each file's directory made), in order, atomically each. No communication.
void write_state_dict_files(const std::vector<StateDictFile>& files);

// A model no unit shards (DDP's replicas: each holds it whole) written in the same format as one shard, so that it
// loads and merges as any sharded state dict. No communication: the caller has one replica write it.
void save_whole_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& dir,
                           const ParamStates& states = {});

// Every entry of a sharded state dict directory merged whole, on CPU, without a model (what `checkpoint export`
// reads). Parameter states appear under "<parameter>::<key>".
std::map<std::string, at::Tensor> read_sharded_state_dict(const std::string& dir);

// The same one entry at a time: the directory's files mapped into memory (io::load_pickle), not read, and an entry
// assembled whole when asked for, so that a reader holds one entry beside what it has handed out. Throws
// std::runtime_error for a directory without metadata.pt or a file that does not read.
class ShardedStateReader {
 public:
  explicit ShardedStateReader(const std::string& dir);
  const std::vector<std::string>& names() const { return names_; }  // every entry, sorted
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // Entry `name` whole (a tensor of its own). Throws std::invalid_argument naming it and the directory when absent.
  at::Tensor whole(const std::string& name) const;

 private:
  struct Piece {
    at::Tensor rows;  // a view of a mapped file
    int64_t first = 0;
  };
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<Piece> pieces;
  };
  std::string dir_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> names_;
};

// Loads such whole entries (parameters, buffers, "<parameter>::<key>" states) into a sharded model, each rank
// copying its rows, as load_sharded_state_dict does from files (a checkpoint merged from several: tensor
// parallelism's at another size), or into a model no unit shards, whole. Checks names and shapes. No
// communication.
void load_state_dict_rows(const std::shared_ptr<torch::nn::Module>& root, const std::map<std::string, at::Tensor>& state,
                          const ParamStates& states = {});
// The same with each entry given when asked for (whole; undefined when there is none): a caller that assembles
// entries (from several files) holds one at a time. Asked for once per entry.
void load_state_dict_rows(const std::shared_ptr<torch::nn::Module>& root,
                          const std::function<at::Tensor(const std::string& name)>& entry_of,
                          const ParamStates& states = {});

// Collective over the units' groups. Parameters in their own dtype; buffers as they are.
std::map<std::string, at::Tensor> full_state_dict(const std::shared_ptr<torch::nn::Module>& root, bool rank0_only = true);
void save_full_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& path);
// Every rank reads `path` (or takes `state`) and keeps its own rows. No communication. `path` is what
// save_full_state_dict wrote or Python's torch.save(model.state_dict(), path) (io::load_torch_state_dict).
void load_full_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::string& path);
void load_full_state_dict(const std::shared_ptr<torch::nn::Module>& root, const std::map<std::string, at::Tensor>& state);

// Loading from another format (a Hugging Face safetensors file: models/weights.h). A slot is one parameter or
// buffer of a sharded model: its name, full shape, and the rows of dim 0 this rank holds, [first_row, first_row +
// rows) — all of them for buffers; a 0-dim parameter is one row. `tensor` is the model's own (identity only:
// between steps a parameter holds its shard).
struct RowSlot {
  std::string name;
  std::vector<int64_t> full_shape;
  int64_t first_row = 0, rows = 0;
  at::Tensor tensor;
};

// Every parameter (unit by unit) and buffer of a sharded model, in one order on every rank.
std::vector<RowSlot> row_slots(const std::shared_ptr<torch::nn::Module>& root);

// Fills every slot with rows_of(slot): a tensor of slot.rows rows (shaped (rows, full_shape[1:]...), any dtype and
// device), copied in. rows_of is called for every slot in row_slots() order on every rank, also where rows = 0, so
// it may be collective (rank 0 reads, the others receive); an undefined tensor keeps the slot's values. No
// communication of its own.
void load_rows(const std::shared_ptr<torch::nn::Module>& root, const std::function<at::Tensor(const RowSlot&)>& rows_of);

}  // namespace shardtrain::fsdp
