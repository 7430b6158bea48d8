// How the parameters an optimizer steps are split across ranks, for optimizers whose statistics span a whole
// parameter (optim::Adafactor): fsdp::row_sharding describes a fully_shard'ed model's, models::TensorParallel::
// tensor_split a tensor-parallel one's (whose slices FSDP may then shard by rows).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::optim {

// Parameters split on dim 0 across the ranks of `group`: a rank's tensor holds `real_rows` of the parameter's
// `full_rows` rows at its top, then padding rows (zero, as FSDP keeps them). A parameter not listed is whole on
// every rank. Every rank lists the same parameters.
struct RowSharding {
  struct Split {
    int64_t full_rows = 0;
    int64_t real_rows = 0;
  };
  dist::Communicator group;
  std::unordered_map<const c10::TensorImpl*, Split> params;
};

// Parameters split by tensor parallelism across the ranks of `group`, each rank holding a slice along `dim` (0: the
// rows, 1: the columns of a matrix) of a parameter whose whole size along it is `extent`. `share`: what a rank's sum
// over its slice counts for in the group's, 1 / the ranks holding the same slice (Megatron's replicated key/value
// heads), else 1. A parameter not listed is whole and equal on every rank of the group.
struct TensorSplit {
  struct Split {
    int64_t dim = 0;
    int64_t extent = 0;
    double share = 1;
  };
  dist::Communicator group;
  std::unordered_map<const c10::TensorImpl*, Split> params;
};

}  // namespace shardtrain::optim
