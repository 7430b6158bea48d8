// What the end-to-end train tests share: running the CLI and capturing what it prints (in the foreground or the
// background), a synthetic FLAVA dataset with its config, and reading a checkpoint's model state back.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include "shardtrain/fsdp/state_dict.h"
#include "shardtrain/io/files.h"

namespace shardtrain::test {

struct Outcome {
  int status = -1;  // the shell's convention: 128 + signal when killed
  std::string output;  // stdout and stderr
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `command` through the shell; `input` is piped to its stdin when given. With SHARDTRAIN_TEST_TIMES=FILE in the
// environment, each command's wall time (seconds) and text are appended to FILE: where a test's time goes.
inline Outcome run(const std::string& command, const std::string& input = "") {
  const std::string out = "/tmp/shardtrain_train_test_out_" + std::to_string(::getpid());
  std::string full = command + " > " + out + " 2>&1";
  if (!input.empty()) full = "printf '" + input + "' | " + full;
  const auto start = std::chrono::steady_clock::now();
  const int raw = std::system(full.c_str());
  if (const char* times = std::getenv("SHARDTRAIN_TEST_TIMES")) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::ofstream(times, std::ios::app) << took.count() << "\t" << command << "\n";
  }
  Outcome r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.output = read_text(out);
  io::remove_tree(out);
  return r;
}

// The lines a run prints for its steps and evaluations ("step 3/6  loss 0.6927", "eval step 3  accuracy ..."), in
// order: two runs on the same samples print the same.
inline std::vector<std::string> loss_lines(const std::string& output) {
  std::vector<std::string> lines;
  const std::regex pattern(R"((step \d+/\d+  loss [-0-9.]+)|(eval step \d+ .*))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pattern); it != std::sregex_iterator(); ++it) {
    lines.push_back(it->str());
  }
  return lines;
}

// A synthetic FLAVA dataset under `root`/data and `root`/config.yaml training flava-debug on it: 8 steps of 4
// samples x 2 micro-batches per rank, evaluated every 4 steps, logged every 2. Returns the synth command's outcome.
inline Outcome write_flava_suite(const std::string& root) {
  io::remove_tree(root);
  io::make_directories(root);
  const Outcome synth = run(std::string(SHARDTRAIN_BIN) + " data synth --out " + root + "/data --image-text 200 "
                            "--text 80 --image 80 --eval 32 --image-size 32 --shard-size 64");
  std::ofstream cfg(root + "/config.yaml");
  cfg << "model: {flavor: flava-debug}\n"
         "data:\n"
         "  image_text: [" << root << "/data/image_text]\n"
         "  text: [" << root << "/data/text]\n"
         "  image: [" << root << "/data/image]\n"
         "  eval: [" << root << "/data/eval]\n"
         "  vocab: " << root << "/data/vocab.txt\n"
         "  mix: {image_text: 0.5, text: 0.25, image: 0.25}\n"
         "  max_text_length: 16\n"
         "  workers: 2\n"
         "optim: {lr: 2.0e-3, warmup_steps: 2}\n"
         "train: {steps: 8, batch_size: 4, grad_accum: 2, eval_interval: 4, eval_samples: 16}\n"
         "log: {interval: 2, progress: lines, peak_tflops: 1}\n";
  return synth;
}

// A command running in the background (`exec`ed by the shell, so `pid` is the command's own), its stdout and
// stderr into the file `out`.
struct Background {
  pid_t pid = -1;
  std::string out;

  Background(const std::string& command, std::string out_path) : out(std::move(out_path)) {
    pid = ::fork();
    if (pid == 0) {
      const std::string line = "exec " + command + " > " + out + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  Outcome wait() const {
    int raw = 0;
    ::waitpid(pid, &raw, 0);
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw), read_text(out)};
  }
};

// A checkpoint's model state: parameters and AdamW moments ("name::exp_avg"), sharded (FSDP) or whole (DDP).
inline std::map<std::string, at::Tensor> saved_state(const std::string& checkpoint, bool sharded) {
  if (sharded) return fsdp::read_sharded_state_dict(checkpoint + "/model");
  std::map<std::string, at::Tensor> out;
  for (const auto& item : torch::pickle_load(io::read_file(checkpoint + "/model.pt")).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

// Max |a - b| over every tensor of two states, which must hold the same names, shapes and dtypes.
inline double max_difference(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    EXPECT_EQ(t.sizes(), it->second.sizes()) << name;
    EXPECT_EQ(t.scalar_type(), it->second.scalar_type()) << name;
    if (t.sizes() != it->second.sizes()) continue;
    worst = std::max(worst, (t.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>());
  }
  return worst;
}

}  // namespace shardtrain::test
