#include "shardtrain/data/pipeline/loader.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "shardtrain/data/pipeline/random.h"
#include "shardtrain/data/formats/image.h"
#include "shardtrain/data/pipeline/packed_texts.h"
#include "data/pipeline/masking.h"
#include "data/pipeline/sampler.h"

namespace shardtrain::data {
namespace {

constexpr int kMaxReplacements = 64;  // consecutive unusable samples before the loader gives up
constexpr size_t kKeptErrors = 8;

// What the loader throws for a sample that is not damaged but does not fit the run: a text longer than the model
// reads when truncation is refused, token ids outside the tokenizer's vocabulary. Never skipped.
class Refused : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A tokenized dataset's row as the model's input: its ids (the special tokens already among them), then a pair's
// second ids (token type 1), cut to `length` (a pair longest-first, as tokenizers cut texts) or padded to it;
// sequence ids 0 or 1 by token type over the tokens that are not special.
Encoding encoding_of_ids(const RawSample& raw, const Tokenizer& t, int64_t length) {
  const std::vector<int64_t> special = t.special_ids();
  const auto n1 = static_cast<int64_t>(raw.input_ids.size()), n2 = static_cast<int64_t>(raw.pair_ids.size());
  const auto [keep1, keep2] = longest_first(n1, n2, length);
  Encoding e;
  e.truncated = n1 + n2 - keep1 - keep2;
  auto add = [&](const std::vector<int64_t>& ids, int64_t keep, bool second) {
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t id = ids[static_cast<size_t>(i)];
      if (id < 0 || id >= t.vocab_size()) {
        throw Refused(foreign_id_error(raw.key, id, t));
      }
      const int64_t type = second ? 1 : raw.token_type_ids.empty() ? 0 : raw.token_type_ids[static_cast<size_t>(i)];
      e.ids.push_back(id);
      e.token_type_ids.push_back(type);
      e.sequence_ids.push_back(std::find(special.begin(), special.end(), id) != special.end() ? -1 : type != 0);
    }
  };
  add(raw.input_ids, keep1, false);
  add(raw.pair_ids, keep2, true);
  pad_encoding(e, length, t.pad_id());
  return e;
}

// Token classification's targets, as transformers' run_ner aligns them: a word's class on its first token; on its
// other tokens -100 (no loss, not scored), or with `all_tokens` the class again, a B- class as its I- class where
// `names` has one (run_ner's b_to_i_label); -100 on the special tokens and the padding.
std::vector<int64_t> word_token_labels(const std::vector<int64_t>& word_ids, const std::vector<int64_t>& classes,
                                       bool all_tokens, const std::vector<std::string>& names) {
  std::vector<int64_t> out(word_ids.size(), -100);
  for (size_t t = 0; t < word_ids.size(); ++t) {
    const int64_t w = word_ids[t];
    if (w < 0) continue;
    const int64_t c = classes.at(static_cast<size_t>(w));
    if (t == 0 || word_ids[t - 1] != w) {
      out[t] = c;
    } else if (all_tokens) {
      const std::string& name = names.at(static_cast<size_t>(c));
      const auto inside = name.rfind("B-", 0) == 0 ? std::find(names.begin(), names.end(), "I-" + name.substr(2))
                                                   : names.end();
      out[t] = inside == names.end() ? c : inside - names.begin();
    }
  }
  return out;
}

struct Example {
  Encoding text;
  MlmMask mlm;
  at::Tensor pixels, codebook;
  std::vector<uint8_t> masked_patches;
  int64_t itm = 1;        // 0: an ITM negative, its text replaced by another row's in build()
  int64_t position = 0;   // stream position it was read at
  std::optional<int64_t> label;
  std::optional<double> score;  // a regression's target instead of a class
  std::optional<std::vector<int64_t>> label_set;  // a multi-label sample's classes instead
  std::vector<int64_t> token_labels;  // token classification: a class per token, -100 where no loss is taken
  int64_t sample = 0;
  bool token_types = false;  // the text's token types came with its tokenized row
};

}  // namespace

struct Loader::Impl {
  std::array<std::shared_ptr<const SampleSource>, 3> sources;
  LoaderOptions options;

