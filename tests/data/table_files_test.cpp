// Hugging Face datasets' Arrow and Parquet files as sample sources, against what datasets and pyarrow wrote:
// tests/reference/datasets_reference.py writes save_to_disk directories, load_dataset's cache, datasets' own
// ArrowWriter in small record batches, Image columns (embedded bytes and paths), pyarrow's file and legacy stream
// formats, a dictionary-encoded and a compressed file; Parquet as a Hub repository holds it and as pyarrow writes
// it with every compression, page version and dictionary setting; damaged files. expected.json says, per case,
// what each row must read as (or the error reading it gives) or which error opening the files must give; every case
// is read again with a table cache, its Parquet files from their Arrow copies.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <ATen/ATen.h>

#include "data/formats/table_files.h"
#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/data/pipeline/packed_texts.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/pipeline/table_records.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/files.h"
#include "support/expect_error.h"
#include "support/scratch.h"

namespace shardtrain::data {
namespace {

std::string reference_dir() {
  const char* dir = std::getenv("SHARDTRAIN_DATASETS_REFERENCE");
  return dir ? dir : "build/hf_reference/datasets";
}

nlohmann::json cases() {
  std::ifstream in(reference_dir() + "/expected.json");
  if (!in) {
    throw std::runtime_error("no " + reference_dir() + "/expected.json (run the data.datasets_reference fixture)");
  }
  return nlohmann::json::parse(in);
}

SampleKind kind_of(const std::string& name) {
  if (name == "text") return SampleKind::TEXT;
  if (name == "image") return SampleKind::IMAGE;
  return SampleKind::IMAGE_TEXT;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

std::unique_ptr<SampleSource> open_case(const nlohmann::json& c, const std::string& table_cache = "") {
  TextFields fields;
  if (c.contains("text")) fields.text = c.at("text").get<std::vector<std::string>>();
  if (c.contains("label")) fields.label = c.at("label").get<std::string>();
  if (c.contains("classes")) fields.classes = c.at("classes").get<std::vector<std::string>>();
  fields.scores = c.value("scores", false);
  fields.multi_label = c.value("multi_label", false);
  fields.words = c.value("words", false);
  return std::make_unique<SampleSource>(c.at("paths").get<std::vector<std::string>>(),
                                        kind_of(c.at("kind").get<std::string>()), fields, table_cache);
}

// Every case, its files opened with `cache` as the table cache ("": Parquet read in place).
void every_row_reads_as_written(const std::string& cache) {
  int64_t rows = 0, refused = 0, copied = 0;
  const nlohmann::json all = cases();
  for (const auto& [name, c] : all.items()) {
    SCOPED_TRACE(name);
    if (c.contains("open_error")) {
      const std::string needle = c.at("open_error");
      try {
        open_case(c, cache);
        ADD_FAILURE() << "opened, expected an error containing \"" << needle << "\"";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
      ++refused;
      continue;
    }
    const auto source = open_case(c, cache);
    for (const std::string& note : source->table_notes()) {
      EXPECT_NE(note.find("read from its Arrow copy"), std::string::npos) << note;
      ++copied;
    }
    const auto& want = c.at("rows");
    ASSERT_EQ(source->size(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("row " + std::to_string(i));
      const auto& w = want[i];
      if (w.contains("error")) {
        shardtrain::testing::expect_error<std::runtime_error>([&] { source->read(static_cast<int64_t>(i)); },
                                                              {w.at("error").get<std::string>()});
        continue;
      }
      const RawSample s = source->read(static_cast<int64_t>(i));
      if (w.contains("text")) EXPECT_EQ(s.text, w.at("text").get<std::string>());
      if (w.contains("pair")) EXPECT_EQ(s.text_pair, w.at("pair").get<std::string>());
      if (w.contains("label")) {
        ASSERT_TRUE(s.label.has_value());
        EXPECT_EQ(*s.label, w.at("label").get<int64_t>());
      } else {
        EXPECT_FALSE(s.label.has_value());
      }
      if (w.contains("score")) {  // float16 and float32 columns hold the scores rounded: 3.8 as 3.80078 in half
        ASSERT_TRUE(s.score.has_value());
        const double x = w.at("score").get<double>();
        EXPECT_NEAR(*s.score, x, 1e-3 * std::max(1.0, std::abs(x)));
      } else {
        EXPECT_FALSE(s.score.has_value());
      }
      if (w.contains("label_set")) {
        ASSERT_TRUE(s.label_set.has_value());
        EXPECT_EQ(*s.label_set, w.at("label_set").get<std::vector<int64_t>>());
      } else {
        EXPECT_FALSE(s.label_set.has_value());
      }
      EXPECT_EQ(s.words, w.value("words", std::vector<std::string>{}));
      EXPECT_EQ(s.word_labels, w.value("word_labels", std::vector<int64_t>{}));
      if (w.contains("image")) EXPECT_EQ(hex(s.image), w.at("image").get<std::string>());
      EXPECT_EQ(s.tokenized, w.contains("ids"));
      if (w.contains("ids")) EXPECT_EQ(s.input_ids, w.at("ids").get<std::vector<int64_t>>());
      EXPECT_EQ(s.token_type_ids, w.value("types", std::vector<int64_t>{}));
      EXPECT_EQ(s.pair_ids, w.value("pair_ids", std::vector<int64_t>{}));
      ++rows;
    }
  }
  EXPECT_GT(rows, 250);
  EXPECT_GT(refused, 12);
  if (cache.empty()) EXPECT_EQ(copied, 0);
  else EXPECT_GT(copied, 30);
}

TEST(DatasetFiles, EveryRowReadsAsDatasetsWroteIt) { every_row_reads_as_written(""); }

TEST(DatasetFiles, EveryRowReadsAsDatasetsWroteItFromParquetsArrowCopies) {
  const testing::TempDir copies;
  every_row_reads_as_written(copies.path);
}

// No room for the copy: the file is read in place, saying why, and nothing half-written is left.
TEST(DatasetFiles, AParquetFileIsReadInPlaceWhenItsCopyFindsNoRoom) {
  const testing::TempDir dir;
  const std::string mnt = dir.path + "/full";
  const testing::SmallDisk disk(mnt, "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  {
    std::ofstream fill(mnt + "/fill", std::ios::binary);
    const std::string block(4096, 'x');
    for (int i = 0; i < 32 && fill; ++i) fill << block << std::flush;  // stops at the 64 KiB the mount holds
  }
  const SampleSource source({reference_dir() + "/parquet_snappy_v2_dict.parquet"}, SampleKind::TEXT, {},
                            mnt + "/cache");
  ASSERT_EQ(source.table_notes().size(), 1u);
  EXPECT_NE(source.table_notes()[0].find("No space left on device"), std::string::npos) << source.table_notes()[0];
  EXPECT_NE(source.table_notes()[0].find("; read in place"), std::string::npos) << source.table_notes()[0];
  EXPECT_EQ(source.read(0).text, "r0 ");
  for (const std::string& name : io::list_directory(mnt + "/cache/tables")) {
    EXPECT_NE(name.substr(name.size() - 5), "arrow") << name;  // the lock file alone
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
  }
}

// A Parquet file's Arrow copy is made once, read as the file reads, and follows its source: a changed source gets a
// new copy (the old one listed as stale), a damaged copy is made again, a file Arrow cannot read has none.
TEST(DatasetFiles, ParquetCopiesAreMadeOnceAndFollowTheirSource) {
  const testing::TempDir dir;
  const std::string source = dir.path + "/train.parquet", cache = dir.path + "/cache";
  std::filesystem::copy_file(reference_dir() + "/parquet_snappy_v2_dict.parquet", source);
  const std::string copy = parquet_arrow_copy(source, cache);
  EXPECT_EQ(copy.rfind(cache + "/tables/train-", 0), 0u) << copy;
  const auto made = std::filesystem::last_write_time(copy);
  EXPECT_EQ(parquet_arrow_copy(source, cache), copy);
  EXPECT_EQ(std::filesystem::last_write_time(copy), made);  // found, not made again

  const auto check_values = [&](const std::string& arrow_file) {
    const io::FileBytes original = io::file_bytes(source), copied = io::file_bytes(arrow_file);
    const auto p = open_parquet(std::string_view(original.data(), original.size()), "p");
    const auto a = open_arrow_ipc(std::string_view(copied.data(), copied.size()), "a");
    ASSERT_EQ(a->rows(), p->rows());
    const int text = p->column("text"), small = p->column("small");
    ASSERT_EQ(a->column("text"), text);
    for (int64_t row = 0; row < p->rows(); ++row) {
      EXPECT_EQ(a->is_null(text, row), p->is_null(text, row)) << row;
      EXPECT_EQ(a->bytes(text, row), p->bytes(text, row)) << row;
      EXPECT_EQ(a->integer(small, row), p->integer(small, row)) << row;
      EXPECT_EQ(a->integers(p->column("tokens"), row), p->integers(p->column("tokens"), row)) << row;
    }
    EXPECT_EQ(a->metadata("huggingface"), p->metadata("huggingface"));
  };
  check_values(copy);

  std::vector<TableCopy> listed = table_copies(cache);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].whole);
  EXPECT_TRUE(listed[0].current);
  EXPECT_EQ(listed[0].source, std::filesystem::canonical(source).string());

  // The source replaced by another file: a new copy; the first is stale.
  std::filesystem::copy_file(reference_dir() + "/parquet_zstd_v1.parquet", source,
                             std::filesystem::copy_options::overwrite_existing);
  const std::string second = parquet_arrow_copy(source, cache);
  EXPECT_NE(second, copy);
  check_values(second);
  listed = table_copies(cache);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].current + listed[1].current, 1);

