// The data pipeline: tar reading and writing, WebDataset grouping, text files, the sampler's coverage across
// world sizes, masks, the loader's determinism and its handling of corrupt data, synthetic data, vocabularies.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "shardtrain/data/formats/image.h"
#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/data/pipeline/packed_texts.h"
#include "shardtrain/data/pipeline/label_values.h"
#include "data/pipeline/masking.h"
#include "shardtrain/data/pipeline/records.h"
#include "data/pipeline/sampler.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/pipeline/synth.h"
#include "data/formats/tar.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/files.h"
#include "support/expect_error.h"
#include "support/scratch.h"

namespace shardtrain::data {
namespace {

using shardtrain::testing::expect_error;

// A fresh directory per test, removed afterwards.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/shardtrain_data_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    io::remove_tree(dir_);
    io::make_directories(dir_);
  }
  void TearDown() override { io::remove_tree(dir_); }
  std::string dir_;
};

void write_text(const std::string& path, const std::string& text) {
  io::write_file_atomic(path, std::vector<char>(text.begin(), text.end()));
}

Image solid(int64_t size, uint8_t r, uint8_t g, uint8_t b) {
  Image img;
  img.width = img.height = size;
  for (int64_t i = 0; i < size * size; ++i) img.rgb.insert(img.rgb.end(), {r, g, b});
  return img;
}

TEST_F(DataTest, TarRoundTripAndSystemTarAgrees) {
  const std::string path = dir_ + "/a.tar";
  TarWriter tar(path);
  tar.add("000.txt", "hello");
  tar.add("000.cls", "3");
  tar.add(std::string(120, 'd') + "/001.txt", std::string(1000, 'x'));  // ustar prefix field
  tar.add("002.bin", "");
  tar.finish();
  const TarScan scan = scan_tar(io::ReadOnlyFile(path));
  EXPECT_EQ(scan.error, "");
  ASSERT_EQ(scan.members.size(), 4u);
  EXPECT_EQ(scan.members[0].name, "000.txt");
  EXPECT_EQ(scan.members[2].name, std::string(120, 'd') + "/001.txt");
  EXPECT_EQ(scan.members[2].size, 1000);
  EXPECT_EQ(io::ReadOnlyFile(path).read(scan.members[0].offset, scan.members[0].size), "hello");
  // GNU tar lists the same members (the format is real ustar, not just readable by ourselves).
  const std::string listing = dir_ + "/listing.txt";
  ASSERT_EQ(std::system(("tar tf " + path + " > " + listing).c_str()), 0);
  std::ifstream in(listing);
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) names.push_back(line);
  EXPECT_EQ(names, (std::vector<std::string>{"000.txt", "000.cls", std::string(120, 'd') + "/001.txt", "002.bin"}));
}

TEST_F(DataTest, SystemTarFilesAreRead) {
  write_text(dir_ + "/k1.txt", "caption one");
  write_text(dir_ + "/k1.cls", "7");
  write_text(dir_ + "/k2.txt", "caption two");
  ASSERT_EQ(std::system(("cd " + dir_ + " && tar --format=gnu -cf sys.tar k1.txt k1.cls k2.txt").c_str()), 0);
  SampleSource source({dir_ + "/sys.tar"}, SampleKind::TEXT);
  ASSERT_EQ(source.size(), 2);
  EXPECT_EQ(source.read(0).text, "caption one");
  EXPECT_EQ(source.read(0).label, 7);
  EXPECT_EQ(source.read(1).text, "caption two");
  EXPECT_FALSE(source.read(1).label.has_value());
}

TEST_F(DataTest, TruncatedTarKeepsTheSamplesBeforeTheDamage) {
  const std::string path = dir_ + "/t.tar";
  TarWriter tar(path);
  for (int i = 0; i < 10; ++i) {
    tar.add("s" + std::to_string(i) + ".png", encode_png(solid(8, 10, 20, static_cast<uint8_t>(i))));
    tar.add("s" + std::to_string(i) + ".txt", "sample " + std::to_string(i));
  }
  tar.finish();
  const int64_t full = io::file_size(path);
  ASSERT_EQ(::truncate(path.c_str(), full * 6 / 10), 0);
  SampleSource source({path}, SampleKind::IMAGE_TEXT);
  EXPECT_GT(source.size(), 3);
  EXPECT_LT(source.size(), 10);
  ASSERT_EQ(source.scan_problems().size(), 1u);
  EXPECT_NE(source.scan_problems()[0].find("truncated"), std::string::npos) << source.scan_problems()[0];
  EXPECT_NE(source.scan_problems()[0].find(path), std::string::npos);
  for (int64_t i = 0; i < source.size(); ++i) EXPECT_EQ(source.read(i).text, "sample " + std::to_string(i));

  // Garbage is "bad header checksum", never a crash; a source with no sample at all is an error that says why.
  write_text(dir_ + "/garbage.tar", std::string(4096, 'g'));
  expect_error<std::invalid_argument>([&] { SampleSource({dir_ + "/garbage.tar"}, SampleKind::TEXT); },
                                      {"no usable sample", "bad header checksum"});
  expect_error<std::invalid_argument>([&] { SampleSource({dir_ + "/missing"}, SampleKind::TEXT); },
                                      {"'" + dir_ + "/missing' does not exist"});
}

TEST_F(DataTest, WebDatasetGroupingLeavesOutIncompleteSamples) {
  const std::string path = dir_ + "/w.tar";
  TarWriter tar(path);
  tar.add("a/000.png", encode_png(solid(4, 1, 2, 3)));
  tar.add("a/000.txt", "with image");
  tar.add("a/001.txt", "text only");  // no image: not an image-text sample
  tar.add("a/002.jpg", encode_jpeg(solid(4, 9, 9, 9)));
  tar.add("a/002.caption", "jpeg");
  tar.add("a/002.json", "{}");  // other extensions are ignored
  tar.finish();
  SampleSource pairs({path}, SampleKind::IMAGE_TEXT);
  EXPECT_EQ(pairs.size(), 2);
  EXPECT_EQ(pairs.incomplete_samples(), 1);
  EXPECT_EQ(pairs.read(1).text, "jpeg");
  EXPECT_EQ(decode_image(pairs.read(1).image).width, 4);
  SampleSource texts({path}, SampleKind::TEXT);
  EXPECT_EQ(texts.size(), 3);
  SampleSource images({path}, SampleKind::IMAGE);
  EXPECT_EQ(images.size(), 2);
}

TEST_F(DataTest, TextAndJsonlFiles) {
  write_text(dir_ + "/c.txt", "first line\n\nsecond line\r\nlast without newline");
  write_text(dir_ + "/d.jsonl", "{\"text\": \"json one\"}\nnot json\n{\"other\": 1}\n");
  SampleSource source({dir_}, SampleKind::TEXT);  // a directory: both files, sorted
  ASSERT_EQ(source.size(), 6);
  EXPECT_EQ(source.read(0).text, "first line");
  EXPECT_EQ(source.read(1).text, "second line");
  EXPECT_EQ(source.read(2).text, "last without newline");
  EXPECT_EQ(source.read(3).text, "json one");
  expect_error<std::runtime_error>([&] { source.read(4); }, {"d.jsonl:2", "not a JSON line"});
  expect_error<std::runtime_error>([&] { source.read(5); }, {"d.jsonl:3", "\"text\""});
  expect_error<std::invalid_argument>([&] { SampleSource({dir_ + "/c.txt"}, SampleKind::IMAGE); },
                                      {"expected a .tar or .arrow/.parquet file for image data"});
}

