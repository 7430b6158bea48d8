#include "shardtrain/data/tokenizers/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <set>
#include <stdexcept>

#include "shardtrain/data/tokenizers/hf_tokenizer.h"
#include "shardtrain/data/tokenizers/sentencepiece_tokenizer.h"
#include "shardtrain/io/files.h"
#include "unicode_text.h"

namespace shardtrain::data {
namespace {

const char* kSpecial[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

}  // namespace

std::pair<int64_t, int64_t> longest_first(int64_t n1, int64_t n2, int64_t budget) {
  if (n1 + n2 <= budget) return {n1, n2};
  const bool swap = n1 > n2;
  if (swap) std::swap(n1, n2);
  n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
  if (n1 + n2 > budget) n1 = budget / 2, n2 = n1 + budget % 2;
  if (swap) std::swap(n1, n2);
  return {n1, n2};
}

const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                                      "vocab.txt", "vocab.json"};

void pad_encoding(Encoding& e, int64_t length, int64_t pad_id) {
  const size_t n = length == kWholeText ? e.ids.size() : static_cast<size_t>(length);
  e.attention_mask.assign(e.ids.size(), 1);
  e.attention_mask.resize(n, 0);
  e.ids.resize(n, pad_id);
  e.token_type_ids.resize(n, 0);
  e.sequence_ids.resize(n, -1);
}

void set_word_ids(Encoding& e, const std::vector<int64_t>& word_of) {
  e.word_ids.assign(e.ids.size(), -1);
  size_t n = 0;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (e.sequence_ids[i] == 0) e.word_ids[i] = word_of.at(n++);
  }
}

Encoding Tokenizer::encode_words(const std::vector<std::string>&, int64_t) const {
  throw std::invalid_argument("tokenizer " + describe() + " cannot encode text already split into words (token "
                              "classification reads a tokenizer.json or a vocab.txt)");
}

std::string foreign_id_error(const std::string& key, int64_t id, const Tokenizer& t) {
  return key + ": token id " + std::to_string(id) + " is outside the vocabulary of " + t.describe() +
         ": the dataset was tokenized by another tokenizer (data.tokenizer names the one to use)";
}

std::string tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return path;
  for (const char* name : kTokenizerFiles) {
    if (fs::is_regular_file(fs::path(path) / name)) return (fs::path(path) / name).string();
  }
  return "";
}

namespace {

// transformers' GPT2Tokenizer files without a tokenizer.json (older GPT-2 checkpoints on the Hub keep only these):
// vocab.json (token -> id) and merges.txt beside it ("#version" first, then one "a b" merge per line), as the
// tokenizer.json transformers' GPT2Converter makes of them: byte-level BPE behind GPT-2's pattern (add_prefix_space
// as tokenizer_config.json says, default false), the ByteLevel post-processor and decoder; the added tokens those
// of tokenizer_config.json's added_tokens_decoder, else GPT-2's one special token, <|endoftext|>.
std::shared_ptr<const Tokenizer> open_gpt2_files(const std::filesystem::path& vocab_json) {
  const std::filesystem::path dir = vocab_json.parent_path(), merges_txt = dir / "merges.txt";
  if (!std::filesystem::is_regular_file(merges_txt)) {
    throw std::invalid_argument("tokenizer: '" + vocab_json.string() + "' has no merges.txt beside it (a GPT-2 "
                                "tokenizer is vocab.json and merges.txt, or a tokenizer.json)");
  }
  nlohmann::json vocab, config = nlohmann::json::object();
  try {
    const std::vector<char> bytes = io::read_file(vocab_json.string());
    vocab = nlohmann::json::parse(bytes.begin(), bytes.end());
    const std::filesystem::path config_path = dir / "tokenizer_config.json";
    if (std::filesystem::is_regular_file(config_path)) {
      const std::vector<char> text = io::read_file(config_path.string());
      config = nlohmann::json::parse(text.begin(), text.end());
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument("tokenizer '" + vocab_json.string() + "': " + e.what());
  }
  if (!vocab.is_object()) throw std::invalid_argument("tokenizer '" + vocab_json.string() + "': not a JSON object");
  nlohmann::json merges = nlohmann::json::array();
  std::ifstream in(merges_txt);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  nlohmann::json added = nlohmann::json::array();
  auto add = [&](int64_t id, const std::string& content, bool special) {
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", !special}, {"special", special}});
  };
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (const auto& [id, token] : config["added_tokens_decoder"].items()) {
      add(std::stoll(id), token.at("content").get<std::string>(), token.value("special", false));
    }
  } else if (vocab.contains("<|endoftext|>")) {
    add(vocab["<|endoftext|>"].get<int64_t>(), "<|endoftext|>", true);
  }
  const bool prefix_space = config.value("add_prefix_space", false);
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", prefix_space},
                                     {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::json post = byte_level;
  post["trim_offsets"] = false;
  const nlohmann::json j = {
      {"added_tokens", added}, {"normalizer", nullptr}, {"pre_tokenizer", byte_level}, {"post_processor", post},
      {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                 {"merges", merges}}}};
  std::string pad;
  if (config.contains("pad_token") && !config["pad_token"].is_null()) {
    pad = config["pad_token"].is_string() ? config["pad_token"].get<std::string>()
                                          : config["pad_token"].at("content").get<std::string>();
  }
  return std::make_shared<HfTokenizer>(HfTokenizer::InMemory{j.dump(), vocab_json.string() + " + merges.txt", pad, ""});
}

}  // namespace

