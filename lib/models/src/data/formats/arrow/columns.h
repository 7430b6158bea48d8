// The ColumnTable of a file Apache Arrow's C++ library reads (data/formats/arrow/ipc.cpp,
// data/formats/arrow/parquet.cpp): the schema flattened into columns, and each value read from the Arrow arrays of the
// piece of the file that holds its row (a record batch of an IPC file; a row group's column of a Parquet file).
//
// Compiled as C++20 (Arrow's headers need it), apart from the rest of the library: nothing outside data/formats/arrow/
// includes this header (data/formats/table_files.h is the way in).
#pragma once

#include <arrow/api.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/data/formats/column_table.h"

namespace shardtrain::data {

// The arrays of one top-level field over a run of rows: per column of that field's subtree, its array (a struct's
// children sliced as their struct; a list's items whole, indexed by the list's offsets) and, for a dictionary
// column, its dictionary. Built once, read from any thread (Arrow boxes children lazily: done here, not while read).
struct ArrowPiece {
  int64_t first_row = 0, rows = 0;  // in the whole file
  std::vector<std::shared_ptr<arrow::Array>> arrays;        // by column; null outside the field's subtree
  std::vector<std::shared_ptr<arrow::Array>> dictionaries;  // by column; null unless dictionary-encoded
};

class ArrowColumns : public ColumnTable {
 public:
  int64_t rows() const override { return rows_; }
  const std::vector<TableColumn>& columns() const override { return columns_; }
  std::string metadata(const std::string& key) const override;
  bool is_null(int column, int64_t row) const override;
  std::string bytes(int column, int64_t row) const override;
  int64_t integer(int column, int64_t row) const override;
  double number(int column, int64_t row) const override;
  std::vector<int64_t> integers(int column, int64_t row) const override;
  std::vector<std::string> strings(int column, int64_t row) const override;

 protected:
  // `schema`'s fields flattened depth first into columns_ ("meta.a", "tokens.item"), its metadata kept.
  ArrowColumns(const arrow::Schema& schema, std::string name);
  // The piece holding `row` (0 <= row < rows()) of top-level field `field`.
  virtual std::shared_ptr<const ArrowPiece> piece(int field, int64_t row) const = 0;
  // `array` (rows [first_row, first_row + its length) of top-level field `field`) as a piece, every array fully
  // validated first (offsets, lengths, dictionary indices inside their buffers), so that no read leaves them.
  ArrowPiece make_piece(int field, int64_t first_row, const std::shared_ptr<arrow::Array>& array) const;
  [[noreturn]] void fail(const std::string& what) const;
  int field_column(int field) const { return field_column_[static_cast<size_t>(field)]; }

  std::string name_;  // the file, in messages
  int64_t rows_ = 0;

 private:
  struct Cell {  // one value: its array (a dictionary's values for a dictionary column) and index; null or not
    std::shared_ptr<const ArrowPiece> piece;  // keeps the arrays alive
    const arrow::Array* array = nullptr;
    int64_t index = 0;
    bool null = false;
  };
  const TableColumn& per_row(int column) const;  // fails unless a column with a value per row
  Cell cell(int column, int64_t row) const;
  // A LIST column's row: its items' array and range (no array for a null row); fails naming the column for a null
  // item.
  struct Items {
    Cell list;
    const arrow::Array* values = nullptr;
    const arrow::Array* dictionary = nullptr;
    int64_t begin = 0, end = 0;
  };
  Items items(int column, int64_t row, bool whole_numbers) const;  // else strings
  void add_field(const arrow::Field& field, const std::string& path, int parent, bool per_row);
  void fill(ArrowPiece& piece, int column, const std::shared_ptr<arrow::Array>& array) const;

  std::vector<TableColumn> columns_;
  std::vector<int> field_of_;                  // per column: its top-level field
  std::vector<std::vector<int>> children_;     // per column: its child columns (a struct's fields, a list's items)
  std::vector<int> field_column_;              // per top-level field: its column
  std::shared_ptr<const arrow::KeyValueMetadata> metadata_;
};

// What an Arrow call returned, or std::runtime_error "`what`: <Arrow's message>" ("FILE: cannot be read: ...").
inline void arrow_check(const arrow::Status& status, const std::string& what) {
  if (!status.ok()) throw std::runtime_error(what + ": " + status.message());
}
template <typename T>
T arrow_value(arrow::Result<T> result, const std::string& what) {
  arrow_check(result.status(), what);
  return std::move(result).ValueUnsafe();
}

}  // namespace shardtrain::data
