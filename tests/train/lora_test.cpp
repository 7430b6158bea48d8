// LoRA fine-tuning end to end through the CLI (model.lora): a Llama written by transformers, adapters on every
// Linear of its layers trained on 2 ranks, exported as PEFT's adapter and as a merged model, and scored again by
// PEFT and transformers (tests/reference/lora_check.py); stopped and resumed, it ends where it would have; bad
// targets and an adapter export of a run without LoRA are refused by name; `shardtrain generate --adapter` over the
// base model makes the merged model's tokens. A BERT classifier with its head trained whole, the same way.
#include <gtest/gtest.h>

#include <cstdio>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "shardtrain/io/files.h"
#include "train_harness.h"

namespace shardtrain {
namespace {

using test::Outcome;
using test::run;

// An empty directory of this test's own.
std::string fresh_dir(const std::string& name) {
  const std::string dir = "/tmp/shardtrain_" + name + "_" + std::to_string(::getpid());
  io::remove_tree(dir);
  io::make_directories(dir);
  return dir;
}

// The first `lines` lines of `from` into `to` (a held-out set of a size every rank's batches divide).
void copy_lines(const std::string& from, const std::string& to, int lines) {
  std::ifstream all(from);
  std::ofstream first(to);
  std::string line;
  for (int i = 0; i < lines && std::getline(all, line); ++i) first << line << "\n";
}

// The number after `metric` in the last "eval step" line.
double last_eval(const std::string& output, const std::string& metric) {
  std::string last;
  for (const std::string& line : test::loss_lines(output)) {
    if (line.rfind("eval step", 0) == 0) last = line;
  }
  std::smatch found;
  return std::regex_search(last, found, std::regex(" " + metric + " ([-0-9.e+]+)")) ? std::stod(found[1]) : NAN;
}

// The JSON line lora_check.py prints last.
nlohmann::json checked(const Outcome& made) {
  return nlohmann::json::parse(made.output.substr(made.output.rfind("{\"eval_loss\"")));
}

// A causal LM's LoRA run in `dir`: 2000 synthetic texts, the base model an example's make_model.py (`make_model`,
// under examples/) writes into dir/base, 320 held-out texts (10 batches of 16 on each of 2 ranks, every one scored
// by both sides), and dir/lora.yaml training it with `lora` (model.lora in YAML) for 16 steps, evaluated at the end,
// logging every 2 steps, checkpointing into dir/run every 8.
void set_up_causal_lm_run(const std::string& dir, const std::string& make_model, const std::string& lora) {
  const std::string st = SHARDTRAIN_BIN, python = SHARDTRAIN_PYTHON, source = SHARDTRAIN_SOURCE_DIR;
  Outcome made = run(st + " data synth --out " + dir + "/data --text 0 --image-text 0 --image 0 --eval 0 "
                     "--seq2seq 2000");
  ASSERT_EQ(made.status, 0) << made.output;
  made = run(python + " " + source + "/examples/" + make_model + " " + dir + "/base " + dir +
             "/data/seq2seq/train.jsonl");
  ASSERT_EQ(made.status, 0) << made.output;
  copy_lines(dir + "/data/seq2seq/eval.jsonl", dir + "/eval.jsonl", 320);
  std::ofstream(dir + "/lora.yaml") << "model:\n"
                                       "  from: " << dir << "/base\n"
                                       "  task: causal_lm\n"
                                       "  lora: " << lora << "\n"
                                       "data:\n"
                                       "  text: [" << dir << "/data/seq2seq/train.jsonl]\n"
                                       "  eval: [" << dir << "/eval.jsonl]\n"
                                       "  text_fields: [input]\n"
                                       "  max_text_length: 48\n"
                                       "optim: {lr: 3.0e-3, warmup_steps: 4}\n"
                                       "train: {steps: 16, batch_size: 16, eval_interval: 16, eval_samples: 0}\n"
                                       "log: {interval: 2, progress: lines}\n"
                                       "checkpoint: {dir: " << dir << "/run, interval: 8}\n";
}

// dir/lora.yaml trained on 2 ranks, with `extra` overrides.
Outcome train_lora(const std::string& dir, const std::string& extra) {
  const std::string st = SHARDTRAIN_BIN;
  return run(st + " launch --nproc-per-node 2 -- " + st + " train " + dir + "/lora.yaml " + extra);
}

// An adapter PEFT made over dir/base on `targets` (both matrices random; lora_check.py make_adapter, into
// dir/peft-made) starts a run (model.lora.from, r and targets from its adapter_config.json) whose start-up line
// says `described` and whose first evaluation is what PEFT scores with it.
void expect_run_from_peft_adapter(const std::string& dir, const std::string& targets, const std::string& described) {
  const std::string python = SHARDTRAIN_PYTHON, source = SHARDTRAIN_SOURCE_DIR;
  const Outcome made = run(python + " " + source + "/tests/reference/lora_check.py make_adapter " + dir + "/base " +
                           dir + "/peft-made " + dir + "/eval.jsonl input 48 " + targets);
  ASSERT_EQ(made.status, 0) << made.output;
  const nlohmann::json made_by_peft = checked(made);
  const Outcome from_peft = train_lora(dir, "--checkpoint.dir=" + dir + "/from-peft --model.lora.from=" + dir +
                                                "/peft-made --model.lora.target_modules=[] --model.lora.r=0 "
                                                "--train.steps=1");
  ASSERT_EQ(from_peft.status, 0) << from_peft.output;
  EXPECT_NE(from_peft.output.find(described), std::string::npos) << from_peft.output;
  const std::string first_eval = test::loss_lines(from_peft.output).front();
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(first_eval, loss, std::regex("eval_loss ([0-9.]+)"))) << first_eval;
  EXPECT_NEAR(std::stod(loss[1]), made_by_peft.at("eval_loss").get<double>(), 1e-3) << from_peft.output;
}

// `shardtrain generate` over dir/base with the exported adapter dir/adapter (unmerged, --adapter) makes the tokens of
// the merged export dir/merged, in one process and sharded over two.
void expect_adapter_generates_as_merged(const std::string& dir) {
  const std::string st = SHARDTRAIN_BIN;
  const std::string prompts = " 'a red circle on the left' 'three small squares' --max-new-tokens 8 --json --out ";
  const Outcome adapted =
      run(st + " generate " + dir + "/base --adapter " + dir + "/adapter" + prompts + dir + "/adapted.jsonl");
  ASSERT_EQ(adapted.status, 0) << adapted.output;
  EXPECT_NE(adapted.output.find(", adapter r 8, lora_alpha 16"), std::string::npos) << adapted.output;
  const Outcome merged = run(st + " generate " + dir + "/merged" + prompts + dir + "/merged.jsonl");
  ASSERT_EQ(merged.status, 0) << merged.output;
  EXPECT_EQ(test::read_text(dir + "/adapted.jsonl"), test::read_text(dir + "/merged.jsonl"));
  // The same over a base model and adapter sharded over two ranks (one batch: rank 1 steps along unreported).
  const Outcome sharded = run(st + " launch --nproc-per-node 2 -- " + st + " generate " + dir + "/base --adapter " +
                              dir + "/adapter" + prompts + dir + "/sharded.jsonl");
  ASSERT_EQ(sharded.status, 0) << sharded.output;
  EXPECT_EQ(test::read_text(dir + "/sharded.jsonl"), test::read_text(dir + "/adapted.jsonl"));
}

// 139584 -> "139,584", as PEFT prints counts.
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

TEST(LoraTrain, AdaptersExportAsPeftLoadsThem) {
  const std::string dir = fresh_dir("lora_train");
  const std::string st = SHARDTRAIN_BIN, python = SHARDTRAIN_PYTHON, source = SHARDTRAIN_SOURCE_DIR;
  ASSERT_NO_FATAL_FAILURE(set_up_causal_lm_run(
      dir, "llama_causal_lm/make_model.py", "{r: 8, lora_alpha: 16, lora_dropout: 0.05, target_modules: all-linear}"));
  auto train = [&](const std::string& extra) { return train_lora(dir, extra); };
  Outcome made;
  const Outcome through = train("");
  ASSERT_EQ(through.status, 0) << through.output;
  EXPECT_NE(through.output.find("LoRA: r 8, lora_alpha 16, lora_dropout 0.05 on 14 modules (self_attn.q_proj, "
                                "self_attn.k_proj, self_attn.v_proj, self_attn.o_proj, mlp.gate_proj, mlp.up_proj, "
                                "mlp.down_proj); trainable params: "),
            std::string::npos) << through.output;
  EXPECT_NE(through.output.find("eval_samples 320"), std::string::npos) << through.output;

  made = run(st + " checkpoint export " + dir + "/run --peft " + dir + "/adapter");
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_NE(made.output.find("28 tensors; LoRA r 8, lora_alpha 16, lora_dropout 0.05 on 14 modules"),
            std::string::npos) << made.output;
  const nlohmann::json config = nlohmann::json::parse(test::read_text(dir + "/adapter/adapter_config.json"));
  EXPECT_EQ(config.at("task_type"), "CAUSAL_LM");
  EXPECT_EQ(config.at("base_model_name_or_path"), dir + "/base");
  made = run(st + " checkpoint export " + dir + "/run --hf " + dir + "/merged");
  ASSERT_EQ(made.status, 0) << made.output;
  made = run(python + " " + source + "/tests/reference/lora_check.py causal_lm " + dir + "/base " + dir +
             "/adapter " + dir + "/merged " + dir + "/eval.jsonl input 48");
  ASSERT_EQ(made.status, 0) << made.output;
  const nlohmann::json theirs = checked(made);
  EXPECT_EQ(theirs.at("samples"), last_eval(through.output, "eval_tokens"));  // every predicted token
  EXPECT_EQ(theirs.at("adapter_tensors"), 28);  // lora_A and lora_B of 7 modules x 2 layers
  // The counts PEFT's print_trainable_parameters gives for its own model of the base and the adapter: 16,384
  // adapter parameters (2 layers x r 8 x the in + out widths of q, k, v, o, gate, up, down: 64+64, 64+32, 64+32,
  // 64+64, 64+128, 64+128, 128+64), of 139,584 with the base's.
  const int64_t lora_parameters = theirs.at("lora_parameters"), all_parameters = theirs.at("all_parameters");
  EXPECT_EQ(lora_parameters, 2 * 8 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3));
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.4f", 100.0 * static_cast<double>(lora_parameters) /
                                                     static_cast<double>(all_parameters));
  const std::string counts = "trainable params: " + with_commas(lora_parameters) + " || all params: " +
                             with_commas(all_parameters) + " || trainable%: " + percent;
  EXPECT_NE(through.output.find(counts), std::string::npos) << counts << "\n" << through.output;
  // PEFT's model scores the held-out texts as the run's last evaluation did, and was trained: the base is worse.
  for (const char* metric : {"eval_loss", "perplexity"}) {
    const double x = theirs.at(metric).get<double>();
    EXPECT_NEAR(last_eval(through.output, metric), x, 1e-3 * std::max(1.0, std::abs(x))) << metric << "\n"
                                                                                          << through.output;
  }
  EXPECT_GT(theirs.at("base_eval_loss").get<double>(), theirs.at("eval_loss").get<double>() + 0.1);
  // PEFT's merge_and_unload gives the merged directory's weights, and both models the same logits.
  EXPECT_LE(theirs.at("merged_weight_diff").get<double>(), 1e-6);
  EXPECT_LE(theirs.at("merged_output_diff").get<double>(), 1e-4);
  ASSERT_NO_FATAL_FAILURE(expect_adapter_generates_as_merged(dir));

  // Started again from the exported adapter (model.lora.from; r, lora_alpha and the targets from its
  // adapter_config.json): the first evaluation is the last one of the run that trained it.
  const Outcome again = train("--checkpoint.dir=" + dir + "/again --model.lora.from=" + dir + "/adapter " +
                              "--model.lora.target_modules=[] --train.steps=2");
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find(counts + "; the adapter from " + dir + "/adapter"), std::string::npos) << again.output;
  const std::vector<std::string> first_run = test::loss_lines(through.output), second_run =
      test::loss_lines(again.output);
  ASSERT_FALSE(second_run.empty());
  EXPECT_EQ(second_run.front().substr(second_run.front().find("eval_loss")),
            first_run.back().substr(first_run.back().find("eval_loss"))) << again.output;
  // An adapter PEFT made (both matrices random), and what PEFT scores with it: the run's first evaluation.
  ASSERT_NO_FATAL_FAILURE(expect_run_from_peft_adapter(dir, "q_proj,v_proj",
                                                       "LoRA: r 4, lora_alpha 8, lora_dropout 0 on 4 modules "
                                                       "(self_attn.q_proj, self_attn.v_proj)"));
  const Outcome bad_rank = train("--checkpoint.dir=" + dir + "/bad --model.lora.from=" + dir + "/peft-made " +
                                 "--model.lora.target_modules=[] --model.lora.r=16");
  EXPECT_NE(bad_rank.status, 0);
  EXPECT_NE(bad_rank.output.find("model.lora.r is 16 but the adapter of model.lora.from"), std::string::npos)
      << bad_rank.output;

  // Stopped at step 8 and resumed: the adapters and their AdamW state, and the dropout's generators, come back.
  const Outcome stopped = train("--checkpoint.dir=" + dir + "/resumed --train.stop_at=8");
  ASSERT_EQ(stopped.status, 0) << stopped.output;
  const Outcome resumed = train("--checkpoint.dir=" + dir + "/resumed --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  std::vector<std::string> joined;
  for (const Outcome* part : {&stopped, &resumed}) {
    for (const std::string& line : test::loss_lines(part->output)) {
      if (line.rfind("eval step 8 ", 0) != 0) joined.push_back(line);  // the stopped run's closing evaluation
    }
  }
  EXPECT_EQ(joined, test::loss_lines(through.output)) << stopped.output << resumed.output;

  // estimate-memory with --lora: the adapters' AdamW state only, and what the frozen layers keep.
  const std::string estimate = st + " estimate-memory " + dir + "/base --num-processes 2 --batch-size 16 --seq-len 48";
  const Outcome full = run(estimate + " --json"), adapted = run(estimate + " --lora 8 --lora-targets all-linear --json");
  ASSERT_EQ(full.status, 0) << full.output;
  ASSERT_EQ(adapted.status, 0) << adapted.output;
  EXPECT_NE(adapted.output.find("+ LoRA r 8 (14 modules; " + std::to_string(lora_parameters) + " of " +
                                std::to_string(all_parameters) + " parameters train)"),
            std::string::npos)
      << adapted.output;
  const auto term = [](const std::string& text, const std::string& name) {
    const nlohmann::json estimate = nlohmann::json::parse(text);
    for (const auto& t : estimate.at("terms")) {
      if (t.at("name") == name) return t.at("bytes").get<double>();
    }
    return -1.0;
  };
  EXPECT_NEAR(term(adapted.output, "AdamW state"), 8.0 * static_cast<double>(lora_parameters) / 2, 1.0)
      << adapted.output;  // two float32 moments per adapter parameter, sharded over 2 ranks
  EXPECT_GT(term(full.output, "AdamW state"), 5 * term(adapted.output, "AdamW state")) << full.output;
  const Outcome typo = train("--checkpoint.dir=" + dir + "/typo --model.lora.target_modules=[q_prj]");
  EXPECT_NE(typo.status, 0);
  EXPECT_NE(typo.output.find("model.lora.target_modules: 'q_prj' is no Linear module of the model's transformer "
                             "layers; theirs are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"),
            std::string::npos) << typo.output;
  const Outcome plain = train("--checkpoint.dir=" + dir + "/plain --model.lora.r=0 "
                              "--model.lora.target_modules=[] --train.steps=1 --train.eval_interval=0");
  ASSERT_EQ(plain.status, 0) << plain.output;
  made = run(st + " checkpoint export " + dir + "/plain --peft " + dir + "/no-adapter");
  EXPECT_NE(made.status, 0);
  EXPECT_NE(made.output.find("is not of a LoRA run"), std::string::npos) << made.output;
  io::remove_tree(dir);
}

