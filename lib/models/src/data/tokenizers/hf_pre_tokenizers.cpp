// tokenizer.json's pre-tokenizers: BertPreTokenizer, ByteLevel (GPT-2's pattern and byte alphabet), Split,
// Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation and Sequence; and the split they all share.
#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "hf_pipeline.h"
#include "regex.h"
#include "unicode_text.h"

namespace shardtrain::data::hf {
namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

// Each character for which `test` holds, as a one-character match.
template <typename Test>
Ranges char_matches(const std::string& text, Test test) {
  Ranges out;
  for (size_t at = 0; at < text.size();) {
    const size_t n = unicode::char_length(text, at);
    const auto cps = unicode::from_utf8(text.substr(at, n));
    if (test(cps[0])) out.emplace_back(at, at + n);
    at += n;
  }
  return out;
}

template <typename Test>
std::vector<Piece> split_chars(std::vector<Piece> pieces, Test test, Behavior behavior) {
  std::vector<Piece> out;
  for (const auto& p : pieces) {
    for (auto& q : split(p, char_matches(p.text, test), behavior)) out.push_back(std::move(q));
  }
  return out;
}

Behavior behavior_of(const std::string& name) {
  if (name == "Removed") return Behavior::REMOVED;
  if (name == "Isolated") return Behavior::ISOLATED;
  if (name == "MergedWithPrevious") return Behavior::MERGED_WITH_PREVIOUS;
  if (name == "MergedWithNext") return Behavior::MERGED_WITH_NEXT;
  if (name == "Contiguous") return Behavior::CONTIGUOUS;
  throw std::invalid_argument("split behavior '" + name +
                              "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

class BertPreTokenizer final : public PreTokenizer {
 public:
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    pieces = split_chars(std::move(pieces), unicode::is_rust_whitespace, Behavior::REMOVED);
    return split_chars(std::move(pieces), unicode::is_punctuation, Behavior::ISOLATED);
  }
};

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel final : public PreTokenizer {
 public:
  explicit ByteLevel(const Json& j)
      : add_prefix_space_(option(j, "add_prefix_space", true)), use_regex_(option(j, "use_regex", true)) {
    if (use_regex_) regex_ = std::make_unique<Regex>(kGpt2Pattern);
  }
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (use_regex_) {
        for (auto& q : split(p, regex_->find_all(p.text), Behavior::ISOLATED)) out.push_back(std::move(q));
      } else if (!p.text.empty()) {
        out.push_back(std::move(p));
      }
    }
    for (auto& p : out) p.text = bytes_to_chars(p.text);
    return out;
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> regex_;
};

class Split final : public PreTokenizer {
 public:
  explicit Split(const Json& j)
      : pattern_(j.at("pattern")),
        behavior_(behavior_of(j.at("behavior").get<std::string>())),
        invert_(option(j, "invert", false)) {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces) {
      for (auto& q : split(p, pattern_.find_all(p.text), behavior_, invert_)) out.push_back(std::move(q));
    }
    return out;
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Spaces become `replacement` (U+2581), which is prepended to a piece ("always"), to the input's first piece
// ("first") or never, and the piece is split before each replacement character.
class Metaspace final : public PreTokenizer {
 public:
  explicit Metaspace(const Json& j)
      : replacement_(option<std::string>(j, "replacement", "\xE2\x96\x81")), split_(option(j, "split", true)) {
    if (j.contains("prepend_scheme")) {
      scheme_ = j.at("prepend_scheme").get<std::string>();
    } else {  // files written before prepend_scheme existed
      scheme_ = option(j, "add_prefix_space", true) ? "always" : "never";
    }
    if (scheme_ != "always" && scheme_ != "first" && scheme_ != "never") {
      throw std::invalid_argument("Metaspace prepend_scheme '" + scheme_ + "' is not always, first or never");
    }
  }
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      std::string s;
      for (char c : p.text) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s += c;
        }
      }
      const bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == "always" || (scheme_ == "first" && p.at_start))) s = replacement_ + s;
      Piece q{std::move(s), p.at_start};
      if (!split_) {
        if (!q.text.empty()) out.push_back(std::move(q));
        continue;
      }
      Ranges at;
      for (size_t i = q.text.find(replacement_); i != std::string::npos; i = q.text.find(replacement_, i + 1)) {
        at.emplace_back(i, i + replacement_.size());
      }
      for (auto& r : split(q, at, Behavior::MERGED_WITH_NEXT)) out.push_back(std::move(r));
    }
    return out;
  }

 private:
  std::string replacement_, scheme_;
  bool split_;
};

