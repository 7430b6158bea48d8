// optim::Adafactor against Hugging Face transformers' Adafactor given the same gradients
// (tests/reference/adafactor_reference.py): the parameters after every case's steps and every state tensor, to
// float32 rounding (bf16 parameters: to one bf16 rounding).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>

#include "shardtrain/io/safetensors.h"
#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/optimizer_state.h"

namespace shardtrain::optim {
namespace {

std::string reference_dir() {
  const char* dir = std::getenv("SHARDTRAIN_ADAFACTOR_REFERENCE");
  return dir ? dir : "build/hf_reference/adafactor";
}

AdafactorOptions options_of(const nlohmann::json& c) {
  AdafactorOptions o(c["lr"].is_null() ? 1e-3 : c["lr"].get<double>());
  o.relative_step(c["relative_step"]).scale_parameter(c["scale_parameter"]).warmup_init(c["warmup_init"]);
  if (c.contains("beta1")) o.beta1(c["beta1"]);
  if (c.contains("weight_decay")) o.weight_decay(c["weight_decay"]);
  if (c.contains("clip_threshold")) o.clip_threshold(c["clip_threshold"]);
  if (c.contains("decay_rate")) o.decay_rate(c["decay_rate"]);
  if (c.contains("eps")) o.eps1(c["eps"][0]).eps2(c["eps"][1]);
  return o;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double scale = w.abs().max().item<double>() + 1e-30;
  const double err = (g - w).abs().max().item<double>();
  EXPECT_LE(err, rtol * scale) << what << ": max difference " << err << " of scale " << scale;
}

TEST(AdafactorParity, MatchesTransformersStepByStep) {
  std::ifstream in(reference_dir() + "/cases.json");
  ASSERT_TRUE(in) << "no " << reference_dir() << "/cases.json (run the optim.adafactor_reference fixture)";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const io::SafetensorsReader file(reference_dir() + "/steps.safetensors");
  const int steps = ref["steps"];
  const size_t n = ref["shapes"].size();
  for (const auto& c : ref["cases"]) {
    const std::string k = std::to_string(c["index"].get<int>()), name = c["name"];
    SCOPED_TRACE("case " + name);
    std::vector<at::Tensor> params;
    for (size_t i = 0; i < n; ++i) params.push_back(file.read(k + "." + std::to_string(i) + ".init").requires_grad_());
    Adafactor optimizer(params, options_of(c));
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < n; ++i) {
        params[i].mutable_grad() = file.read(k + "." + std::to_string(i) + ".grad." + std::to_string(t));
      }
      optimizer.step();
    }
    const bool bf16 = c.contains("dtype") && c["dtype"] == "bfloat16";
    for (size_t i = 0; i < n; ++i) {
      const std::string prefix = k + "." + std::to_string(i) + ".";
      EXPECT_EQ(params[i].scalar_type(), bf16 ? at::kBFloat16 : at::kFloat);
      expect_close(params[i].detach(), file.read(prefix + "final"), bf16 ? 1e-2 : 2e-6, name + " parameter " + prefix);
      const auto& state = *optimizer.state().at(params[i].unsafeGetTensorImpl());
      EXPECT_EQ(state_step(state), steps);
      const auto tensors = state_tensors(state, params[i]);
      size_t expected = 0;
      for (const auto& e : file.entries()) {
        if (e.name.rfind(prefix, 0) != 0) continue;
        const std::string key = e.name.substr(prefix.size());
        if (key == "init" || key == "final" || key.rfind("grad.", 0) == 0) continue;
        ++expected;
        ASSERT_TRUE(tensors.count(key)) << prefix << " has no state '" << key << "'";
        expect_close(tensors.at(key).tensor, file.read(e.name), 2e-6, name + " state " + prefix + key);
      }
      EXPECT_EQ(tensors.size(), expected) << prefix << ": state tensors transformers does not keep";
    }
  }
}

}  // namespace
}  // namespace shardtrain::optim
