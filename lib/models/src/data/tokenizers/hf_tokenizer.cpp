// HfTokenizer: a tokenizer.json's stages (hf_pipeline.h) put together as the tokenizers library's
// Tokenizer::encode runs them, with its added-token matching, post-processor templates and truncation.
#include "shardtrain/data/tokenizers/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "hf_pipeline.h"
#include "shardtrain/io/checksum.h"
#include "shardtrain/io/files.h"
#include "unicode_text.h"

namespace shardtrain::data {
namespace {

using hf::Json;

struct AddedToken {
  std::string content;  // as matched: the normalized form for a `normalized` token
  int64_t id = 0;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

// One entry of a post-processor template: a sequence (A or B) or special token ids, with their token type.
struct TemplateItem {
  int sequence = -1;  // 0 for A, 1 for B; -1 for special tokens
  std::vector<int64_t> ids;
  int64_t type = 0;
};

struct Template {
  std::vector<TemplateItem> single, pair;
  int64_t added(bool is_pair) const {
    int64_t n = 0;
    for (const auto& item : is_pair ? pair : single) n += static_cast<int64_t>(item.ids.size());
    return n;
  }
};

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  std::unique_ptr<hf::Normalizer> normalizer;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer;
  std::unique_ptr<hf::Model> model;
  std::unique_ptr<hf::Decoder> decoder;
  std::vector<AddedToken> added;                       // raw-matched first, then normalized-matched
  std::unordered_map<int64_t, const AddedToken*> added_by_id;
  Template post;
  int64_t pad = 0;
  std::optional<int64_t> mask, eos;
  std::vector<int64_t> specials;  // the special added tokens and the pad id, ascending
  std::string model_type;
  uint64_t fingerprint = 0;  // of the tokenizer.json's text and the options beside it

  // A stretch of the input: text still to tokenize, or an added token's id.
  struct Segment {
    std::string text;
    std::optional<int64_t> id;
    bool at_start = false;
  };

  std::optional<int64_t> find(const std::string& token) const {
    for (const auto& a : added) {
      if (a.content == token) return a.id;
    }
    return model->id_of(token);
  }

  // The added tokens of `text` (those matched before or after normalization, per `normalized_pass`) cut out,
  // leftmost-longest, honouring lstrip/rstrip/single_word as AddedVocabulary::find_matches does.
  std::vector<Segment> cut(const Segment& seg, bool normalized_pass) const {
    std::vector<Segment> out;
    const std::string& s = seg.text;
    size_t emitted = 0;
    for (size_t at = 0; at < s.size();) {
      const AddedToken* best = nullptr;
      for (const auto& a : added) {
        if (a.normalized != normalized_pass || a.content.empty()) continue;
        if (s.compare(at, a.content.size(), a.content) == 0 && (!best || a.content.size() > best->content.size())) {
          best = &a;
        }
      }
      if (!best) {
        at += unicode::char_length(s, at);
        continue;
      }
      size_t start = at, stop = at + best->content.size();
      at = stop;
      if (best->single_word) {
        const bool before = start == 0 || !unicode::is_word(unicode::from_utf8(s.substr(0, start)).back());
        const bool after = stop == s.size() || !unicode::is_word(unicode::from_utf8(s.substr(stop, 4))[0]);
        if (!before || !after) continue;
      }
      if (best->lstrip) {
        const auto head = unicode::from_utf8(s.substr(0, start));
        size_t bytes = start;
        for (auto it = head.rbegin(); it != head.rend() && unicode::is_rust_whitespace(*it); ++it) {
          bytes -= unicode::to_utf8(*it).size();
        }
        start = std::max(bytes, emitted);
      }
      if (best->rstrip) {
        while (stop < s.size()) {
          const size_t n = unicode::char_length(s, stop);
          if (!unicode::is_rust_whitespace(unicode::from_utf8(s.substr(stop, n))[0])) break;
          stop += n;
        }
        at = stop;
      }
      if (emitted < start) {
        out.push_back({s.substr(emitted, start - emitted), std::nullopt, seg.at_start && emitted == 0});
      }
      out.push_back({s.substr(start, stop - start), best->id, false});
      emitted = stop;
    }
    if (emitted < s.size()) out.push_back({s.substr(emitted), std::nullopt, seg.at_start && emitted == 0});
    return out;
  }