// Labelled sentence pairs in the three record formats: fields by JSON key or header column, labels by class name or
// id, CSV quoting; what cannot be used names the file and line (or, at construction, the column).
TEST_F(DataTest, LabelledRecordsInJsonlTsvAndCsv) {
  write_text(dir_ + "/a.jsonl", "{\"s1\": \"one\", \"s2\": \"two\", \"y\": \"yes\"}\n"
                                "{\"s1\": \"three\", \"s2\": \"four\", \"y\": 0}\n"
                                "{\"s1\": \"five\", \"y\": 1}\n"
                                "{\"s1\": \"six\", \"s2\": \"seven\", \"y\": \"maybe\"}\n");
  write_text(dir_ + "/b.tsv", "y\ts1\ts2\n1\tsaid \"hi\t\"there\n\n2\tx\ty\nno\tshort\n");
  write_text(dir_ + "/c.csv", "id,s1,s2,y\r\n7,\"a, b\",\"say \"\"hi\"\"\",no\r\n8,\"open,x,1\r\n");
  const TextFields fields{{"s1", "s2"}, "y", {"no", "yes"}};
  SampleSource source({dir_}, SampleKind::TEXT, fields);
  ASSERT_TRUE(source.pairs());
  ASSERT_EQ(source.size(), 9);  // 4 + 3 + 2 records; headers and empty lines are none
  auto expect_sample = [&](int64_t i, const std::string& first, const std::string& second, int64_t label) {
    const RawSample r = source.read(i);
    EXPECT_EQ(r.text, first) << i;
    EXPECT_EQ(r.text_pair, second) << i;
    EXPECT_EQ(r.label, label) << i;
  };
  expect_sample(0, "one", "two", 1);
  expect_sample(1, "three", "four", 0);
  expect_error<std::runtime_error>([&] { source.read(2); }, {"a.jsonl:3", "string field \"s2\""});
  expect_error<std::runtime_error>([&] { source.read(3); }, {"a.jsonl:4", "label 'maybe'", "[no, yes]"});
  expect_sample(4, "said \"hi", "\"there", 1);  // TSV: no quoting, quotes are text (GLUE's files)
  expect_error<std::runtime_error>([&] { source.read(5); }, {"b.tsv:4", "label '2'", "class id below 2"});
  expect_error<std::runtime_error>([&] { source.read(6); }, {"b.tsv:5", "2 fields, the header has more"});
  expect_sample(7, "a, b", "say \"hi\"", 0);  // CSV: quoted commas and doubled quotes
  expect_error<std::runtime_error>([&] { source.read(8); }, {"c.csv:3", "quoted field is not closed"});

  expect_error<std::invalid_argument>(
      [&] { SampleSource({dir_ + "/b.tsv"}, SampleKind::TEXT, TextFields{{"s1", "sentence2"}, "y", {}}); },
      {"b.tsv", "no column 'sentence2'", "'y', 's1', 's2'"});
  write_text(dir_ + "/d.txt", "plain\n");
  expect_error<std::invalid_argument>([&] { SampleSource({dir_ + "/d.txt"}, SampleKind::TEXT, fields); },
                                      {"d.txt", "without a second text"});
  // Without classes, a label is any whole number.
  SampleSource ids({dir_ + "/a.jsonl"}, SampleKind::TEXT, TextFields{{"s1"}, "y", {}});
  EXPECT_FALSE(ids.pairs());
  EXPECT_EQ(ids.read(1).label, 0);
  expect_error<std::runtime_error>([&] { ids.read(0); }, {"label 'yes' is not a whole number"});
}

// A WordPiece tokenizer over ten tokens: the five special ones (ids 0-4), then red circle blue square green.
std::shared_ptr<const Tokenizer> shapes_tokenizer() {
  return std::make_shared<WordPieceTokenizer>(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "circle", "blue", "square",
                               "green"},
      true);
}

// A loader over sentence pairs: [CLS] a [SEP] b [SEP] with token types, and the labels of every row.
TEST_F(DataTest, LoaderBatchesSentencePairs) {
  write_text(dir_ + "/p.tsv", "label\ta\tb\n1\tred circle\tblue square\n0\tgreen\tred\n");
  LoaderOptions o;
  o.batch_size = 2, o.workers = 0, o.text_length = 8, o.mlm_probability = 0, o.mix = {0, 1, 0};
  o.tokenizer = shapes_tokenizer();
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{dir_ + "/p.tsv"}, SampleKind::TEXT,
                                               TextFields{{"a", "b"}, "label", {}});
  Loader loader({nullptr, source, nullptr}, o);
  const Batch b = loader.build(SampleKind::TEXT, 0);
  for (int64_t row = 0; row < 2; ++row) {
    const int64_t label = b.labels[row].item<int64_t>();
    const std::vector<int64_t> ids(b.input_ids[row].data_ptr<int64_t>(), b.input_ids[row].data_ptr<int64_t>() + 8);
    const std::vector<int64_t> types(b.token_type_ids[row].data_ptr<int64_t>(),
                                     b.token_type_ids[row].data_ptr<int64_t>() + 8);
    if (label == 1) {
      EXPECT_EQ(ids, (std::vector<int64_t>{2, 5, 6, 3, 7, 8, 3, 0}));
      EXPECT_EQ(types, (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 0}));
    } else {
      EXPECT_EQ(ids, (std::vector<int64_t>{2, 9, 3, 5, 3, 0, 0, 0}));
      EXPECT_EQ(types, (std::vector<int64_t>{0, 0, 0, 1, 1, 0, 0, 0}));
    }
  }
  EXPECT_EQ(b.labels.sum().item<int64_t>(), 1);
  EXPECT_EQ(loader.stats().truncated, 0);
  // Shorter rows: the first pair loses 2 of its 4 tokens, the second 0 of 2; counted, or refused.
  o.text_length = 5;
  const Loader short_rows({nullptr, source, nullptr}, o);
  short_rows.build(SampleKind::TEXT, 0);
  EXPECT_EQ(short_rows.stats().truncated, 1);
  EXPECT_EQ(short_rows.stats().truncated_tokens, 2);
  EXPECT_EQ(short_rows.stats().skipped, 0);
  o.refuse_truncation = true;
  const Loader refusing({nullptr, source, nullptr}, o);
  expect_error<std::invalid_argument>([&] { refusing.build(SampleKind::TEXT, 0); },
                                      {"p.tsv:2", "2 tokens longer than the 5", "data.truncation: error"});
}

