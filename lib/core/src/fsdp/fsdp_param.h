// One parameter under fully_shard, moving between its sharded and unsharded forms (private to the fsdp layer).
//
// [Note: FSDP parameter storage] The module keeps its own parameter tensor for life (the optimizer holds the same
// TensorImpl); only its data is swapped with set_data():
//   SHARDED    data = this rank's rows, a (chunk_rows, rest...) view into the unit's flat shard buffer. This is
//              what the optimizer reads and updates. Padding rows past the real ones stay zero.
//   UNSHARDED  data = the first `rows` rows of `unsharded_`, a (chunk_rows * W, rest...) buffer in the compute
//              dtype (mixed precision's param_dtype, else the parameter's own) filled by the
//              unit's all-gather. While SHARDED, that buffer's storage is freed in place (nbytes 0) and refilled on
//              the next unshard (docs/notes/libtorch.md §7), so views autograd saved during forward (e.g. the
//              transposed weight of a linear) stay valid across the free and refill.
// Memory: SHARDED costs shard_numel elements; UNSHARDED adds chunk_rows * W * row_numel.
//
// A parameter gathered in float8 (gather_in_float8: a float8 linear's weight under FsdpOptions::float8_all_gather)
// differs while UNSHARDED: `unsharded_` is e4m3 (1 byte an element), filled with every rank's shard cast with one
// scale (the MAX of the ranks' amax, set_float8_scale), and handed to the module that reads it
// (nn::Float8CastAhead::cast); the parameter's data is then a placeholder of its full shape (one zero broadcast,
// no memory), autograd's handle for its gradient, which arrives in the compute dtype as before.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/nn/float8_linear.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::fsdp {

class FsdpParam {
 public:
  // `param` holds the full value, identical on every rank; nothing is swapped until init_shard(). The full value
  // is computed with in `compute_dtype`.
  FsdpParam(std::string name, at::Tensor param, int world, int rank, at::ScalarType compute_dtype);

  const std::string& name() const { return name_; }
  const at::Tensor& param() const { return param_; }
  at::Tensor& grad() { return param_.mutable_grad(); }  // the parameter's .grad, whichever shape it has now
  int64_t shard_numel() const { return chunk_rows_ * row_numel_; }
  int64_t full_numel() const { return rows_ * row_numel_; }
  const std::vector<int64_t>& full_shape() const { return shape_; }

  int64_t unsharded_bytes() const { return chunk_rows_ * world_ * row_numel_ * c10::elementSize(gather_dtype()); }

  // Float8 all-gather, set before init_shard(): `cast` (a module of `owner`, kept alive here) computes from this
  // parameter's full value cast to e4m3, which the unit gathers in place of the compute dtype's.
  void gather_in_float8(std::shared_ptr<torch::nn::Module> owner, nn::Float8CastAhead* cast);
  bool in_float8() const { return float8_cast_ != nullptr; }
  at::ScalarType gather_dtype() const { return in_float8() ? at::kFloat8_e4m3fn : compute_dtype_; }
  // max |x| over this rank's shard in `dtype` (the padding's zeros change no maximum): a float32 scalar.
  at::Tensor shard_amax(at::ScalarType dtype) const;
  // The scale the gathers cast with until the next call (float32 scalar, copied in place: a module's cast keeps it).
  void set_float8_scale(const at::Tensor& scale);
  const at::Tensor& float8_scale() const { return float8_scale_; }

  // Copies this rank's rows of `full_value` into `shard_view` (flat, shard_numel elements, a slot of the unit's
  // flat shard buffer) and points the parameter at it.
  void init_shard(const at::Tensor& shard_view, const at::Tensor& full_value);