class Whitespace final : public PreTokenizer {
 public:
  Whitespace() : regex_(R"(\w+|[^\w\s]+)") {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    std::vector<Piece> out;
    for (const auto& p : pieces) {
      for (auto& q : split(p, regex_.find_all(p.text), Behavior::REMOVED, /*invert=*/true)) out.push_back(std::move(q));
    }
    return out;
  }

 private:
  Regex regex_;
};

class WhitespaceSplit final : public PreTokenizer {
 public:
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    return split_chars(std::move(pieces), unicode::is_rust_whitespace, Behavior::REMOVED);
  }
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(const Json& j) : individual_(option(j, "individual_digits", false)) {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    return split_chars(std::move(pieces), unicode::is_numeric, individual_ ? Behavior::ISOLATED : Behavior::CONTIGUOUS);
  }

 private:
  bool individual_;
};

class Punctuation final : public PreTokenizer {
 public:
  explicit Punctuation(const Json& j) : behavior_(behavior_of(option<std::string>(j, "behavior", "Isolated"))) {}
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    return split_chars(std::move(pieces), unicode::is_punctuation, behavior_);
  }

 private:
  Behavior behavior_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(const Json& j) {
    for (const Json& p : j.at("pretokenizers")) stages_.push_back(make_pre_tokenizer(p));
  }
  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const override {
    for (const auto& stage : stages_) pieces = stage->pre_tokenize(std::move(pieces));
    return pieces;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

}  // namespace

Pattern::Pattern(const Json& j) {
  if (j.contains("Regex")) {
    regex_ = std::make_unique<Regex>(j.at("Regex").get<std::string>());
  } else {
    literal_ = j.at("String").get<std::string>();
  }
}

Pattern::~Pattern() = default;

Ranges Pattern::find_all(const std::string& text) const {
  if (regex_) return regex_->find_all(text);
  Ranges out;
  if (literal_.empty()) return out;
  for (size_t at = text.find(literal_); at != std::string::npos; at = text.find(literal_, at + literal_.size())) {
    out.emplace_back(at, at + literal_.size());
  }
  return out;
}

std::vector<Piece> split(const Piece& piece, const Ranges& matches, Behavior behavior, bool invert) {
  struct Span {
    size_t begin, end;
    bool match;
  };
  std::vector<Span> spans;  // the whole text, matched and unmatched stretches in turn
  size_t at = 0;
  for (const auto& [b, e] : matches) {
    if (b > at) spans.push_back({at, b, invert});
    spans.push_back({b, e, !invert});
    at = e;
  }
  if (at < piece.text.size()) spans.push_back({at, piece.text.size(), invert});

  std::vector<Span> kept;
  bool previous = false;
  switch (behavior) {
    case Behavior::ISOLATED:
      kept = spans;
      break;
    case Behavior::REMOVED:
      for (const auto& s : spans) {
        if (!s.match) kept.push_back(s);
      }
      break;
    case Behavior::CONTIGUOUS:
      for (const auto& s : spans) {
        if (s.match == previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous = s.match;
      }
      break;
    case Behavior::MERGED_WITH_PREVIOUS:
      for (const auto& s : spans) {
        if (s.match && !previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous = s.match;
      }
      break;
    case Behavior::MERGED_WITH_NEXT:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        previous = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  std::vector<Piece> out;
  for (const auto& s : kept) {
    if (s.end > s.begin) out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
  return out;
}

const std::vector<std::string>& byte_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<size_t>(b)] = unicode::to_utf8(printable ? b : next++);
    }
    return t;
  }();
  return table;
}

std::string bytes_to_chars(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_chars()[b];
  return out;
}

std::optional<std::string> chars_to_bytes(const std::string& text) {
  static const std::unordered_map<int32_t, char> inverse = [] {
    std::unordered_map<int32_t, char> m;
    for (int b = 0; b < 256; ++b) m[unicode::from_utf8(byte_chars()[static_cast<size_t>(b)])[0]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (auto cp : unicode::from_utf8(text)) {
    const auto it = inverse.find(cp);
    if (it == inverse.end()) return std::nullopt;
    out += it->second;
  }
  return out;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").get<std::string>();
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j);
  if (type == "Split") return std::make_unique<Split>(j);
  if (type == "Metaspace") return std::make_unique<Metaspace>(j);
  if (type == "Whitespace") return std::make_unique<Whitespace>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  if (type == "Digits") return std::make_unique<Digits>(j);
  if (type == "Punctuation") return std::make_unique<Punctuation>(j);
  if (type == "Sequence") return std::make_unique<Sequence>(j);
  throw std::invalid_argument("pre_tokenizer type '" + type +
                              "' is not supported (known: BertPreTokenizer, ByteLevel, Split, Metaspace, Whitespace, "
                              "WhitespaceSplit, Digits, Punctuation, Sequence)");
}

}  // namespace shardtrain::data::hf
