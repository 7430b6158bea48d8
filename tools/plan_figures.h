// The seeds' figures from the memory model (`shardtrain plan --figure`): the FLAVA post's Figure 2 (max local batch
// per flavor and configuration on 8 x A100-40GB), the T5 post's wrapping comparison and its scale claims, each next to what the post
// reports, saying where the model agrees and where it does not.
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain::cli {

struct FigureTable {
  std::string text;  // the table and the comparison with the post, for the terminal
  std::string json;  // the same numbers (scripts/plot_plan.py draws them)
};

// `text_tokens`: the text length of FLAVA's samples (the post does not say; 77 is Hugging Face's FLAVA examples')
// and of T5's rows (512).
FigureTable flava_figure(int64_t text_tokens = 77);
FigureTable t5_figure(int64_t text_tokens = 512);
// The T5 post's scale claims: the largest T5 each technique fits on 4 nodes x 8 A100-40GB (DDP with checkpointing,
// FSDP, with checkpointing, with parameter offload, with activation offload too), next to the post's 3B / ~4x /
// ~20x (81B).
FigureTable t5_scale_figure(int64_t text_tokens = 512);
// Published runs (plan/published_runs.h: torchtitan's Llama on A100 and H100) beside the throughput model's
// prediction for each: tokens/s per GPU, theirs and ours, and the error.
FigureTable published_figure();

}  // namespace shardtrain::cli
