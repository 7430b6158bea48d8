// WordPieceTokenizer against Hugging Face's BertTokenizer: tests/reference/tokenizer_reference.py writes a vocab
// and, for lower-cased and cased tokenizers, the tokens and padded ids of texts that exercise every rule.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>

#include "shardtrain/data/tokenizers/tokenizer.h"

namespace shardtrain::data {
namespace {

std::string reference_dir() {
  const char* dir = std::getenv("SHARDTRAIN_TOKENIZER_REFERENCE");
  return dir ? dir : "build/hf_reference/tokenizer";
}

TEST(TokenizerParity, MatchesBertTokenizer) {
  std::ifstream in(reference_dir() + "/cases.json");
  ASSERT_TRUE(in) << "no " << reference_dir() << "/cases.json (run the data.tokenizer_reference fixture)";
  const nlohmann::json cases = nlohmann::json::parse(in);
  const auto vocab = load_vocab(reference_dir() + "/vocab.txt");
  int64_t compared = 0;
  for (const auto& [name, lowercase] : {std::pair<std::string, bool>{"lowercase", true}, {"cased", false}}) {
    WordPieceTokenizer tok(vocab, lowercase);
    for (const auto& c : cases.at(name)) {
      const std::string text = c.at("text");
      EXPECT_EQ(tok.tokenize(text), c.at("tokens").get<std::vector<std::string>>()) << name << ": " << text;
      const Encoding e = tok.encode(text, 16);
      EXPECT_EQ(e.ids, c.at("ids16").get<std::vector<int64_t>>()) << name << ": " << text;
      EXPECT_EQ(e.attention_mask, c.at("mask16").get<std::vector<int64_t>>()) << name << ": " << text;
      ++compared;
    }
  }
  EXPECT_GE(compared, 30);
}

// Sentence pairs as BertTokenizerFast encodes them: ids, token types, padding and longest-first truncation.
TEST(TokenizerParity, PairsMatchBertTokenizerFast) {
  std::ifstream in(reference_dir() + "/cases.json");
  ASSERT_TRUE(in) << "no " << reference_dir() << "/cases.json (run the data.tokenizer_reference fixture)";
  const nlohmann::json cases = nlohmann::json::parse(in);
  WordPieceTokenizer tok(load_vocab(reference_dir() + "/vocab.txt"), true);
  int64_t compared = 0, truncated = 0;
  for (const auto& c : cases.at("pairs")) {
    const std::string first = c.at("first"), second = c.at("second");
    const int64_t length = c.at("length");
    const Encoding e = tok.encode_pair(first, second, length);
    const std::string where = "'" + first + "' + '" + second + "' at " + std::to_string(length);
    EXPECT_EQ(e.ids, c.at("ids").get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(e.token_type_ids, c.at("types").get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(e.attention_mask, c.at("mask").get<std::vector<int64_t>>()) << where;
    truncated += static_cast<int64_t>(tok.token_ids(first).size() + tok.token_ids(second).size()) + 3 > length;
    ++compared;
  }
  EXPECT_GE(compared, 100);
  EXPECT_GE(truncated, 40);  // the truncation rule is exercised, not only padding
}

// Texts already split into words as BertTokenizerFast encodes them with is_split_into_words (run_ner's input): the
// ids, and the word of each token (transformers' word_ids(), None as -1), truncated and padded.
TEST(TokenizerParity, WordsMatchBertTokenizerFastSplitIntoWords) {
  std::ifstream in(reference_dir() + "/cases.json");
  ASSERT_TRUE(in) << "no " << reference_dir() << "/cases.json (run the data.tokenizer_reference fixture)";
  const nlohmann::json cases = nlohmann::json::parse(in);
  WordPieceTokenizer tok(load_vocab(reference_dir() + "/vocab.txt"), true);
  int64_t compared = 0, split_words = 0;
  for (const auto& c : cases.at("words")) {
    const auto words = c.at("words").get<std::vector<std::string>>();
    const Encoding e = tok.encode_words(words, c.at("length").get<int64_t>());
    const std::string where = c.at("words").dump() + " at " + c.at("length").dump();
    EXPECT_EQ(e.ids, c.at("ids").get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(e.word_ids, c.at("word_ids").get<std::vector<int64_t>>()) << where;
    for (size_t i = 1; i < e.word_ids.size(); ++i) {
      split_words += e.word_ids[i] >= 0 && e.word_ids[i] == e.word_ids[i - 1];
    }
    ++compared;
  }
  EXPECT_GE(compared, 50);
  EXPECT_GE(split_words, 20);  // words of several tokens, not only one token each
}

TEST(TokenizerParity, VocabularyErrors) {
  EXPECT_THROW(load_vocab("/nonexistent/vocab.txt"), std::runtime_error);
  try {
    WordPieceTokenizer({"[PAD]", "a"}, true);
    ADD_FAILURE() << "a vocabulary without [UNK] was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[UNK]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::data
