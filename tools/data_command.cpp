// `shardtrain data synth`, `shardtrain data vocab` and `shardtrain data show` (`data pack`: data_pack.cpp).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/data/pipeline/records.h"
#include "shardtrain/data/pipeline/table_records.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/pipeline/synth.h"
#include "shardtrain/data/tokenizers/tokenizer.h"

namespace shardtrain::cli {
namespace {

const char* kDataUsage =
    "usage: shardtrain data synth --out DIR [--image-text N] [--text N] [--image N] [--eval N] [--pairs N]\n"
    "                             [--seq2seq N] [--ner N]\n"
    "                             [--image-size PIXELS] [--shard-size N] [--vocab-size N] [--seed S]\n"
    "       shardtrain data vocab --out vocab.txt [--size N] [--min-frequency K] [--cased] [--field F] FILE|DIR...\n"
    "       shardtrain data show FILE.parquet|FILE.arrow [--rows N]\n"
    "       shardtrain data pack CONFIG.yaml [--section.key=value ...]\n"
    "       shardtrain data cache [DIR] [--prune | --clear]\n"
    "synth: renders scenes of coloured shapes with captions that describe them and writes WebDataset shards\n"
    "       (image_text/, text/, image/, held-out eval/) and a WordPiece vocab.txt built from the captions;\n"
    "       --pairs: N sentence pairs in GLUE MRPC's TSV layout (pairs/train.tsv, N/4 in pairs/eval.tsv),\n"
    "       Quality 1 when both captions describe the same scene;\n"
    "       --seq2seq: N records {\"input\": caption, \"target\": its first object} (seq2seq/train.jsonl, N/4 in\n"
    "       seq2seq/eval.jsonl);\n"
    "       --ner: N captions tagged as CoNLL-2003 named entities, objects (B-OBJ, I-OBJ) and places (B-LOC)\n"
    "       (ner/train.conll, N/4 in ner/valid.conll).\n"
    "vocab: learns a WordPiece vocabulary (BERT's vocab.txt format) from text: .txt lines, .jsonl fields,\n"
    "       .tsv/.csv, .parquet or .arrow columns (--field, default \"text\"), or the .txt members of tars.\n"
    "show: a table file's columns (type, and datasets' feature: a ClassLabel's names) and its first N rows\n"
    "      (default 3): the names data.text_fields, data.label_field and data.image_field take.\n"
    "pack: counts a causal LM config's data.text and data.eval into data.cache_dir as packed token streams (what\n"
    "      data.packing reads), on every CPU, so that the training job starts by reading them.\n"
    "cache: the packed streams and the Arrow copies of Parquet files in DIR (default: data.cache_dir's default,\n"
    "       $SHARDTRAIN_CACHE, else $XDG_CACHE_HOME/shardtrain or ~/.cache/shardtrain), each with its size and\n"
    "       source files and whether a start over them reads it (current); --prune removes the others (a source\n"
    "       changed or gone, damaged), --clear all; one being made is left.\n";

int synth(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {"out", "image-text", "text", "image", "eval", "image-size", "shard-size",
                                   "vocab-size", "seed", "pairs", "seq2seq", "ner"}, {});
  data::SynthOptions o;
  o.out = a.get("out", "");
  if (o.out.empty()) throw std::invalid_argument("--out DIR is required");
  o.image_text_samples = a.get_int("image-text", o.image_text_samples);
  o.text_samples = a.get_int("text", o.text_samples);
  o.image_samples = a.get_int("image", o.image_samples);
  o.eval_samples = a.get_int("eval", o.eval_samples);
  o.pair_samples = a.get_int("pairs", o.pair_samples);
  o.seq2seq_samples = a.get_int("seq2seq", o.seq2seq_samples);
  o.ner_samples = a.get_int("ner", o.ner_samples);
  o.image_size = a.get_int("image-size", o.image_size);
  o.samples_per_shard = a.get_int("shard-size", o.samples_per_shard);
  o.vocab_size = a.get_int("vocab-size", o.vocab_size);
  o.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  const bool tty = isatty_stderr();
  std::string replaced;
  for (const std::string& name : data::clear_earlier_synth(o.out)) replaced += (replaced.empty() ? "" : ", ") + name;
  if (!replaced.empty()) {
    std::cout << "data synth: replacing an earlier data synth in " << o.out << " (" << replaced << ")\n";
  }
  const int64_t files = data::write_synth_dataset(o, [&](int64_t done, int64_t total) {
    if (tty) {
      std::fprintf(stderr, "\rdata synth: %lld / %lld samples", static_cast<long long>(done),
                   static_cast<long long>(total));
      if (done == total) std::fprintf(stderr, "\n");
    }
  });
  std::cout << "data synth: wrote " << files << " files to " << o.out << " (" << o.image_text_samples
            << " image-text, " << o.text_samples << " text, " << o.image_samples << " image, " << o.eval_samples
            << " held-out, " << o.pair_samples << " sentence pairs, " << o.seq2seq_samples
            << " seq2seq records, " << o.ner_samples << " tagged sentences; vocab.txt)\n";
  return 0;
}

int vocab(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {"out", "size", "min-frequency", "field"}, {"cased"});
  const std::string out = a.get("out", "");
  if (out.empty()) throw std::invalid_argument("--out vocab.txt is required");
  if (a.positionals.empty()) throw std::invalid_argument("no input files (FILE|DIR...)");
  data::VocabOptions o;
  o.size = a.get_int("size", o.size);
  o.min_frequency = a.get_int("min-frequency", o.min_frequency);
  o.lowercase = !a.has("cased");
  data::TextFields fields;
  fields.text = {a.get("field", "text")};
  data::SampleSource source(a.positionals, data::SampleKind::TEXT, fields);
  std::vector<std::string> texts;
  int64_t unreadable = 0;
  for (int64_t i = 0; i < source.size(); ++i) {
    try {
      texts.push_back(source.read(i).text);
    } catch (const std::exception& e) {
      if (unreadable++ < 3) std::cerr << "data vocab: skipped: " << e.what() << "\n";
    }
  }
  for (const auto& p : source.scan_problems()) std::cerr << "data vocab: " << p << "\n";
  const auto v = data::build_vocab(texts, o);
  data::save_vocab(v, out);
  std::cout << "data vocab: " << v.size() << " tokens from " << texts.size() << " texts -> " << out;
  if (unreadable) std::cout << " (" << unreadable << " unreadable samples skipped)";
  std::cout << "\n";
  return 0;
}