  // `text` with its added tokens cut out (before and after normalization), the rest normalized and
  // pre-tokenized: the pieces the model tokenizes one by one, and the added tokens between them.
  std::vector<Segment> segments(const std::string& text) const {
    std::vector<Segment> segments;
    for (auto& raw : cut({text, std::nullopt, true}, false)) {
      if (raw.id) {
        segments.push_back(std::move(raw));
        continue;
      }
      if (normalizer) raw.text = normalizer->normalize(raw.text);
      if (raw.text.empty()) continue;
      for (auto& s : cut(raw, true)) {
        if (s.id || !pre_tokenizer) {
          segments.push_back(std::move(s));
          continue;
        }
        for (auto& p : pre_tokenizer->pre_tokenize({{std::move(s.text), s.at_start}})) {
          segments.push_back({std::move(p.text), std::nullopt, p.at_start});
        }
      }
    }
    return segments;
  }

  std::vector<int64_t> ids_of(const std::string& text) const {
    std::vector<int64_t> ids;
    for (const auto& seg : segments(text)) {
      if (seg.id) {
        ids.push_back(*seg.id);
      } else {
        model->tokenize(seg.text, ids);
      }
    }
    return ids;
  }

  Encoding assemble(std::vector<int64_t> a, std::optional<std::vector<int64_t>> b, int64_t length) const {
    const bool is_pair = b.has_value();
    const int64_t added_count = post.added(is_pair);
    const int64_t budget =
        length == kWholeText ? static_cast<int64_t>(a.size() + (is_pair ? b->size() : 0)) : length - added_count;
    if (budget < 0) {
      throw std::invalid_argument("encode: length " + std::to_string(length) + " leaves no room for the " +
                                  std::to_string(added_count) + " special tokens of " + path);
    }
    Encoding e;
    const auto n1 = static_cast<int64_t>(a.size()), n2 = is_pair ? static_cast<int64_t>(b->size()) : 0;
    const auto [keep1, keep2] = is_pair ? longest_first(n1, n2, budget) : std::pair{std::min(n1, budget), int64_t{0}};
    e.truncated = n1 + n2 - std::min(n1, keep1) - std::min(n2, keep2);
    a.resize(static_cast<size_t>(std::min(n1, keep1)));
    if (is_pair) b->resize(static_cast<size_t>(std::min(n2, keep2)));
    for (const auto& item : is_pair ? post.pair : post.single) {
      const std::vector<int64_t>& part = item.sequence < 0 ? item.ids : item.sequence == 0 ? a : *b;
      e.ids.insert(e.ids.end(), part.begin(), part.end());
      e.token_type_ids.resize(e.ids.size(), item.type);
      e.sequence_ids.resize(e.ids.size(), item.sequence);
    }
    pad_encoding(e, length, pad);
    return e;
  }

  void read_post_processor(const Json& j) {
    auto special = [&](const std::string& token, int64_t type) {
      const auto id = find(token);
      if (!id) throw std::invalid_argument("post_processor: special token '" + token + "' is not in the vocabulary");
      return TemplateItem{-1, {*id}, type};
    };
    const std::string type = j.is_null() ? "" : j.at("type").get<std::string>();
    if (type.empty() || type == "ByteLevel") {
      post.single = {{0, {}, 0}};
      post.pair = {{0, {}, 0}, {1, {}, 1}};
    } else if (type == "TemplateProcessing") {
      auto items = [&](const Json& list) {
        std::vector<TemplateItem> out;
        for (const Json& item : list) {
          if (item.contains("Sequence")) {
            const std::string id = item.at("Sequence").at("id").get<std::string>();
            if (id != "A" && id != "B") {
              throw std::invalid_argument("post_processor: a template's Sequence id '" + id + "' is not A or B");
            }
            const int64_t type_id = hf::id(item.at("Sequence").at("type_id"), "a template's type_id");
            out.push_back({id == "A" ? 0 : 1, {}, type_id});
          } else {
            const Json& s = item.at("SpecialToken");
            const std::string name = s.at("id").get<std::string>();
            const Json& entry = j.at("special_tokens").at(name);
            std::vector<int64_t> ids;
            for (const Json& v : entry.at("ids")) ids.push_back(hf::id(v, "special token " + name + "'s id"));
            out.push_back({-1, std::move(ids), hf::id(s.at("type_id"), "a template's type_id")});
          }
        }
        return out;
      };
      post.single = items(j.at("single"));
      post.pair = items(j.at("pair"));
      for (const TemplateItem& item : post.single) {
        if (item.sequence == 1) throw std::invalid_argument("post_processor: the single template uses sequence B");
      }
    } else if (type == "BertProcessing") {
      const std::string cls = j.at("cls").at(0).get<std::string>(), sep = j.at("sep").at(0).get<std::string>();
      post.single = {special(cls, 0), {0, {}, 0}, special(sep, 0)};
      post.pair = {special(cls, 0), {0, {}, 0}, special(sep, 0), {1, {}, 1}, special(sep, 1)};
    } else if (type == "RobertaProcessing") {
      const std::string cls = j.at("cls").at(0).get<std::string>(), sep = j.at("sep").at(0).get<std::string>();
      post.single = {special(cls, 0), {0, {}, 0}, special(sep, 0)};
      post.pair = {special(cls, 0), {0, {}, 0}, special(sep, 0), special(sep, 0), {1, {}, 0}, special(sep, 0)};
    } else if (type == "Sequence") {  // e.g. Llama 3's [ByteLevel, TemplateProcessing]: the one that adds tokens
      bool found = false;
      for (const Json& p : j.at("processors")) {
        if (p.at("type").get<std::string>() == "ByteLevel") continue;
        if (found) throw std::invalid_argument("post_processor: a Sequence of more than one template is not supported");
        read_post_processor(p);
        found = true;
      }
      if (!found) read_post_processor(Json());
    } else {
      throw std::invalid_argument("post_processor type '" + type +
                                  "' is not supported (known: TemplateProcessing, BertProcessing, RobertaProcessing, "
                                  "ByteLevel, Sequence)");
    }
  }