  // Epoch permutations, shared by the workers: the two newest epochs per kind.
  mutable std::mutex perm_mutex;
  mutable std::map<std::pair<int, int64_t>, std::shared_ptr<const std::vector<int64_t>>> perms;

  // Planning and hand-over. Item i is micro-batch (i % micro_batches) of step first_step + i / micro_batches.
  mutable std::mutex mutex;
  std::condition_variable work_cv, ready_cv;
  LoaderState planned;        // state after the items planned so far
  LoaderState delivered;      // state after the steps returned so far
  int64_t next_item = 0;      // next item to plan
  int64_t next_deliver = 0;   // next item to return
  int64_t first_step = 0;
  std::map<int64_t, std::pair<Batch, std::exception_ptr>> ready;
  bool stopping = false;
  std::vector<std::thread> threads;

  mutable std::mutex stats_mutex;
  mutable LoaderStats stats;
  mutable std::set<std::string> damaged_files;  // those already passed to options.on_damaged

  uint64_t kind_seed(SampleKind k) const { return hash_of(options.seed, 0x5eed0000 + static_cast<uint64_t>(k)); }

  int64_t sample_at(SampleKind kind, int64_t position) const {
    const auto& source = *sources[static_cast<size_t>(kind)];
    const int64_t n = kind == SampleKind::TEXT && options.packed ? options.packed->blocks() : source.size();
    const int64_t epoch = position / n;
    std::shared_ptr<const std::vector<int64_t>> perm;
    {
      std::lock_guard<std::mutex> lock(perm_mutex);
      auto key = std::make_pair(static_cast<int>(kind), epoch);
      auto it = perms.find(key);
      if (it == perms.end()) {
        it = perms.emplace(key, std::make_shared<std::vector<int64_t>>(epoch_permutation(n, kind_seed(kind), epoch)))
                 .first;
        // keep this kind's two newest epochs (a batch may straddle a boundary)
        std::vector<std::pair<int, int64_t>> mine;
        for (const auto& entry : perms) {
          if (entry.first.first == static_cast<int>(kind)) mine.push_back(entry.first);
        }
        for (size_t i = 0; i + 2 < mine.size(); ++i) {
          if (mine[i] != key) perms.erase(mine[i]);  // a lagging worker's older epoch stays until next time
        }
        it = perms.find(key);
      }
      perm = it->second;
    }
    return (*perm)[static_cast<size_t>(position % n)];
  }

  void note_truncation(const std::string& key, int64_t tokens) const {
    if (options.refuse_truncation) {
      throw Refused(key + ": " + std::to_string(tokens) + " tokens longer than the " +
                    std::to_string(options.text_length) + " the model reads (data.truncation: error; "
                    "data.max_text_length sets the length, up to the model's positions)");
    }
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++stats.truncated;
    stats.truncated_tokens += tokens;
  }

  // A sample skipped as unusable: `key` ("shard-00003.tar:000123"; "" when not read yet) and why.
  void note_skip(const std::string& key, const std::string& why) const {
    const std::string text = key.empty() ? why : key + ": " + why;
    const std::string file = key.substr(0, key.rfind(':'));
    bool first_in_file = false;
    {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++stats.skipped;
      if (stats.first_errors.size() < kKeptErrors) stats.first_errors.push_back(text);
      first_in_file = damaged_files.insert(file).second;
    }
    if (first_in_file && options.on_damaged) options.on_damaged(text);
  }

  at::Tensor image_tensor(const Image& decoded, bool codebook) const {
    if (codebook) return to_codebook_tensor(resize(decoded, options.codebook_size, options.codebook_size));
    return to_normalized_tensor(resize(decoded, options.image_size, options.image_size), options.image_mean,
                                options.image_std);
  }