// GPT-2's projections are Conv1D (weights stored (in, out)) and its attention one c_attn: PEFT's default target for
// GPT-2. Adapters on c_attn and the MLP's c_fc train on 2 ranks, export with fan_in_fan_out (as PEFT sets it for
// Conv1D), and PEFT's GPT2LMHeadModel with them scores the held-out texts as the run did; the merged export equals
// PEFT's merge_and_unload ((B A)^T added to each (in, out) weight). An adapter PEFT made on c_attn and c_proj (its
// adapter_config says fan_in_fan_out) starts a run that evaluates as PEFT scores it.
TEST(LoraTrain, Gpt2Conv1DAdaptersMatchPeft) {
  const std::string dir = fresh_dir("lora_gpt2");
  const std::string st = SHARDTRAIN_BIN, python = SHARDTRAIN_PYTHON, source = SHARDTRAIN_SOURCE_DIR;
  ASSERT_NO_FATAL_FAILURE(
      set_up_causal_lm_run(dir, "gpt2_clm/make_model.py", "{r: 8, lora_alpha: 16, target_modules: [c_attn, c_fc]}"));
  auto train = [&](const std::string& extra) { return train_lora(dir, extra); };
  Outcome made;
  const Outcome through = train("");
  ASSERT_EQ(through.status, 0) << through.output;
  EXPECT_NE(through.output.find("on 4 modules (attn.c_attn, mlp.c_fc)"), std::string::npos) << through.output;
  made = run(st + " checkpoint export " + dir + "/run --peft " + dir + "/adapter");
  ASSERT_EQ(made.status, 0) << made.output;
  const nlohmann::json config = nlohmann::json::parse(test::read_text(dir + "/adapter/adapter_config.json"));
  EXPECT_EQ(config.at("fan_in_fan_out"), true);
  made = run(st + " checkpoint export " + dir + "/run --hf " + dir + "/merged");
  ASSERT_EQ(made.status, 0) << made.output;
  made = run(python + " " + source + "/tests/reference/lora_check.py causal_lm " + dir + "/base " + dir +
             "/adapter " + dir + "/merged " + dir + "/eval.jsonl input 48");
  ASSERT_EQ(made.status, 0) << made.output;
  const nlohmann::json theirs = checked(made);
  EXPECT_EQ(theirs.at("samples"), last_eval(through.output, "eval_tokens"));
  EXPECT_EQ(theirs.at("adapter_tensors"), 8);  // lora_A and lora_B of 2 modules x 2 layers
  const double x = theirs.at("eval_loss").get<double>();
  EXPECT_NEAR(last_eval(through.output, "eval_loss"), x, 1e-3 * std::max(1.0, x)) << through.output;
  EXPECT_GT(theirs.at("base_eval_loss").get<double>(), x + 0.1);
  EXPECT_LE(theirs.at("merged_weight_diff").get<double>(), 1e-6);
  EXPECT_LE(theirs.at("merged_output_diff").get<double>(), 1e-4);
  ASSERT_NO_FATAL_FAILURE(expect_adapter_generates_as_merged(dir));

  ASSERT_NO_FATAL_FAILURE(
      expect_run_from_peft_adapter(dir, "c_attn,c_proj", "on 6 modules (attn.c_attn, attn.c_proj, mlp.c_proj)"));
  io::remove_tree(dir);
}

