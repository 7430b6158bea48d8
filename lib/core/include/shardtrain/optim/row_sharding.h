// How the parameters an optimizer steps are split across ranks, for optimizers whose statistics span a whole
// parameter (optim::Adafactor): fsdp::row_sharding describes a fully_shard'ed model's.
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

}  // namespace shardtrain::optim