// Multi-label: each record's set of classes (a .jsonl array of names or ids) is a row of 0/1 per class in the batch,
// float32 whatever the model's dtype (binary cross-entropy's targets); a sample with none is a row of zeros.
TEST_F(DataTest, LabelSetsAreRowsOfOnesPerClass) {
  write_text(dir_ + "/m.jsonl", "{\"text\": \"red circle\", \"tags\": [\"round\", \"warm\"]}\n"
                                "{\"text\": \"blue square\", \"tags\": []}\n"
                                "{\"text\": \"green circle\", \"tags\": [0, \"round\"]}\n");
  TextFields fields{{"text"}, "tags", {"round", "warm", "cold"}};
  fields.multi_label = true;
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{dir_ + "/m.jsonl"}, SampleKind::TEXT, fields);
  EXPECT_EQ(*source->read(0).label_set, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(*source->read(2).label_set, (std::vector<int64_t>{0}));  // a class named twice is in the set once
  EXPECT_FALSE(source->read(0).label.has_value());
  LoaderOptions o;
  o.batch_size = 3, o.workers = 0, o.text_length = 8, o.mlm_probability = 0, o.mix = {0, 1, 0};
  o.tokenizer = shapes_tokenizer();
  const Batch b = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
  ASSERT_EQ(b.labels.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(b.labels.scalar_type(), at::kFloat);
  for (int64_t r = 0; r < 3; ++r) {
    at::Tensor want = at::zeros({3});
    const RawSample sample = source->read(b.sample_ids[static_cast<size_t>(r)]);
    for (int64_t id : *sample.label_set) want[id] = 1;
    EXPECT_TRUE(b.labels[r].equal(want)) << r;
  }
  EXPECT_EQ(b.to(at::kCPU, at::kBFloat16).labels.scalar_type(), at::kFloat);
}

// Token classification's batches: each word's class on its first token, -100 on its others, the special tokens and
// the padding; with label_all_tokens the others take it too (a B- class as its I- class); with pad_to_longest every
// (B, T) tensor ends at the batch's longest row, the rows unchanged before it.
TEST_F(DataTest, WordBatchesLabelFirstTokensAndPadToTheLongest) {
  write_text(dir_ + "/w.jsonl", "{\"tokens\": [\"red\", \"circles\"], \"tags\": [\"B-X\", \"I-X\"]}\n"
                                "{\"tokens\": [\"blue\"], \"tags\": [\"O\"]}\n");
  TextFields fields{{"tokens"}, "tags", {"O", "B-X", "I-X"}};
  fields.words = true;
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{dir_ + "/w.jsonl"}, SampleKind::TEXT, fields);
  EXPECT_EQ(source->read(0).words, (std::vector<std::string>{"red", "circles"}));
  EXPECT_EQ(source->read(0).word_labels, (std::vector<int64_t>{1, 2}));
  LoaderOptions o;
  o.batch_size = 2, o.workers = 0, o.text_length = 12, o.mlm_probability = 0, o.mix = {0, 1, 0};
  o.tokenizer = std::make_shared<WordPieceTokenizer>(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "circle", "##s", "blue"}, true);
  const std::vector<int64_t> circles = o.tokenizer->token_ids("circles");
  ASSERT_GT(circles.size(), 1u);  // a word of several tokens
  auto labels_of = [&](const Batch& b, int64_t sample) {  // the row of `sample`, as a vector
    const auto row = static_cast<int64_t>(std::find(b.sample_ids.begin(), b.sample_ids.end(), sample) -
                                          b.sample_ids.begin());
    const at::Tensor r = b.labels[row].contiguous();
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  };
  const Batch full = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
  ASSERT_EQ(full.labels.sizes(), (std::vector<int64_t>{2, 12}));
  std::vector<int64_t> want(12, -100);
  want[1] = 1, want[2] = 2;  // [CLS] red circles... [SEP]: the first token of each word
  EXPECT_EQ(labels_of(full, 0), want);
  o.label_all_tokens = true;
  const Batch all = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
  for (size_t k = 1; k < circles.size(); ++k) want[2 + k] = 2;  // I-X on the rest of "circles"
  EXPECT_EQ(labels_of(all, 0), want);
  o.label_all_tokens = false, o.pad_to_longest = true;
  const Batch cut = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
  const int64_t longest = 3 + static_cast<int64_t>(circles.size());  // [CLS] red circles.. [SEP]
  for (const at::Tensor* t : {&cut.input_ids, &cut.attention_mask, &cut.sequence_ids, &cut.labels}) {
    EXPECT_EQ(t->sizes(), (std::vector<int64_t>{2, longest}));
  }
  EXPECT_TRUE(cut.input_ids.equal(full.input_ids.narrow(1, 0, longest)));
  EXPECT_TRUE(cut.labels.equal(full.labels.narrow(1, 0, longest)));
  EXPECT_EQ(full.attention_mask.narrow(1, longest, 12 - longest).sum().item<int64_t>(), 0);
}

// A regression's labels (TextFields::scores, GLUE STS-B's similarity): decimal scores as float32 labels (B), any
// decimal form; a label that is no number is the sample's error, as a class that does not exist is.
TEST_F(DataTest, ScoresAreFloatLabels) {
  write_text(dir_ + "/s.tsv", "a\tb\tscore\nred\tblue\t3.8\ngreen\tred\t4\nred\tred\t-1e-1\nblue\tred\thigh\n");
  TextFields fields{{"a", "b"}, "score", {}};
  fields.scores = true;
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{dir_ + "/s.tsv"}, SampleKind::TEXT, fields);
  EXPECT_DOUBLE_EQ(*source->read(0).score, 3.8);
  EXPECT_DOUBLE_EQ(*source->read(2).score, -0.1);
  EXPECT_FALSE(source->read(0).label.has_value());
  expect_error<std::runtime_error>([&] { source->read(3); }, {"s.tsv:", "label 'high' is not a number"});
  for (const std::string bad : {"", " 1", "1 ", "nan", "inf", "1e999", "0x10", "3.8.1", "-"}) {
    EXPECT_FALSE(score_of(bad).has_value()) << bad;
  }
  EXPECT_EQ(score_of("+2.5E1"), 25.0);
  LoaderOptions o;
  o.batch_size = 3, o.workers = 0, o.text_length = 8, o.mlm_probability = 0, o.mix = {0, 1, 0};
  o.tokenizer = shapes_tokenizer();
  const Batch b = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
  ASSERT_TRUE(b.labels.defined());
  EXPECT_EQ(b.labels.scalar_type(), at::kFloat);
  EXPECT_EQ(b.labels.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(b.to(at::kCPU, at::kBFloat16).labels.scalar_type(), at::kFloat);  // scores stay float32
}

