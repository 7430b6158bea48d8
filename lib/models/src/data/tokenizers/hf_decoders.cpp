// tokenizer.json's decoders, each turning the tokens of a sequence back into text pieces: ByteLevel, WordPiece,
// Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder and Sequence.
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "hf_pipeline.h"
#include "unicode_text.h"

namespace shardtrain::data::hf {
namespace {

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

class ByteLevel final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) bytes += chars_to_bytes(t).value_or(t);
    return {unicode::to_utf8(unicode::from_utf8(bytes))};  // invalid UTF-8 -> U+FFFD, as from_utf8_lossy
  }
};

class WordPiece final : public Decoder {
 public:
  explicit WordPiece(const Json& j)
      : prefix_(option<std::string>(j, "prefix", "##")), cleanup_(option(j, "cleanup", true)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) t = t.compare(0, prefix_.size(), prefix_) == 0 ? t.substr(prefix_.size()) : " " + t;
      if (cleanup_) {
        for (const auto& [from, to] : kCleanup) t = replace_all(t, from, to);
      }
    }
    return tokens;
  }

 private:
  // transformers' clean_up_tokenization: spaces before punctuation and contractions
  inline static const std::pair<const char*, const char*> kCleanup[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  std::string prefix_;
  bool cleanup_;
};

class Metaspace final : public Decoder {
 public:
  explicit Metaspace(const Json& j) : replacement_(option<std::string>(j, "replacement", "\xE2\x96\x81")) {
    prepends_ = j.contains("prepend_scheme") ? j.at("prepend_scheme").get<std::string>() != "never"
                                             : option(j, "add_prefix_space", true);
  }
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && prepends_)) out += ' ';
          at += replacement_.size();
        } else {
          out += t[at++];
        }
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool prepends_;
};

class Replace final : public Decoder {
 public:
  explicit Replace(const Json& j) : content_(j.at("content").get<std::string>()) {
    const Json& p = j.at("pattern");
    if (!p.contains("String")) throw std::invalid_argument("Replace decoder: only String patterns are supported");
    literal_ = p.at("String").get<std::string>();
  }
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) t = replace_all(t, literal_, content_);
    return tokens;
  }

 private:
  std::string literal_, content_;
};

// Runs of <0xXX> tokens become the text of their bytes (one U+FFFD per byte when they are not valid UTF-8).
class ByteFallback final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (unicode::to_utf8(unicode::from_utf8(bytes)) == bytes) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
      }
      bytes.clear();
    };
    for (auto& t : tokens) {
      auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
      const bool byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4]);
      if (byte) {
        bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
};

class Fuse final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

// Up to `start` leading and `stop` trailing `content` characters off each token.
class Strip final : public Decoder {
 public:
  explicit Strip(const Json& j)
      : content_(unicode::from_utf8(j.at("content").get<std::string>()).at(0)),
        start_(option<size_t>(j, "start", 0)),
        stop_(option<size_t>(j, "stop", 0)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      const auto cps = unicode::from_utf8(t);
      size_t b = 0, e = cps.size();
      while (b < std::min(start_, cps.size()) && cps[b] == content_) ++b;
      for (size_t i = 0; i < stop_ && e > b && cps[e - 1] == content_; ++i) --e;
      t = unicode::to_utf8(unicode::Codepoints(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e)));
    }
    return tokens;
  }

 private:
  int32_t content_;
  size_t start_, stop_;
};

class BpeDecoder final : public Decoder {
 public:
  explicit BpeDecoder(const Json& j) : suffix_(option<std::string>(j, "suffix", "</w>")) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
    }
    return tokens;
  }

 private:
  std::string suffix_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(const Json& j) {
    for (const Json& d : j.at("decoders")) stages_.push_back(make_decoder(d));
  }
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& stage : stages_) tokens = stage->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "WordPiece") return std::make_unique<WordPiece>(j);
  if (type == "Metaspace") return std::make_unique<Metaspace>(j);
  if (type == "Replace") return std::make_unique<Replace>(j);
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") return std::make_unique<Strip>(j);
  if (type == "BPEDecoder") return std::make_unique<BpeDecoder>(j);
  if (type == "Sequence") return std::make_unique<Sequence>(j);
  throw std::invalid_argument("decoder type '" + type +
                              "' is not supported (known: ByteLevel, WordPiece, Metaspace, Replace, ByteFallback, "
                              "Fuse, Strip, BPEDecoder, Sequence)");
}

}  // namespace shardtrain::data::hf