std::shared_ptr<const Tokenizer> open_tokenizer(const std::string& path, bool lowercase) {
  namespace fs = std::filesystem;
  const fs::path file = tokenizer_file(path);
  if (file.empty()) {
    std::string names;
    for (const char* name : kTokenizerFiles) names += std::string(names.empty() ? "" : ", ") + name;
    throw std::invalid_argument("tokenizer: directory '" + path + "' holds none of " + names);
  }
  if (!fs::is_regular_file(file)) throw std::invalid_argument("tokenizer: no file '" + file.string() + "'");
  if (file.filename() == "vocab.json") return open_gpt2_files(file);
  if (file.extension() == ".json") return std::make_shared<HfTokenizer>(file.string());
  if (file.extension() == ".model") return std::make_shared<SentencePieceTokenizer>(file.string());
  if (file.extension() == ".txt") return std::make_shared<WordPieceTokenizer>(load_vocab(file.string()), lowercase);
  throw std::invalid_argument("tokenizer: '" + file.string() +
                              "' is not a tokenizer.json, a SentencePiece .model, a WordPiece vocab.txt or a GPT-2 "
                              "vocab.json");
}

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

// transformers' BertTokenizer as a tokenizer.json (its converter's stages): BertNormalizer, BertPreTokenizer,
// WordPiece with "##" and at most 100 characters a word, [CLS] $A [SEP] ($B [SEP]) with token types, the special
// tokens as added tokens, the WordPiece decoder.
WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, bool lowercase)
    : vocab_(std::move(vocab)), lowercase_(lowercase) {
  nlohmann::json ids = nlohmann::json::object();
  for (size_t i = 0; i < vocab_.size(); ++i) {
    if (!ids.contains(vocab_[i])) ids[vocab_[i]] = static_cast<int64_t>(i);  // the first of a repeated line wins
  }
  auto id_in = [&](const char* token) {
    if (!ids.contains(token)) {
      throw std::invalid_argument(std::string("vocabulary of ") + std::to_string(vocab_.size()) + " tokens has no " +
                                  token + "; a BERT vocab.txt has [PAD] [UNK] [CLS] [SEP] [MASK]");
    }
    return ids[token].get<int64_t>();
  };
  pad_ = id_in("[PAD]"), unk_ = id_in("[UNK]"), cls_ = id_in("[CLS]"), sep_ = id_in("[SEP]"), mask_ = id_in("[MASK]");
  nlohmann::json added = nlohmann::json::array();
  for (const char* token : kSpecial) {
    added.push_back({{"id", ids[token]}, {"content", token}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const nlohmann::json j = {
      {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                      {"strip_accents", nullptr}, {"lowercase", lowercase}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", sep_}}, {"cls", {"[CLS]", cls_}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                 {"max_input_chars_per_word", 100}, {"vocab", ids}}}};
  // A line that is not UTF-8 becomes U+FFFD (no text can produce it: clean-up drops U+FFFD), so it matches nothing.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  hf_ = std::make_unique<HfTokenizer>(HfTokenizer::InMemory{text, "vocab.txt", "[PAD]", "[MASK]"});
}

WordPieceTokenizer::~WordPieceTokenizer() = default;

std::optional<int64_t> WordPieceTokenizer::find(const std::string& token) const { return hf_->find(token); }

std::string WordPieceTokenizer::describe() const {
  return "WordPiece vocab.txt (" + std::to_string(vocab_size()) + " tokens" + (lowercase_ ? ", lower-cased)" : ")");
}

uint64_t WordPieceTokenizer::fingerprint() const { return hf_->fingerprint(); }  // its vocabulary and lowercase

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  return hf_->decode(ids, skip_special);
}

int64_t WordPieceTokenizer::id_of(const std::string& token) const {
  const auto id = find(token);
  if (!id) throw std::invalid_argument("token '" + token + "' is not in the vocabulary");
  return *id;
}

std::vector<std::string> WordPieceTokenizer::basic_tokens(const std::string& text) const { return hf_->pieces(text); }

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (int64_t id : token_ids(text)) out.push_back(token(id));
  return out;
}

std::vector<int64_t> WordPieceTokenizer::token_ids(const std::string& text) const { return hf_->token_ids(text); }

Encoding WordPieceTokenizer::encode(const std::string& text, int64_t length) const {
  if (length != kWholeText && length < 2) {
    throw std::invalid_argument("encode: length " + std::to_string(length) + " leaves no room for [CLS] and [SEP]");
  }
  return hf_->encode(text, length);
}

Encoding WordPieceTokenizer::encode_pair(const std::string& first, const std::string& second, int64_t length) const {
  if (!second.empty() && length != kWholeText && length < 3) {
    throw std::invalid_argument("encode_pair: length " + std::to_string(length) +
                                " leaves no room for [CLS] and two [SEP]");
  }
  return hf_->encode_pair(first, second, length);
}

Encoding WordPieceTokenizer::encode_words(const std::vector<std::string>& words, int64_t length) const {
  if (length != kWholeText && length < 2) {
    throw std::invalid_argument("encode_words: length " + std::to_string(length) + " leaves no room for [CLS] and "
                                "[SEP]");
  }
  return hf_->encode_words(words, length);
}

namespace {

using Pair = std::pair<int, int>;  // two adjacent symbols of a word

// The corpus' distinct words as symbol ids, each with its count. Symbols are texts ("a", "##b"), numbered in the
// order they are made: the alphabet first, sorted (as Hugging Face's trainer puts it before any merge), then each
// merge.
struct Corpus {
  std::vector<std::string> symbols;
  std::map<std::string, int> symbol_ids;
  std::vector<std::vector<int>> words;
  std::vector<int64_t> counts;

  int symbol(const std::string& s) {
    auto it = symbol_ids.find(s);
    if (it != symbol_ids.end()) return it->second;
    symbols.push_back(s);
    return symbol_ids[s] = static_cast<int>(symbols.size() - 1);
  }
  // The text of `p` merged: "a" + "##b" -> "ab".
  std::string merged_text(const Pair& p) const {
    const std::string& b = symbols[p.second];
    return symbols[p.first] + (b.rfind("##", 0) == 0 ? b.substr(2) : b);
  }
};

Corpus corpus_of(const std::map<std::string, int64_t>& word_counts) {
  Corpus corpus;
  auto character = [](const unicode::Codepoints& cps, size_t i) { return (i ? "##" : "") + unicode::to_utf8(cps[i]); };
  std::set<std::string> alphabet;
  for (const auto& [w, c] : word_counts) {
    const unicode::Codepoints cps = unicode::from_utf8(w);
    for (size_t i = 0; i < cps.size(); ++i) alphabet.insert(character(cps, i));
  }
  for (const auto& a : alphabet) corpus.symbol(a);
  for (const auto& [w, c] : word_counts) {
    const unicode::Codepoints cps = unicode::from_utf8(w);
    std::vector<int> ids;
    for (size_t i = 0; i < cps.size(); ++i) ids.push_back(corpus.symbol(character(cps, i)));
    corpus.words.push_back(std::move(ids));
    corpus.counts.push_back(c);
  }
  return corpus;
}

// Replaces `pair` by `merged` in every word that holds it (`where`: the words each pair occurs in, kept up to date)
// and returns how each pair's count changed.
std::map<Pair, int64_t> merge_everywhere(Corpus& corpus, std::map<Pair, std::set<size_t>>& where, const Pair& pair,
                                         int merged) {
  std::map<Pair, int64_t> touched;
  for (size_t w : where[pair]) {
    auto& ids = corpus.words[w];
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
    for (size_t i = 0; i + 1 < ids.size(); ++i) touched[{ids[i], ids[i + 1]}] -= corpus.counts[w];
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      const Pair p{out[i], out[i + 1]};
      touched[p] += corpus.counts[w];
      where[p].insert(w);
    }
    ids = std::move(out);
  }
  return touched;
}

}  // namespace

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
  Corpus corpus = corpus_of(word_counts);

  std::map<Pair, int64_t> pair_counts;
  std::map<Pair, std::set<size_t>> where;
  for (size_t w = 0; w < corpus.words.size(); ++w) {
    const auto& ids = corpus.words[w];
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      pair_counts[{ids[i], ids[i + 1]}] += corpus.counts[w];
      where[{ids[i], ids[i + 1]}].insert(w);
    }
  }
  // Ties: the pair whose merged text is smallest, so the result does not depend on container order.
  using Entry = std::tuple<int64_t, std::string, Pair>;
  auto order = [](const Entry& a, const Entry& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return std::get<1>(a) > std::get<1>(b);
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(order)> heap(order);
  for (const auto& [p, c] : pair_counts) heap.emplace(c, corpus.merged_text(p), p);

  while (specials + static_cast<int64_t>(corpus.symbols.size()) < options.size && !heap.empty()) {
    auto [count, text, pair] = heap.top();
    heap.pop();
    auto current = pair_counts.find(pair);
    if (current == pair_counts.end() || current->second != count) continue;  // stale
    if (count < options.min_frequency) break;
    for (const auto& [p, delta] : merge_everywhere(corpus, where, pair, corpus.symbol(text))) {
      if (delta == 0) continue;
      const int64_t c = (pair_counts[p] += delta);
      if (c > 0) heap.emplace(c, corpus.merged_text(p), p);
    }
    pair_counts.erase(pair);
    where.erase(pair);
  }
  std::vector<std::string> vocab(kSpecial, kSpecial + specials);
  vocab.insert(vocab.end(), corpus.symbols.begin(), corpus.symbols.end());
  // An alphabet larger than the size asked for is cut (its last characters tokenize as [UNK]).
  if (static_cast<int64_t>(vocab.size()) > options.size) vocab.resize(static_cast<size_t>(options.size));
  return vocab;
}

}  // namespace shardtrain::data