  Example example(SampleKind kind, int64_t position) const {
    const auto& source = *sources[static_cast<size_t>(kind)];
    const uint64_t seed = kind_seed(kind);
    const LoaderOptions& o = options;
    std::string last_error;
    for (int attempt = 0; attempt < kMaxReplacements; ++attempt, ++position) {
      Example ex;
      std::string key;
      try {
        ex.sample = sample_at(kind, position);
        const auto p = static_cast<uint64_t>(position);
        const bool packed = kind == SampleKind::TEXT && o.packed;
        const RawSample raw = packed ? RawSample{} : source.read(ex.sample);  // a block reads its documents itself
        key = raw.key;
        ex.label = raw.label, ex.score = raw.score, ex.label_set = raw.label_set;
        if (packed) {  // one full row of the stream (sequence id 0 on every token, special ones too)
          ex.text.ids = o.packed->block(ex.sample);
          ex.text.sequence_ids.assign(ex.text.ids.size(), 0);
          pad_encoding(ex.text, o.text_length, o.tokenizer->pad_id());
        } else if (source.fields().words) {
          ex.text = o.tokenizer->encode_words(raw.words, o.text_length);
          ex.token_labels =
              word_token_labels(ex.text.word_ids, raw.word_labels, o.label_all_tokens, source.fields().classes);
          if (ex.text.truncated > 0) note_truncation(raw.key, ex.text.truncated);
        } else if (kind != SampleKind::IMAGE) {
          ex.text = raw.tokenized      ? encoding_of_ids(raw, *o.tokenizer, o.text_length)
                    : source.pairs() ? o.tokenizer->encode_pair(raw.text, raw.text_pair, o.text_length)
                                     : o.tokenizer->encode(raw.text, o.text_length);
          ex.token_types = !raw.token_type_ids.empty();
          if (ex.text.truncated > 0) note_truncation(raw.key, ex.text.truncated);
        }
        if (kind != SampleKind::IMAGE && o.mlm_probability > 0) {
          auto rng = rng_for(seed, p, Purpose::kMlm);
          const auto& t = *o.tokenizer;
          ex.mlm = mlm_mask(ex.text.ids, t.special_ids(), *t.mask_id(), t.vocab_size(), o.mlm_probability, rng);
        }
        if (kind != SampleKind::TEXT) {
          const Image decoded = decode_image(raw.image, o.max_image_pixels);
          // An ITM negative: this image gets another row's text when the batch is put together (build()).
          ex.itm = kind == SampleKind::IMAGE_TEXT &&
                           unit_of(hash_of(seed, p, static_cast<uint64_t>(Purpose::kItm))) < o.itm_negative_probability
                       ? 0
                       : 1;
          ex.position = position;
          ex.pixels = image_tensor(decoded, false);
          if (o.codebook_size > 0) ex.codebook = image_tensor(decoded, true);
          if (o.mim_probability > 0) {
            const int64_t grid = o.image_size / o.patch_size;
            // BEiT's smallest block is 16 of 196 patches; scaled to the grid so small images get blocks too
            const int64_t min_block = std::max<int64_t>(1, std::llround(16.0 * grid * grid / 196.0));
            auto rng = rng_for(seed, p, Purpose::kMim);
            ex.masked_patches = block_mask(grid, grid, o.mim_probability, min_block, rng);
          }
        }
        return ex;
      } catch (const Refused&) {
        throw;  // not a damaged sample: one the run cannot use
      } catch (const std::exception& e) {
        note_skip(key, e.what());
        last_error = e.what();
      }
    }
    throw std::runtime_error(std::string("the ") + kind_name(kind) + " data has " + std::to_string(kMaxReplacements) +
                             " unusable samples in a row; the last: " + last_error);
  }

  // ITM negatives inside the batch: each negative row takes the text (and its MLM mask) of a positive row, so its
  // image meets a caption of another image. Borrowing a text already in the batch, rather than one from outside
  // it, keeps every text of the batch the caption of an image in it, so no caption is only ever a contrastive
  // distractor (FlavaForPreTraining scores the positive rows against all texts). Measured on flava-debug with
  // synthetic data: image rows against all texts stayed at chance with outside captions and learned with these.
  void pair_negatives(std::vector<Example>& examples) const {
    std::vector<size_t> positives;
    for (size_t i = 0; i < examples.size(); ++i) {
      if (examples[i].itm == 1) positives.push_back(i);
    }
    if (positives.empty()) {  // at least one positive: the negatives need a text to borrow
      examples[0].itm = 1;
      positives.push_back(0);
    }
    const uint64_t seed = kind_seed(SampleKind::IMAGE_TEXT);
    for (auto& ex : examples) {
      if (ex.itm == 1) continue;
      if (positives.size() == 1 && &examples[positives[0]] == &ex) continue;
      const uint64_t h = hash_of(seed, static_cast<uint64_t>(ex.position), static_cast<uint64_t>(Purpose::kItmPartner));
      const Example& partner = examples[positives[h % positives.size()]];
      ex.text = partner.text;
      ex.mlm = partner.mlm;
    }
  }