// data.packing: every text encoded whole ([CLS] .. [SEP] here), end to end in file order, in blocks of
// text_length: a text longer than a block spans blocks (nothing truncated), a damaged line is left out and counted,
// the blocks are the same at any number of threads and when read by encoding again. The loader's rows are the
// blocks, every block once an epoch across ranks, and resumed batches are the same batches.
TEST_F(DataTest, PackedTextsAreTheWholeTextsInBlocks) {
  std::string lines;
  for (int i = 0; i < 9; ++i) {
    std::string text = "green";
    for (int w = 0; w < (i * 5) % 17; ++w) text += w % 2 ? " red" : " circle";  // 1 to 16 words
    lines += (i == 4 ? std::string("{\"text\": broken") : "{\"text\": \"" + text + "\"}") + "\n";
  }
  write_text(dir_ + "/t.jsonl", lines);
  const auto tokenizer = shapes_tokenizer();
  auto source = std::make_shared<const SampleSource>(std::vector<std::string>{dir_ + "/t.jsonl"}, SampleKind::TEXT);
  std::vector<int64_t> stream;
  for (int64_t d = 0; d < source->size(); ++d) {
    if (d == 4) continue;
    const std::vector<int64_t> ids = tokenizer->encode(source->read(d).text, kWholeText).ids;
    EXPECT_EQ(ids.size(), tokenizer->token_ids(source->read(d).text).size() + 2);  // whole, unpadded
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  PackedTexts::Options po;
  po.length = 8;
  const auto packed = std::make_shared<const PackedTexts>(source, tokenizer, po);
  EXPECT_EQ(packed->tokens(), static_cast<int64_t>(stream.size()));
  EXPECT_EQ(packed->blocks(), (packed->tokens() + 7) / 8);
  EXPECT_EQ(packed->skipped(), 1);
  ASSERT_EQ(packed->first_errors().size(), 1u);
  EXPECT_NE(packed->first_errors()[0].find("t.jsonl:5"), std::string::npos) << packed->first_errors()[0];
  EXPECT_NE(packed->describe().find(std::to_string(stream.size()) + " tokens of 9 documents in "),
            std::string::npos) << packed->describe();
  std::vector<int64_t> joined;
  for (int64_t i = 0; i < packed->blocks(); ++i) {
    const std::vector<int64_t> block = packed->block(i);
    EXPECT_EQ(static_cast<int64_t>(block.size()), i + 1 < packed->blocks() ? 8 : packed->tokens() - 8 * i);
    joined.insert(joined.end(), block.begin(), block.end());
  }
  EXPECT_EQ(joined, stream);
  // the same blocks counted on 3 threads, and read by encoding the documents again (a stream over keep_bytes)
  EXPECT_EQ(packed->where(), PackedTexts::Where::MEMORY);
  po.threads = 3;
  const PackedTexts threaded(source, tokenizer, po);
  po.keep_bytes = 4 * packed->tokens() - 4;  // one token short
  const PackedTexts encoded_again(source, tokenizer, po);
  EXPECT_EQ(encoded_again.where(), PackedTexts::Where::ENCODED_AGAIN);
  EXPECT_NE(encoded_again.describe().find("encoded again per block"), std::string::npos) << encoded_again.describe();
  for (int64_t i = 0; i < packed->blocks(); ++i) {
    EXPECT_EQ(threaded.block(i), packed->block(i)) << i;
    EXPECT_EQ(encoded_again.block(i), packed->block(i)) << i;
  }
  po.append_eos = true;  // BERT's WordPiece ends texts in [SEP] and has no end of text to put between them
  expect_error<std::invalid_argument>([&] { PackedTexts(source, tokenizer, po); },
                                      {"data.packing_eos", "has no end-of-text token"});
  expect_error<std::out_of_range>([&] { packed->block(packed->blocks()); }, {"block " + std::to_string(
                                                                                  packed->blocks())});

  LoaderOptions o;
  o.batch_size = 2, o.workers = 0, o.text_length = 8, o.mlm_probability = 0, o.mix = {0, 1, 0};
  o.tokenizer = tokenizer, o.packed = packed;
  for (int64_t world = 1; world <= 3; ++world) {
    std::multiset<int64_t> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      o.rank = rank, o.world = world;
      const Loader loader({nullptr, source, nullptr}, o);
      for (int64_t start = 0; start < packed->blocks(); start += world * o.batch_size) {
        const Batch b = loader.build(SampleKind::TEXT, start);
        ASSERT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{2, 8}));
        for (int64_t r = 0; r < 2; ++r) {
          const int64_t block = b.sample_ids[static_cast<size_t>(r)];
          if (start + rank * 2 + r < packed->blocks()) seen.insert(block);
          const auto ids = packed->block(block);
          const auto n = static_cast<int64_t>(ids.size());
          EXPECT_TRUE(b.input_ids[r].slice(0, 0, n).equal(at::tensor(ids)));
          EXPECT_EQ(b.attention_mask[r].sum().item<int64_t>(), n);
          EXPECT_TRUE(b.sequence_ids[r].equal(b.attention_mask[r] - 1));  // 0 on every token, -1 on padding
        }
        EXPECT_EQ(loader.stats().truncated, 0);
      }
    }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), packed->blocks()) << "world " << world;
    for (int64_t i = 0; i < packed->blocks(); ++i) EXPECT_EQ(seen.count(i), 1u) << i << " world " << world;
  }
  o.rank = 0, o.world = 1;
  Loader loader({nullptr, source, nullptr}, o);
  loader.next_step();
  const LoaderState state = loader.state();
  const auto second = loader.next_step();
  Loader resumed({nullptr, source, nullptr}, o, state);
  EXPECT_TRUE(resumed.next_step()[0].input_ids.equal(second[0].input_ids));
  o.text_length = 9;
  expect_error<std::invalid_argument>([&] { Loader({nullptr, source, nullptr}, o); },
                                      {"packed blocks of 8 tokens need", "text_length 9"});
}

