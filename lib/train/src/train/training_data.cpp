#include "train/training_data.h"

#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <tuple>

#include "shardtrain/data/pipeline/table_records.h"
#include "shardtrain/data/pipeline/label_values.h"
#include "shardtrain/data/pipeline/records.h"
#include "shardtrain/data/pipeline/packed_texts.h"

namespace shardtrain::train {
namespace {

using config::Config;

// The fields the task reads from .jsonl/.tsv/.csv records: the config's text fields, and a classifier's labels.
data::TextFields text_fields(const Config& c, const models::DataNeeds& needs) {
  data::TextFields f;
  f.text = c.data.text_fields;
  f.image = c.data.image_field;
  if (needs.num_labels > 0) f.label = c.data.label_field, f.classes = needs.class_names;
  f.scores = needs.num_labels == 1 && !needs.multi_label;  // one label: a regression's scores (transformers')
  f.multi_label = needs.multi_label;
  f.words = needs.word_labels;
  return f;
}

// data.cache_dir as a directory: the default (data::default_cache_dir) when empty, "" for "none".
std::string cache_directory(const Config& c) {
  if (c.data.cache_dir == "none") return "";
  return c.data.cache_dir.empty() ? data::default_cache_dir() : c.data.cache_dir;
}

std::array<std::shared_ptr<const data::SampleSource>, 3> open_sources(const Config& c, const std::string& flavor,
                                                                       const models::DataNeeds& needs) {
  const std::array<const std::vector<std::string>*, 3> paths = {&c.data.image_text, &c.data.text, &c.data.image};
  const char* path_keys[] = {"data.image_text", "data.text", "data.image"};
  std::array<std::shared_ptr<const data::SampleSource>, 3> sources;
  bool any = false;
  for (size_t k = 0; k < 3; ++k) {
    if (!needs.kinds[k] || paths[k]->empty()) continue;
    sources[k] = std::make_shared<data::SampleSource>(*paths[k], static_cast<data::SampleKind>(k),
                                                      text_fields(c, needs), cache_directory(c));
    any = true;
  }
  if (!any) {
    std::string wanted;
    for (size_t k = 0; k < 3; ++k) {
      if (needs.kinds[k]) wanted += std::string(wanted.empty() ? "" : " or ") + path_keys[k];
    }
    throw std::invalid_argument(flavor + " trains on " + wanted + ", and the config gives none");
  }
  return sources;
}

// The tokenizer and text length for a model that reads text (null and 0 otherwise).
std::pair<std::shared_ptr<const data::Tokenizer>, int64_t> checked_tokenizer(
    const Config& c, const std::string& flavor, const models::DataNeeds& needs,
    std::shared_ptr<const data::Tokenizer> tokenizer) {
  if (needs.vocab_size == 0) return {nullptr, 0};
  if (!tokenizer) {
    throw std::invalid_argument("data.tokenizer: " + flavor + " reads text; give a tokenizer.json, a SentencePiece "
                                ".model or a vocab.txt" + (c.model.from.empty() ? "" : " (" + c.model.from +
                                " holds none)"));
  }
  if (tokenizer->vocab_size() > needs.vocab_size) {
    throw std::invalid_argument("data.tokenizer: " + tokenizer->describe() + " has more tokens than " + flavor +
                                "'s vocabulary of " + std::to_string(needs.vocab_size));
  }
  const int64_t length = c.data.max_text_length > 0 ? c.data.max_text_length : needs.max_text_length;
  if (length > needs.max_text_length) {
    throw std::invalid_argument("data.max_text_length: " + std::to_string(length) + " is more than " + flavor +
                                "'s " + std::to_string(needs.max_text_length) + " positions");
  }
  return {tokenizer, length};
}

data::LoaderOptions loader_options(const Config& c, const std::string& flavor, const models::DataNeeds& needs,
                                   std::shared_ptr<const data::Tokenizer> tokenizer, int rank, int world_size) {
  if (c.data.image_size > 0 && needs.image_size > 0 && c.data.image_size != needs.image_size) {
    throw std::invalid_argument("data.image_size: " + std::to_string(c.data.image_size) + ", but " + flavor +
                                " takes " + std::to_string(needs.image_size) + " pixels (0 = the model's)");
  }
  data::LoaderOptions lo;
  lo.seed = static_cast<uint64_t>(c.train.seed);
  lo.rank = rank, lo.world = world_size;
  lo.batch_size = c.train.batch_size, lo.micro_batches = c.train.grad_accum;
  lo.workers = c.data.workers, lo.queue_depth = c.data.queue_depth;
  lo.mix = needs.mixes_kinds ? std::array<double, 3>{c.data.mix.image_text, c.data.mix.text, c.data.mix.image}
                             : std::array<double, 3>{1, 1, 1};
  std::tie(lo.tokenizer, lo.text_length) = checked_tokenizer(c, flavor, needs, std::move(tokenizer));
  lo.mlm_probability = needs.uses_mlm ? c.data.mlm_probability : 0;
  lo.image_size = needs.image_size, lo.patch_size = needs.patch_size, lo.codebook_size = needs.codebook_size;
  lo.mim_probability = needs.uses_mim ? c.data.mim_probability : 0;
  lo.image_mean = c.data.image_mean, lo.image_std = c.data.image_std;
  lo.itm_negative_probability = c.data.itm_negative_probability;
  lo.max_image_pixels = c.data.max_image_pixels;
  lo.refuse_truncation = c.data.truncation == "error";
  lo.label_all_tokens = c.data.label_all_tokens;
  lo.pad_to_longest = c.data.padding == "longest";
  return lo;
}


// The CPUs this process may run on (a job scheduler's share of the node).
int64_t usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// data.packing: a text source's documents counted once (a progress line while it takes), for blocks of the
// loader's text length. With a cache one process counts while the node's others wait, so it takes every CPU.
std::shared_ptr<const data::PackedTexts> pack_texts(const Config& c, std::shared_ptr<const data::SampleSource> text,
                                                    const data::LoaderOptions& options, const log::Logger& logger) {
  data::PackedTexts::Options o;
  o.length = options.text_length, o.append_eos = c.data.packing_eos;
  o.cache_dir = cache_directory(c);
  o.threads = o.cache_dir.empty() ? std::max<int64_t>(1, c.data.workers) : usable_cpus();
  o.progress = [&](int64_t done, int64_t total) {
    logger.status("packing texts: " + std::to_string(done) + " of " + std::to_string(total) + " documents counted");
  };
  auto packed = std::make_shared<const data::PackedTexts>(std::move(text), options.tokenizer, o);
  logger.status("");
  return packed;
}

}  // namespace

RunLabels run_labels(const Config& c) {
  for (const auto* paths : {&c.data.text, &c.data.image}) {
    for (const std::string& file : data::expand_paths(*paths)) {
      const data::RecordFormat format = data::record_format_of(file);
      if (format == data::RecordFormat::ARROW || format == data::RecordFormat::PARQUET) {
        const data::LabelColumn column = data::label_column(file, c.data.label_field);
        // a token classifier's List(ClassLabel) holds a class per word, not a set
        const bool sets = column.multi_label && c.model.task != "token_classify";
        const std::string from = "the " + std::string(column.scores ? "scores of the dataset's float column '"
                                                      : column.multi_label ? "dataset's List(ClassLabel) '"
                                                                           : "dataset's ClassLabel '") +
                                 c.data.label_field + "'";
        return {c.data.labels.empty() ? column.names : c.data.labels, c.data.multi_label || sets,
                c.data.labels.empty() && !column.names.empty() ? from : ""};
      }
    }
  }
  const bool words = c.model.task == "token_classify";
  if (!c.data.labels.empty() || (c.model.task != "classify" && !words)) return {c.data.labels, c.data.multi_label, ""};
  const data::LabelValues values =
      data::label_values(data::expand_paths(c.data.text), c.data.label_field, c.data.multi_label, words);
  if (values.scores) {  // one output (a regression), named after the field, as a float column makes one
    return {{c.data.label_field}, false, "the scores of '" + c.data.label_field + "' in data.text"};
  }
  const std::string from = words ? "the distinct tags in data.text, sorted (as run_ner collects them)"
                                 : "the distinct labels of '" + c.data.label_field + "' in data.text, sorted (as " +
                                       "run_glue collects them)";
  return {values.names, c.data.multi_label || (values.lists && !words), values.names.empty() ? "" : from};
}

std::shared_ptr<const data::Tokenizer> open_run_tokenizer(const Config& c) {
  if (!c.data.tokenizer.empty() && !c.data.vocab.empty()) {
    throw std::invalid_argument("data.tokenizer '" + c.data.tokenizer + "' and data.vocab '" + c.data.vocab +
                                "' both name a tokenizer; keep one");
  }
  const std::string key = c.data.vocab.empty() ? "data.tokenizer" : "data.vocab";
  const std::string named = c.data.vocab.empty() ? c.data.tokenizer : c.data.vocab;
  // transformers' AutoTokenizer of the model: the model directory's own when the config names none
  if (named.empty() && (c.model.from.empty() || data::tokenizer_file(c.model.from).empty())) return nullptr;
  try {
    return data::open_tokenizer(named.empty() ? c.model.from : named, c.data.lowercase);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument((named.empty() ? "model.from" : key) + ": " + e.what());
  }
}

TrainingData open_training_data(const Config& c, const models::Task& task,
                                std::shared_ptr<const data::Tokenizer> tokenizer, int rank, int world_size,
                                const log::Logger& logger) {
  const std::string& flavor = c.model.flavor;
  const models::DataNeeds needs = task.data_needs();
  TrainingData d;
  d.sources = open_sources(c, flavor, needs);
  if (c.data.packing && task.name() != "causal_lm") {
    throw std::invalid_argument("data.packing: true packs texts for causal_lm; " + flavor + "'s task is " +
                                task.name());
  }
  d.options = loader_options(c, flavor, needs, std::move(tokenizer), rank, world_size);
  d.options.on_damaged = [logger, rank](const std::string& what) {
    logger.warning_every_rank("rank " + std::to_string(rank) + ": damaged data: " + what +
                              " (skipped and replaced by the next sample; the run's end counts them all)");
  };
  if (c.data.packing) {
    const auto& text = d.sources[static_cast<size_t>(data::SampleKind::TEXT)];
    if (!text) throw std::invalid_argument("data.packing: true packs data.text, and the config gives none");
    d.options.packed = pack_texts(c, text, d.options, logger);
  }
  if (!task.has_evaluation() && !c.data.eval.empty()) {
    logger.warning("data.eval: " + task.name() + " has no evaluation, so the held-out data is not read (the "
                   "training loss is what shows the learning)");
  }
  if (task.has_evaluation() && !c.data.eval.empty()) {
    const data::SampleKind kind = task.eval_kind();
    d.eval_source = std::make_shared<data::SampleSource>(c.data.eval, kind, text_fields(c, needs),
                                                         cache_directory(c));
    data::LoaderOptions eo = d.options;
    eo.workers = 0, eo.micro_batches = 1, eo.itm_negative_probability = 0;  // masks as in training
    // held-out texts packed as the training's (run_clm groups its validation split the same), else one per row
    if (c.data.packing && kind == data::SampleKind::TEXT) {
      d.eval_packed = pack_texts(c, d.eval_source, d.options, logger);
      const int64_t per_step = static_cast<int64_t>(world_size) * c.train.batch_size;
      if (d.eval_packed->blocks() < per_step) {  // the evaluation scores whole batches of blocks
        throw std::invalid_argument(
            "data.eval: the held-out texts pack into " + std::to_string(d.eval_packed->blocks()) + " blocks of " +
            std::to_string(d.options.text_length) + " tokens, fewer than one batch on every rank (" +
            std::to_string(world_size) + " ranks x train.batch_size " + std::to_string(c.train.batch_size) +
            "): give more held-out text, a smaller batch or a shorter data.max_text_length");
      }
    }
    // unpacked: the samples the evaluation reads (train.eval_samples of them at most) fill a batch on every rank
    const int64_t per_step = static_cast<int64_t>(world_size) * c.train.batch_size, samples = d.eval_source->size();
    const int64_t read = c.train.eval_samples > 0 ? std::min(c.train.eval_samples, samples) : samples;
    if (!d.eval_packed && read < per_step) {
      throw std::invalid_argument(
          "data.eval: the evaluation reads " + std::to_string(read) + " held-out samples" +
          (read < samples ? " (train.eval_samples " + std::to_string(c.train.eval_samples) + " of " +
                                std::to_string(samples) + ")"
                          : std::string()) +
          ", fewer than one batch on every rank (" + std::to_string(world_size) + " ranks x train.batch_size " +
          std::to_string(c.train.batch_size) + "): give more held-out samples" +
          (read < samples ? ", a larger train.eval_samples" : std::string()) + " or a smaller batch");
    }
    eo.packed = d.eval_packed;
    std::array<std::shared_ptr<const data::SampleSource>, 3> eval_sources;
    eval_sources[static_cast<size_t>(kind)] = d.eval_source;
    d.eval_loader = std::make_unique<data::Loader>(eval_sources, eo);
  }
  return d;
}

void start_loading(TrainingData& d, const data::LoaderState& start) {
  d.loader = std::make_unique<data::Loader>(d.sources, d.options, start);
}

int64_t TrainingData::eval_size() const { return eval_packed ? eval_packed->blocks() : eval_source->size(); }

void describe_data(const TrainingData& d, const log::Logger& logger) {
  if (d.options.tokenizer) logger.info("  tokenizer: " + d.options.tokenizer->describe());
  for (const auto& note : d.notes) logger.info("  " + note);
  for (size_t k = 0; k < 3; ++k) {
    const auto& source = d.sources[k];
    if (!source) continue;
    std::string line = "  " + std::string(data::kind_name(static_cast<data::SampleKind>(k))) + " data: " +
                       std::to_string(source->size()) + " samples in " + std::to_string(source->files().size()) +
                       " files";
    if (!source->tokenized().empty()) line += ", tokenized (" + source->tokenized() + "; not tokenized again)";
    if (source->incomplete_samples()) {
      line += ", " + std::to_string(source->incomplete_samples()) + " incomplete left out";
    }
    logger.info(line);
    for (const auto& p : source->scan_problems()) logger.info("  data problem: " + p);
    for (const auto& note : source->table_notes()) logger.info("  " + note);
    const bool packed = k == static_cast<size_t>(data::SampleKind::TEXT) && d.options.packed;
    if (packed) {
      logger.info("  " + d.options.packed->describe());
      for (const auto& e : d.options.packed->first_errors()) logger.info("  data problem: " + e);
    }
    // One micro-batch of this kind takes batch_size samples on every rank.
    const int64_t global = static_cast<int64_t>(d.options.world) * d.options.batch_size;
    const int64_t samples = packed ? d.options.packed->blocks() : source->size();
    if (samples < global) {
      logger.warning(std::string(data::kind_name(static_cast<data::SampleKind>(k))) + " data: " +
                     std::to_string(samples) + (packed ? " blocks" : " samples") +
                     " are fewer than one global batch (" +
                     std::to_string(d.options.world) + " ranks x train.batch_size " +
                     std::to_string(d.options.batch_size) + " = " + std::to_string(global) +
                     "): every batch of it repeats samples");
    }
  }
  if (d.eval_source) {
    for (const auto& note : d.eval_source->table_notes()) logger.info("  held-out " + note);
  }
  if (d.eval_packed) {
    logger.info("  held-out text " + d.eval_packed->describe());
    for (const auto& e : d.eval_packed->first_errors()) logger.info("  data problem: " + e);
  }
}

}  // namespace shardtrain::train
