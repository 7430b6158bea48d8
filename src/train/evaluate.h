// FLAVA's zero-shot evaluation on held-out image-text pairs (private to the train layer): retrieval R@1 in both
// directions over the whole evaluated set (embeddings of the unmasked passes, gathered from every rank), and
// image-text matching accuracy on each pair and on a mismatched pair (the text with the next sample's image),
// with the inputs masked as in training (FLAVA's ITM head only ever sees the masked multimodal pass; unmasked
// inputs are a distribution it was not trained on). Chance: R@1 = 1/N, ITM = 0.5.
#pragma once

#include <map>
#include <string>

#include "shardtrain/data/loader.h"
#include "shardtrain/dist/communicator.h"
#include "shardtrain/models/zoo.h"

namespace shardtrain::train {

// Collective over `world`. Uses the largest multiple of world * batch_size samples up to `max_samples` (0: all).
// Returns {"r1_image_to_text", "r1_text_to_image", "itm_accuracy", "eval_samples"}.
std::map<std::string, double> evaluate_flava(models::ZooModel& model, const data::Loader& eval_loader,
                                             int64_t source_size, int64_t max_samples, int64_t batch_size,
                                             const dist::Communicator& world);

}  // namespace shardtrain::train
