// tokenizer.json's normalizers: BertNormalizer, NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Replace, Prepend,
// ByteLevel, Precompiled (SentencePiece's compiled character map, as T5's and XLM-R's files carry it) and Sequence.
#include <cstring>
#include <stdexcept>

#include "hf_pipeline.h"
#include "regex.h"
#include "unicode_text.h"

namespace shardtrain::data::hf {
namespace {

using unicode::Codepoints;

class BertNormalizer final : public Normalizer {
 public:
  explicit BertNormalizer(const Json& j)
      : clean_text_(option(j, "clean_text", true)),
        chinese_(option(j, "handle_chinese_chars", true)),
        lowercase_(option(j, "lowercase", true)),
        strip_accents_(option(j, "strip_accents", lowercase_)) {}

  std::string normalize(const std::string& text) const override {
    Codepoints out;
    for (auto cp : unicode::from_utf8(text)) {
      if (clean_text_) {
        if (cp == 0 || cp == 0xFFFD || (cp != '\t' && cp != '\n' && cp != '\r' && unicode::is_other(cp))) continue;
        if (cp == '\t' || cp == '\n' || cp == '\r' || unicode::is_rust_whitespace(cp)) cp = ' ';
      }
      if (chinese_ && unicode::is_cjk(cp)) {
        out.insert(out.end(), {' ', cp, ' '});
      } else {
        out.push_back(cp);
      }
    }
    std::string s = unicode::to_utf8(out);
    if (strip_accents_) {
      Codepoints kept;
      for (auto cp : unicode::from_utf8(unicode::normalize(s, unicode::Form::NFD))) {
        if (!unicode::is_nonspacing_mark(cp)) kept.push_back(cp);
      }
      s = unicode::to_utf8(kept);
    }
    return lowercase_ ? unicode::lowercase(s) : s;
  }

 private:
  bool clean_text_, chinese_, lowercase_, strip_accents_;
};

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(unicode::Form form) : form_(form) {}
  std::string normalize(const std::string& text) const override { return unicode::normalize(text, form_); }

 private:
  unicode::Form form_;
};

class Lowercase final : public Normalizer {
 public:
  std::string normalize(const std::string& text) const override { return unicode::lowercase(text); }
};

class Strip final : public Normalizer {
 public:
  explicit Strip(const Json& j) : left_(option(j, "strip_left", true)), right_(option(j, "strip_right", true)) {}
  std::string normalize(const std::string& text) const override {
    const Codepoints cps = unicode::from_utf8(text);
    size_t b = 0, e = cps.size();
    if (left_) {
      while (b < e && unicode::is_rust_whitespace(cps[b])) ++b;
    }
    if (right_) {
      while (e > b && unicode::is_rust_whitespace(cps[e - 1])) --e;
    }
    return unicode::to_utf8(Codepoints(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e)));
  }

 private:
  bool left_, right_;
};

class StripAccents final : public Normalizer {
 public:
  std::string normalize(const std::string& text) const override {
    Codepoints kept;
    for (auto cp : unicode::from_utf8(text)) {
      if (!unicode::is_combining_mark(cp)) kept.push_back(cp);
    }
    return unicode::to_utf8(kept);
  }
};

