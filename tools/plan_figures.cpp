#include "plan_figures.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "shardtrain/models/zoo.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/planner.h"
#include "shardtrain/plan/published_runs.h"

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

FigureTable t5_scale_figure(int64_t text_tokens) {
  plan::Cluster cluster;  // A100-40GB, 4 nodes of 8 (the post's largest setting)
  cluster.gpus = 32, cluster.nodes = 4;
  // T5-3B and T5-11B, then wider and deeper T5s (d_model, heads of 128, d_ff, layers per stack), grown as the 11B
  // grows from the 3B (the post does not list its larger shapes); the 80.6B one is the post's 81B's size.
  struct Shape {
    std::string name;
    std::map<std::string, double> overrides;
  };
  std::vector<Shape> ladder = {{"t5-3b", {}}, {"t5-11b", {}}};
  for (const auto& [dim, heads, mlp, layers] : std::vector<std::array<double, 4>>{
           {2048, 64, 65536, 24}, {2048, 64, 65536, 36}, {4096, 64, 65536, 32}, {4096, 64, 98304, 40},
           {4096, 128, 131072, 36}, {6144, 128, 131072, 40}, {8192, 128, 131072, 48}}) {
    ladder.push_back({"t5-11b", {{"dim", dim}, {"heads", heads}, {"mlp_dim", mlp}, {"layers", layers}}});
  }
  struct Technique {
    std::string name;
    parallel::Strategy strategy;
    bool ac, cpu_offload, activation_offload, sgd;
  };
  const std::vector<Technique> techniques = {
      {"DDP + AC", parallel::Strategy::DDP, true, false, false, false},
      {"DDP + AC, SGD", parallel::Strategy::DDP, true, false, false, true},
      {"FSDP", parallel::Strategy::FULL_SHARD, false, false, false, false},
      {"FSDP + AC", parallel::Strategy::FULL_SHARD, true, false, false, false},
      {"FSDP + AC + parameter offload", parallel::Strategy::FULL_SHARD, true, true, false, false},
      {"FSDP + AC + activation and parameter offload", parallel::Strategy::FULL_SHARD, true, true, true, false}};
  enum { DDP_ADAMW, DDP_SGD, FSDP, FSDP_AC, PARAMETER_OFFLOAD, BOTH_OFFLOADS };
  std::string text = "T5 post: the largest T5 per technique on 4 nodes x 8 A100-40GB (bf16, " +
                     std::to_string(text_tokens) +
                     " tokens, AdamW unless said, T5Block units, 1 TiB of host memory a node), by the memory model\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-26s %10s  %s\n", "d_model, heads, d_ff, layers", "parameters",
                "fits with (its largest batch per GPU)");
  text += line;
  nlohmann::json j;
  j["figure"] = "t5-scale";
  j["setting"] = "4 x 8 A100-40GB, bf16, " + std::to_string(text_tokens) + " tokens";
  std::vector<double> largest(techniques.size(), 0);
  bool post_size_needs_offload = false;
  for (const Shape& shape : ladder) {
    const auto recipe = models::recipe_of_model(shape.name, shape.overrides);
    const plan::ModelShape model = plan::model_shape(*recipe);
    const double parameters = static_cast<double>(model.parameters());
    std::string fits;
    nlohmann::json row = {{"model", recipe->flavor()}, {"parameters", parameters}};
    std::vector<int64_t> batches;
    for (const Technique& tech : techniques) {
      plan::TrainingJob job = a100_job(tech.strategy, tech.ac, parallel::Precision::BF16, text_tokens);
      job.world = cluster.gpus, job.nodes = cluster.nodes;
      job.cpu_offload = tech.cpu_offload, job.activation_offload = tech.activation_offload;
      if (tech.sgd) job.optimizer = "SGD", job.optimizer_state_bytes = 4;  // the momentum buffer
      const int64_t batch = plan::largest_batch(*recipe, model, job, cluster);  // the device's and host's memory
      row[tech.name] = batch;
      batches.push_back(batch);
      if (batch > 0) fits += (fits.empty() ? "" : ", ") + tech.name + " (" + std::to_string(batch) + ")";
    }
    for (size_t t = 0; t < techniques.size(); ++t) {
      if (batches[t] > 0) largest[t] = std::max(largest[t], parameters);
    }
    if (std::abs(parameters - 81e9) < 2e9) {
      post_size_needs_offload = batches[BOTH_OFFLOADS] > 0 && batches[FSDP_AC] == 0;
    }
    const std::string label = shape.overrides.empty()
                                  ? shape.name
                                  : std::to_string(static_cast<int64_t>(shape.overrides.at("dim"))) + ", " +
                                        std::to_string(static_cast<int64_t>(shape.overrides.at("heads"))) + ", " +
                                        std::to_string(static_cast<int64_t>(shape.overrides.at("mlp_dim"))) + ", " +
                                        std::to_string(static_cast<int64_t>(shape.overrides.at("layers")));
    std::snprintf(line, sizeof line, "  %-26s %9.1fB  %s\n", label.c_str(), parameters / 1e9,
                  fits.empty() ? "nothing" : fits.c_str());
    text += line;
    j["rows"].push_back(row);
  }
  const double ddp = largest[DDP_SGD] > 0 ? largest[DDP_SGD] : 0;
  text += "\nThe largest that fits, per technique (x the largest DDP + AC, SGD):\n";
  for (size_t t = 0; t < techniques.size(); ++t) {
    std::snprintf(line, sizeof line, "  %-46s %6.1fB  %5.1fx\n", techniques[t].name.c_str(), largest[t] / 1e9,
                  ddp > 0 ? largest[t] / ddp : 0.0);
    text += line;
    j["largest"][techniques[t].name] = largest[t];
  }
  // The post's claims. Its 3B with DDP cannot have had AdamW's float32 state (16 bytes a parameter: 46 GB for
  // T5-3B, more than the GPU); its optimizer is not said: DDP's claim is checked with SGD with momentum.
  auto within = [](double got, double want, double factor) { return got >= want / factor && got <= want * factor; };
  const double ratio_fsdp = ddp > 0 ? std::max(largest[FSDP], largest[FSDP_AC]) / ddp : 0;
  const double ratio_offload = ddp > 0 ? largest[BOTH_OFFLOADS] / ddp : 0;
  char fsdp_claim[200], offload_claim[200];
  std::snprintf(fsdp_claim, sizeof fsdp_claim, "FSDP trains a model about 4x larger than DDP (here %.0fx)", ratio_fsdp);
  std::snprintf(offload_claim, sizeof offload_claim,
                "FSDP with checkpointing, activation and parameter offloading about 20x DDP's (here %.0fx)",
                ratio_offload);
  const std::vector<std::pair<std::string, bool>> findings = {
      {"DDP with checkpointing trains up to about 3B (with AdamW: " +
           (largest[DDP_ADAMW] > 0 ? std::to_string(static_cast<int64_t>(largest[DDP_ADAMW] / 1e9)) + "B" : "none") +
           " of these)",
       within(largest[DDP_SGD], 3e9, 1.5)},
      {fsdp_claim, within(ratio_fsdp, 4, 1.5)},
      {"81B trains with checkpointing, activation and parameter offloading, and not with checkpointing alone",
       post_size_needs_offload},
      {offload_claim, within(ratio_offload, 20, 1.5)},
  };
  text += "\nThe post's claims against the model (its sizes are the runs it made, the model's the largest that fit):\n";
  for (const auto& [finding, agrees] : findings) {
    text += "  " + verdict(agrees) + " " + finding + "\n";
    j["findings"].push_back({{"finding", finding}, {"agrees", agrees}});
  }
  return {text, j.dump(2)};
}

