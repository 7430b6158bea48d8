// Apache Parquet files, as datasets are kept on the Hugging Face Hub (a dataset repository's data/*.parquet, the
// converted refs/convert/parquet branch) and as pandas, pyarrow, polars and Spark write tables.
//
// A file is "PAR1", the column chunks, the footer (FileMetaData in Thrift's compact encoding), its size, "PAR1".
// The footer gives the schema (a tree flattened depth first; its leaves hold the values) and, per row group, each
// leaf's column chunk: pages, each a Thrift PageHeader then its bytes (compressed), a dictionary page first when the
// values are dictionary-encoded. A data page holds definition levels (how far down the tree a row is defined: below
// the leaf's level, null) and the values present, PLAIN or as dictionary indices, levels and indices in the RLE /
// bit-packing hybrid.
//
// The footer is read when the table is opened, every chunk checked to lie inside the file; a leaf's values are read
// a row group at a time when one is asked for, and the last groups read kept (rows are read in shuffled order, so a
// group evicted is decoded again). Read: BOOLEAN, INT32, INT64 and BYTE_ARRAY values; no compression, Snappy, gzip
// and zstd; PLAIN and dictionary encodings; data pages v1 and v2. Not read: encrypted files, chunks in other files,
// the items of repeated (list) columns, DELTA_* and BYTE_STREAM_SPLIT encodings, LZ4, Brotli and LZO compression —
// each refused naming the column when its values are asked for.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "data/column_table.h"

namespace shardtrain::data {

class ParquetTable : public ColumnTable {
 public:
  // `bytes` is the whole file; it must outlive the table. Throws std::runtime_error naming `name` and what is wrong
  // (not Parquet, encrypted, a damaged footer, a chunk outside the file).
  ParquetTable(std::string_view bytes, std::string name);
  ~ParquetTable() override;

  int64_t rows() const override { return rows_; }
  const std::vector<TableColumn>& columns() const override { return columns_; }
  std::string metadata(const std::string& key) const override;  // the footer's key_value_metadata
  bool is_null(int column, int64_t row) const override;
  std::string bytes(int column, int64_t row) const override;
  int64_t integer(int column, int64_t row) const override;

 private:
  struct Node {          // per column, beside TableColumn
    int leaf = -1;       // its index among the leaves (the column chunks of a row group); -1 for a group
    int first_leaf = -1; // the first leaf at or below it: a group's nulls are read from it
    int level = 0;       // its definition level: how many optional or repeated nodes from the root to it
    int physical = -1;   // a leaf's Parquet type (BOOLEAN 0, INT32 1, INT64 2, ..., BYTE_ARRAY 6)
  };
  struct Chunk {
    int64_t start = 0, size = 0;  // its pages: the dictionary page's offset (or the first data page's), bytes
    int codec = 0;                // UNCOMPRESSED 0, SNAPPY 1, GZIP 2, ..., ZSTD 6
  };
  struct Group {
    int64_t first_row = 0, rows = 0;
    std::vector<Chunk> chunks;  // by leaf
  };
  struct Values;  // one leaf of one row group, decoded

  std::shared_ptr<const Values> values(int column, int64_t& row) const;  // `row` made relative to its group
  std::shared_ptr<const Values> decode(int leaf_column, const Group& group) const;
  [[noreturn]] void fail(const std::string& what) const;

  std::string_view bytes_;
  std::string name_;
  std::vector<TableColumn> columns_;
  std::vector<Node> nodes_;
  std::vector<int> leaves_;  // the column of each leaf
  std::vector<Group> groups_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  int64_t rows_ = 0;
  mutable std::mutex mutex_;
  mutable std::list<std::pair<int64_t, std::shared_ptr<const Values>>> cache_;  // (group x leaves + leaf), newest first
};

}  // namespace shardtrain::data