  // The stages of tokenizer.json `j`, and the pad and mask tokens (tokenizer_config.json's `config`, when given).
  // `text`: the tokenizer.json `j` was parsed from, for the fingerprint.
  void read(const Json& j, const Json& config, const std::string& where, const std::string& text) {
    Impl& m = *this;
    m.path = where;
    m.fingerprint = io::checksum_bytes(io::to_hex(io::checksum_bytes(text)) + config.dump());
    try {
      m.normalizer = hf::make_normalizer(hf::option(j, "normalizer", Json()));
      m.pre_tokenizer = hf::make_pre_tokenizer(hf::option(j, "pre_tokenizer", Json()));
      m.model = hf::make_model(j.at("model"));
      m.decoder = hf::make_decoder(hf::option(j, "decoder", Json()));
      m.model_type = hf::option<std::string>(j.at("model"), "type", "BPE");
      for (const Json& a : hf::option(j, "added_tokens", Json::array())) {
        AddedToken t;
        t.content = a.at("content").get<std::string>();
        t.id = hf::id(a.at("id"), "an added token's id");
        t.special = hf::option(a, "special", false);
        t.normalized = hf::option(a, "normalized", !t.special);
        t.lstrip = hf::option(a, "lstrip", false), t.rstrip = hf::option(a, "rstrip", false);
        t.single_word = hf::option(a, "single_word", false);
        if (t.normalized && m.normalizer) t.content = m.normalizer->normalize(t.content);
        m.added.push_back(std::move(t));
      }
      for (const auto& a : m.added) m.added_by_id[a.id] = &a;
      m.read_post_processor(hf::option(j, "post_processor", Json()));

      const auto padding = hf::option(j, "padding", Json());
      if (!padding.is_null() && padding.contains("pad_id")) {
        m.pad = hf::id(padding.at("pad_id"), "padding's pad_id");
      } else if (auto name = m.configured_token(config, "pad_token"); name && m.find(*name)) {
        m.pad = *m.find(*name);
      } else {  // no pad token (GPT-2, Llama): the end of text pads, as transformers users set pad = eos
        m.pad = m.first_present({"[PAD]", "<pad>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>"})
                    .value_or(0);
      }
      if (auto name = m.configured_token(config, "mask_token"); name && m.find(*name)) {
        m.mask = m.find(*name);
      } else {
        m.mask = m.first_present({"[MASK]", "<mask>"});
      }
      if (auto name = m.configured_token(config, "eos_token"); name && m.find(*name)) {
        m.eos = m.find(*name);
      } else {
        m.eos = m.first_present({"</s>", "<|endoftext|>", "<|end_of_text|>"});
      }
      std::set<int64_t> specials{m.pad};
      for (const auto& a : m.added) {
        if (a.special) specials.insert(a.id);
      }
      m.specials.assign(specials.begin(), specials.end());
    } catch (const std::exception& e) {
      throw std::invalid_argument("tokenizer '" + where + "': " + e.what());
    }
  }