  Batch build(SampleKind kind, int64_t start) const {
    const LoaderOptions& o = options;
    if (!sources[static_cast<size_t>(kind)]) {
      throw std::logic_error(std::string("Loader: no ") + kind_name(kind) + " source");
    }
    std::vector<Example> examples;
    for (int64_t position : EpochSampler::rank_positions(start, o.rank, o.batch_size)) {
      examples.push_back(example(kind, position));
    }
    if (kind == SampleKind::IMAGE_TEXT) pair_negatives(examples);
    Batch b;
    b.kind = kind;
    const int64_t B = o.batch_size;
    for (const auto& ex : examples) b.sample_ids.push_back(ex.sample);
    auto rows = [&](auto member) {
      std::vector<int64_t> flat;
      for (const auto& ex : examples) {
        const auto& v = member(ex);
        flat.insert(flat.end(), v.begin(), v.end());
      }
      return at::tensor(flat, at::kLong).view({B, -1});
    };
    if (kind != SampleKind::IMAGE) {
      b.input_ids = rows([](const Example& e) -> const std::vector<int64_t>& { return e.text.ids; });
      b.attention_mask = rows([](const Example& e) -> const std::vector<int64_t>& { return e.text.attention_mask; });
      b.sequence_ids = rows([](const Example& e) -> const std::vector<int64_t>& { return e.text.sequence_ids; });
      if (sources[static_cast<size_t>(kind)]->pairs() ||
          std::any_of(examples.begin(), examples.end(), [](const Example& e) { return e.token_types; })) {
        b.token_type_ids =
            rows([](const Example& e) -> const std::vector<int64_t>& { return e.text.token_type_ids; });
      }
      if (o.mlm_probability > 0) {
        b.input_ids_masked = rows([](const Example& e) -> const std::vector<int64_t>& { return e.mlm.masked_ids; });
        b.mlm_labels = rows([](const Example& e) -> const std::vector<int64_t>& { return e.mlm.labels; });
      }
      b.texts = B;
    }
    if (kind != SampleKind::TEXT) {
      std::vector<at::Tensor> pixels, codebook;
      for (const auto& ex : examples) {
        pixels.push_back(ex.pixels);
        if (ex.codebook.defined()) codebook.push_back(ex.codebook);
      }
      b.pixels = at::stack(pixels);
      if (!codebook.empty()) b.codebook_pixels = at::stack(codebook);
      if (o.mim_probability > 0) {
        std::vector<uint8_t> flat;
        for (const auto& ex : examples) flat.insert(flat.end(), ex.masked_patches.begin(), ex.masked_patches.end());
        b.masked_patches = at::from_blob(flat.data(), {B, static_cast<int64_t>(flat.size()) / B}, at::kByte)
                               .to(at::kBool);
      }
      b.images = B;
    }
    if (kind == SampleKind::IMAGE_TEXT) {
      std::vector<int64_t> itm;
      for (const auto& ex : examples) itm.push_back(ex.itm);
      b.itm_labels = at::tensor(itm, at::kLong);
    }
    if (std::all_of(examples.begin(), examples.end(), [](const Example& e) { return e.label.has_value(); })) {
      std::vector<int64_t> labels;
      for (const auto& ex : examples) labels.push_back(*ex.label);
      b.labels = at::tensor(labels, at::kLong);
    }
    if (std::all_of(examples.begin(), examples.end(), [](const Example& e) { return e.score.has_value(); })) {
      std::vector<float> scores;
      for (const auto& ex : examples) scores.push_back(static_cast<float>(*ex.score));
      b.labels = at::tensor(scores, at::kFloat);
    }
    if (sources[static_cast<size_t>(kind)]->fields().words) {
      b.labels = rows([](const Example& e) -> const std::vector<int64_t>& { return e.token_labels; });
    }
    if (std::all_of(examples.begin(), examples.end(), [](const Example& e) { return e.label_set.has_value(); })) {
      // (B, classes) float 0/1: the targets of every output (transformers' multi-label labels)
      const auto classes = static_cast<int64_t>(sources[static_cast<size_t>(kind)]->fields().classes.size());
      b.labels = at::zeros({static_cast<int64_t>(examples.size()), classes}, at::kFloat);
      auto rows = b.labels.accessor<float, 2>();
      for (size_t r = 0; r < examples.size(); ++r) {
        for (int64_t id : *examples[r].label_set) rows[static_cast<int64_t>(r)][id] = 1;
      }
    }
    const bool packed = kind == SampleKind::TEXT && o.packed;
    if (o.pad_to_longest && kind != SampleKind::IMAGE && !packed) {
      cut_padding(b, sources[static_cast<size_t>(kind)]->fields().words);
    }
    return b;
  }

