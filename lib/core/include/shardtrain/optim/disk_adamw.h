// AdamW whose moments live on a local disk (parallel.offload: nvme; DeepSpeed ZeRO-Infinity's optimizer offload to
// NVMe): host memory holds two chunks of them, not all. A step streams them through two staging buffers — the next
// chunk's moments read while this chunk steps, this chunk's written back while the next steps — with asynchronous
// I/O in aligned blocks (io/scratch_file.h: io_uring, O_DIRECT). The update is FusedAdamW's kernel on the same
// values: parameters and moments equal to FusedAdamW's bit for bit. Parameters and gradients are on the host (CPU
// offload's shards, or a model computing on the CPU).
//
//   optim::DiskAdamW adam(groups, torch::optim::AdamWOptions(1e-3), {.dir = "/nvme", .name = "optimizer-rank0"});
//   adam.step();                 // as AdamW's
//   adam.last_step().io_wait_s   // what the step waited for the disk
//
// Layout: each parameter's two moments (exp_avg, exp_avg_sq; the parameter's dtype) at an offset of their own, in
// the order of the parameter groups, each padded to 4 KiB; the file holds them all from construction (a full disk
// fails there). Chunks are runs of consecutive parameters with gradients, up to chunk_bytes (a parameter larger than
// that is a chunk of its own), one read and one write each.
//
// State dicts and checkpoints see AdamW's state (optim/optimizer_state.h): a parameter's moments are read from disk
// when asked for (read_state), and a loaded state (empty_state, filled by the caller) waits in host memory and goes
// to disk at the next step.
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::optim {

struct DiskStateOptions {
  std::string dir;                      // parallel.nvme_path
  std::string name = "optimizer";       // the file's name there (a rank's own: "optimizer-rank3")
  int64_t chunk_bytes = 64LL << 20;     // each of the two staging buffers
};

// What one step moved and waited for.
struct DiskStepStats {
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t chunks = 0;
  double io_wait_s = 0;   // blocked on the disk (the first read, and what compute did not hide)
  double compute_s = 0;   // the AdamW kernel
  double seconds = 0;     // the whole step
};

class DiskAdamW : public torch::optim::AdamW {
 public:
  // Throws what io::ScratchFile::create throws (a missing, unwritable or too small directory, no io_uring), and
  // std::invalid_argument for AMSGrad (not on the disk tier).
  DiskAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
            DiskStateOptions disk);
  ~DiskAdamW() override;

  // Throws std::invalid_argument naming a parameter that is not a contiguous floating tensor on the CPU with a
  // gradient like it.
  at::Tensor step(LossClosure closure = nullptr) override;

  // The moments of `param` ({"exp_avg", "exp_avg_sq"}): read from disk into new host tensors, or a loaded state's
  // own while it waits to go there (a checkpoint's loader fills them). Throws std::invalid_argument for a parameter
  // without state.
  std::map<std::string, at::Tensor> read_state(const at::Tensor& param);
  // A state for `param` at `step` whose moments are zeros in host memory, to be filled by the caller; it goes to
  // disk at the next step. Returns the moments.
  std::map<std::string, at::Tensor> empty_state(const at::Tensor& param, int64_t step);

  int64_t disk_bytes() const;  // the file's size
  bool direct() const;         // O_DIRECT (else buffered: the filesystem refused it)
  const DiskStepStats& last_step() const { return last_; }

 private:
  struct Store;
  std::unique_ptr<Store> store_;
  DiskStepStats last_;
};

// The state DiskAdamW keeps in AdamW's state map: the step count, and the moments only while a loaded state waits
// for the next step (undefined otherwise: they are on disk).
struct DiskAdamWParamState : torch::optim::AdamWParamState {
  DiskAdamW* owner = nullptr;
};

}  // namespace shardtrain::optim
