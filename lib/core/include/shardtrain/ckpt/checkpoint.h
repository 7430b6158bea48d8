// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
//   <dir>/step-00000100/
//     model/               FSDP: each rank's rows of every parameter and of its optimizer state
//                          (fsdp/state_dict.h's sharded format: loads at any world size); with tensor
//                          parallelism model/tp-<t>-of-<T>/ and model/tensor_parallel.json (CheckpointModel),
//                          under DDP too; with pipeline parallelism a directory per stage rank,
//                          model/pp-<p>-of-<P>/, and model/pipeline.json
//     model.pt             DDP without tensor or pipeline parallelism: the whole parameters and moments, written
//                          by rank 0 (DDP's pipeline stages: model/pp-<p>-of-<P>/ by the first replica)
//     rng-rank00000.pt     each rank's default generator states: "cpu" and, with GPUs, "cuda:0", ... (dropout)
//     model.safetensors    checkpoint.state_dict_type = full: the whole model under Hugging Face names
//     trainer.json         step, data position, per-parameter optimizer steps, world size, flavor, run id, the config
//     manifest.json        every other file's size and checksum, the run id (ckpt/manifest.h); written last
//
// Atomic: every rank writes into <dir>/step-00000100.partial; rank 0 writes trainer.json; the ranks hash the files
// between them and rank 0 writes the manifest, fsyncs and renames the directory into place, so a step-* directory
// is always a whole save; a crash leaves only a .partial, which the next save or prune removes. What happens to the
// files afterwards (a flipped bit, a truncation, a copy from elsewhere) is caught by verifying against the
// manifest, which loading does first. The learning-rate schedule is a function of the step, so the step restores
// it.
#pragma once

#include <array>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/ckpt/trainer_state.h"
#include "shardtrain/distributed/communicator.h"
#include "shardtrain/tp/split.h"

namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace shardtrain::ckpt {


struct CheckpointModel {
  std::shared_ptr<torch::nn::Module> root;
  torch::optim::Optimizer* optimizer = nullptr;  // AdamW, FusedAdamW or AnyPrecisionAdamW (optim/optimizer_state.h)
  bool sharded = true;  // fully_shard'ed (else replicated: DDP or one process)
  // (our name, Hugging Face name) of every tensor of a Hugging Face file of the model (models::hf_names_of); given:
  // also write model.safetensors (state_dict_type = full). Checkpoints know names, not model families.
  std::vector<std::pair<std::string, std::string>> hf_names;
  // Tensor parallelism: the group whose ranks hold slices of the split parameters, and by parameter name how each
  // is split (models::TensorParallel::split_layouts). Each rank of the group writes its slices as a sharded state
  // dict of their own (a replicated model's: one shard, written by world rank 0's group),
  // model/tp-<t>-of-<T>/, beside model/tensor_parallel.json (the size
  // and the split dimensions); loading at the same size reads its own, at another (or without tensor parallelism,
  // or a checkpoint saved without it) merges the slices whole and takes its own. Unset: none.
  std::optional<dist::Communicator> tp_group = std::nullopt;
  std::map<std::string, tp::SplitLayout> tp_split = {};
  // Pipeline parallelism: the group whose ranks hold the model's stages (root: this rank's, under the whole model's
  // names). Each pipeline rank's stages are written as a model directory of their own (a replicated model's by
  // world rank 0's pipeline group), model/pp-<p>-of-<P>/, beside
  // model/pipeline.json; loading at the same size reads its own, at another (or without a pipeline, or a
  // checkpoint saved without one) takes the entries this rank's model holds from wherever they are. Unset: none.
  std::optional<dist::Communicator> pp_group = std::nullopt;
  // CPU offload (fsdp::FsdpOptions::offload_params): what loading allocates — the optimizer state, the files'
  // tensors read into the shards — is the host's, as the step's is (memory::CpuTier::HOST when computing on the CPU).
  bool offloaded = false;
};

std::string step_directory_name(int64_t step);  // "step-00000100"

// What save_checkpoint throws, on every rank alike and having written nothing, when a parameter or optimizer state
// tensor of some rank holds NaN or Inf (a diverged run): names the rank and the tensor.
class NonFiniteState : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What save_checkpoint throws, on every rank alike, when a write failed on any (a full disk, a permission, an I/O
// error; or a checkpoint of the same step that belongs to another run, which is never replaced): names the rank,
// the file and the system's reason. The partial directory is removed; earlier checkpoints are untouched.
class CheckpointWriteFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Collective over `world`. Returns the checkpoint's path. The manifest's run id is state.run_id. Throws
// NonFiniteState or CheckpointWriteFailed as above.
std::string save_checkpoint(const std::string& dir, const TrainerState& state, const CheckpointModel& model,
                            const dist::Communicator& world);

// What is wrong with the checkpoint at `path` ("" when nothing is): its files against its manifest (ckpt/manifest.h:
// sizes, checksums, nothing missing or added), then their values — weights or optimizer state holding NaN or Inf
// are damage too (a diverged run's), named by file and tensor. Reads the files at positions offset, offset +
// stride, ... of the listing (several processes share the reading).
std::string verify_checkpoint_files(const std::string& path, int offset = 0, int stride = 1);

// The same, the ranks reading a share of the files each; the same text on every rank. Collective.
std::string verify_checkpoint(const std::string& path, const dist::Communicator& world);

// What load_checkpoint throws, before it has changed anything, when the checkpoint does not verify: a caller may
// go on to an older one.
class CheckpointDamaged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Verifies (as above; CheckpointDamaged when it does not), calls `accept` (when given) with its trainer state — which
// may throw to refuse it before anything loads —, then restores parameters, optimizer state and (at the saved world
// size) RNG; returns the trainer state. Collective. Throws std::runtime_error naming the path and what is wrong
// (not a checkpoint, a different model).
TrainerState load_checkpoint(const std::string& path, const CheckpointModel& model, const dist::Communicator& world,
                             const std::function<void(const TrainerState&)>& accept = {});

// <path>/trainer.json (ckpt/trainer_state.h).
TrainerState read_trainer_state(const std::string& path);

// The checkpoints in `dir`, oldest first (full paths): every step-* directory. The rename that puts one in place is
// the last step of a save, so each is a whole save, unless damaged since: verify before trusting one.
std::vector<std::string> list_checkpoints(const std::string& dir);
std::optional<std::string> latest_checkpoint(const std::string& dir);

// The run id a checkpoint's manifest names; "" when the manifest does not read.
std::string run_id_of(const std::string& path);

// Removes run `run_id`'s checkpoints but its newest `keep` (0: keep all), and any .partial left by a crash.
// Checkpoints of other runs, and ones whose manifest does not read, are never removed.
void prune_checkpoints(const std::string& dir, int64_t keep, const std::string& run_id);

// One tensor of an export: its name in the checkpoint, its name in the file, its shape in the model.
struct ExportTensor {
  std::string name, file_name;
  std::vector<int64_t> shape;
};

struct ExportOptions {
  std::optional<at::ScalarType> dtype;  // the file's dtype; unset: each tensor's own
  bool allow_non_finite = false;        // write NaN/Inf weights instead of refusing them
};

// Merges a checkpoint's model (sharded or whole) into one safetensors file holding `tensors` (the model's layout
// under Hugging Face names: `shardtrain checkpoint export` builds it from the checkpoint's flavor). Needs no process
// group: verifies the checkpoint against its manifest, then reads the files. Throws std::runtime_error when it
// does not verify, naming a tensor the checkpoint lacks or holds in another shape, and one that holds NaN or Inf values (in the checkpoint, or once cast to options.dtype) unless
// options.allow_non_finite: a diverged or damaged model is not written where it would be taken for a good one.
void export_checkpoint(const std::string& path, const std::string& out, const std::vector<ExportTensor>& tensors,
                       const ExportOptions& options = {});

// What export_checkpoint writes, verified, read and checked the same way: (file name, tensor) in `tensors`' order,
// for a caller that writes them elsewhere (a Hugging Face model directory's shards: io::write_safetensors_files).
std::vector<std::pair<std::string, at::Tensor>> read_export_tensors(const std::string& path,
                                                                    const std::vector<ExportTensor>& tensors,
                                                                    const ExportOptions& options = {});

}  // namespace shardtrain::ckpt