  // A copy cut short is no copy: listed as damaged, made again.
  std::filesystem::resize_file(second, std::filesystem::file_size(second) / 2);
  listed = table_copies(cache);
  EXPECT_EQ(listed[0].whole + listed[1].whole, 1);
  EXPECT_EQ(parquet_arrow_copy(source, cache), second);
  check_values(second);

  // Not Parquet: no copy, an error naming the file (open_table_file then reads it in place, and refuses it).
  const std::string text = dir.path + "/notes.parquet";
  std::ofstream(text) << "text,label\nhello,1\n";
  shardtrain::testing::expect_error<std::runtime_error>([&] { parquet_arrow_copy(text, cache); },
                                                        {text + ": not a Parquet file"});
  const TableFile in_place = open_table_file(reference_dir() + "/parquet_snappy_v2_dict.parquet", "");
  EXPECT_EQ(in_place.note, "");
}

// A tokenized dataset's rows as batches: the ids datasets holds (max_length's padding, right or left, left out and
// the row padded again to the loader's length) with their token types; a row longer than text_length cut and
// counted, or refused under data.truncation: error; rows whole and end to end when packed for causal LM.
TEST(DatasetFiles, TokenizedRowsAreTheBatchesTokens) {
  const nlohmann::json want = cases().at("tokenized").at("rows");
  const std::string dir = reference_dir() + "/tokenized";
  LoaderOptions o;
  o.batch_size = 6, o.workers = 0;
  o.mix = {0, 1, 0};  // text only
  o.tokenizer = open_tokenizer(dir + "/vocab.txt");
  auto row = [&](const Batch& b, int64_t r, const char* what) {
    return want[static_cast<size_t>(b.sample_ids[static_cast<size_t>(r)])].at(what).get<std::vector<int64_t>>();
  };
  for (const std::string name : {"plain", "padded", "left"}) {
    SCOPED_TRACE(name);
    auto source = std::make_shared<SampleSource>(std::vector<std::string>{dir + "/" + name}, SampleKind::TEXT);
    EXPECT_EQ(source->tokenized(), "input_ids, token_type_ids, attention_mask");
    o.text_length = 20;
    const Batch b = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
    ASSERT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{6, 20}));
    ASSERT_TRUE(b.token_type_ids.defined());
    for (int64_t r = 0; r < 6; ++r) {
      const std::vector<int64_t> ids = row(b, r, "ids"), types = row(b, r, "types");
      const auto n = static_cast<int64_t>(ids.size());
      EXPECT_TRUE(b.input_ids[r].slice(0, 0, n).equal(at::tensor(ids))) << r;
      EXPECT_TRUE(b.token_type_ids[r].slice(0, 0, n).equal(at::tensor(types))) << r;
      EXPECT_EQ(b.attention_mask[r].sum().item<int64_t>(), n) << r;
      EXPECT_EQ(b.input_ids[r][n].item<int64_t>(), o.tokenizer->pad_id()) << r;
    }
  }
  auto source = std::make_shared<SampleSource>(std::vector<std::string>{dir + "/plain"}, SampleKind::TEXT);
  o.text_length = 8;
  Loader cut({nullptr, source, nullptr}, o);
  const Batch b = cut.build(SampleKind::TEXT, 0);
  int64_t longer = 0;
  for (int64_t r = 0; r < 6; ++r) {
    std::vector<int64_t> ids = row(b, r, "ids");
    longer += ids.size() > 8;
    ids.resize(std::min<size_t>(ids.size(), 8));
    EXPECT_TRUE(b.input_ids[r].slice(0, 0, static_cast<int64_t>(ids.size())).equal(at::tensor(ids))) << r;
  }
  EXPECT_GT(longer, 0);
  EXPECT_EQ(cut.stats().truncated, longer);
  o.refuse_truncation = true;
  EXPECT_THROW(Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0), std::invalid_argument);
  // Packed: every row's ids whole, end to end in the table's order, in blocks of 8; the batch's rows are blocks.
  o.refuse_truncation = false;
  PackedTexts::Options po;
  po.length = 8;
  o.packed = std::make_shared<const PackedTexts>(source, o.tokenizer, po);
  std::vector<int64_t> stream, blocks;
  for (const auto& w : want) {
    const auto ids = w.at("ids").get<std::vector<int64_t>>();
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  for (int64_t i = 0; i < o.packed->blocks(); ++i) {
    const std::vector<int64_t> block = o.packed->block(i);
    blocks.insert(blocks.end(), block.begin(), block.end());
  }
  EXPECT_EQ(blocks, stream);
  const Batch packed = Loader({nullptr, source, nullptr}, o).build(SampleKind::TEXT, 0);
  ASSERT_EQ(packed.input_ids.sizes(), (std::vector<int64_t>{6, 8}));
  for (int64_t r = 0; r < 6; ++r) {
    const std::vector<int64_t> block = o.packed->block(packed.sample_ids[static_cast<size_t>(r)]);
    EXPECT_TRUE(packed.input_ids[r].slice(0, 0, static_cast<int64_t>(block.size())).equal(at::tensor(block))) << r;
  }
  // ids from another tokenizer's vocabulary stop the packing before the first step, naming the id
  const nlohmann::json foreign = cases().at("tokens_list");
  testing::expect_error<std::invalid_argument>([&] { PackedTexts(open_case(foreign), o.tokenizer, po); },
                                               {"list.arrow:4: token id 1099511627776 is outside the vocabulary"});
}

