// Published training runs the throughput model is held to (docs/notes/throughput-model.md, `shardtrain plan
// --figure published`, unit.Planner.PredictsPublishedRunsWithinAQuarter): each run's model, cluster and
// configuration as the source states them, its tokens/s per GPU, and the planner's prediction for the same.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "shardtrain/plan/planner.h"

namespace shardtrain::plan {

struct PublishedRun {
  std::string source;   // where the figure is: a document and its table
  std::string setting;  // the run as the source states it
  std::string model;    // a zoo flavor, with `overrides` for a size the zoo lacks (Llama 2 13B: llama-2-7b's family)
  std::map<std::string, double> overrides;
  Cluster cluster;      // the GPU preset, GPUs and nodes; inter-node bandwidth where the source states it
  TrainingJob job;      // the configuration in our terms
  double tokens_per_second_per_gpu = 0;  // theirs
  std::string differs;  // where our configuration is not exactly theirs, or "" when it is
  // The source's own measured gain from what the run has and the model does not price (torch.compile, Float8,
  // asynchronous TP): the model is held to theirs divided by it. 1 where nothing is unpriced.
  double unpriced_speedup = 1;
};

// torchtitan's published Llama runs our features cover (FSDP, tensor and pipeline parallelism, activation
// checkpointing of every layer or every other, Float8 linears; not torch.compile, asynchronous TP or context
// parallelism, whose gains are held apart: unpriced_speedup).
std::vector<PublishedRun> published_runs();

struct PublishedCheck {
  PublishedRun run;
  PlannedConfig ours;  // the prediction for run.job on run.cluster
  double error = 0;    // ours / (theirs / run.unpriced_speedup) - 1, in tokens/s per GPU
};
std::vector<PublishedCheck> check_published_runs();

// A published comparison (this configuration over that one) or ordering, and the model's view of it: the seeds'
// posts measured FLAVA and T5 on 8 A100-40GB in ratios of their own throughput units, so the ratios, not the
// magnitudes, are what the model can be held to.
struct PublishedFinding {
  std::string source, finding;
  std::string theirs;  // as the source states it ("2.19x")
  double ours = 0;     // the model's ratio, the same way round
  bool holds = false;  // the model's ratio on the source's side of 1
  std::string why;     // where it does not hold, or its size is far from theirs: what the model leaves out ("" where
                       // the model is expected to agree)
};
std::vector<PublishedFinding> check_published_findings();

}  // namespace shardtrain::plan