// data.cache_dir: the packed stream is a file named by the texts' files and the tokenizer. The first start counts
// into it; later ones (any block length) read it, the same blocks; a process that finds another counting waits on
// the lock, showing the other's progress, then reads its file; of two starting at once one counts. A changed text
// file or another tokenizer names another file; a damaged file is replaced, an impossible id in it is refused by
// name; a directory that cannot be made leaves the stream in memory, said in the start-up line.
TEST_F(DataTest, PackedTextsAreCachedForLaterStarts) {
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    lines += std::string(i % 3 ? "green red" : "Blue square circle") + (i % 7 ? "" : " red") + "\n";
  }
  write_text(dir_ + "/t.txt", lines);
  const auto tokenizer = shapes_tokenizer();
  auto source = std::make_shared<const SampleSource>(std::vector<std::string>{dir_ + "/t.txt"}, SampleKind::TEXT);
  PackedTexts::Options po;
  po.length = 8;
  const PackedTexts reference(source, tokenizer, po);  // no cache
  auto blocks_of = [](const PackedTexts& p) {
    std::vector<int64_t> joined;
    for (int64_t i = 0; i < p.blocks(); ++i) {
      const std::vector<int64_t> block = p.block(i);
      joined.insert(joined.end(), block.begin(), block.end());
    }
    return joined;
  };
  const std::vector<int64_t> stream = blocks_of(reference);
  po.cache_dir = dir_ + "/cache";
  const PackedTexts first(source, tokenizer, po);
  EXPECT_EQ(first.where(), PackedTexts::Where::CACHE_FILE);
  EXPECT_TRUE(first.counted());
  const std::string path = first.cache_file();
  EXPECT_EQ(path.rfind(dir_ + "/cache/packed-", 0), 0u) << path;
  EXPECT_EQ(first.tokens(), reference.tokens());
  EXPECT_GT(io::file_size(path), 4 * first.tokens());  // the ids, then the key and the trailer
  EXPECT_NE(first.describe().find("cached in " + path + " ("), std::string::npos) << first.describe();
  EXPECT_NE(first.describe().find("counted now"), std::string::npos) << first.describe();
  EXPECT_EQ(blocks_of(first), stream);
  po.length = 5;
  const PackedTexts later(source, tokenizer, po);
  EXPECT_FALSE(later.counted());
  EXPECT_EQ(later.cache_file(), path);
  EXPECT_EQ(later.documents(), 40);
  EXPECT_EQ(later.blocks(), (reference.tokens() + 4) / 5);
  EXPECT_EQ(blocks_of(later), stream);
  EXPECT_NE(later.describe().find("counted by an earlier start"), std::string::npos) << later.describe();
  po.length = 8;

  // another process counting: this one waits, shows its progress, then reads its file
  const std::vector<char> bytes = io::read_file(path);
  io::remove_tree(path);
  {
    auto other = std::make_unique<io::FileLock>(path + ".lock");
    ASSERT_TRUE(other->try_lock());
    other->write_note("5 40");
    std::mutex mutex;
    std::vector<std::pair<int64_t, int64_t>> shown;
    std::atomic<bool> finished{false};
    std::unique_ptr<PackedTexts> waited;
    PackedTexts::Options wo = po;
    wo.progress = [&](int64_t done, int64_t total) {
      std::lock_guard<std::mutex> lock(mutex);
      shown.emplace_back(done, total);
    };
    std::thread waiter([&] {
      waited = std::make_unique<PackedTexts>(source, tokenizer, wo);
      finished = true;
    });
    // Wait for the waiter to show the other process's progress (bounded: 60 s), then it must still be waiting.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!shown.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_FALSE(finished);
    io::write_file_atomic(path, bytes);  // the other process's file, then its lock released
    {
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_FALSE(shown.empty());
      if (!shown.empty()) EXPECT_EQ(shown[0], std::make_pair(int64_t{5}, int64_t{40}));
    }
    other.reset();
    waiter.join();
    ASSERT_TRUE(waited);
    EXPECT_FALSE(waited->counted());
    EXPECT_EQ(blocks_of(*waited), stream);
  }
  // two starting at once: one counts, the other reads what it wrote
  io::remove_tree(path);
  std::unique_ptr<PackedTexts> a, b;
  std::thread ta([&] { a = std::make_unique<PackedTexts>(source, tokenizer, po); });
  std::thread tb([&] { b = std::make_unique<PackedTexts>(source, tokenizer, po); });
  ta.join(), tb.join();
  EXPECT_EQ(int{a->counted()} + int{b->counted()}, 1);
  EXPECT_EQ(blocks_of(*a), stream);
  EXPECT_EQ(blocks_of(*b), stream);

  // a truncated file is counted again and replaced, whole
  io::write_file_atomic(path, std::vector<char>(bytes.begin(), bytes.end() - 1));
  const PackedTexts replaced(source, tokenizer, po);
  EXPECT_TRUE(replaced.counted());
  EXPECT_NE(replaced.describe().find("replaced " + path), std::string::npos) << replaced.describe();
  EXPECT_EQ(io::read_file(path), bytes);
  // an id the tokenizer cannot have (the file damaged in place) stops the block that holds it
  std::vector<char> damaged = bytes;
  damaged[4 * 9] = 100;  // token 9: block 1
  io::write_file_atomic(path, damaged);
  const PackedTexts bad(source, tokenizer, po);
  EXPECT_NO_THROW(bad.block(0));
  expect_error<std::runtime_error>([&] { bad.block(1); }, {path, "token 9 is id 100", "damaged"});

  // other texts, another tokenizer: other files
  write_text(dir_ + "/t.txt", lines + "circle\n");
  auto changed = std::make_shared<const SampleSource>(std::vector<std::string>{dir_ + "/t.txt"}, SampleKind::TEXT);
  const PackedTexts recounted(changed, tokenizer, po);
  EXPECT_TRUE(recounted.counted());
  EXPECT_NE(recounted.cache_file(), path);
  EXPECT_EQ(recounted.documents(), 41);
  const auto cased = std::make_shared<WordPieceTokenizer>(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "circle", "blue", "square",
                               "green"},
      false);
  EXPECT_NE(cased->fingerprint(), tokenizer->fingerprint());
  EXPECT_EQ(shapes_tokenizer()->fingerprint(), tokenizer->fingerprint());
  const PackedTexts other_tokenizer(changed, cased, po);
  EXPECT_TRUE(other_tokenizer.counted());
  EXPECT_NE(other_tokenizer.cache_file(), recounted.cache_file());
  EXPECT_NE(blocks_of(other_tokenizer), blocks_of(recounted));  // "Blue" is [UNK] when cased

  // a cache directory that cannot be made: counted into memory, said so
  po.cache_dir = dir_ + "/t.txt/cache";
  const PackedTexts uncached(changed, tokenizer, po);
  EXPECT_EQ(uncached.where(), PackedTexts::Where::MEMORY);
  EXPECT_NE(uncached.describe().find("not cached ("), std::string::npos) << uncached.describe();
  EXPECT_EQ(blocks_of(uncached), blocks_of(recounted));
}

