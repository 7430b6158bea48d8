#include "shardtrain/data/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <queue>
#include <set>
#include <stdexcept>

#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

using Codepoints = std::vector<utf8proc_int32_t>;

// UTF-8 to code points; invalid bytes become U+FFFD (which clean-up then drops, like a lossy decode would).
Codepoints from_utf8(const std::string& text) {
  Codepoints out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) cp = 0xFFFD, n = 1;
    out.push_back(cp);
    p += n, left -= n;
  }
  return out;
}

std::string to_utf8(const Codepoints& cps) {
  std::string out;
  utf8proc_uint8_t buffer[4];
  for (auto cp : cps) {
    const auto n = utf8proc_encode_char(cp, buffer);
    out.append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
  }
  return out;
}

std::string normalize(const std::string& text, utf8proc_uint8_t* (*form)(const utf8proc_uint8_t*)) {
  utf8proc_uint8_t* result = form(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
  if (!result) return text;  // invalid UTF-8 cannot reach here (decode/encode made it valid)
  std::string out(reinterpret_cast<const char*>(result));
  std::free(result);
  return out;
}

bool is_control(utf8proc_int32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN:
      return true;
    default:
      return false;
  }
}

bool is_whitespace(utf8proc_int32_t cp) {
  return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS;
}

// Where Python's str.split() splits once clean-up has run (line and paragraph separators survive it).
bool is_separator(utf8proc_int32_t cp) {
  const auto c = utf8proc_category(cp);
  return is_whitespace(cp) || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool is_punctuation(utf8proc_int32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126)) {
    return true;
  }
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool is_cjk(utf8proc_int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

std::vector<Codepoints> split_on(const Codepoints& cps, bool (*separator)(utf8proc_int32_t)) {
  std::vector<Codepoints> out;
  Codepoints current;
  for (auto cp : cps) {
    if (separator(cp)) {
      if (!current.empty()) out.push_back(std::move(current)), current.clear();
    } else {
      current.push_back(cp);
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

constexpr size_t kMaxWordChars = 100;
const char* kSpecial[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

}  // namespace

std::vector<std::string> load_vocab(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read vocabulary '" + path + "'");
  std::vector<std::string> vocab;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.push_back(line);
  }
  for (const char* s : kSpecial) {
    if (std::find(vocab.begin(), vocab.end(), s) == vocab.end()) {
      throw std::runtime_error("vocabulary '" + path + "' (" + std::to_string(vocab.size()) + " tokens) has no " +
                               s + " token; a BERT vocab.txt has [PAD] [UNK] [CLS] [SEP] [MASK]");
    }
  }
  return vocab;
}

void save_vocab(const std::vector<std::string>& vocab, const std::string& path) {
  std::vector<char> bytes;
  for (const auto& token : vocab) {
    bytes.insert(bytes.end(), token.begin(), token.end());
    bytes.push_back('\n');
  }
  io::write_file_atomic(path, bytes);
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, bool lowercase)
    : vocab_(std::move(vocab)), lowercase_(lowercase) {
  for (size_t i = 0; i < vocab_.size(); ++i) ids_.emplace(vocab_[i], static_cast<int64_t>(i));  // first one wins
  pad_ = id_of("[PAD]"), unk_ = id_of("[UNK]"), cls_ = id_of("[CLS]"), sep_ = id_of("[SEP]"), mask_ = id_of("[MASK]");
}

int64_t WordPieceTokenizer::id_of(const std::string& token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) throw std::invalid_argument("token '" + token + "' is not in the vocabulary");
  return it->second;
}

std::vector<std::string> WordPieceTokenizer::basic_tokens(const std::string& text) const {
  Codepoints cleaned;
  for (auto cp : from_utf8(text)) {
    if (cp == 0 || cp == 0xFFFD || is_control(cp)) continue;
    if (is_whitespace(cp)) {
      cleaned.push_back(' ');
    } else if (is_cjk(cp)) {
      cleaned.insert(cleaned.end(), {' ', cp, ' '});
    } else {
      cleaned.push_back(cp);
    }
  }
  // No NFC here: Hugging Face's BertTokenizer (the tokenizers library's BertNormalizer) leaves composition alone,
  // so a cased tokenizer sees "e" + U+0301 as two characters (lower-casing strips the accent either way).
  std::vector<std::string> out;
  for (Codepoints word : split_on(cleaned, is_separator)) {
    if (lowercase_) {
      for (auto& cp : word) cp = utf8proc_tolower(cp);
      Codepoints stripped;
      for (auto cp : from_utf8(normalize(to_utf8(word), utf8proc_NFD))) {
        if (utf8proc_category(cp) != UTF8PROC_CATEGORY_MN) stripped.push_back(cp);
      }
      word = std::move(stripped);
    }
    Codepoints current;
    for (auto cp : word) {
      if (is_punctuation(cp)) {
        if (!current.empty()) out.push_back(to_utf8(current)), current.clear();
        out.push_back(to_utf8({cp}));
      } else {
        current.push_back(cp);
      }
    }
    if (!current.empty()) out.push_back(to_utf8(current));
  }
  return out;
}

void WordPieceTokenizer::word_pieces(const std::string& word, std::vector<std::string>& out) const {
  const Codepoints chars = from_utf8(word);
  if (chars.size() > kMaxWordChars) {
    out.push_back("[UNK]");
    return;
  }
  std::vector<std::string> pieces;
  size_t start = 0;
  while (start < chars.size()) {
    size_t end = chars.size();
    std::string match;
    for (; end > start; --end) {
      std::string candidate = to_utf8(Codepoints(chars.begin() + start, chars.begin() + end));
      if (start > 0) candidate = "##" + candidate;
      if (ids_.count(candidate)) {
        match = std::move(candidate);
        break;
      }
    }
    if (match.empty()) {
      out.push_back("[UNK]");
      return;
    }
    pieces.push_back(std::move(match));
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const auto& word : basic_tokens(text)) word_pieces(word, out);
  return out;
}

std::vector<int64_t> WordPieceTokenizer::token_ids(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& t : tokenize(text)) ids.push_back(ids_.at(t));
  return ids;
}

Encoding WordPieceTokenizer::encode(const std::string& text, int64_t length) const {
  if (length < 2) throw std::invalid_argument("encode: length " + std::to_string(length) + " leaves no room for [CLS] and [SEP]");
  std::vector<int64_t> tokens = token_ids(text);
  Encoding e;
  e.truncated = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - (length - 2));
  if (e.truncated > 0) tokens.resize(static_cast<size_t>(length - 2));
  e.ids.reserve(static_cast<size_t>(length));
  e.ids.push_back(cls_);
  e.ids.insert(e.ids.end(), tokens.begin(), tokens.end());
  e.ids.push_back(sep_);
  e.attention_mask.assign(e.ids.size(), 1);
  e.token_type_ids.assign(static_cast<size_t>(length), 0);
  e.ids.resize(static_cast<size_t>(length), pad_);
  e.attention_mask.resize(static_cast<size_t>(length), 0);
  return e;
}