// data.packing against transformers' run_clm (tokenize_function, then group_texts): the same blocks of 16 from a
// save_to_disk dataset and from the same documents as a .txt, by a byte-level BPE without special tokens (GPT-2)
// and with <s> before each document (Llama); the stream whole, the remainder run_clm drops in a last short block.
TEST(DatasetFiles, PackedBlocksAreRunClmsGroupedTexts) {
  std::ifstream in(reference_dir() + "/clm/expected.json");
  ASSERT_TRUE(in);
  const nlohmann::json want = nlohmann::json::parse(in);
  const int64_t block_size = want.at("block_size").get<int64_t>();
  for (const std::string name : {"gpt2", "llama"}) {
    const auto tokenizer = open_tokenizer(want.at(name).at("tokenizer").get<std::string>());
    const auto blocks = want.at(name).at("blocks").get<std::vector<std::vector<int64_t>>>();
    const auto stream = want.at(name).at("stream").get<std::vector<int64_t>>();
    for (const std::string file : {"texts", "texts.txt"}) {
      SCOPED_TRACE(name + " " + file);
      auto source = std::make_shared<const SampleSource>(std::vector<std::string>{reference_dir() + "/clm/" + file},
                                                         SampleKind::TEXT);
      for (int64_t threads : {1, 3}) {
        PackedTexts::Options po;
        po.length = block_size, po.threads = threads;
        po.keep_bytes = threads == 1 ? po.keep_bytes : 0;  // 3 threads: blocks read by encoding the texts again
        const PackedTexts packed(source, tokenizer, po);
        EXPECT_EQ(packed.where() == PackedTexts::Where::MEMORY, threads == 1);
        EXPECT_EQ(packed.documents(), 60);
        EXPECT_EQ(packed.tokens(), static_cast<int64_t>(stream.size()));
        ASSERT_EQ(packed.blocks(), static_cast<int64_t>(blocks.size()) + 1);  // run_clm drops the remainder
        std::vector<int64_t> all;
        for (int64_t i = 0; i < packed.blocks(); ++i) {
          const std::vector<int64_t> block = packed.block(i);
          if (i < static_cast<int64_t>(blocks.size())) EXPECT_EQ(block, blocks[static_cast<size_t>(i)]) << i;
          all.insert(all.end(), block.begin(), block.end());
        }
        EXPECT_EQ(all, stream);
      }
      // data.packing_eos: the end of text after every document, as tokenizer(text) + [eos_token_id]
      PackedTexts::Options po;
      po.length = block_size, po.append_eos = true;
      const PackedTexts with_eos(source, tokenizer, po);
      std::vector<int64_t> all;
      for (int64_t i = 0; i < with_eos.blocks(); ++i) {
        const std::vector<int64_t> block = with_eos.block(i);
        all.insert(all.end(), block.begin(), block.end());
      }
      EXPECT_EQ(all, want.at(name).at("stream_eos").get<std::vector<int64_t>>());
      EXPECT_NE(with_eos.describe().find("an end of text after each document"), std::string::npos)
          << with_eos.describe();
    }
  }
}