  // padding="longest": the columns after the batch's longest row are padding in every row (attention mask 0, no
  // label, never masked), so every (B, T) tensor ends there; `token_labels`: the labels are (B, T) too.
  static void cut_padding(Batch& b, bool token_labels) {
    const int64_t T = b.attention_mask.size(1);
    const at::Tensor used = b.attention_mask.any(0);  // (T) a token in some row
    const int64_t longest = used.any().item<bool>() ? T - used.flip(0).to(at::kLong).argmax().item<int64_t>() : 1;
    if (longest == T) return;
    for (at::Tensor* t : {&b.input_ids, &b.attention_mask, &b.token_type_ids, &b.sequence_ids, &b.input_ids_masked,
                          &b.mlm_labels}) {
      if (t->defined()) *t = t->narrow(1, 0, longest).contiguous();
    }
    if (token_labels) b.labels = b.labels.narrow(1, 0, longest).contiguous();
  }

  SampleKind kind_of(int64_t step) const {
    std::array<double, 3> w{};
    double total = 0;
    for (size_t k = 0; k < 3; ++k) total += (w[k] = sources[k] ? std::max(0.0, options.mix[k]) : 0.0);
    if (total <= 0) throw std::invalid_argument("Loader: no source has a positive mix weight");
    double u = unit_of(hash_of(options.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(Purpose::kBatchKind))) *
               total;
    for (size_t k = 0; k < 3; ++k) {
      if (w[k] > 0 && u < w[k]) return static_cast<SampleKind>(k);
      u -= w[k];
    }
    for (size_t k = 3; k-- > 0;) {  // u rounded up to the total: the last kind with a weight
      if (w[k] > 0) return static_cast<SampleKind>(k);
    }
    return SampleKind::IMAGE_TEXT;
  }

  // Under `mutex`: the next item's (kind, stream start), advancing `planned`.
  std::pair<SampleKind, int64_t> plan_next() {
    const int64_t item = next_item++;
    const int64_t step = first_step + item / options.micro_batches;
    const SampleKind kind = kind_of(step);
    int64_t& consumed = planned.consumed[static_cast<size_t>(kind)];
    const int64_t start = consumed;
    consumed += options.world * options.batch_size;
    if ((item + 1) % options.micro_batches == 0) planned.step = step + 1;
    return {kind, start};
  }

  void worker() {
    while (true) {
      int64_t item;
      std::pair<SampleKind, int64_t> plan;
      {
        std::unique_lock<std::mutex> lock(mutex);
        work_cv.wait(lock, [&] { return stopping || next_item < next_deliver + options.queue_depth; });
        if (stopping) return;
        item = next_item;
        plan = plan_next();
      }
      Batch batch;
      std::exception_ptr error;
      try {
        batch = build(plan.first, plan.second);
      } catch (...) {
        error = std::current_exception();
      }
      batch.step = first_step + item / options.micro_batches;
      batch.micro = item % options.micro_batches;
      {
        std::lock_guard<std::mutex> lock(mutex);
        ready.emplace(item, std::make_pair(std::move(batch), error));
      }
      ready_cv.notify_all();
    }
  }
};

