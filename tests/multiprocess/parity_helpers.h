// What the data-parallel parity tests share: each rank's share of a batch, the single-process reference for
// gradient accumulation, and the float32 comparison of parameters against a reference model.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "test_env.h"
#include "toy_model.h"

namespace shardtrain::testing {

// This rank's rows of a batch: equal shares in rank order.
inline at::Tensor local_rows(const at::Tensor& t) {
  const int w = test_process_group().world_size(), r = test_process_group().rank();
  const int64_t n = t.size(0) / w;
  return t.narrow(0, r * n, n);
}

// One process, the first two batches as micro-batches of one step: each loss halved, gradients accumulated, one
// SGD(0.1) step from the seed-42 Toy.
inline fsdp::testing_models::Toy accumulated_reference() {
  auto batches = fsdp::testing_models::make_batches();
  torch::manual_seed(42);
  fsdp::testing_models::Toy ref;
  torch::optim::SGD sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
  for (int m = 0; m < 2; ++m) (torch::mse_loss(ref(batches[m].first), batches[m].second) / 2).backward();
  sgd.step();
  return ref;
}

inline std::map<std::string, at::Tensor> parameters_of(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().detach();
  return out;
}

// Every parameter of `ref` has its counterpart in `got`, equal within float32 tolerance (1e-5 relative).
inline void expect_params_equal(const std::map<std::string, at::Tensor>& got, const torch::nn::Module& ref,
                                const std::string& label) {
  for (const auto& p : ref.named_parameters()) {
    ASSERT_TRUE(got.count(p.key())) << label << " missing " << p.key();
    EXPECT_TRUE(torch::allclose(got.at(p.key()), p.value(), 1e-5, 1e-6))
        << label << " " << p.key() << " max |diff| " << (got.at(p.key()) - p.value()).abs().max().item<double>();
  }
}

}  // namespace shardtrain::testing