// A cache directory on a full disk (a 64 KiB tmpfs; needs root to mount) under a stream of 100 kB: the counting
// goes on into memory, the start-up line gives the system's reason, and no part of a file is left there.
TEST_F(DataTest, PackedTextsGoOnWithoutTheCacheOnAFullDisk) {
  const std::string mnt = dir_ + "/full";
  const testing::SmallDisk disk(mnt, "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  std::string lines;
  for (int i = 0; i < 5000; ++i) lines += "green red circle\n";  // 5 tokens a line with [CLS] and [SEP]
  write_text(dir_ + "/t.txt", lines);
  auto source = std::make_shared<const SampleSource>(std::vector<std::string>{dir_ + "/t.txt"}, SampleKind::TEXT);
  PackedTexts::Options po;
  po.length = 64, po.cache_dir = mnt + "/cache";
  const PackedTexts packed(source, shapes_tokenizer(), po);
  EXPECT_EQ(packed.tokens(), 25000);
  EXPECT_EQ(packed.where(), PackedTexts::Where::MEMORY);
  EXPECT_NE(packed.describe().find("not cached ("), std::string::npos) << packed.describe();
  EXPECT_NE(packed.describe().find("No space left on device"), std::string::npos) << packed.describe();
  std::vector<int64_t> stream;
  for (int i = 0; i < 5000; ++i) stream.insert(stream.end(), {2, 9, 5, 6, 3});  // [CLS] green red circle [SEP]
  EXPECT_EQ(packed.block(0), std::vector<int64_t>(stream.begin(), stream.begin() + 64));
  EXPECT_EQ(packed.block(390), std::vector<int64_t>(stream.begin() + 390 * 64, stream.end()));  // the last 40
  for (const std::string& name : io::list_directory(mnt + "/cache")) {
    EXPECT_NE(name.find(".lock"), std::string::npos) << name << ": a part of the stream's file was left";
  }
}

// Every rank's positions over one epoch: each sample exactly once, for world sizes 1-4 and sizes that do not
// divide evenly; the order depends on seed and epoch only.
// A classifier's classes from text records without a ClassLabel, as run_glue and run_ner collect them: sorted,
// whole numbers by value; numbers not all whole are a regression's scores; .jsonl arrays are sets; CoNLL tags from
// the last column; tables and unparsable lines add nothing.
TEST(LabelValues, DistinctSortedAsTransformersCollectThem) {
  const std::string dir = "/tmp/shardtrain_label_values_" + std::to_string(::getpid());
  io::make_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string tsv = write("a.tsv", "text\tlabel\nx\tpos\ny\tneg\nz\tpos\nbroken line\n");
  const std::string jsonl =
      write("b.jsonl", "{\"text\": \"u\", \"label\": \"neutral\"}\nnot json\n{\"text\": \"v\"}\n");
  LabelValues v = label_values({tsv, jsonl}, "label", false, false);
  EXPECT_EQ(v.names, (std::vector<std::string>{"neg", "neutral", "pos"}));
  EXPECT_FALSE(v.scores);
  EXPECT_FALSE(v.lists);
  v = label_values({write("ids.tsv", "text\tlabel\na\t10\nb\t2\nc\t0\n")}, "label", false, false);
  EXPECT_EQ(v.names, (std::vector<std::string>{"0", "2", "10"}));  // by value, not "0", "10", "2"
  v = label_values({write("s.tsv", "text\tscore\na\t3.8\nb\t4\n")}, "score", false, false);
  EXPECT_TRUE(v.scores);
  EXPECT_TRUE(v.names.empty());
  v = label_values({write("m.jsonl", "{\"t\": \"a\", \"labels\": [\"joy\", \"anger\"]}\n{\"labels\": []}\n")},
                   "labels", false, false);
  EXPECT_EQ(v.names, (std::vector<std::string>{"anger", "joy"}));
  EXPECT_TRUE(v.lists);
  v = label_values({write("m.tsv", "text\tlabels\na\t2, 15\nb\t\n")}, "labels", true, false);
  EXPECT_EQ(v.names, (std::vector<std::string>{"2", "15"}));
  const std::string conll = write("eng.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-ORG\nrejects VBZ O\n\nlonely\n"
                                             "Peter\tB-PER\n");
  v = label_values({conll}, "ner_tags", false, true);
  EXPECT_EQ(v.names, (std::vector<std::string>{"B-ORG", "B-PER", "O"}));
  EXPECT_TRUE(label_values({conll}, "label", false, false).names.empty());  // a .txt of texts holds no labels
  io::remove_tree(dir);
}

TEST(Sampler, EveryEpochCoversEverySampleOnceAcrossRanks) {
  for (int64_t n : {1, 7, 64, 101}) {
    for (int64_t world = 1; world <= 4; ++world) {
      for (int64_t batch : {1, 3, 8}) {
        EpochSampler sampler(n, 42);
        std::map<int64_t, std::multiset<int64_t>> seen_by_epoch;
        const int64_t steps = (3 * n + world * batch - 1) / (world * batch);  // three epochs at least
        for (int64_t step = 0; step < steps; ++step) {
          for (int64_t rank = 0; rank < world; ++rank) {
            for (int64_t p : EpochSampler::rank_positions(step * world * batch, rank, batch)) {
              seen_by_epoch[p / n].insert(sampler.sample_at(p));
            }
          }
        }
        for (int64_t epoch = 0; epoch < 3; ++epoch) {
          const auto& seen = seen_by_epoch[epoch];
          ASSERT_EQ(static_cast<int64_t>(seen.size()), n) << "n " << n << " world " << world << " batch " << batch;
          for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen.count(i), 1u) << "sample " << i << " epoch " << epoch;
        }
      }
    }
  }
  EXPECT_EQ(epoch_permutation(50, 1, 0), epoch_permutation(50, 1, 0));
  EXPECT_NE(epoch_permutation(50, 1, 0), epoch_permutation(50, 1, 1));
  EXPECT_NE(epoch_permutation(50, 1, 0), epoch_permutation(50, 2, 0));
}

TEST(Masking, MlmAndBlockMasks) {
  std::mt19937_64 rng(3);
  std::vector<int64_t> ids(2000, 50);
  ids[0] = 2, ids[1999] = 3;
  const MlmMask m = mlm_mask(ids, {2, 3, 0}, /*mask_id=*/4, /*vocab_size=*/100, 0.15, rng);
  int64_t chosen = 0, masked = 0, kept = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (m.labels[i] == -100) {
      EXPECT_EQ(m.masked_ids[i], ids[i]);
      continue;
    }
    ++chosen;
    EXPECT_EQ(m.labels[i], 50);
    masked += m.masked_ids[i] == 4;
    kept += m.masked_ids[i] == 50;
  }
  EXPECT_EQ(m.labels[0], -100);  // specials are never chosen
  EXPECT_EQ(m.labels[1999], -100);
  EXPECT_NEAR(chosen / 2000.0, 0.15, 0.03);
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.07);
  EXPECT_GT(kept, 0);

  for (int64_t grid : {4, 14}) {
    const auto mask = block_mask(grid, grid, 0.4, grid == 14 ? 16 : 1, rng);
    int64_t count = 0;
    for (auto v : mask) count += v;
    EXPECT_GT(count, 0);
    EXPECT_LE(count, std::llround(0.4 * grid * grid));
  }
}

TEST(Images, DecodeResizeNormalize) {
  const Image red = solid(10, 255, 0, 0);
  const Image back = decode_image(encode_png(red));
  EXPECT_EQ(back.rgb, red.rgb);
  const Image small = resize(back, 4, 4);
  EXPECT_EQ(small.width, 4);
  EXPECT_EQ(small.rgb[0], 255);
  const at::Tensor t = to_normalized_tensor(small, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5});
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 4, 4}));
  EXPECT_NEAR(t[0].mean().item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(t[1].mean().item<double>(), -1.0, 1e-6);
  EXPECT_NEAR(to_codebook_tensor(small)[0][0][0].item<double>(), 0.9, 1e-6);
  expect_error<DecodeError>([] { decode_image("not an image at all"); }, {"cannot decode image"});
  const std::string png = encode_png(red);
  expect_error<DecodeError>([&] { decode_image(png.substr(0, png.size() / 2)); }, {"cannot decode image"});
}

