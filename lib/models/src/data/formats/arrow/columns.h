// The ColumnTable of an Arrow IPC file (data/formats/arrow/ipc.cpp: datasets' files, pyarrow's, and the Arrow copies
// of Parquet files): the schema flattened into columns, and each value read from the Arrow arrays of the record batch
// that holds its row.
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

class ArrowColumns : public ColumnTable {
 public:
  // `schema`'s fields flattened depth first into columns ("meta.a", "tokens.item"), its metadata kept; `batches`
  // (of that schema) the rows, every array validated whole first (offsets, lengths, dictionary indices inside their
  // buffers), so that no read leaves them. `name` names the file in messages.
  ArrowColumns(const arrow::Schema& schema, std::string name, const arrow::RecordBatchVector& batches);

  int64_t rows() const override { return rows_; }
  const std::vector<TableColumn>& columns() const override { return columns_; }
  std::string metadata(const std::string& key) const override;
  bool is_null(int column, int64_t row) const override;
  std::string bytes(int column, int64_t row) const override;
  int64_t integer(int column, int64_t row) const override;
  double number(int column, int64_t row) const override;
  std::vector<int64_t> integers(int column, int64_t row) const override;
  std::vector<std::string> strings(int column, int64_t row) const override;

 private:
  // One record batch's arrays by column (a struct's children sliced as their struct; a list's items whole, indexed
  // by the list's offsets) and, for a dictionary column, its dictionary. Arrow boxes children lazily: done here,
  // once, so that any thread may read them.
  struct Batch {
    int64_t first_row = 0;  // in the whole file
    std::vector<std::shared_ptr<arrow::Array>> arrays;
    std::vector<std::shared_ptr<arrow::Array>> dictionaries;  // null unless dictionary-encoded
  };
  struct Cell {  // one value: its array (a dictionary's values for a dictionary column) and index; null or not
    const Batch* batch = nullptr;
    const arrow::Array* array = nullptr;
    int64_t index = 0;
    bool null = false;
  };
  // A LIST column's row: its items' array and range (no array for a null row).
  struct Items {
    Cell list;
    const arrow::Array* values = nullptr;
    const arrow::Array* dictionary = nullptr;
    int64_t begin = 0, end = 0;
  };

  [[noreturn]] void fail(const std::string& what) const;
  const TableColumn& per_row(int column) const;  // fails unless a column with a value per row
  Cell cell(int column, int64_t row) const;
  // Fails naming the column for items of another kind than whole numbers (else strings), and for a null item.
  Items items(int column, int64_t row, bool whole_numbers) const;
  void add_field(const arrow::Field& field, const std::string& path, int parent, bool per_row);
  void fill(Batch& batch, int column, const std::shared_ptr<arrow::Array>& array) const;

  std::string name_;
  std::vector<TableColumn> columns_;
  std::vector<std::vector<int>> children_;  // per column: its child columns (a struct's fields, a list's items)
  std::vector<int> field_column_;           // per top-level field: its column
  std::shared_ptr<const arrow::KeyValueMetadata> metadata_;
  std::vector<Batch> batches_;  // those with rows
  int64_t rows_ = 0;
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
