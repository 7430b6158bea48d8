// The data of a run (private to the train layer): the sources the task reads among those the config gives, the
// tokenizer, the loader that builds each step's micro-batches ahead, and the held-out loader of the task's
// evaluation. Each check names the config key and what the model expects.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/log/log.h"
#include "shardtrain/models/recipe.h"

namespace shardtrain::train {

struct TrainingData {
  std::array<std::shared_ptr<const data::SampleSource>, 3> sources;  // by kind; null where not read
  data::LoaderOptions options;                                       // the training loader's
  std::unique_ptr<data::Loader> loader;                              // from start_loading()
  std::shared_ptr<const data::SampleSource> eval_source;             // null: no evaluation
  std::shared_ptr<const data::PackedTexts> eval_packed;              // its blocks, with data.packing
  std::unique_ptr<data::Loader> eval_loader;
  int64_t eval_size() const;  // the held-out samples: eval_source's, or its packed blocks
  std::vector<std::string> notes;  // start-up lines about where settings came from (describe_data prints them)
};

// A classifier's classes: data.labels, else the names of the ClassLabel column data.label_field of the first Hugging
// Face datasets .arrow/.parquet file among data.text and data.image (where transformers' run_glue takes them from),
// else none (the model's own id2label then); multi_label: data.multi_label, or that column holds lists of class ids
// (List(ClassLabel), as run_classification decides) and model.task is not token_classify (whose List(ClassLabel) holds
// each word's class). Without a ClassLabel, for model.task classify or token_classify, the distinct labels of
// data.text's .jsonl, .tsv/.csv and CoNLL records, sorted (data/pipeline/label_values.h: run_glue's and run_ner's
// get_label_list; numbers that are not all whole make a regression, and .jsonl arrays a multi-label classifier). Throws
// std::invalid_argument for a data path that does not exist.
struct RunLabels {
  std::vector<std::string> names;
  bool multi_label = false;
  // Where `names` came from when the config gave none, for the start-up line ("the dataset's ClassLabel 'label'");
  // "" otherwise.
  std::string from;
};
RunLabels run_labels(const config::Config& config);

// The run's tokenizer (data::open_tokenizer): data.tokenizer (or the older data.vocab), else the model.from
// directory's own; null when neither names one. Throws std::invalid_argument naming the key when it cannot be read.
std::shared_ptr<const data::Tokenizer> open_run_tokenizer(const config::Config& config);

// Opens the sources the task reads and checks them and `tokenizer` against its DataNeeds (before the model is
// built: bad input fails fast); with data.packing, packs data.text and data.eval (read from data.cache_dir, or
// counted into it: progress on `logger`'s status line). Throws std::invalid_argument naming the config key.
TrainingData open_training_data(const config::Config& config, const models::Task& task,
                                std::shared_ptr<const data::Tokenizer> tokenizer, int rank, int world_size,
                                const log::Logger& logger);

// Starts the loader's threads at `start` (a resumed run's data position).
void start_loading(TrainingData& data, const data::LoaderState& start);

// The start-up lines about the data: samples and files per source, incomplete samples, problems found, the packed
// stream's tokens and blocks; a warning for a source smaller than one global batch.
void describe_data(const TrainingData& data, const log::Logger& logger);

}  // namespace shardtrain::train
