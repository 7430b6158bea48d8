// Synthetic data that a model can visibly learn from: procedurally rendered scenes of one to three kinds of
// shapes (circle, square, triangle, diamond, cross), in eight colours, two sizes, at five places, one to three of a
// kind, with a caption that says exactly that ("two small red circles on the left and a large blue square at the
// top"). `shardtrain data synth` writes them as WebDataset shards:
//   <out>/image_text/train-00000.tar ...  png + txt + cls (the first object's shape)
//   <out>/text/text-00000.tar ...          txt only (captions of other scenes)
//   <out>/image/image-00000.tar ...        png + cls
//   <out>/eval/eval-00000.tar              held-out image-text pairs
//   <out>/pairs/train.tsv, eval.tsv        sentence pairs in GLUE MRPC's layout (Quality, #1 ID, #2 ID, #1 String,
//                                          #2 String): Quality 1 when both describe one scene (synth_pair)
//   <out>/seq2seq/train.jsonl, eval.jsonl  {"input": a caption, "target": its first object's description}
//   <out>/ner/train.conll, valid.conll     captions as CoNLL-2003 named entities: objects (size, colour, shape
//                                          words: B-OBJ, I-OBJ) and places (B-LOC), other words O
//   <out>/vocab.txt                        WordPiece vocabulary built from all captions (held-out ones aside)
// Every scene is a function of (seed, split, index): the same options write the same bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/data/formats/image.h"

namespace shardtrain::data {

struct SynthScene {
  Image image;
  std::string caption;
  std::vector<std::string> objects;  // the caption's description of each kind of object ("two small red circles ...")
  int64_t label = 0;  // shape of the first object: 0 circle, 1 square, 2 triangle, 3 diamond, 4 cross
};

// Scene `index` of stream `stream` (train, text, image and eval use different streams).
SynthScene render_scene(uint64_t seed, uint64_t stream, int64_t index, int64_t image_size);

// A sentence pair of the MRPC-like task: label 1 when both captions describe the same scene.
struct SynthPair {
  std::string first, second;
  int64_t label = 0;
};
SynthPair synth_pair(uint64_t seed, bool eval, int64_t index);

struct SynthOptions {
  std::string out;
  int64_t image_text_samples = 20000;
  int64_t text_samples = 10000;
  int64_t image_samples = 10000;
  int64_t eval_samples = 512;
  int64_t pair_samples = 0;          // sentence pairs of pairs/train.tsv; pairs/eval.tsv holds a quarter as many
  int64_t seq2seq_samples = 0;       // records of seq2seq/train.jsonl; seq2seq/eval.jsonl holds a quarter as many
  int64_t ner_samples = 0;           // sentences of ner/train.conll; ner/valid.conll holds a quarter as many
  int64_t image_size = 64;           // rendered size (models resize to their own)
  int64_t samples_per_shard = 2500;
  int64_t vocab_size = 1000;         // flava-debug's vocabulary size
  uint64_t seed = 0;
};

// Empties `out` of an earlier data synth's output (image_text/, text/, image/, eval/, pairs/, seq2seq/, ner/,
// vocab.txt), so that a new one is not read mixed with shards of the last; returns the names it removed. Throws
// std::invalid_argument naming them when `out` holds anything else: it is not the directory of a data synth.
std::vector<std::string> clear_earlier_synth(const std::string& out);

// Writes the dataset into `out`, replacing an earlier one there (clear_earlier_synth); `progress(done, total)` is
// called as samples are written. Returns the number of files.
int64_t write_synth_dataset(const SynthOptions& options,
                            const std::function<void(int64_t done, int64_t total)>& progress = nullptr);

}  // namespace shardtrain::data