// One value as `show` prints it: a string quoted and cut at 60 bytes, bytes by their count, numbers as they are.
std::string shown(const data::ColumnTable& t, int column, int64_t row) {
  const data::TableColumn& c = t.columns()[static_cast<size_t>(column)];
  if (t.is_null(column, row)) return "null";
  if (c.kind == data::ColumnKind::UTF8) {
    const std::string v = t.bytes(column, row);
    return "\"" + v.substr(0, 60) + (v.size() > 60 ? "...\"" : "\"");
  }
  if (c.kind == data::ColumnKind::BINARY) return "<" + std::to_string(t.bytes(column, row).size()) + " bytes>";
  if (c.kind == data::ColumnKind::LIST) {  // whole numbers (a tokenized text's ids) or strings (words), the first 8
    std::vector<std::string> items;
    if (t.columns()[static_cast<size_t>(c.items)].kind == data::ColumnKind::UTF8) {
      for (const std::string& v : t.strings(column, row)) items.push_back("\"" + v.substr(0, 20) + "\"");
    } else {
      for (int64_t v : t.integers(column, row)) items.push_back(std::to_string(v));
    }
    std::string out;
    for (size_t i = 0; i < std::min<size_t>(items.size(), 8); ++i) out += (i ? ", " : "") + items[i];
    return "[" + out + (items.size() > 8 ? ", ... (" + std::to_string(items.size()) + ")]" : "]");
  }
  if (c.kind == data::ColumnKind::FLOAT) {  // a regression's score: 6 significant digits
    char text[32];
    std::snprintf(text, sizeof text, "%g", t.number(column, row));
    return text;
  }
  return std::to_string(t.integer(column, row));
}

int show(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {"rows"}, {});
  if (a.positionals.size() != 1) throw std::invalid_argument("data show takes one file (.parquet or .arrow)");
  const std::string& path = a.positionals[0];
  const data::RecordFormat format = data::record_format_of(path);
  if (format != data::RecordFormat::PARQUET && format != data::RecordFormat::ARROW) {
    throw std::invalid_argument("data show: '" + path + "' is not a table file (expected .parquet or .arrow)");
  }
  const data::TableFile file = data::open_table_file(path);
  const data::ColumnTable& t = *file.table;
  std::cout << path << ": " << (format == data::RecordFormat::PARQUET ? "Parquet" : "Arrow") << ", " << t.rows()
            << " rows\n";
  std::vector<int> readable;  // the columns with a value per row that reads as text, bytes or a number
  for (size_t i = 0; i < t.columns().size(); ++i) {
    const data::TableColumn& c = t.columns()[i];
    int depth = 0;
    for (int p = c.parent; p >= 0; p = t.columns()[static_cast<size_t>(p)].parent) ++depth;
    const std::string feature = c.parent < 0 ? data::feature_of(t, c.path) : "";
    const std::string items = c.items >= 0 ? "<" + t.columns()[static_cast<size_t>(c.items)].type + ">" : "";
    std::cout << "  " << std::string(2 * static_cast<size_t>(depth), ' ') << c.path << "  " << c.type << items
              << (feature.empty() ? "" : "  " + feature) << "\n";
    const data::ColumnKind item = c.items >= 0 ? t.columns()[static_cast<size_t>(c.items)].kind : c.kind;
    const bool whole_numbers = c.items >= 0 && (item == data::ColumnKind::INT || item == data::ColumnKind::BOOL);
    const bool words = c.items >= 0 && item == data::ColumnKind::UTF8;
    const bool values = c.kind == data::ColumnKind::UTF8 || c.kind == data::ColumnKind::BINARY ||
                        c.kind == data::ColumnKind::INT || c.kind == data::ColumnKind::BOOL ||
                        c.kind == data::ColumnKind::FLOAT || whole_numbers || words;
    if (c.per_row && values) readable.push_back(static_cast<int>(i));
  }
  const int64_t rows = std::min<int64_t>(a.get_int("rows", 3), t.rows());
  for (int64_t r = 0; r < rows; ++r) {
    std::cout << "row " << r << ":";
    for (int c : readable) {
      std::cout << "  " << t.columns()[static_cast<size_t>(c)].path << "=";
      try {
        std::cout << shown(t, c, r);
      } catch (const std::runtime_error& e) {
        std::cout << "(unreadable: " << e.what() << ")";
      }
    }
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

int run_data_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kDataUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "synth") return synth(rest);
  if (args[0] == "vocab") return vocab(rest);
  if (args[0] == "show") return show(rest);
  if (args[0] == "pack") return run_data_pack(rest);
  if (args[0] == "cache") return run_data_cache(rest);
  std::cerr << "shardtrain data: unknown sub-command '" << args[0] << "'\n" << kDataUsage;
  return 2;
}

}  // namespace shardtrain::cli
