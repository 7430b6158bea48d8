// A table file as a source's records, each row a sample (data/formats/table_files.h, read by Apache Arrow's library): a
// Hugging Face `datasets` Arrow file of the cache (load_dataset's `<name>-<split>.arrow`) or of save_to_disk, read
// in place from the mapped file; a Parquet file as datasets on the Hub are stored, its row groups decoded as
// samples are read.
// Columns are chosen by name, as for .jsonl/.tsv records (data.text_fields, data.label_field, data.image_field).
// A tokenized dataset's column of token ids (datasets' `input_ids` after dataset.map(tokenizer)) is read as the
// tokens themselves, with its token_type_ids and attention_mask beside it.
//
// datasets' features (the schema's "huggingface" metadata) are used where they say more than the Arrow types: an
// Image column is a struct {bytes, path} — the encoded image, or where datasets kept only a path, the file there —
// and a ClassLabel column's names must be the classes the run was given (data.labels), in their order, so that a
// label id means the same class in both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/data/formats/column_table.h"
#include "shardtrain/io/mapped_file.h"
#include "shardtrain/data/pipeline/source.h"

namespace shardtrain::data {

// A table file opened: its bytes (mapped) and the table over them, by the file's extension (.parquet: Parquet,
// else Arrow). With a `table_cache` directory, a Parquet file is read from its Arrow copy there, made when missing
// (data/formats/table_files.h: for shuffled reading); where no copy can be made, in place, saying why in `note`. Throws
// as data/formats/table_files.h.
struct TableFile {
  io::FileBytes bytes;
  std::unique_ptr<ColumnTable> table;
  std::string note;  // "PATH: read from its Arrow copy COPY", or why it is read in place; "" without a cache
};
TableFile open_table_file(const std::string& path, const std::string& table_cache = "");

// datasets' description of each column in the file's "huggingface" metadata, by column ("ClassLabel [neg, pos]",
// "Image", "Value(string)"); empty where it says nothing.
std::string feature_of(const ColumnTable& table, const std::string& column);

class TableRecords {
 public:
  // Throws std::invalid_argument naming the file and the column for a column missing (listing the columns there
  // are) or of a type that cannot be the field, ClassLabel names other than fields.classes; std::runtime_error for
  // a file that is damaged or not of its format (data/formats/table_files.h).
  // `table_cache`: as open_table_file's.
  TableRecords(const std::string& path, SampleKind kind, const TextFields& fields, const std::string& table_cache);
  const std::string& note() const { return file_.note; }  // open_table_file's

  int64_t rows() const { return table_->rows(); }
  // The columns a tokenized table's samples are read from ("input_ids, attention_mask"); "" when its text is text.
  std::string tokenized() const;
  // The row's fields into `s` (s.key already set). Throws std::runtime_error naming s.key for a null text or
  // image, a label that is no class, an image file that cannot be read: the loader skips and counts the sample.
  void read(int64_t row, RawSample& s) const;

 private:
  int find(const std::string& field, const std::string& key, const std::vector<ColumnKind>& kinds) const;
  bool token_list(int column) const;  // a top-level column of lists of whole numbers
  void read_tokens(int64_t row, RawSample& s) const;
  void read_words(int64_t row, RawSample& s) const;
  // A top-level list column of items of `items` kinds, else std::invalid_argument saying `wanted`.
  int list_column(const std::string& field, const std::string& key, const std::vector<ColumnKind>& items,
                  const std::string& wanted) const;
  // Throws unless a ClassLabel's `names` (empty: none) are the run's classes in their order.
  void check_class_names(const std::vector<std::string>& names, const std::string& column) const;

  std::string path_;
  TableFile file_;
  const ColumnTable* table_ = nullptr;  // file_'s
  std::vector<int> text_;  // one column per text field
  int ids_ = -1, type_ids_ = -1, mask_ = -1;  // a tokenized table's token ids and the lists beside them, or -1
  int pair_ids_ = -1;                         // a second field of token ids (a seq2seq target), or -1
  int label_ = -1;
  int words_ = -1;       // token classification's list of words (TextFields::words); label_ its list of classes
  bool scores_ = false;  // label_ is a regression's number (TextFields::scores)
  bool sets_ = false;    // label_ is a list of class ids (TextFields::multi_label)
  int image_ = -1, image_path_ = -1;  // the encoded bytes; the path beside them (an Image struct), or -1
  std::vector<std::string> classes_;
};

// What `column` of the .arrow or .parquet file at `path` says of a classifier, as transformers' run_glue and
// run_classification read datasets' features: the names of its ClassLabel (empty when it is none); for a column of
// lists of whole numbers (List(ClassLabel): sets of classes, go_emotions') the items' names and multi_label; {column}
// alone when it holds floats (a regression, as run_glue decides from the dtype: STS-B's similarity). Throws as
// data/formats/table_files.h.
struct LabelColumn {
  std::vector<std::string> names;
  bool multi_label = false;
  bool scores = false;  // a float column: names is {column}
};
LabelColumn label_column(const std::string& path, const std::string& column);

}  // namespace shardtrain::data
