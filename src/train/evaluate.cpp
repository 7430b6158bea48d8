#include "train/evaluate.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <stdexcept>

#include "shardtrain/models/flava.h"

namespace shardtrain::train {

std::map<std::string, double> evaluate_flava(models::ZooModel& model, const data::Loader& eval_loader,
                                             int64_t source_size, int64_t max_samples, int64_t batch_size,
                                             const dist::Communicator& world) {
  auto* flava = dynamic_cast<models::FlavaImpl*>(model.module.get());
  if (!flava) throw std::logic_error("evaluate_flava: not a FLAVA model");
  const int64_t W = world.size(), per_step = W * batch_size;
  const int64_t wanted = max_samples > 0 ? std::min(max_samples, source_size) : source_size;
  const int64_t used = wanted / per_step * per_step;
  if (used == 0) {
    throw std::invalid_argument("eval: " + std::to_string(wanted) + " held-out samples are fewer than one batch on "
                                "every rank (" + std::to_string(per_step) + ")");
  }
  c10::AutoGradMode no_grad(false);
  const bool was_training = flava->is_training();
  flava->eval();
  std::vector<at::Tensor> image_embeddings, text_embeddings;
  int64_t itm_correct = 0, itm_total = 0;
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = eval_loader.build(data::SampleKind::IMAGE_TEXT, start);
    // Embeddings come from the unmasked passes; ITM from the masked multimodal pass, as in training (the eval
    // loader masks like the training one, by eval position).
    models::FlavaBatch fb;
    fb.input_ids = b.input_ids, fb.attention_mask = b.attention_mask, fb.pixels = b.pixels;
    fb.input_ids_masked = b.input_ids_masked, fb.masked_patches = b.masked_patches;
    fb.codebook_pixels = b.codebook_pixels;
    const models::FlavaOutputs positive = flava->run(fb);
    image_embeddings.push_back(positive.image_embedding);
    text_embeddings.push_back(positive.text_embedding);
    itm_correct += (positive.itm_logits.argmax(1) == 1).sum().item<int64_t>();
    itm_total += b.input_ids.size(0);
    if (b.input_ids.size(0) > 1) {  // each text with the next sample's image
      fb.pixels = b.pixels.roll(1, 0);
      if (fb.masked_patches.defined()) fb.masked_patches = b.masked_patches.roll(1, 0);
      if (fb.codebook_pixels.defined()) fb.codebook_pixels = b.codebook_pixels.roll(1, 0);
      const models::FlavaOutputs negative = flava->run(fb);
      itm_correct += (negative.itm_logits.argmax(1) == 0).sum().item<int64_t>();
      itm_total += b.input_ids.size(0);
    }
  }
  if (was_training) flava->train();

  // Every rank's embeddings, rank-major: (used, C) on every rank.
  auto gather = [&](const std::vector<at::Tensor>& parts) {
    const at::Tensor local = at::cat(parts).contiguous();
    at::Tensor all = at::empty({W * local.size(0), local.size(1)}, local.options());
    world.all_gather(all, local).wait();
    return all;
  };
  const at::Tensor images = gather(image_embeddings), texts = gather(text_embeddings);
  const at::Tensor similarity = images.matmul(texts.t());  // (N images, N texts)
  // A hit when the true partner scores at least as high as every other (identical captions tie exactly).
  const at::Tensor diagonal = similarity.diagonal();
  const double r1_i2t = (diagonal >= std::get<0>(similarity.max(1))).to(at::kDouble).mean().item<double>();
  const double r1_t2i = (diagonal >= std::get<0>(similarity.max(0))).to(at::kDouble).mean().item<double>();
  at::Tensor itm = at::tensor({static_cast<double>(itm_correct), static_cast<double>(itm_total)}, at::kDouble)
                      .to(images.device());  // NCCL reduces device tensors only
  world.all_reduce(itm, dist::ReduceOp::SUM).wait();
  itm = itm.cpu();
  return {{"r1_image_to_text", r1_i2t},
          {"r1_text_to_image", r1_t2i},
          {"itm_accuracy", itm[0].item<double>() / itm[1].item<double>()},
          {"eval_samples", static_cast<double>(used)}};
}

}  // namespace shardtrain::train