// Truncation as the `tokenizers` library's longest_first does it for a pair (what BertTokenizerFast runs): with a
// budget of B = length - 3 tokens, the shorter sequence keeps at most floor(B / 2) (the first, on a tie) and the
// other takes the rest. An empty second text is no pair (transformers' tokenizer(a, "") encodes `a` alone).
Encoding WordPieceTokenizer::encode_pair(const std::string& first, const std::string& second, int64_t length) const {
  if (second.empty()) return encode(first, length);
  if (length < 3) {
    throw std::invalid_argument("encode_pair: length " + std::to_string(length) +
                                " leaves no room for [CLS] and two [SEP]");
  }
  std::vector<int64_t> a = token_ids(first), b = token_ids(second);
  const size_t budget = static_cast<size_t>(length - 3);
  const int64_t truncated = std::max<int64_t>(0, static_cast<int64_t>(a.size() + b.size() - budget));
  if (truncated > 0) {
    if (a.size() > b.size()) {
      b.resize(std::min(b.size(), budget / 2));
      a.resize(budget - b.size());
    } else {
      a.resize(std::min(a.size(), budget / 2));
      b.resize(budget - a.size());
    }
  }
  Encoding e;
  e.truncated = truncated;
  e.ids.reserve(static_cast<size_t>(length));
  e.ids.push_back(cls_);
  e.ids.insert(e.ids.end(), a.begin(), a.end());
  e.ids.push_back(sep_);
  e.token_type_ids.assign(e.ids.size(), 0);
  e.ids.insert(e.ids.end(), b.begin(), b.end());
  e.ids.push_back(sep_);
  e.token_type_ids.resize(e.ids.size(), 1);
  e.attention_mask.assign(e.ids.size(), 1);
  e.ids.resize(static_cast<size_t>(length), pad_);
  e.attention_mask.resize(static_cast<size_t>(length), 0);
  e.token_type_ids.resize(static_cast<size_t>(length), 0);
  return e;
}

