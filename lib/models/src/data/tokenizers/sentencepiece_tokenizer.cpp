#include "shardtrain/data/tokenizers/sentencepiece_tokenizer.h"

#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "shardtrain/io/checksum.h"

namespace shardtrain::data {

struct SentencePieceTokenizer::Impl {
  std::string path;
  sentencepiece::SentencePieceProcessor sp;
  bool add_bos = false, add_eos = true;
  uint64_t fingerprint = 0;  // of the model's bytes and add_bos/add_eos
  int64_t pad = 0;
  std::vector<int64_t> specials;  // control and unknown pieces

  // <s> ids </s> (as asked) appended to `e`, the ids marked as text `sequence`.
  void append(Encoding& e, const std::vector<int64_t>& ids, int64_t sequence) const {
    if (add_bos) e.ids.push_back(sp.bos_id()), e.sequence_ids.push_back(-1);
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.sequence_ids.resize(e.ids.size(), sequence);
    if (add_eos) e.ids.push_back(sp.eos_id()), e.sequence_ids.push_back(-1);
  }
  int64_t added() const { return (add_bos ? 1 : 0) + (add_eos ? 1 : 0); }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path, const SentencePieceOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  const auto status = m.sp.Load(path);
  if (!status.ok()) throw std::invalid_argument("SentencePiece model '" + path + "': " + status.ToString());
  nlohmann::json config;
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::ifstream in(config_path); in) config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto flag = [&](const char* key, bool fallback) {
    return config.is_object() && config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : fallback;
  };
  m.add_bos = options.add_bos.value_or(flag("add_bos_token", false));
  m.add_eos = options.add_eos.value_or(flag("add_eos_token", !flag("add_bos_token", false)));
  if ((m.add_bos && m.sp.bos_id() < 0) || (m.add_eos && m.sp.eos_id() < 0)) {
    throw std::invalid_argument("SentencePiece model '" + path + "' has no " + (m.add_bos ? "<s>" : "</s>") +
                                " piece, which the tokenizer is asked to add");
  }
  for (int id = 0; id < m.sp.GetPieceSize(); ++id) {
    if (m.sp.IsControl(id) || m.sp.IsUnknown(id)) m.specials.push_back(id);
  }
  m.pad = m.sp.pad_id() >= 0 ? m.sp.pad_id() : m.sp.eos_id() >= 0 ? m.sp.eos_id() : 0;
  m.fingerprint = io::checksum_bytes(io::to_hex(io::checksum_bytes(m.sp.serialized_model_proto())) +
                                     (m.add_bos ? " bos" : "") + (m.add_eos ? " eos" : ""));
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::token_ids(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("SentencePiece '" + impl_->path + "': " + status.ToString());
  return {ids.begin(), ids.end()};
}

Encoding SentencePieceTokenizer::encode(const std::string& text, int64_t length) const {
  const Impl& m = *impl_;
  if (length != kWholeText && length < m.added()) {
    throw std::invalid_argument("encode: length " + std::to_string(length) + " is too short");
  }
  std::vector<int64_t> ids = token_ids(text);
  const int64_t budget = length == kWholeText ? static_cast<int64_t>(ids.size()) : length - m.added();
  const int64_t cut = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - budget);
  ids.resize(ids.size() - static_cast<size_t>(cut));
  Encoding e;
  e.truncated = cut;
  m.append(e, ids, 0);
  pad_encoding(e, length, m.pad);
  return e;
}

Encoding SentencePieceTokenizer::encode_pair(const std::string& first, const std::string& second,
                                             int64_t length) const {
  if (second.empty()) return encode(first, length);
  const Impl& m = *impl_;
  if (length != kWholeText && length < 2 * m.added()) {
    throw std::invalid_argument("encode_pair: length " + std::to_string(length) + " is too short for two texts");
  }
  std::vector<int64_t> a = token_ids(first), b = token_ids(second);
  const auto whole = static_cast<int64_t>(a.size() + b.size());
  const auto [n1, n2] = longest_first(static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size()),
                                      length == kWholeText ? whole : length - 2 * m.added());
  const int64_t cut = static_cast<int64_t>(a.size() + b.size()) - n1 - n2;
  a.resize(static_cast<size_t>(std::min<int64_t>(n1, static_cast<int64_t>(a.size()))));
  b.resize(static_cast<size_t>(std::min<int64_t>(n2, static_cast<int64_t>(b.size()))));
  Encoding e;
  e.truncated = cut;
  m.append(e, a, 0);
  m.append(e, b, 1);
  pad_encoding(e, length, m.pad);
  return e;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<int> kept;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && impl_->sp.IsControl(static_cast<int>(id))) continue;
    kept.push_back(static_cast<int>(id));
  }
  std::string text;
  impl_->sp.Decode(kept, &text).IgnoreError();
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

std::optional<int64_t> SentencePieceTokenizer::find(const std::string& token) const {
  const int id = impl_->sp.PieceToId(token);
  if (id == impl_->sp.unk_id() && token != impl_->sp.IdToPiece(id)) return std::nullopt;
  return id;
}

int64_t SentencePieceTokenizer::pad_id() const { return impl_->pad; }
std::optional<int64_t> SentencePieceTokenizer::eos_id() const {
  return impl_->sp.eos_id() >= 0 ? std::optional<int64_t>(impl_->sp.eos_id()) : std::nullopt;
}

std::vector<int64_t> SentencePieceTokenizer::special_ids() const { return impl_->specials; }

uint64_t SentencePieceTokenizer::fingerprint() const { return impl_->fingerprint; }

std::string SentencePieceTokenizer::describe() const {
  return "SentencePiece '" + impl_->path + "' (" + std::to_string(vocab_size()) + " pieces)";
}

}  // namespace shardtrain::data
