// Apache Arrow's IPC format, read in place: what Hugging Face `datasets` keeps its data in (the cache files
// load_dataset writes, `<name>-train.arrow`, and save_to_disk's `data-00000-of-00001.arrow`, both the streaming
// format) and what pyarrow writes as `.arrow`/`.feather` files (the file format: the same stream between an
// "ARROW1" header and a footer, which is not needed to read it).
//
// A stream is a sequence of messages, each [0xFFFFFFFF][int32 metadata size][flatbuffer Message][body]: first the
// Schema, then RecordBatches (a length, one FieldNode {length, null_count} per field in depth-first order, and the
// offset and size of each of their buffers in the body), ended by a zero size. A field's buffers: its validity
// bitmap, then by type: nothing more (struct, fixed_size_list: the children follow), data (ints, floats, bools as
// bits), offsets + data (utf8, binary; int32 offsets, int64 for the large_ kinds), offsets (list, large_list; the
// child, the items of every row end to end, follows).
//
// Every offset, buffer and string offset is checked against the file when the table is opened, so reading a value
// afterwards cannot leave the file whatever the file holds. Not read: compressed bodies (lz4/zstd; datasets never
// writes them), big-endian data, and the values of dictionary-encoded, view, union and run-end columns — such a
// column can be present (its buffers are stepped over); asking for its values is refused naming it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardtrain/data/column_table.h"

namespace shardtrain::data {

class ArrowTable : public ColumnTable {
 public:
  // `bytes` is the whole file; it must outlive the table. Throws std::runtime_error naming `name` and what is wrong
  // (not an Arrow file, cut short, a buffer outside the file, offsets that go backwards, a compressed body).
  ArrowTable(std::string_view bytes, std::string name);

  int64_t rows() const override { return rows_; }
  const std::vector<TableColumn>& columns() const override { return columns_; }
  std::string metadata(const std::string& key) const override;  // the schema's
  bool is_null(int column, int64_t row) const override;
  std::string bytes(int column, int64_t row) const override { return std::string(view(column, row)); }
  int64_t integer(int column, int64_t row) const override;
  double number(int column, int64_t row) const override;
  std::vector<int64_t> integers(int column, int64_t row) const override;
  std::vector<std::string> strings(int column, int64_t row) const override;
  std::string_view view(int column, int64_t row) const;  // bytes() in place: a view of the file

 private:
  // Where one column's values of one record batch are: byte offsets into the file (-1: the buffer is absent).
  struct Slice {
    int64_t length = 0, null_count = 0;
    int64_t validity = -1, offsets = -1, data = -1;
  };
  struct Batch {
    int64_t first_row = 0, rows = 0;
    std::vector<Slice> slices;  // per column
  };
  void read_schema(const char* metadata, size_t size);
  void read_batch(const char* metadata, size_t size, int64_t body, int64_t body_size);
  const Batch& locate(int column, int64_t& row) const;  // the batch holding `row`, made relative to it
  std::pair<int64_t, int64_t> item_range(int column, int64_t row) const;
  const Slice& items_of(int column, int64_t row, std::pair<int64_t, int64_t> range) const;
  [[noreturn]] void fail(const std::string& what) const;

  std::string_view bytes_;
  std::string name_;
  std::vector<TableColumn> columns_;
  std::vector<int> buffers_;  // per column: how many buffers a record batch gives it; -1: 2 + a variadic count
  std::vector<int32_t> list_size_;  // per column: a fixed_size_list's items per row; 0 for others
  int16_t version_ = 0;       // the schema message's MetadataVersion (4 = V5, 3 = V4)
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<Batch> batches_;
  int64_t rows_ = 0;
};

}  // namespace shardtrain::data