// Byte-pair merges over the corpus' distinct words, weighted by their counts. Pair counts are kept up to date
// incrementally; a max-heap of (count, pair) with stale entries skipped picks the next merge.
std::vector<std::string> build_vocab(const std::vector<std::string>& texts, const VocabOptions& options) {
  const int64_t specials = static_cast<int64_t>(std::size(kSpecial));
  if (options.size <= specials) {
    throw std::invalid_argument("vocabulary size " + std::to_string(options.size) + " leaves no room beyond the " +
                                std::to_string(specials) + " special tokens");
  }
  WordPieceTokenizer basic({kSpecial, kSpecial + specials}, options.lowercase);
  std::map<std::string, int64_t> word_counts;
  for (const auto& text : texts) {
    for (const auto& w : basic.basic_tokens(text)) ++word_counts[w];
  }

  std::vector<std::string> symbols;  // symbol id -> text ("a", "##b")
  std::map<std::string, int> symbol_ids;
  auto symbol = [&](const std::string& s) {
    auto it = symbol_ids.find(s);
    if (it != symbol_ids.end()) return it->second;
    symbols.push_back(s);
    return symbol_ids[s] = static_cast<int>(symbols.size() - 1);
  };
  std::vector<std::vector<int>> words;
  std::vector<int64_t> counts;
  // Characters first, sorted, so the alphabet comes before any merge in the vocabulary (as the trainer does).
  std::set<std::string> alphabet;
  for (const auto& [w, c] : word_counts) {
    const Codepoints cps = from_utf8(w);
    for (size_t i = 0; i < cps.size(); ++i) alphabet.insert((i ? "##" : "") + to_utf8({cps[i]}));
  }
  for (const auto& a : alphabet) symbol(a);
  for (const auto& [w, c] : word_counts) {
    const Codepoints cps = from_utf8(w);
    std::vector<int> ids;
    for (size_t i = 0; i < cps.size(); ++i) ids.push_back(symbol((i ? "##" : "") + to_utf8({cps[i]})));
    words.push_back(std::move(ids));
    counts.push_back(c);
  }

  using Pair = std::pair<int, int>;
  std::map<Pair, int64_t> pair_counts;
  std::map<Pair, std::set<size_t>> where;
  for (size_t w = 0; w < words.size(); ++w) {
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const Pair p{words[w][i], words[w][i + 1]};
      pair_counts[p] += counts[w];
      where[p].insert(w);
    }
  }
  // Ties: the pair whose merged text is smallest, so the result does not depend on container order.
  auto merged_text = [&](const Pair& p) {
    const std::string& b = symbols[p.second];
    return symbols[p.first] + (b.rfind("##", 0) == 0 ? b.substr(2) : b);
  };
  using Entry = std::tuple<int64_t, std::string, Pair>;
  auto order = [](const Entry& a, const Entry& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return std::get<1>(a) > std::get<1>(b);
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(order)> heap(order);
  for (const auto& [p, c] : pair_counts) heap.emplace(c, merged_text(p), p);

  while (specials + static_cast<int64_t>(symbols.size()) < options.size && !heap.empty()) {
    auto [count, text, pair] = heap.top();
    heap.pop();
    auto current = pair_counts.find(pair);
    if (current == pair_counts.end() || current->second != count) continue;  // stale
    if (count < options.min_frequency) break;
    const int merged = symbol(text);
    std::map<Pair, int64_t> touched;
    for (size_t w : where[pair]) {
      auto& ids = words[w];
      std::vector<int> out;
      bool changed = false;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == pair.first && ids[i + 1] == pair.second) {
          out.push_back(merged), i += 2, changed = true;
        } else {
          out.push_back(ids[i]), i += 1;
        }
      }
      if (!changed) continue;
      for (size_t i = 0; i + 1 < ids.size(); ++i) touched[{ids[i], ids[i + 1]}] -= counts[w];
      for (size_t i = 0; i + 1 < out.size(); ++i) {
        const Pair p{out[i], out[i + 1]};
        touched[p] += counts[w];
        where[p].insert(w);
      }
      ids = std::move(out);
    }
    for (const auto& [p, delta] : touched) {
      if (delta == 0) continue;
      const int64_t c = (pair_counts[p] += delta);
      if (c > 0) heap.emplace(c, merged_text(p), p);
    }
    pair_counts.erase(pair);
    where.erase(pair);
  }
  std::vector<std::string> vocab(kSpecial, kSpecial + specials);
  vocab.insert(vocab.end(), symbols.begin(), symbols.end());
  // An alphabet larger than the size asked for is cut (its last characters tokenize as [UNK]).
  if (static_cast<int64_t>(vocab.size()) > options.size) vocab.resize(static_cast<size_t>(options.size));
  return vocab;
}

}  // namespace shardtrain::data
