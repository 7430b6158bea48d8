// HfTokenizer and SentencePieceTokenizer against Hugging Face's tokenizers library and Google's sentencepiece:
// tests/reference/tokenizer_json_reference.py trains BERT-, GPT-2-, Llama 3-, Llama 2-, T5-shaped and a mixed
// tokenizer.json on a small corpus and records, per text, the ids, the truncated and padded encodings, sentence
// pairs and decoded texts; these tests read the same files and must give the same numbers.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <fstream>

#include "shardtrain/data/tokenizers/hf_tokenizer.h"
#include "shardtrain/data/tokenizers/sentencepiece_tokenizer.h"
#include "shardtrain/io/files.h"
#include "support/expect_error.h"

namespace shardtrain::data {
namespace {

std::string reference_dir() {
  const char* dir = std::getenv("SHARDTRAIN_TOKENIZER_JSON_REFERENCE");
  return dir ? dir : "build/hf_reference/tokenizer_json";
}

nlohmann::json cases() {
  std::ifstream in(reference_dir() + "/cases.json");
  if (!in) throw std::runtime_error("no " + reference_dir() + "/cases.json (run the data.tokenizer_json_reference fixture)");
  return nlohmann::json::parse(in);
}

std::vector<int64_t> unpadded(const Encoding& e) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (e.attention_mask[i]) ids.push_back(e.ids[i]);
  }
  return ids;
}