FigureTable published_figure() {
  std::string text = "Published runs against the throughput model (tokens/s per GPU; docs/notes/throughput-model.md)\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-86s %9s %9s %7s\n", "run", "theirs", "ours", "error");
  text += line;
  nlohmann::json j;
  j["figure"] = "published";
  for (const plan::PublishedCheck& c : plan::check_published_runs()) {
    std::snprintf(line, sizeof line, "  %-86s %9.0f %9.0f %+6.0f%%\n", c.run.setting.c_str(),
                  c.run.tokens_per_second_per_gpu, c.ours.tokens_per_second_per_gpu, 100 * c.error);
    text += line;
    if (!c.run.differs.empty()) text += "      (" + c.run.differs + ")\n";
    j["runs"].push_back({{"setting", c.run.setting}, {"source", c.run.source},
                         {"theirs", c.run.tokens_per_second_per_gpu}, {"ours", c.ours.tokens_per_second_per_gpu},
                         {"mfu", c.ours.mfu}, {"error", c.error}});
  }
  text += "\nSources: torchtitan docs/performance.md and benchmarks/llama3_h100_202412_torchtitan.md; the A100 "
          "cluster's network is not stated there: 25 GB/s per GPU assumed.\n\nPublished ratios (the seeds' posts on 8 "
          "x A100-40GB, whose throughput units differ; torchtitan's pipeline schedules):\n\n";
  std::snprintf(line, sizeof line, "  %-88s %7s %7s %s\n", "finding", "theirs", "ours", "");
  text += line;
  for (const plan::PublishedFinding& f : plan::check_published_findings()) {
    std::snprintf(line, sizeof line, "  %-88s %7s %6.2fx %s\n", f.finding.c_str(), f.theirs.c_str(), f.ours,
                  f.holds ? "holds" : "DOES NOT HOLD");
    text += line;
    if (!f.why.empty()) text += "      (" + f.why + ")\n";
    j["findings"].push_back({{"source", f.source}, {"finding", f.finding}, {"theirs", f.theirs}, {"ours", f.ours},
                             {"holds", f.holds}, {"why", f.why}});
  }
  return {text, j.dump(2)};
}

}  // namespace shardtrain::cli
