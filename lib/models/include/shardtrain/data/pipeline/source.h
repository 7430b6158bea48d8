// A source of raw samples: the files of one kind of data, indexed once, read by sample number from any thread.
//
// WebDataset tars: consecutive members sharing a key (the path up to the first '.' of the file name) form a sample; by
// extension: jpg/jpeg/png/bmp/gif/ppm/pgm = the image, txt/text/caption = the text, cls = an integer label. Text files,
// each non-empty line a sample: .txt (the line is the text), .jsonl (an object: the fields TextFields names), .tsv and
// .csv (a header row naming the columns, then records; data/pipeline/records.h); CoNLL columns (.conll, or .txt for
// token classification), each sentence a sample. Hugging Face datasets' Arrow files (.arrow: load_dataset's cache,
// save_to_disk) and Parquet files (the Hub's), each row a sample of any kind, its columns named by TextFields
// (data/pipeline/table_records.h). Directories stand for every data file inside, sorted; a save_to_disk directory for
// the files its state.json lists.
//
// What cannot be used is counted, never fatal: a truncated or corrupt tar contributes the samples before the
// damage (scan_problems says where it stopped), a sample lacking the kind's parts is left out
// (incomplete_samples); a sample whose bytes turn out bad when read (undecodable image, malformed JSON) is the
// loader's to skip and count.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::io {
class ReadOnlyFile;
}

namespace shardtrain::data {

class TableRecords;

enum class SampleKind { IMAGE_TEXT, TEXT, IMAGE };
const char* kind_name(SampleKind kind);  // "image_text", "text", "image"

struct RawSample {
  std::string key;    // "shard-00003.tar:000123" or "corpus.txt:17" (line number)
  std::string image;  // encoded bytes; empty when the kind has none
  std::string text;
  std::string text_pair;         // a sentence pair's second text (TextFields names two)
  std::optional<int64_t> label;  // the .cls member, or the record's label field as a class id
  std::optional<double> score;   // the label as a number instead, when TextFields::scores (a regression target)
  // The label as a set of class ids instead, when TextFields::multi_label (ascending, each once; may be empty).
  std::optional<std::vector<int64_t>> label_set;
  // A text already split into words, each with its class, when TextFields::words (token classification: CoNLL-2003's
  // tokens and ner_tags); the text is then empty.
  std::vector<std::string> words;
  std::vector<int64_t> word_labels;  // one class id per word
  // A tokenized dataset's row (an .arrow/.parquet column or a .jsonl field of token ids, Hugging Face datasets'
  // `input_ids` after dataset.map(tokenizer)): the ids as its tokenizer made them, special tokens included, padding
  // left out; the text is then empty and is not tokenized again.
  bool tokenized = false;
  std::vector<int64_t> input_ids;
  std::vector<int64_t> token_type_ids;  // the row's token_type_ids when the table has them; else empty
  // A pair's second sequence when two fields hold token ids (a seq2seq dataset's input_ids and labels: the target),
  // -100 (transformers' ignored label, its padding) left out; else empty.
  std::vector<int64_t> pair_ids;
};

// Which fields of a .jsonl/.tsv/.csv/.arrow/.parquet record a source reads (JSON keys, header columns, columns).
struct TextFields {
  // One field, or two: a sentence pair (MRPC's sentence1, sentence2). A table's column of token ids (lists of whole
  // numbers), or a .jsonl field holding an array of them, is read as its tokenizer's output (RawSample::input_ids),
  // with token_type_ids and attention_mask beside it when the record has them; a record with no "text" but such an
  // "input_ids" is read so by default. Two such fields are a pair of token sequences (seq2seq's [input_ids, labels]).
  std::vector<std::string> text = {"text"};
  std::string label;                         // the label's field; empty: records carry no label
  // The classes by id: a label value is a class name or a whole-number id below classes.size(). Empty: labels are
  // whole numbers, unchecked (tars' .cls).
  std::vector<std::string> classes;
  // The label is a number, not a class: a regression's target (GLUE STS-B's similarity 0-5), read into
  // RawSample::score from a JSON number, a decimal string or a table's float/int column; `classes` unused.
  bool scores = false;
  // The label is a set of classes (go_emotions' labels: a .jsonl array of class names or ids, a .tsv/.csv field of
  // them separated by commas, a table's list of ClassLabel ids), read into RawSample::label_set; `classes` names
  // them. A .txt or tar cannot hold one.
  bool multi_label = false;
  // The text field holds words, the label field one class per word (token classification, transformers' run_ner:
  // CoNLL-2003's `tokens` and `ner_tags`): a .jsonl array of strings and one of class names or ids, a table's list
  // of strings and list of ClassLabel ids or names, or CoNLL columns (.conll, and .txt then: a sentence per sample,
  // the word and tag of each line; the field names unused); read into RawSample::words and word_labels. `classes`
  // names them. One text field; .tsv, .csv and tars cannot hold them.
  bool words = false;
  // A table's image column (binary, or datasets' Image struct {bytes, path}); when the table has none of this
  // name, its one Image column.
  std::string image = "image";
};

class SampleSource {
 public:
  // Throws std::invalid_argument when a path does not exist, names no usable file, or yields no sample at all. Also
  // throws it for a .tsv/.csv/.arrow/.parquet lacking a field of `fields`, or a .txt asked for a pair or a label;
  // std::runtime_error for an .arrow/.parquet file that is damaged. `table_cache`: a directory where Parquet files are
  // read from their Arrow copies, for shuffled reading (data.cache_dir; data/pipeline/table_records.h); "": in place.
  SampleSource(const std::vector<std::string>& paths, SampleKind kind, TextFields fields = {},
               const std::string& table_cache = "");
  ~SampleSource();
  SampleSource(const SampleSource&) = delete;
  SampleSource& operator=(const SampleSource&) = delete;

