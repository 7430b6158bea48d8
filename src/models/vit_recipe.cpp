// ViT's recipe: image classification (ViTForImageClassification) on the .cls labels of image samples.
#include <ATen/ATen.h>

#include "models/families.h"
#include "models/recipe_helpers.h"
#include "shardtrain/models/vit.h"

namespace shardtrain::models {
namespace {

class VitClassification : public Task {
 public:
  VitClassification(std::string flavor, const VitConfig& config) : flavor_(std::move(flavor)), config_(config) {}
  std::string name() const override { return "image_classification"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, false, true};
    d.image_size = config_.image_size, d.patch_size = config_.patch_size, d.num_labels = config_.num_labels;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"cls"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    if (!b.labels.defined()) throw std::runtime_error("ViT classification needs a .cls label in every image sample");
    const int64_t top = b.labels.max().item<int64_t>();
    if (top >= config_.num_labels || b.labels.min().item<int64_t>() < 0) {
      throw std::runtime_error("label " + std::to_string(top) + " is outside " + flavor_ + "'s " +
                               std::to_string(config_.num_labels) + " classes");
    }
    Losses out;
    out.total = module_as<VitImpl>(model, "vit").run(b.pixels, b.labels).loss;
    out.parts["cls"] = value_of(out.total);
    return out;
  }

 private:
  std::string flavor_;
  VitConfig config_;
};

class VitRecipe : public FamilyRecipe<VitConfig, Vit> {
 public:
  using FamilyRecipe::FamilyRecipe;

  // Per sample, over n = (image_size / patch_size)^2 + 1 tokens (patches and CLS) of width d through L layers:
  //   3 * L * (2 * (4 d^2 + 2 d mlp_dim) * n + 4 n^2 d)   (patch embedding and classifier left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::IMAGE) throw_unread_kind(flavor(), b);
    const double d = static_cast<double>(config().dim);
    const double side = static_cast<double>(config().image_size / config().patch_size), n = side * side + 1;
    const double weights = 4 * d * d + 2 * d * static_cast<double>(config().mlp_dim);
    return 3 * static_cast<double>(config().layers) * transformer_layer_flops(weights, n, d) * batch_rows(b);
  }

  std::vector<std::string> tasks() const override { return {"image_classification"}; }

 protected:
  std::unique_ptr<Task> make_task(const std::string&) const override {
    if (config().num_labels <= 0) throw std::invalid_argument(flavor() + " has no classifier to train");
    return std::make_unique<VitClassification>(flavor(), config());
  }
};

}  // namespace

ModelFamily vit_family() {
  return {"vit", vit_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<VitRecipe>("vit", f, vit_flavor(f), vit_names, "ViTLayer");
          }};
}

}  // namespace shardtrain::models