// Every match of a literal string or a regular expression replaced by `content`.
class Replace final : public Normalizer {
 public:
  explicit Replace(const Json& j) : pattern_(j.at("pattern")), content_(j.at("content").get<std::string>()) {}
  std::string normalize(const std::string& text) const override {
    std::string out;
    size_t at = 0;
    for (const auto& [b, e] : pattern_.find_all(text)) {
      out.append(text, at, b - at);
      out += content_;
      at = e;
    }
    out.append(text, at, std::string::npos);
    return out;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(const Json& j) : prefix_(j.at("prepend").get<std::string>()) {}
  std::string normalize(const std::string& text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  std::string normalize(const std::string& text) const override { return bytes_to_chars(text); }
};

// SentencePiece's precompiled normalization map: a little-endian uint32 with the byte size of a Darts double-array
// trie, the trie's 32-bit units, then NUL-terminated replacement strings the trie's values point into. Each
// grapheme shorter than 6 bytes is looked up whole; otherwise (or when it has no entry) each of its characters is.
// A lookup takes the shortest key that prefixes the chunk, as the tokenizers library's spm_precompiled does.
class Precompiled final : public Normalizer {
 public:
  explicit Precompiled(const Json& j) {
    const std::string blob = base64_decode(j.at("precompiled_charsmap").get<std::string>());
    if (blob.size() < 4) throw std::invalid_argument("Precompiled normalizer: precompiled_charsmap is too short");
    const uint32_t trie_bytes = little_endian(blob, 0);
    if (trie_bytes % 4 != 0 || 4 + static_cast<size_t>(trie_bytes) > blob.size()) {
      throw std::invalid_argument("Precompiled normalizer: a trie of " + std::to_string(trie_bytes) +
                                  " bytes does not fit precompiled_charsmap's " + std::to_string(blob.size()));
    }
    units_.resize(trie_bytes / 4);
    for (size_t u = 0; u < units_.size(); ++u) units_[u] = little_endian(blob, 4 + 4 * u);
    normalized_ = blob.substr(4 + trie_bytes);
  }

  std::string normalize(const std::string& text) const override {
    std::string out;
    for (const auto& [b, e] : unicode::graphemes(text)) {
      const std::string grapheme = text.substr(b, e - b);
      if (grapheme.size() < 6) {
        if (auto norm = transform(grapheme)) {
          out += *norm;
          continue;
        }
      }
      for (size_t at = 0; at < grapheme.size();) {
        const size_t n = unicode::char_length(grapheme, at);
        const std::string part = grapheme.substr(at, n);
        const auto norm = transform(part);
        out += norm ? *norm : part;
        at += n;
      }
    }
    return out;
  }

 private:
  static uint32_t little_endian(const std::string& bytes, size_t at) {
    uint32_t v = 0;
    for (size_t i = 4; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
    return v;
  }
  static bool has_leaf(uint32_t unit) { return ((unit >> 8) & 1) == 1; }
  static uint32_t value(uint32_t unit) { return unit & ((1u << 31) - 1); }
  static uint32_t label(uint32_t unit) { return unit & ((1u << 31) | 0xFF); }
  static uint32_t offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

  std::optional<std::string> transform(const std::string& chunk) const {
    if (units_.empty()) return std::nullopt;
    size_t node = offset(units_[0]);
    for (unsigned char c : chunk) {
      if (c == 0) break;
      node ^= c;
      if (node >= units_.size()) return std::nullopt;
      const uint32_t unit = units_[node];
      if (label(unit) != c) return std::nullopt;
      node ^= offset(unit);
      if (node >= units_.size()) return std::nullopt;
      if (has_leaf(unit)) {
        const size_t at = value(units_[node]);
        if (at > normalized_.size()) return std::nullopt;
        return std::string(normalized_.c_str() + at, strnlen(normalized_.c_str() + at, normalized_.size() - at));
      }
    }
    return std::nullopt;
  }

  std::vector<uint32_t> units_;
  std::string normalized_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(const Json& j) {
    for (const Json& n : j.at("normalizers")) stages_.push_back(make_normalizer(n));
  }
  std::string normalize(const std::string& text) const override {
    std::string s = text;
    for (const auto& stage : stages_) s = stage->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").get<std::string>();
  if (type == "BertNormalizer") return std::make_unique<BertNormalizer>(j);
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::Form::NFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::Form::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::Form::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::Form::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") return std::make_unique<Strip>(j);
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Replace") return std::make_unique<Replace>(j);
  if (type == "Prepend") return std::make_unique<Prepend>(j);
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Precompiled") return std::make_unique<Precompiled>(j);
  if (type == "Sequence") return std::make_unique<Sequence>(j);
  throw std::invalid_argument("normalizer type '" + type +
                              "' is not supported (known: BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                              "StripAccents, Replace, Prepend, ByteLevel, Precompiled, Sequence)");
}

std::string base64_decode(const std::string& text) {
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=' || c == '\n' || c == '\r') continue;
    else throw std::invalid_argument(std::string("base64: unexpected character '") + c + "'");
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace shardtrain::data::hf