class TokenizerJson : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerJson, MatchesTheTokenizersLibrary) {
  const std::string kind = GetParam();
  const nlohmann::json c = cases().at(kind);
  // The directory: tokenizer.json comes first; gpt2-files has vocab.json and merges.txt only.
  const auto tok = open_tokenizer(reference_dir() + "/" + kind);
  ASSERT_NE(dynamic_cast<const HfTokenizer*>(tok.get()), nullptr) << tok->describe();
  EXPECT_EQ(tok->pad_id(), c.at("pad_id").get<int64_t>());
  int64_t compared = 0, truncated = 0;
  for (const auto& row : c.at("texts")) {
    const std::string text = row.at("text");
    EXPECT_EQ(tok->token_ids(text), row.at("ids").get<std::vector<int64_t>>()) << kind << ": '" << text << "'";
    const std::vector<int64_t> full = unpadded(tok->encode(text, 4096));
    EXPECT_EQ(tok->decode(full, true), row.at("decoded").get<std::string>()) << kind << ": '" << text << "'";
    EXPECT_EQ(tok->decode(full, false), row.at("decoded_special").get<std::string>()) << kind << ": '" << text << "'";
    for (int64_t length : {6, 12, 64}) {
      const Encoding e = tok->encode(text, length);
      const auto& want = row.at("at" + std::to_string(length));
      EXPECT_EQ(e.ids, want.at("ids").get<std::vector<int64_t>>()) << kind << " at " << length << ": '" << text << "'";
      EXPECT_EQ(e.token_type_ids, want.at("types").get<std::vector<int64_t>>()) << kind << ": '" << text << "'";
      EXPECT_EQ(e.attention_mask, want.at("mask").get<std::vector<int64_t>>()) << kind << ": '" << text << "'";
      truncated += e.truncated > 0;
      ++compared;
    }
  }
  for (const auto& p : c.at("pairs")) {
    const std::string first = p.at("first"), second = p.at("second");
    const Encoding e = tok->encode_pair(first, second, p.at("length").get<int64_t>());
    const std::string where = kind + ": '" + first + "' + '" + second + "' at " + p.at("length").dump();
    EXPECT_EQ(e.ids, p.at("ids").get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(e.token_type_ids, p.at("types").get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(e.attention_mask, p.at("mask").get<std::vector<int64_t>>()) << where;
    truncated += e.truncated > 0;
    ++compared;
  }
  EXPECT_GE(compared, 100);
  EXPECT_GE(truncated, 30);  // truncation is exercised, not only padding
}

INSTANTIATE_TEST_SUITE_P(Kinds, TokenizerJson,
                         ::testing::Values("bert", "gpt2", "gpt2-files", "llama3", "llama2", "t5", "mixed"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The .model files through libsentencepiece: sentencepiece's own ids, T5's closing </s> and Llama's opening <s>.
TEST(SentencePiece, MatchesSentencePieceAndAddsTheModelsSpecialTokens) {
  const nlohmann::json all = cases();
  for (const std::string kind : {"t5", "llama2"}) {
    const auto& c = all.at(kind).at("sentencepiece");
    SentencePieceOptions o;
    o.add_bos = c.at("add_bos").get<bool>(), o.add_eos = c.at("add_eos").get<bool>();
    const SentencePieceTokenizer tok(reference_dir() + "/" + kind + "/spiece.model", o);
    for (const auto& row : c.at("texts")) {
      const std::string text = row.at("text");
      const auto want = row.at("ids").get<std::vector<int64_t>>();
      EXPECT_EQ(tok.token_ids(text), want) << kind << ": '" << text << "'";
      EXPECT_EQ(tok.decode(tok.token_ids(text)), row.at("decoded").get<std::string>()) << kind << ": '" << text << "'";
      const Encoding e = tok.encode(text, 8);
      const std::vector<int64_t> kept = unpadded(e);
      ASSERT_FALSE(kept.empty());
      if (o.add_bos.value()) EXPECT_EQ(kept.front(), *tok.find("<s>")) << kind;
      if (o.add_eos.value()) EXPECT_EQ(kept.back(), *tok.find("</s>")) << kind;
      EXPECT_EQ(e.truncated, std::max<int64_t>(0, static_cast<int64_t>(want.size()) - 7)) << kind << ": '" << text << "'";
    }
  }
}

// A tokenizer.json holding `json` must be refused with a message naming the file and containing `needle`.
void expect_error(const std::string& json, const std::string& needle) {
  const std::string dir = "/tmp/tokenizer_json_error_" + std::to_string(::getpid());
  io::make_directories(dir);
  { std::ofstream(dir + "/tokenizer.json") << json; }
  testing::expect_error<std::invalid_argument>([&] { HfTokenizer tok(dir + "/tokenizer.json"); },
                                               {needle, "tokenizer.json"});
  io::remove_tree(dir);
}

TEST(TokenizerJsonErrors, NameTheFileAndWhatIsWrong) {
  expect_error(R"({"model": {"type": "Sentence", "vocab": {}}})", "model type 'Sentence'");
  expect_error(R"({"pre_tokenizer": {"type": "UnicodeScripts"}, "model": {"type": "WordLevel", "vocab": {"<unk>": 0}}})",
               "pre_tokenizer type 'UnicodeScripts'");
  expect_error(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"}})", "'[UNK]'");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})", "'ab'");
  expect_error(R"({"model": )", "tokenizer.json");
  // A template's sequences are A and B, and a single text has only A (the fuzzer's find: read past an empty B).
  const std::string word_level = R"("model": {"type": "WordLevel", "vocab": {"<unk>": 0}, "unk_token": "<unk>"})";
  expect_error(R"({"post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": ")A",
               "type_id": 0}}], "pair": [], "special_tokens": {}}, )" + word_level + "}",
               "Sequence id ')A' is not A or B");
  expect_error(R"({"post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B",
               "type_id": 0}}], "pair": [], "special_tokens": {}}, )" + word_level + "}",
               "the single template uses sequence B");
  // Ids are the tokenizers library's u32 (the fuzzer's find: a negative vocabulary id indexed before the table).
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})",
               "the vocabulary's id of 'a' is -3, outside the ids 0 .. 4294967295");
  expect_error(R"({"added_tokens": [{"content": "x", "id": 4294967296}], )" + word_level + "}",
               "an added token's id is 4294967296");
  // A vocabulary with holes in its ids takes no room for them: the largest id sizes nothing.
  {
    const std::string dir = "/tmp/tokenizer_json_holes_" + std::to_string(::getpid());
    io::make_directories(dir);
    std::ofstream(dir + "/tokenizer.json")
        << R"({"model": {"type": "WordLevel", "vocab": {"<unk>": 0, "a": 4000000000}, "unk_token": "<unk>"}})";
    HfTokenizer tok(dir + "/tokenizer.json");
    EXPECT_EQ(tok.vocab_size(), 4000000001);
    io::remove_tree(dir);
  }
  testing::expect_error<std::invalid_argument>([] { open_tokenizer("/nonexistent/dir/tokenizer.json"); },
                                               {"/nonexistent/dir/tokenizer.json"});
  const std::string empty = "/tmp/tokenizer_json_empty_" + std::to_string(::getpid());
  io::make_directories(empty);
  testing::expect_error<std::invalid_argument>([&] { open_tokenizer(empty); }, {empty, "tokenizer.json", "vocab.txt"});
  // A GPT-2 vocab.json without its merges.txt.
  std::ofstream(empty + "/vocab.json") << R"({"a": 0})";
  testing::expect_error<std::invalid_argument>([&] { open_tokenizer(empty); }, {empty + "/vocab.json", "merges.txt"});
  io::remove_tree(empty);
}

}  // namespace
}  // namespace shardtrain::data
