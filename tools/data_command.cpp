// `shardtrain data synth` and `shardtrain data vocab`.
#include <cstdio>
#include <iostream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/data/source.h"
#include "shardtrain/data/synth.h"
#include "shardtrain/data/tokenizer.h"

namespace shardtrain::cli {
namespace {

const char* kDataUsage =
    "usage: shardtrain data synth --out DIR [--image-text N] [--text N] [--image N] [--eval N] [--pairs N]\n"
    "                             [--seq2seq N]\n"
    "                             [--image-size PIXELS] [--shard-size N] [--vocab-size N] [--seed S]\n"
    "       shardtrain data vocab --out vocab.txt [--size N] [--min-frequency K] [--cased] FILE|DIR...\n"
    "synth: renders scenes of coloured shapes with captions that describe them and writes WebDataset shards\n"
    "       (image_text/, text/, image/, held-out eval/) and a WordPiece vocab.txt built from the captions;\n"
    "       --pairs: N sentence pairs in GLUE MRPC's TSV layout (pairs/train.tsv, N/4 in pairs/eval.tsv),\n"
    "       Quality 1 when both captions describe the same scene;\n"
    "       --seq2seq: N records {\"input\": caption, \"target\": its first object} (seq2seq/train.jsonl, N/4 in\n"
    "       seq2seq/eval.jsonl).\n"
    "vocab: learns a WordPiece vocabulary (BERT's vocab.txt format) from text: .txt lines, .jsonl \"text\"\n"
    "       fields, or the .txt members of WebDataset tars.\n";

int synth(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {"out", "image-text", "text", "image", "eval", "image-size", "shard-size",
                                   "vocab-size", "seed", "pairs", "seq2seq"}, {});
  data::SynthOptions o;
  o.out = a.get("out", "");
  if (o.out.empty()) throw std::invalid_argument("--out DIR is required");
  o.image_text_samples = a.get_int("image-text", o.image_text_samples);
  o.text_samples = a.get_int("text", o.text_samples);
  o.image_samples = a.get_int("image", o.image_samples);
  o.eval_samples = a.get_int("eval", o.eval_samples);
  o.pair_samples = a.get_int("pairs", o.pair_samples);
  o.seq2seq_samples = a.get_int("seq2seq", o.seq2seq_samples);
  o.image_size = a.get_int("image-size", o.image_size);
  o.samples_per_shard = a.get_int("shard-size", o.samples_per_shard);
  o.vocab_size = a.get_int("vocab-size", o.vocab_size);
  o.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  const bool tty = isatty_stderr();
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
            << " seq2seq records; vocab.txt)\n";
  return 0;
}

int vocab(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {"out", "size", "min-frequency"}, {"cased"});
  const std::string out = a.get("out", "");
  if (out.empty()) throw std::invalid_argument("--out vocab.txt is required");
  if (a.positionals.empty()) throw std::invalid_argument("no input files (FILE|DIR...)");
  data::VocabOptions o;
  o.size = a.get_int("size", o.size);
  o.min_frequency = a.get_int("min-frequency", o.min_frequency);
  o.lowercase = !a.has("cased");
  data::SampleSource source(a.positionals, data::SampleKind::TEXT);
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

}  // namespace

int run_data_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kDataUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "synth") return synth(rest);
  if (args[0] == "vocab") return vocab(rest);
  std::cerr << "shardtrain data: unknown sub-command '" << args[0] << "'\n" << kDataUsage;
  return 2;
}

}  // namespace shardtrain::cli
