// Batches for training, built by background threads a bounded number of steps ahead, in step order.
//
// Each step draws its batch kind (image-text, text-only, image-only) from the mix weights, seeded by the step, so
// every rank trains on the same kind. Samples come from the kind's source through the stream of sampler.h; masks,
// ITM negatives and everything random are functions of (seed, kind, stream position), so the batches are the same
// whichever thread builds them, at any number of threads, and after a resume from state().
//
// A sample that cannot be used (undecodable image, malformed JSON line, unreadable bytes) is replaced by the next
// position of the stream, counted in stats() and its reason kept (the first ones), never a crash. The batch keeps
// its size, so every rank's shapes agree.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/data/formats/image.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/tokenizers/tokenizer.h"

namespace shardtrain::data {

class PackedTexts;  // shardtrain/data/pipeline/packed_texts.h

// One micro-batch of one rank. What the kind lacks is undefined.
struct Batch {
  SampleKind kind = SampleKind::IMAGE_TEXT;
  int64_t step = 0, micro = 0;
  at::Tensor input_ids;         // (B, T) int64, [CLS] ... [SEP] [PAD]...
  at::Tensor attention_mask;    // (B, T) int64
  at::Tensor token_type_ids;    // (B, T) int64, 1 over a sentence pair's second text; undefined for single texts
  at::Tensor sequence_ids;      // (B, T) int64, 0 over the (first) text's tokens, 1 over a pair's second, -1 else
  at::Tensor input_ids_masked;  // (B, T) MLM input; undefined when mlm_probability is 0
  at::Tensor mlm_labels;        // (B, T) original ids where masked, -100 elsewhere
  at::Tensor pixels;            // (B, 3, S, S) float32, normalised
  at::Tensor codebook_pixels;   // (B, 3, C, C) float32 in [0.1, 0.9]; undefined when codebook_size is 0
  at::Tensor masked_patches;    // (B, N) bool; undefined when mim_probability is 0
  at::Tensor itm_labels;        // (B) int64: 1 = the text is the image's, 0 = another row's text (image-text only)
  at::Tensor labels;            // (B) int64 class labels (.cls), when every sample has one; float32 scores instead
                                // for a regression (TextFields::scores); (B, classes) float32 0/1 for sets of
                                // classes (TextFields::multi_label); (B, T) int64 for token classification
                                // (TextFields::words): a word's class on its first token (on all of them with
                                // label_all_tokens), -100 elsewhere
  std::vector<int64_t> sample_ids;  // (B) the source's sample numbers (for tests and debugging)

  // The same batch with every tensor on `device` (the loader builds on the CPU), its floating-point inputs (pixels)
  // in `floats` (the model's dtype: bf16 for pure bf16 training); a regression's labels stay float32.
  Batch to(const at::Device& device, at::ScalarType floats = at::kFloat) const;
  int64_t texts = 0, images = 0;    // items as the FLAVA post counts them
};

struct LoaderOptions {
  uint64_t seed = 0;
  int64_t rank = 0, world = 1;
  int64_t batch_size = 8;     // per rank per micro-batch
  int64_t micro_batches = 1;  // per step (gradient accumulation)
  int64_t workers = 2;        // 0: batches are built on the calling thread
  int64_t queue_depth = 4;    // micro-batches built ahead
  std::array<double, 3> mix = {1, 0, 0};  // weights of IMAGE_TEXT, TEXT, IMAGE (absent sources count as 0)
  // Text.
  std::shared_ptr<const Tokenizer> tokenizer;
  int64_t text_length = 32;
  double mlm_probability = 0.15;
  // Images.
  int64_t image_size = 224;
  int64_t patch_size = 16;     // the MIM mask is (image_size / patch_size)^2 patches
  int64_t codebook_size = 0;   // FLAVA's codebook input size (112 for 224 / 16); 0: none
  double mim_probability = 0.4;
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  double itm_negative_probability = 0.5;  // rows whose text is replaced by another row's (ITM negatives)
  int64_t max_image_pixels = kDefaultMaxImagePixels;  // larger images are skipped undecoded (and counted)
  // A text longer than text_length tokens: false, it is truncated and counted (LoaderStats::truncated); true, the
  // loader stops with an error naming the sample (data.truncation: error).
  bool refuse_truncation = false;
  // Called the first time a sample of a file is skipped as unusable (a truncated shard, an undecodable image, a
  // damaged row), with "FILE:SAMPLE: why", from a loading thread: a damaged file is said when met, not only in the
  // run's closing counts. Once per file.
  std::function<void(const std::string&)> on_damaged;
  // Token classification (TextFields::words): a word's tokens after its first take its class too (a B- class its
  // I- class, by the source's class names), as run_ner's label_all_tokens; false: -100 there.
  bool label_all_tokens = false;
  // Unpacked text batches end at their longest row's last token (transformers' padding="longest"): the columns that
  // are padding in every row are cut from every (B, T) tensor. false: T is text_length.
  bool pad_to_longest = false;
  // Text batches (causal LM): each row a block of text_length tokens of this packing of the text source
  // (transformers' run_clm grouping: every text end to end, long ones across rows; no padding but in the last
  // block), the blocks shuffled and dealt as samples are; null: one padded row per text. Its length must be
  // text_length.
  std::shared_ptr<const PackedTexts> packed;
};

// Where the stream stands: steps handed out and stream positions consumed per kind (global, over all ranks).
struct LoaderState {
  int64_t step = 0;
  std::array<int64_t, 3> consumed = {0, 0, 0};
};

struct LoaderStats {
  int64_t skipped = 0;                   // unusable samples replaced
  int64_t truncated = 0;                 // texts cut to text_length tokens
  int64_t truncated_tokens = 0;          // the tokens they lost
  std::vector<std::string> first_errors; // the first 8 reasons
};

class Loader {
 public:
  // sources: by kind (IMAGE_TEXT, TEXT, IMAGE); null where there is none.
  Loader(std::array<std::shared_ptr<const SampleSource>, 3> sources, LoaderOptions options, LoaderState start = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The micro-batches of the next step. Rethrows what a worker could not recover from.
  std::vector<Batch> next_step();
  LoaderState state() const;  // after the steps returned so far
  LoaderStats stats() const;

  // The kind of batch of `step` (the same on every rank).
  SampleKind kind_of(int64_t step) const;

  // One micro-batch of this rank whose stream starts at `start` (what the workers build; public for tests).
  Batch build(SampleKind kind, int64_t start) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::data