// A decompression bomb is refused from its header: the pixels are never allocated.
// Found by fuzz_image: a GIF whose header says 1544 x 0 decoded "successfully" into an image without pixels, which
// later steps refused with another exception. Now it is undecodable like any damaged image.
TEST(Images, AGifWithZeroRowsIsUndecodable) {
  const unsigned char gif[] = {0x47, 0x49, 0x46, 0x38, 0x37, 0x61, 0x08, 0x06, 0x00, 0x00, 0x81, 0x00, 0x00, 0xc8, 0x1e, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x2c, 0x06};
  try {
    decode_image(std::string(reinterpret_cast<const char*>(gif), sizeof(gif)));
    FAIL() << "decoded";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("has no pixels"), std::string::npos) << e.what();
  }
}

TEST(Images, AboveThePixelLimitIsNotDecoded) {
  Image image;
  image.width = 40, image.height = 30;
  image.rgb.assign(40 * 30 * 3, 7);
  for (const std::string& file : {encode_png(image), encode_jpeg(image)}) {
    testing::expect_error<DecodeError>([&] { decode_image(file, 1199); },
                                       {"image of 40x30 = 1200 pixels is above data.max_image_pixels (1199)"});
    EXPECT_EQ(decode_image(file, 1200).width, 40);
  }
  // A 16000 x 16000 PNG header (a few bytes of file) against the default limit: refused before decoding.
  std::string png = encode_png(image);
  auto put_be32 = [&](size_t at, uint32_t v) {
    for (int b = 0; b < 4; ++b) png[at + b] = static_cast<char>((v >> (24 - 8 * b)) & 0xff);
  };
  put_be32(16, 16000), put_be32(20, 16000);  // IHDR's width and height (its CRC is not checked by the header probe)
  testing::expect_error<DecodeError>([&] { decode_image(png); }, {"16000x16000 = 256000000 pixels"});
}

// A small image-text dataset with some corrupt samples, for the loader tests.
std::string make_pairs(const std::string& dir, int64_t count, const std::set<int64_t>& corrupt) {
  const std::string path = dir + "/pairs.tar";
  TarWriter tar(path);
  for (int64_t i = 0; i < count; ++i) {
    const std::string key = "k" + std::to_string(1000 + i);
    const std::string png = encode_png(solid(16, static_cast<uint8_t>(i * 7), 100, 200));
    tar.add(key + ".png", corrupt.count(i) ? png.substr(0, 40) : png);
    tar.add(key + ".txt", "a red circle number " + std::to_string(i));
  }
  tar.finish();
  return path;
}

LoaderOptions loader_options(int64_t workers) {
  LoaderOptions o;
  o.seed = 5;
  o.batch_size = 4;
  o.micro_batches = 2;
  o.workers = workers;
  o.tokenizer = std::make_shared<WordPieceTokenizer>(
      build_vocab({"a red circle number 0 1 2 3 4 5 6 7 8 9"}, VocabOptions{200, 1, true}), true);
  o.text_length = 12;
  o.image_size = 16, o.patch_size = 4, o.codebook_size = 8;
  return o;
}

TEST_F(DataTest, LoaderIsDeterministicAtAnyThreadCountAndResumes) {
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{make_pairs(dir_, 23, {})},
                                               SampleKind::IMAGE_TEXT);
  std::vector<std::vector<Batch>> reference;
  {
    Loader loader({source, nullptr, nullptr}, loader_options(0));
    for (int s = 0; s < 6; ++s) reference.push_back(loader.next_step());
  }
  for (int64_t workers : {1, 3}) {
    Loader loader({source, nullptr, nullptr}, loader_options(workers));
    for (int s = 0; s < 6; ++s) {
      const auto step = loader.next_step();
      ASSERT_EQ(step.size(), 2u);
      for (size_t m = 0; m < step.size(); ++m) {
        EXPECT_EQ(step[m].sample_ids, reference[s][m].sample_ids);
        EXPECT_TRUE(step[m].input_ids_masked.equal(reference[s][m].input_ids_masked));
        EXPECT_TRUE(step[m].masked_patches.equal(reference[s][m].masked_patches));
        EXPECT_TRUE(step[m].itm_labels.equal(reference[s][m].itm_labels));
        EXPECT_TRUE(step[m].pixels.equal(reference[s][m].pixels));
        EXPECT_EQ(step[m].step, s);
        EXPECT_EQ(step[m].micro, static_cast<int64_t>(m));
      }
    }
  }
  // Resumed from the state after step 2: the same batches as steps 3..5.
  LoaderState state;
  {
    Loader loader({source, nullptr, nullptr}, loader_options(2));
    for (int s = 0; s < 3; ++s) loader.next_step();
    state = loader.state();
  }
  EXPECT_EQ(state.step, 3);
  EXPECT_EQ(state.consumed[0], 3 * 2 * 4);
  Loader resumed({source, nullptr, nullptr}, loader_options(2), state);
  for (int s = 3; s < 6; ++s) {
    const auto step = resumed.next_step();
    for (size_t m = 0; m < step.size(); ++m) EXPECT_EQ(step[m].sample_ids, reference[s][m].sample_ids);
  }
}

TEST_F(DataTest, LoaderShapesAndItmNegatives) {
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{make_pairs(dir_, 40, {})},
                                               SampleKind::IMAGE_TEXT);
  LoaderOptions o = loader_options(1);
  o.batch_size = 40, o.micro_batches = 1;
  Loader loader({source, nullptr, nullptr}, o);
  const Batch b = loader.next_step()[0];
  EXPECT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{40, 12}));
  EXPECT_EQ(b.pixels.sizes(), (std::vector<int64_t>{40, 3, 16, 16}));
  EXPECT_EQ(b.codebook_pixels.sizes(), (std::vector<int64_t>{40, 3, 8, 8}));
  EXPECT_EQ(b.masked_patches.sizes(), (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(b.texts, 40);
  EXPECT_EQ(b.images, 40);
  const int64_t negatives = (b.itm_labels == 0).sum().item<int64_t>();
  EXPECT_GT(negatives, 8);
  EXPECT_LT(negatives, 32);
  // Every image is its own sample's; a negative's text is the text of a positive row of the same batch.
  for (int64_t i = 0; i < 40; ++i) {
    const double own_red = (b.sample_ids[static_cast<size_t>(i)] * 7 % 256) / 255.0;
    EXPECT_NEAR(b.codebook_pixels[i][0][0][0].item<double>(), own_red * 0.8 + 0.1, 1e-3) << "row " << i;
    if (b.itm_labels[i].item<int64_t>() == 1) continue;
    bool borrowed = false;
    for (int64_t j = 0; j < 40; ++j) {
      borrowed |= j != i && b.itm_labels[j].item<int64_t>() == 1 && b.input_ids[j].equal(b.input_ids[i]);
    }
    EXPECT_TRUE(borrowed) << "row " << i;
  }
}

TEST_F(DataTest, CorruptSamplesAreSkippedCountedAndReported) {
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{make_pairs(dir_, 30, {3, 4, 17})},
                                               SampleKind::IMAGE_TEXT);
  LoaderOptions o = loader_options(2);
  o.itm_negative_probability = 0;  // only the samples themselves are read
  std::mutex mutex;
  std::vector<std::string> warned;  // on_damaged: once per file, when first met
  o.on_damaged = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    warned.push_back(what);
  };
  Loader loader({source, nullptr, nullptr}, o);
  std::multiset<int64_t> seen;
  for (int s = 0; s < 4; ++s) {  // 4 steps x 2 micro-batches x 4 = 32 positions: one epoch and a bit
    for (const auto& b : loader.next_step()) {
      EXPECT_EQ(b.pixels.size(0), 4);  // the batch keeps its size
      for (auto id : b.sample_ids) seen.insert(id);
    }
  }
  for (int64_t bad : {3, 4, 17}) EXPECT_EQ(seen.count(bad), 0u) << bad;
  const LoaderStats stats = loader.stats();
  EXPECT_GE(stats.skipped, 3);
  ASSERT_FALSE(stats.first_errors.empty());
  EXPECT_NE(stats.first_errors[0].find("cannot decode image"), std::string::npos) << stats.first_errors[0];
  ASSERT_EQ(warned.size(), 1u);  // three damaged samples, one file
  EXPECT_EQ(warned[0].rfind(source->files()[0] + ":", 0), 0u) << warned[0];
  EXPECT_NE(warned[0].find("cannot decode image"), std::string::npos) << warned[0];
}

