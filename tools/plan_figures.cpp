#include "plan_figures.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "shardtrain/models/zoo.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/planner.h"

namespace shardtrain::cli {

namespace {

// The posts' setting: one node of 8 A100-40GB, bf16 mixed precision (AMP), transformer layers as FSDP units.
plan::TrainingJob a100_job(parallel::Strategy strategy, bool ac, parallel::Precision precision, int64_t seq_len) {
  plan::TrainingJob job;
  job.world = 8, job.strategy = strategy, job.activation_checkpointing = ac, job.mixed_precision = precision;
  job.seq_len = seq_len, job.device = parallel::Device::CUDA;
  return job;
}

std::string verdict(bool agrees) { return agrees ? "agrees   " : "DISAGREES"; }

}  // namespace

FigureTable flava_figure(int64_t text_tokens) {
  const plan::Cluster cluster;  // 8 x A100-40GB
  const char* flavors[] = {"flava-350m", "flava-900m", "flava-1.8b", "flava-2.7b", "flava-4.8b", "flava-10b"};
  struct Row {
    std::string flavor;
    int64_t ddp, fsdp, fsdp_ac;
  };
  std::vector<Row> rows;
  for (const char* f : flavors) {
    const auto recipe = models::recipe_of(f);
    const plan::ModelShape shape = plan::model_shape(*recipe);
    auto batch = [&](parallel::Strategy s, bool ac) {
      return plan::largest_batch(*recipe, shape, a100_job(s, ac, parallel::Precision::BF16, text_tokens), cluster);
    };
    rows.push_back({f, batch(parallel::Strategy::DDP, false), batch(parallel::Strategy::FULL_SHARD, false),
                    batch(parallel::Strategy::FULL_SHARD, true)});
  }
  std::string text =
      "FLAVA post, Figure 2: max local batch on 8 x A100-40GB (bf16 mixed precision, 224-px images, " +
      std::to_string(text_tokens) +
      " text tokens,\nAdamW, transformer-layer units, 5% of memory kept free), predicted by the memory model (0: does "
      "not fit)\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-12s %8s %8s %10s\n", "flavor", "DDP", "FSDP", "FSDP+AC");
  text += line;
  nlohmann::json j;
  j["figure"] = "flava";
  j["setting"] = "8 x A100-40GB, bf16, " + std::to_string(text_tokens) + " text tokens, 224-px images";
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "  %-12s %8lld %8lld %10lld\n", r.flavor.c_str(), static_cast<long long>(r.ddp),
                  static_cast<long long>(r.fsdp), static_cast<long long>(r.fsdp_ac));
    text += line;
    j["rows"].push_back({{"flavor", r.flavor}, {"DDP", r.ddp}, {"FSDP", r.fsdp}, {"FSDP+AC", r.fsdp_ac}});
  }
  // The post's findings, each checked against the table.
  auto fits = [](int64_t b) { return b > 0; };
  const bool ddp_small_only = fits(rows[0].ddp) && fits(rows[1].ddp) && !fits(rows[2].ddp) && !fits(rows[3].ddp);
  const bool fsdp_to_27 = fits(rows[2].fsdp) && fits(rows[3].fsdp) && !fits(rows[4].fsdp) && !fits(rows[5].fsdp);
  const bool ac_to_10b = fits(rows[4].fsdp_ac) && fits(rows[5].fsdp_ac);
  const double ratio_350 = rows[0].ddp > 0 ? static_cast<double>(rows[0].fsdp_ac) / rows[0].ddp : 0;
  const double ratio_900 = rows[1].ddp > 0 ? static_cast<double>(rows[1].fsdp_ac) / rows[1].ddp : 0;
  const bool fsdp_above_ddp = rows[0].fsdp >= rows[0].ddp && rows[1].fsdp >= rows[1].ddp;
  std::vector<std::pair<std::string, bool>> findings = {
      {"DDP fits only the 350M and 900M models", ddp_small_only},
      {"FSDP fits 1.8B and 2.7B too (about 3x DDP's largest), not 4.8B or 10B", fsdp_to_27},
      {"FSDP with activation checkpointing fits 4.8B and 10B", ac_to_10b},
      {"10B with FSDP+AC reaches a local batch of about 20 (here " + std::to_string(rows[5].fsdp_ac) + ")",
       std::abs(static_cast<double>(rows[5].fsdp_ac) - 20) <= 10},
      {"FSDP alone fits a slightly larger batch than DDP", fsdp_above_ddp},
  };
  char ratio[160];
  std::snprintf(ratio, sizeof ratio, "FSDP+AC fits ~3x DDP's batch at 350M and ~5.5x at 900M (here %.1fx, %.1fx)",
                ratio_350, ratio_900);
  findings.push_back({ratio, std::abs(ratio_350 - 3) <= 1.5 && std::abs(ratio_900 - 5.5) <= 2.75});
  text += "\nThe post's findings against the model:\n";
  for (const auto& [finding, agrees] : findings) {
    text += "  " + verdict(agrees) + " " + finding + "\n";
    j["findings"].push_back({{"finding", finding}, {"agrees", agrees}});
  }
  return {text, j.dump(2)};
}

FigureTable t5_figure(int64_t text_tokens) {
  const plan::Cluster cluster;
  const auto recipe = models::recipe_of("t5-3b");
  const plan::ModelShape shape = plan::model_shape(*recipe);
  std::string text =
      "T5 post: T5-3B on 8 x A100-40GB, FULL_SHARD, the whole model as one FSDP unit (\"default wrapping\") vs each\n"
      "T5Block a unit (transformer wrapping), " + std::to_string(text_tokens) +
      " text tokens; the post reports batch 14 vs 28 (2x)\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-10s %16s %20s %7s\n", "precision", "default wrap", "transformer wrap", "ratio");
  text += line;
  nlohmann::json j;
  j["figure"] = "t5";
  j["setting"] = "T5-3B, 8 x A100-40GB, FULL_SHARD, " + std::to_string(text_tokens) + " tokens";
  bool any_agrees = false;
  for (parallel::Precision p : {parallel::Precision::NO, parallel::Precision::BF16}) {
    const std::string precision = parallel::to_string(p);
    plan::TrainingJob job = a100_job(parallel::Strategy::FULL_SHARD, false, p, text_tokens);
    job.wrap = parallel::Wrap::NONE;
    const int64_t whole = plan::largest_batch(*recipe, shape, job, cluster);
    job.wrap = parallel::Wrap::TRANSFORMER;
    const int64_t layers = plan::largest_batch(*recipe, shape, job, cluster);
    const double r = whole > 0 ? static_cast<double>(layers) / whole : 0;
    std::snprintf(line, sizeof line, "  %-10s %16lld %20lld %6.1fx\n", precision.c_str(), static_cast<long long>(whole),
                  static_cast<long long>(layers), r);
    text += line;
    j["rows"].push_back({{"precision", precision}, {"default_wrap", whole}, {"transformer_wrap", layers}});
    any_agrees = any_agrees || (r >= 1.5 && r <= 3);
  }
  text += "\n  " + verdict(any_agrees) + " transformer wrapping fits about twice the batch of one unit\n";
  j["findings"].push_back({{"finding", "transformer wrapping fits about twice the batch of one unit"},
                           {"agrees", any_agrees}});
  return {text, j.dump(2)};
}

}  // namespace shardtrain::cli