  SampleKind kind() const { return kind_; }
  bool pairs() const { return fields_.text.size() == 2; }  // samples are sentence pairs
  const TextFields& fields() const { return fields_; }
  // What the first tokenized table reads ("input_ids, token_type_ids, attention_mask"); "" when no table is.
  std::string tokenized() const;
  int64_t size() const { return size_; }
  // Throws std::runtime_error naming the file and line for bytes that cannot be read or parsed (a .jsonl line that
  // is not JSON, a field missing, a label that is not one of the classes).
  RawSample read(int64_t i) const;

  const std::vector<std::string>& files() const { return files_; }
  const std::vector<std::string>& scan_problems() const { return problems_; }  // "file: why the scan stopped"
  // Per Parquet file read with a table cache: where it is read from, or why in place (TableFile::note).
  const std::vector<std::string>& table_notes() const { return table_notes_; }
  int64_t incomplete_samples() const { return incomplete_; }

 private:
  struct Range {
    int64_t offset = -1, size = 0;  // -1: absent
  };
  struct Entry {
    int32_t file = 0;
    int64_t number = 0;  // member key number or line number, for RawSample::key
    Range image, text, label;
  };
  void index_tar(int32_t file);
  void index_lines(int32_t file);
  void index_sentences(int32_t file);  // CoNLL columns (data/pipeline/records.h): a sentence per sample
  void read_header(int32_t file);  // a table's column of each field, from its first indexed line (then dropped)
  void read_fields(RawSample& s, const std::string& line, int32_t file) const;

  SampleKind kind_;
  TextFields fields_;
  // Per file: its format, and for tables the column of each text field then (when read) of the label.
  std::vector<int> formats_;
  std::vector<std::vector<size_t>> columns_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<io::ReadOnlyFile>> handles_;  // per file; null for a table
  std::vector<std::unique_ptr<TableRecords>> tables_;  // per file: the table of an .arrow/.parquet file, else null
  std::vector<std::string> keys_;  // tar sample keys, parallel to index_ for tars (empty strings for lines)
  std::vector<Entry> index_;       // the samples of tars and line files
  // Sample numbers by file, in order: a file's samples are [first, next span's first). A table's are its rows (no
  // entry each: a dataset of 100M rows costs nothing per row); another file's are index_ from `entries` on.
  struct Span {
    int64_t first = 0;
    int32_t file = 0;
    int64_t entries = -1;  // -1: a table
  };
  std::vector<Span> spans_;
  int64_t size_ = 0;
  std::vector<std::string> problems_;
  std::vector<std::string> table_notes_;
  int64_t incomplete_ = 0;
};

// The files a list of paths stands for (directories expanded, sorted; patterns as `data/train-*.parquet`
// matched), checked to exist. Throws std::invalid_argument for a directory of datasets' splits (dataset_dict.json:
// name one) or one holding several splits' files side by side (load_dataset's cache, a Hub dataset's parquet
// files).
std::vector<std::string> expand_paths(const std::vector<std::string>& paths);

}  // namespace shardtrain::data