TEST_F(DataTest, SynthIsDeterministicAndDescribesItsImages) {
  SynthOptions o;
  o.out = dir_ + "/synth";
  o.image_text_samples = 30, o.text_samples = 10, o.image_samples = 10, o.eval_samples = 8;
  o.samples_per_shard = 16, o.image_size = 32;
  EXPECT_EQ(write_synth_dataset(o), 2 + 1 + 1 + 1 + 1);  // shards + vocab
  SampleSource pairs({o.out + "/image_text"}, SampleKind::IMAGE_TEXT);
  EXPECT_EQ(pairs.size(), 30);
  const SynthScene scene = render_scene(o.seed, 1, 5, 32);
  EXPECT_EQ(pairs.read(5).text, scene.caption);
  EXPECT_EQ(decode_image(pairs.read(5).image).rgb, scene.image.rgb);
  EXPECT_EQ(pairs.read(5).label, scene.label);
  EXPECT_EQ(SampleSource({o.out + "/eval"}, SampleKind::IMAGE_TEXT).size(), 8);
  EXPECT_EQ(SampleSource({o.out + "/text"}, SampleKind::TEXT).size(), 10);
  const auto vocab = load_vocab(o.out + "/vocab.txt");
  WordPieceTokenizer tok(vocab, true);
  for (int64_t i = 0; i < pairs.size(); ++i) {
    for (const auto& t : tok.tokenize(pairs.read(i).text)) EXPECT_NE(t, "[UNK]") << pairs.read(i).text;
  }
  // Again into the same directory, smaller: the earlier shards are gone, not read beside the new ones.
  o.image_text_samples = 5, o.text_samples = 0;
  EXPECT_EQ(write_synth_dataset(o), 1 + 1 + 1 + 1);
  EXPECT_EQ(SampleSource({o.out + "/image_text"}, SampleKind::IMAGE_TEXT).size(), 5);
  EXPECT_FALSE(io::path_exists(o.out + "/text"));
  // A directory holding anything else is not replaced: refused, naming what is there.
  io::write_file_atomic(o.out + "/notes.md", {'x'});
  expect_error<std::invalid_argument>([&] { write_synth_dataset(o); },
                                      {"'" + o.out + "' holds what data synth does not write (notes.md)"});
  EXPECT_TRUE(io::path_exists(o.out + "/vocab.txt"));
}

// --ner: captions as CoNLL-2003 sentences, each word tagged by what it says: size, colour and shape words an object
// (B-OBJ first, I-OBJ after; a size always opens one), a place word a location, the rest O; a quarter as many held out.
TEST_F(DataTest, SynthNerTagsTheCaptionsWords) {
  SynthOptions o;
  o.out = dir_ + "/synth";
  o.image_text_samples = o.text_samples = o.image_samples = o.eval_samples = 0;
  o.ner_samples = 40;
  EXPECT_EQ(write_synth_dataset(o), 2 + 1);
  for (const auto& [file, count, stream] : {std::tuple<std::string, int64_t, uint64_t>{"train.conll", 40, 9},
                                            {"valid.conll", 10, 10}}) {
    const std::vector<char> bytes = io::read_file(o.out + "/ner/" + file);
    const std::string text(bytes.begin(), bytes.end());
    ASSERT_EQ(text.rfind("-DOCSTART- -X- -X- O\n\n", 0), 0u);
    std::istringstream lines(text.substr(text.find("\n\n") + 2));
    std::string line, sentence, previous = "O";
    int64_t sentences = 0;
    while (std::getline(lines, line)) {
      if (line.empty()) {
        EXPECT_EQ(sentence, render_scene(o.seed, stream, sentences, 16).caption);
        ++sentences, sentence.clear(), previous = "O";
        continue;
      }
      std::istringstream fields(line);
      std::string word, pos, chunk, tag;
      fields >> word >> pos >> chunk >> tag;
      sentence += (sentence.empty() ? "" : " ") + word;
      const bool size = word == "small" || word == "large";
      const bool place = word == "left" || word == "right" || word == "top" || word == "bottom" || word == "middle";
      const bool shape = word.rfind("circle", 0) == 0 || word.rfind("square", 0) == 0 ||
                         word.rfind("triangle", 0) == 0 || word.rfind("diamond", 0) == 0 || word.rfind("cross", 0) == 0;
      if (size) EXPECT_EQ(tag, "B-OBJ") << line;
      if (shape) EXPECT_EQ(tag, "I-OBJ") << line;  // after its size and colour
      if (place) EXPECT_EQ(tag, "B-LOC") << line;
      if (!size && !shape && !place && tag != "O") EXPECT_EQ(tag, "I-OBJ") << line;  // a colour, inside an object
      if (tag == "I-OBJ") EXPECT_NE(previous, "O") << line;
      previous = tag;
    }
    EXPECT_EQ(sentences, count) << file;
  }
}

TEST(Vocab, BuildsWordPiecesThatCoverTheCorpus) {
  const std::vector<std::string> corpus = {"the runner runs", "running runners run", "a rerun", "Runs!"};
  VocabOptions o;
  o.size = 40;
  o.min_frequency = 1;
  const auto vocab = build_vocab(corpus, o);
  EXPECT_LE(static_cast<int64_t>(vocab.size()), 40);
  EXPECT_EQ(std::vector<std::string>(vocab.begin(), vocab.begin() + 5),
            (std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}));
  WordPieceTokenizer tok(vocab, true);
  for (const auto& text : corpus) {
    for (const auto& t : tok.tokenize(text)) EXPECT_NE(t, "[UNK]") << text;
  }
  EXPECT_EQ(build_vocab(corpus, o), vocab);  // deterministic
  // Frequent words become single tokens.
  VocabOptions big = o;
  big.size = 200;
  WordPieceTokenizer whole(build_vocab(corpus, big), true);
  EXPECT_EQ(whole.tokenize("runs"), std::vector<std::string>{"runs"});
}

}  // namespace
}  // namespace shardtrain::data
