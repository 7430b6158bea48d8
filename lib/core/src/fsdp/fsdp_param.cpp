#include "fsdp/fsdp_param.h"

#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <cmath>
#include <stdexcept>

namespace shardtrain::fsdp {

namespace {

// A 0-dim view of a one-element tensor. (Not `t.view({})`: `{}` converts to ScalarType(0), which reinterprets the
// bytes as uint8 — Tensor::view has a dtype overload.)
at::Tensor as_scalar(const at::Tensor& t) { return t.view(at::IntArrayRef{}); }

}  // namespace

FsdpParam::FsdpParam(std::string name, at::Tensor param, int world, int rank, at::ScalarType compute_dtype)
    : name_(std::move(name)),
      param_(std::move(param)),
      compute_device_(param_.device()),
      world_(world),
      rank_(rank),
      compute_dtype_(compute_dtype) {
  scalar_ = param_.dim() == 0;
  shape_ = scalar_ ? std::vector<int64_t>{1} : param_.sizes().vec();
  rows_ = shape_[0];
  row_numel_ = 1;
  for (size_t d = 1; d < shape_.size(); ++d) row_numel_ *= shape_[d];
  chunk_rows_ = (rows_ + world_ - 1) / world_;
  if (chunk_rows_ == 0) chunk_rows_ = 1;  // an empty parameter still gets a (padding) row
  shard_shape_ = shape_;
  shard_shape_[0] = chunk_rows_;
  padded_shape_ = shape_;
  padded_shape_[0] = chunk_rows_ * world_;
  if (!param_.is_contiguous()) {
    throw std::invalid_argument("fully_shard: parameter '" + name_ + "' is not contiguous");
  }
}

int64_t FsdpParam::shard_real_rows() const {
  return std::max<int64_t>(0, std::min(rows_, shard_first_row() + chunk_rows_) - shard_first_row());
}

void FsdpParam::init_shard(const at::Tensor& shard_view, const at::Tensor& full_value) {
  c10::AutoGradMode no_grad(false);
  shard_ = shard_view.view(shard_shape_);
  shard_.zero_();
  const int64_t real_rows = shard_real_rows();
  if (real_rows > 0) {
    shard_.narrow(0, 0, real_rows).copy_(full_value.reshape(shape_).narrow(0, shard_first_row(), real_rows));
  }
  const auto compute = at::TensorOptions().dtype(compute_dtype_).device(compute_device_);
  unsharded_ = at::empty(padded_shape_, compute.dtype(gather_dtype()));
  if (in_float8()) {
    float8_scale_ = at::ones({}, compute.dtype(at::kFloat));
    placeholder_ = at::zeros({}, compute).expand(shape_);
  }
  use_sharded();
}

void FsdpParam::gather_in_float8(std::shared_ptr<torch::nn::Module> owner, nn::Float8CastAhead* cast) {
  if (shape_.size() != 2 || scalar_) {
    throw std::invalid_argument("fully_shard: float8 all-gather of parameter '" + name_ + "' of shape " +
                                c10::str(param_.sizes()) + " (expected a 2-D weight)");
  }
  float8_owner_ = std::move(owner);
  float8_cast_ = cast;
}

at::Tensor FsdpParam::shard_amax(at::ScalarType dtype) const {
  c10::AutoGradMode no_grad(false);
  // Rounding to `dtype` is monotonic and symmetric: the largest |x| rounded is the largest of the rounded |x|.
  return at::linalg_vector_norm(shard_, INFINITY).to(dtype).to(at::kFloat);
}

void FsdpParam::set_float8_scale(const at::Tensor& scale) {
  c10::AutoGradMode no_grad(false);
  float8_scale_.copy_(scale);
}

bool FsdpParam::unsharded_allocated() const { return unsharded_.storage().nbytes() > 0; }

void FsdpParam::alloc_unsharded() {
  c10::StorageImpl* storage = unsharded_.storage().unsafeGetStorageImpl();
  if (storage->nbytes() > 0) return;
  const size_t nbytes = static_cast<size_t>(unsharded_.numel()) * unsharded_.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

void FsdpParam::copy_in_unsharded(const at::Tensor& gathered, int64_t unit_shard_numel, int64_t offset_in_unit) {
  c10::AutoGradMode no_grad(false);
  unsharded_.view({world_, shard_numel()}).copy_(slots_in(gathered, unit_shard_numel, offset_in_unit));
}

void FsdpParam::copy_in_unsharded_bytes(const at::Tensor& gathered, int64_t block_bytes, int64_t byte_offset) {
  c10::AutoGradMode no_grad(false);
  const int64_t bytes = shard_numel() * static_cast<int64_t>(c10::elementSize(gather_dtype()));
  const at::Tensor slots = gathered.view({world_, block_bytes}).narrow(1, byte_offset, bytes);
  unsharded_.view({world_, shard_numel()}).view(at::kByte).copy_(slots);
}

void FsdpParam::use_unsharded() {
  if (!unsharded_allocated()) {
    throw std::logic_error("fully_shard: parameter '" + name_ + "' made unsharded before its buffer was filled");
  }
  at::Tensor full = unsharded_.narrow(0, 0, rows_);
  if (in_float8()) {
    float8_cast_->cast = {full, float8_scale_};
    param_.set_data(placeholder_);
    return;
  }
  param_.set_data(scalar_ ? as_scalar(full) : full);
}

void FsdpParam::use_sharded() {
  if (in_float8()) float8_cast_->cast = {};
  param_.set_data(shard_);
  c10::StorageImpl* storage = unsharded_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, unsharded_.device()));
  storage->set_nbytes(0);
}