// The table's own view of a file of record batches of 3 rows: every column's type as pyarrow names it, nulls,
// values across batch boundaries, and refusals naming the column.
TEST(DatasetFiles, TableReadsValuesAcrossRecordBatches) {
  std::ifstream in(reference_dir() + "/batches.arrow", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto table = open_arrow_ipc(bytes, "batches.arrow");
  const ColumnTable& t = *table;
  EXPECT_EQ(t.rows(), 8);
  std::vector<std::string> types;
  for (const auto& c : t.columns()) types.push_back(c.path + ":" + c.type);
  EXPECT_EQ(types, (std::vector<std::string>{"text:large_string", "small:int8", "name:string", "flag:bool",
                                             "score:float32", "tokens:list", "tokens.item:int32", "meta:struct",
                                             "meta.a:int64", "meta.b:string", "when:timestamp"}));
  EXPECT_NE(t.metadata("huggingface").find("\"_type\": \"Value\""), std::string::npos);
  const int text = t.column("text"), small = t.column("small"), a = t.column("meta.a");
  EXPECT_EQ(t.bytes(text, 4), "r4 xxxx");  // the second batch
  EXPECT_TRUE(t.is_null(text, 5));
  EXPECT_EQ(t.bytes(text, 5), "");
  EXPECT_EQ(t.bytes(text, 7), "r7 xxxxxxx");  // the last, short batch
  EXPECT_EQ(t.integer(small, 6), -1);
  EXPECT_EQ(t.integer(a, 7), 7);
  EXPECT_EQ(t.bytes(t.column("meta.b"), 3), "3");
  EXPECT_TRUE(t.is_null(t.column("when"), 0));
  EXPECT_EQ(t.integers(t.column("tokens"), 4), (std::vector<int64_t>{0, 1, 2, 3}));  // list(range(row))
  EXPECT_EQ(t.integers(t.column("tokens"), 7).size(), 7u);
  EXPECT_TRUE(t.integers(t.column("tokens"), 0).empty());
  using shardtrain::testing::expect_error;
  expect_error<std::runtime_error>([&] { t.integer(text, 0); }, {"column 'text' holds large_string"});
  expect_error<std::runtime_error>([&] { t.bytes(t.column("tokens.item"), 0); }, {"a list's items"});
  expect_error<std::runtime_error>([&] { t.integers(text, 0); }, {"column 'text' holds large_string, not lists"});
  expect_error<std::runtime_error>([&] { t.bytes(text, 8); }, {"row 8 of 8"});
  // The same table as Parquet, its integers and lists delta-encoded, in row groups of 5 rows.
  std::ifstream delta_in(reference_dir() + "/parquet_delta_v2.parquet", std::ios::binary);
  ASSERT_TRUE(delta_in);
  const std::string delta_bytes((std::istreambuf_iterator<char>(delta_in)), std::istreambuf_iterator<char>());
  const auto parquet = open_parquet(delta_bytes, "parquet_delta_v2.parquet");
  const ColumnTable& p = *parquet;
  for (int64_t row = 0; row < 8; ++row) {
    std::vector<int64_t> range(static_cast<size_t>(row));
    std::iota(range.begin(), range.end(), 0);
    EXPECT_EQ(p.integers(p.column("tokens"), row), range) << row;
    EXPECT_EQ(p.integer(p.column("meta.a"), row), row);
  }
  EXPECT_EQ(p.integer(p.column("small"), 6), -1);
  // Cut anywhere, the file is refused when opened, never read past its end.
  for (size_t cut : {size_t{0}, size_t{3}, size_t{7}, bytes.size() / 4, bytes.size() / 2, bytes.size() - 9,
                     bytes.size() - 8}) {
    EXPECT_THROW(open_arrow_ipc(std::string_view(bytes).substr(0, cut), "cut"), std::runtime_error) << cut;
  }
}

}  // namespace
}  // namespace shardtrain::data