// A BERT sentence-pair classifier from a BertForMaskedLM: the classifier and the pooler it reads (the masked-LM
// checkpoint has neither) train whole beside the adapters, are saved with them, and PEFT's
// BertForSequenceClassification with the adapter scores the held-out pairs as the run did.
TEST(LoraTrain, ClassifierTrainsWholeBesideTheAdapters) {
  const std::string dir = fresh_dir("lora_classify");
  const std::string st = SHARDTRAIN_BIN, python = SHARDTRAIN_PYTHON, source = SHARDTRAIN_SOURCE_DIR;
  Outcome made = run(st + " data synth --out " + dir + "/data --text 0 --image-text 0 --image 0 --eval 0 "
                     "--pairs 1000 --vocab-size 400");
  ASSERT_EQ(made.status, 0) << made.output;
  made = run(python + " " + source + "/examples/bert_classify/make_model.py " + dir + "/base " + dir +
             "/data/vocab.txt");
  ASSERT_EQ(made.status, 0) << made.output;
  // 224 held-out pairs (after the header; 7 batches of 16 on each of 2 ranks): every one scored by both sides
  copy_lines(dir + "/data/pairs/eval.tsv", dir + "/eval.tsv", 1 + 224);
  const Outcome trained = run(
      st + " launch --nproc-per-node 2 -- " + st + " train " + source + "/examples/bert_classify/classify.yaml " +
      "--model.from=" + dir + "/base --data.text=[" + dir + "/data/pairs/train.tsv] --data.eval=[" + dir +
      "/eval.tsv] --checkpoint.dir=" + dir + "/run --model.lora.r=4 --model.lora.lora_alpha=8 "
      "--model.lora.target_modules=[query,value,output.dense] --train.steps=30 --train.eval_interval=30 "
      "--train.eval_samples=0 --optim.lr=3e-3 --optim.warmup_steps=0");
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_NE(trained.output.find("on 8 modules (attention.self.query, attention.self.value, attention.output.dense, "
                                "output.dense), pooler, classifier trained whole"),
            std::string::npos) << trained.output;
  EXPECT_NE(trained.output.find("eval_samples 224"), std::string::npos) << trained.output;
  made = run(st + " checkpoint export " + dir + "/run --peft " + dir + "/adapter");
  ASSERT_EQ(made.status, 0) << made.output;
  made = run(st + " checkpoint export " + dir + "/run --hf " + dir + "/merged");
  ASSERT_EQ(made.status, 0) << made.output;
  made = run(python + " " + source + "/tests/reference/lora_check.py classify " + dir + "/base " + dir +
             "/adapter " + dir + "/merged " + dir + "/eval.tsv '#1 String,#2 String,Quality' 48");
  ASSERT_EQ(made.status, 0) << made.output;
  const nlohmann::json theirs = checked(made);
  EXPECT_EQ(theirs.at("samples"), 224);
  EXPECT_EQ(theirs.at("adapter_tensors"), 2 * 2 * 4 + 2 + 2);  // A and B of 4 modules x 2 layers; pooler, classifier
  for (const char* metric : {"eval_loss", "accuracy"}) {
    const double x = theirs.at(metric).get<double>();
    EXPECT_NEAR(last_eval(trained.output, metric), x, 1e-3 * std::max(1.0, std::abs(x))) << metric << "\n"
                                                                                          << trained.output;
  }
  EXPECT_LE(theirs.at("merged_weight_diff").get<double>(), 1e-6);
  EXPECT_LE(theirs.at("merged_output_diff").get<double>(), 1e-4);
  io::remove_tree(dir);
}

}  // namespace
}  // namespace shardtrain