void FsdpParam::use_shard_as_full() { param_.set_data(scalar_ ? as_scalar(shard_) : shard_); }

void FsdpParam::copy_grad_out(const at::Tensor& full_grad, const at::Tensor& rs_input, int64_t unit_shard_numel,
                              int64_t offset_in_unit) const {
  if (shard_numel() == 0) return;
  c10::AutoGradMode no_grad(false);
  // (W, chunk_rows, row_numel): rank k's slot takes rows [k * chunk_rows, (k + 1) * chunk_rows) of the gradient,
  // written in place, the padding rows past rows_ zeroed there (no padded copy of the whole gradient).
  at::Tensor dst = slots_in(rs_input, unit_shard_numel, offset_in_unit).view({world_, chunk_rows_, row_numel_});
  at::Tensor grad = full_grad.reshape({rows_, row_numel_});
  const int64_t whole = rows_ / chunk_rows_;  // ranks whose slot holds real rows only
  const int64_t rest = rows_ - whole * chunk_rows_;
  if (whole > 0) dst.narrow(0, 0, whole).copy_(grad.narrow(0, 0, whole * chunk_rows_).view({whole, chunk_rows_,
                                                                                               row_numel_}));
  if (whole == world_) return;
  at::Tensor partial = dst.select(0, whole);
  partial.narrow(0, 0, rest).copy_(grad.narrow(0, whole * chunk_rows_, rest));
  partial.narrow(0, rest, chunk_rows_ - rest).zero_();
  dst.narrow(0, whole + 1, world_ - whole - 1).zero_();
}

void FsdpParam::zero_grad_slots(const at::Tensor& rs_input, int64_t unit_shard_numel, int64_t offset_in_unit) const {
  if (shard_numel() > 0) slots_in(rs_input, unit_shard_numel, offset_in_unit).zero_();
}

at::Tensor FsdpParam::as_shard(const at::Tensor& flat) const { return flat.view(shard_shape_); }

at::Tensor FsdpParam::full_from_gathered(const at::Tensor& gathered, int64_t unit_shard_numel,
                                         int64_t offset_in_unit) const {
  at::Tensor padded = slots_in(gathered, unit_shard_numel, offset_in_unit).reshape(padded_shape_);
  // Contiguous: a clone of a view with size-1 dimensions would keep the gathered buffer's strides.
  at::Tensor full = padded.narrow(0, 0, rows_).clone(at::MemoryFormat::Contiguous);
  return scalar_ ? as_scalar(full) : full;
}

}  // namespace shardtrain::fsdp
