// A table of columns read from a file, as the sources see it whatever its format (data/formats/table_files.h): Apache
// Arrow IPC files (Hugging Face datasets' cache and save_to_disk) and Parquet files (datasets on the Hugging Face Hub).
// Each row is a sample; a column is read by row, as strings, bytes, whole numbers, numbers (a regression's float
// labels), lists of whole numbers (a tokenized dataset's input_ids) or lists of strings (words).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::data {

enum class ColumnKind { NULL_TYPE, BOOL, INT, FLOAT, UTF8, BINARY, STRUCT, LIST, OTHER };

// One node of the schema, flattened depth first: a top-level column is its name, a struct's child "parent.child"
// (the bytes of an image column are "image.bytes").
struct TableColumn {
  std::string path;
  ColumnKind kind = ColumnKind::OTHER;
  std::string type;  // as pyarrow names it, without parameters: "int64", "string", "large_binary", "float32",
                     // "struct", "timestamp", ...; a dictionary-encoded column's by its values
  int width = 0;     // Parquet's: bytes per INT or FLOAT value, 1-8
  bool is_signed = true;
  int parent = -1;      // the column this one is a child of; -1 at the top
  bool per_row = true;  // one value per row: a top-level column or a struct's child (not a list's items)
  // A LIST's items when they are one column of scalars (datasets' Sequence(Value("int32")), List(Value(...))): that
  // column; -1 for a list of structs or of lists, and for other kinds.
  int items = -1;
};

class ColumnTable {
 public:
  virtual ~ColumnTable() = default;
  virtual int64_t rows() const = 0;
  virtual const std::vector<TableColumn>& columns() const = 0;
  // The file's key-value metadata ("huggingface": datasets' features as JSON); "" when absent.
  virtual std::string metadata(const std::string& key) const = 0;

  // A value at `row` (0 <= row < rows()) of a per_row column; null when the column or a struct above it is null
  // there. Each may be called from several threads at once. Throws std::runtime_error naming the column when its
  // kind is not the one asked for, and for data that turns out damaged when read.
  virtual bool is_null(int column, int64_t row) const = 0;
  virtual std::string bytes(int column, int64_t row) const = 0;  // UTF8 or BINARY; "" when null
  virtual int64_t integer(int column, int64_t row) const = 0;    // INT or BOOL; 0 when null
  virtual double number(int column, int64_t row) const = 0;      // FLOAT (float16/32/64), INT or BOOL; 0 when null
  // A LIST of INT or BOOL items: the row's items in order (input_ids [101, 7592, 102]); empty when null. Throws
  // naming the column for a null item.
  virtual std::vector<int64_t> integers(int column, int64_t row) const = 0;
  // A LIST of UTF8 items: the row's strings in order (a token-classification dataset's words, CoNLL-2003's
  // `tokens`); empty when null. Throws naming the column for a null item.
  virtual std::vector<std::string> strings(int column, int64_t row) const = 0;

  int column(const std::string& path) const;  // -1 when there is none
};

}  // namespace shardtrain::data