  // Allocates the unsharded buffer's storage (in place, keeping saved views valid) and returns it flat:
  // (W * shard_numel) elements, rank-major, to be filled by copy_in_unsharded().
  void alloc_unsharded();
  // Copies rank r's chunk from the all-gather output (rank-major over the unit's params) into the buffer.
  void copy_in_unsharded(const at::Tensor& gathered, int64_t unit_shard_numel, int64_t offset_in_unit);
  // The same from a gather of bytes (W * block_bytes, uint8): this parameter's shard in gather_dtype() at
  // byte_offset of each rank's block.
  void copy_in_unsharded_bytes(const at::Tensor& gathered, int64_t block_bytes, int64_t byte_offset);
  // Points the parameter at its full value (the first `rows` rows of the buffer).
  void use_unsharded();
  // Points the parameter at its shard and frees the unsharded storage.
  void use_sharded();
  // A group of one: the shard is the full value (no padding), so the parameter takes it in its full shape.
  void use_shard_as_full();
  bool unsharded_allocated() const;

  // Writes this parameter's full gradient (full_shape) into the reduce-scatter input (rank-major, padded rows
  // zero), at offset_in_unit inside each rank's block of unit_shard_numel elements.
  void copy_grad_out(const at::Tensor& full_grad, const at::Tensor& rs_input, int64_t unit_shard_numel,
                     int64_t offset_in_unit) const;
  // Zeroes this parameter's slots in the reduce-scatter input: a parameter without a gradient on this rank.
  void zero_grad_slots(const at::Tensor& rs_input, int64_t unit_shard_numel, int64_t offset_in_unit) const;
  // The shard-shaped view of a flat shard-sized tensor.
  at::Tensor as_shard(const at::Tensor& flat) const;
  // This parameter's full value (a new tensor of full_shape) out of a unit all-gather result (rank-major).
  at::Tensor full_from_gathered(const at::Tensor& gathered, int64_t unit_shard_numel, int64_t offset_in_unit) const;
  // The rows [first, first + count) of the full parameter that this rank's shard holds: first = rank * chunk_rows,
  // count = real (non-padding) rows, possibly 0.
  int64_t shard_first_row() const { return static_cast<int64_t>(rank_) * chunk_rows_; }
  int64_t shard_real_rows() const;
  // This rank's real (non-padding) rows: a writable (shard_real_rows(), rest...) view of the shard.
  at::Tensor real_shard() const { return shard_.narrow(0, 0, shard_real_rows()); }
  // The full shape as the model declares it ({} for a 0-dim parameter, which is sharded as one row).
  std::vector<int64_t> declared_shape() const { return scalar_ ? std::vector<int64_t>{} : shape_; }

 private:
  // This parameter's slot in every rank's block of a rank-major unit buffer (W * unit_shard_numel elements):
  // a (W, shard_numel) view.
  at::Tensor slots_in(const at::Tensor& unit_flat, int64_t unit_shard_numel, int64_t offset_in_unit) const {
    return unit_flat.view({world_, unit_shard_numel}).narrow(1, offset_in_unit, shard_numel());
  }

  std::string name_;
  at::Tensor param_;
  at::Device compute_device_;         // where the full value lives while unsharded (the parameter's at creation)
  std::vector<int64_t> shape_;        // full shape; 0-dim parameters are treated as shape (1)
  std::vector<int64_t> shard_shape_;  // (chunk_rows, rest...)
  std::vector<int64_t> padded_shape_; // (chunk_rows * W, rest...)
  int64_t rows_ = 1;                  // full_shape[0]
  int64_t row_numel_ = 1;             // product of full_shape[1:]
  int64_t chunk_rows_ = 1;            // ceil(rows / W)
  int world_ = 1;
  int rank_ = 0;
  bool scalar_ = false;
  at::ScalarType compute_dtype_;
  at::Tensor shard_;       // this rank's slot of the unit's flat shard buffer, viewed as shard_shape_
  at::Tensor unsharded_;   // padded_shape_ in gather_dtype(), own storage, freed while sharded
  std::shared_ptr<torch::nn::Module> float8_owner_;  // float8 all-gather only: the module reading the cast
  nn::Float8CastAhead* float8_cast_ = nullptr;
  at::Tensor float8_scale_;  // float32 scalar on the compute device
  at::Tensor placeholder_;   // the full shape broadcast from one zero in the compute dtype
};

}  // namespace shardtrain::fsdp
