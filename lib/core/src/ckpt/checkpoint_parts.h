// What a checkpoint's save (save.cpp) and its loading and verification (checkpoint.cpp) share. Private to ckpt/.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/Dict.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/fsdp/state_dict.h"

namespace shardtrain::ckpt {

// The suffix of a save's directory until it is whole: step-00000100.partial.
inline constexpr const char* kPartial = ".partial";

// The default generators a run draws from (dropout, masks drawn on the device): the CPU's and, on a machine with
// GPUs, each device's, keyed "cpu", "cuda:0", ...
std::vector<std::pair<std::string, at::Generator>> default_generators();
// <dir>/rng-rank00003.pt: world rank 3's generator states.
std::string rng_file(const std::string& dir, int rank);

// name -> parameter of `root`.
std::map<std::string, at::Tensor> named_parameters(const torch::nn::Module& root);
// The optimizer state tensors of the model's parameters that have state.
fsdp::ParamStates moments(const CheckpointModel& model);

// A str -> any dict, as a pickle holds one.
c10::impl::GenericDict new_dict();

// How many of `t`'s values are NaN or Inf (0 for integer tensors), and the text that says so: "'w' holds 3 NaN or
// Inf values of 64".
int64_t non_finite_count(const at::Tensor& t);
std::string non_finite_text(const std::string& name, int64_t bad, int64_t numel);

}  // namespace shardtrain::ckpt
