// `--lora R [--lora-targets a,b]` of estimate-memory and plan: the LoRA a job would train.
#pragma once

#include <algorithm>
#include <stdexcept>

#include "cli_args.h"
#include "shardtrain/models/lora_spec.h"

namespace shardtrain::cli {

// r from --lora (0: none), PEFT's target_modules from --lora-targets (empty: the family's default), lora_alpha 2r
// (the scale changes neither memory nor speed). Throws std::invalid_argument for --lora-targets without --lora.
inline models::LoraSpec lora_of_args(const Args& args) {
  models::LoraSpec lora;
  lora.r = args.get_int("lora", 0);
  lora.lora_alpha = 2.0 * static_cast<double>(std::max<int64_t>(1, lora.r));
  lora.target_modules = split_commas(args.get("lora-targets", ""));
  if (args.has("lora-targets") && !args.has("lora")) throw std::invalid_argument("--lora-targets goes with --lora R");
  return lora;
}

}  // namespace shardtrain::cli