  // transformers' tokenizer_config.json names the special tokens ("pad_token": "<pad>" or {"content": ...}).
  std::optional<std::string> configured_token(const Json& config, const char* key) const {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return std::nullopt;
    return it->is_string() ? it->get<std::string>() : it->at("content").get<std::string>();
  }

  std::optional<int64_t> first_present(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      if (auto id = find(n)) return id;
    }
    return std::nullopt;
  }
};

namespace {

Json parsed(const std::vector<char>& bytes) { return Json::parse(bytes.begin(), bytes.end()); }

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Json j, config;
  std::vector<char> text;
  try {
    text = io::read_file(path);
    j = parsed(text);
    // transformers' tokenizer_config.json beside it names the pad and mask tokens
    const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::is_regular_file(config_path)) config = parsed(io::read_file(config_path.string()));
  } catch (const std::exception& e) {
    throw std::invalid_argument("tokenizer '" + path + "': " + e.what());
  }
  impl_->read(j, config, path, std::string(text.begin(), text.end()));
}

HfTokenizer::HfTokenizer(const InMemory& json) : impl_(std::make_unique<Impl>()) {
  hf::Json j, config = hf::Json::object();
  try {
    j = hf::Json::parse(json.text);
  } catch (const std::exception& e) {
    throw std::invalid_argument("tokenizer '" + json.name + "': " + e.what());
  }
  if (!json.pad_token.empty()) config["pad_token"] = json.pad_token;
  if (!json.mask_token.empty()) config["mask_token"] = json.mask_token;
  impl_->read(j, config, json.name, json.text);
}

HfTokenizer::~HfTokenizer() = default;

std::vector<int64_t> HfTokenizer::token_ids(const std::string& text) const { return impl_->ids_of(text); }

std::vector<std::string> HfTokenizer::pieces(const std::string& text) const {
  std::vector<std::string> out;
  for (auto& seg : impl_->segments(text)) out.push_back(std::move(seg.text));
  return out;
}

Encoding HfTokenizer::encode(const std::string& text, int64_t length) const {
  return impl_->assemble(impl_->ids_of(text), std::nullopt, length);
}

Encoding HfTokenizer::encode_pair(const std::string& first, const std::string& second, int64_t length) const {
  if (second.empty()) return encode(first, length);
  return impl_->assemble(impl_->ids_of(first), impl_->ids_of(second), length);
}

Encoding HfTokenizer::encode_words(const std::vector<std::string>& words, int64_t length) const {
  std::vector<int64_t> ids, word_of;
  for (size_t w = 0; w < words.size(); ++w) {
    const std::vector<int64_t> word = impl_->ids_of(words[w]);
    ids.insert(ids.end(), word.begin(), word.end());
    word_of.resize(ids.size(), static_cast<int64_t>(w));
  }
  Encoding e = impl_->assemble(std::move(ids), std::nullopt, length);
  set_word_ids(e, word_of);
  return e;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (const auto it = m.added_by_id.find(id); it != m.added_by_id.end()) {
      if (!(skip_special && it->second->special)) tokens.push_back(it->second->content);
    } else if (auto token = m.model->token_of(id)) {
      tokens.push_back(std::move(*token));
    }
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::string out;
  for (const auto& piece : m.decoder->decode_chain(std::move(tokens))) out += piece;
  return out;
}

int64_t HfTokenizer::vocab_size() const {
  int64_t n = impl_->model->size();
  for (const auto& a : impl_->added) n = std::max(n, a.id + 1);
  return n;
}

std::optional<int64_t> HfTokenizer::find(const std::string& token) const { return impl_->find(token); }
int64_t HfTokenizer::pad_id() const { return impl_->pad; }
std::optional<int64_t> HfTokenizer::mask_id() const { return impl_->mask; }
std::optional<int64_t> HfTokenizer::eos_id() const { return impl_->eos; }

std::vector<int64_t> HfTokenizer::special_ids() const { return impl_->specials; }

uint64_t HfTokenizer::fingerprint() const { return impl_->fingerprint; }

std::string HfTokenizer::describe() const {
  return impl_->model_type + " tokenizer.json '" + impl_->path + "' (" + std::to_string(vocab_size()) + " tokens)";
}

}  // namespace shardtrain::data