Loader::Loader(std::array<std::shared_ptr<const SampleSource>, 3> sources, LoaderOptions options, LoaderState start)
    : impl_(std::make_unique<Impl>()) {
  impl_->sources = std::move(sources);
  impl_->options = std::move(options);
  const auto& o = impl_->options;
  if (o.batch_size < 1 || o.micro_batches < 1 || o.world < 1 || o.rank < 0 || o.rank >= o.world ||
      o.queue_depth < 1 || o.workers < 0) {
    throw std::invalid_argument("Loader: batch_size, micro_batches, world and queue_depth must be positive, rank in "
                                "[0, world), workers >= 0");
  }
  if ((impl_->sources[0] || impl_->sources[1]) && !o.tokenizer) {
    throw std::invalid_argument("Loader: text data needs a tokenizer");
  }
  if (o.packed && (!impl_->sources[1] || o.packed->length() != o.text_length)) {
    throw std::invalid_argument("Loader: packed blocks of " + std::to_string(o.packed->length()) +
                                " tokens need a text source and text_length " + std::to_string(o.text_length) +
                                " equal to it");
  }
  if (o.tokenizer && o.mlm_probability > 0 && !o.tokenizer->mask_id()) {
    throw std::invalid_argument("masked language modelling needs a mask token, and the tokenizer has none: " +
                                o.tokenizer->describe());
  }
  if ((impl_->sources[0] || impl_->sources[2]) && (o.image_size <= 0 || o.patch_size <= 0 ||
                                                   o.image_size % o.patch_size != 0)) {
    throw std::invalid_argument("Loader: image_size " + std::to_string(o.image_size) +
                                " must be a positive multiple of patch_size " + std::to_string(o.patch_size));
  }
  impl_->kind_of(start.step);  // a mix with no source throws here, not in a worker
  impl_->planned = impl_->delivered = start;
  impl_->first_step = start.step;
  for (int64_t t = 0; t < o.workers; ++t) impl_->threads.emplace_back([this] { impl_->worker(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->work_cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

std::vector<Batch> Loader::next_step() {
  Impl& m = *impl_;
  std::vector<Batch> out;
  for (int64_t micro = 0; micro < m.options.micro_batches; ++micro) {
    Batch batch;
    std::exception_ptr error;
    if (m.options.workers == 0) {
      std::pair<SampleKind, int64_t> plan;
      {
        std::lock_guard<std::mutex> lock(m.mutex);
        plan = m.plan_next();
      }
      batch = m.build(plan.first, plan.second);
      batch.step = m.delivered.step, batch.micro = micro;
    } else {
      std::unique_lock<std::mutex> lock(m.mutex);
      m.ready_cv.wait(lock, [&] { return m.ready.count(m.next_deliver) > 0; });
      auto node = m.ready.extract(m.next_deliver);
      batch = std::move(node.mapped().first);
      error = node.mapped().second;
    }
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      ++m.next_deliver;
      if (!error) m.delivered.consumed[static_cast<size_t>(batch.kind)] += m.options.world * m.options.batch_size;
    }
    m.work_cv.notify_all();
    if (error) std::rethrow_exception(error);
    out.push_back(std::move(batch));
  }
  std::lock_guard<std::mutex> lock(m.mutex);
  ++m.delivered.step;
  return out;
}

LoaderState Loader::state() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->delivered;
}

LoaderStats Loader::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->stats;
}

SampleKind Loader::kind_of(int64_t step) const { return impl_->kind_of(step); }
Batch Loader::build(SampleKind kind, int64_t start) const { return impl_->build(kind, start); }

Batch Batch::to(const at::Device& device, at::ScalarType floats) const {
  Batch out = *this;
  for (at::Tensor* t : {&out.input_ids, &out.attention_mask, &out.token_type_ids, &out.sequence_ids,
                        &out.input_ids_masked, &out.mlm_labels, &out.pixels, &out.codebook_pixels,
                        &out.masked_patches, &out.itm_labels, &out.labels}) {
    if (!t->defined()) continue;
    // a regression's scores stay float32: the loss is computed in float32 whatever the model's dtype
    *t = t->is_floating_point() && t != &out.labels ? t->to(device, floats) : t->to(device);
  }
  return out;
}

}  // namespace shardtrain::data
