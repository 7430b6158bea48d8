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
// The footer is read when the table is opened, every chunk checked to lie inside the file; a row's value is read by
// decoding the page that holds it (a chunk's page headers read once, its dictionary decoded once), and the pages
// last read are kept up to kCacheBytes (rows are read in shuffled order: a page evicted is decoded again). Read:
// BOOLEAN, INT32, INT64 and BYTE_ARRAY values; pages uncompressed or compressed with Snappy, gzip, Brotli, LZ4 or
// zstd (Arrow's codecs: data/formats/compression.h); PLAIN, dictionary and DELTA_*
// encodings (RLE for v2's booleans); data pages v1 and v2; lists of whole numbers (a list column's leaf has
// repetition levels too: a slot per item, level 0 starting a row; a page must start a row; its values stay encoded
// in the cache, each item decoded when its row is read, since dictionary indices decode to many times their bytes)
// and lists of strings (a token-classification dataset's words: a page's items decoded whole).
// Not read: encrypted files, chunks in other files, lists of floats and lists of lists, BYTE_STREAM_SPLIT (floats'),
// LZO compression — each refused naming the column when its values are asked for.
//
// Ours rather than Arrow's Parquet reader, which decodes no less than a row group's column (docs/notes/
// table-files.md): a row group of a Hub dataset decodes to ~100 MB. A training run reads a file larger than the
// page cache from its Arrow copy instead (data/formats/table_files.h), since shuffled rows would decode a page each.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/data/formats/column_table.h"

namespace shardtrain::data {

namespace parquet_footer {  // what the footer says, as the table's constructor reads it (parquet.cpp)
struct SchemaElement;
struct ChunkMeta;
}  // namespace parquet_footer

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
  double number(int column, int64_t row) const override;
  std::vector<int64_t> integers(int column, int64_t row) const override;
  std::vector<std::string> strings(int column, int64_t row) const override;

 private:
  struct Node {          // per column, beside TableColumn
    int leaf = -1;       // its index among the leaves (the column chunks of a row group); -1 for a group
    int first_leaf = -1; // the first leaf at or below it: a group's nulls are read from it
    int level = 0;       // its definition level: how many optional or repeated nodes from the root to it
    int repetition = 0;  // its repetition level: how many repeated nodes (lists) from the root to it
    int item_level = 0;  // under a list: the definition level at which a slot holds an item (null or not)
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
  struct Values;  // one page of a leaf, decoded (or a chunk's dictionary)
  struct Page {
    int64_t header = 0;              // its PageHeader's offset in the file
    int64_t first_row = 0, rows = 0;  // in the row group
  };
  struct Pages {  // one column chunk's, found by reading its page headers
    int64_t dictionary = -1;  // the dictionary page's header offset; -1: none
    std::vector<Page> data;
  };

  // Adds schema[next] and its children, depth first, under column `parent` (-1: the table) with the levels of the
  // nodes above it; `next` moves past them.
  void add_column(const std::vector<parquet_footer::SchemaElement>& schema, size_t& next, int parent, int level,
                  int repetition, int item_level, int depth);
  // Each row group's chunks (a chunk per leaf), checked to lie before the footer and to hold their leaf's type.
  void add_row_groups(const std::vector<std::pair<int64_t, std::vector<parquet_footer::ChunkMeta>>>& row_groups,
                      int64_t num_rows, int64_t footer_start);
  // The values of the page holding `row` of `column`'s first leaf (a list's: its items' leaf); `row` made relative
  // to that page.
  std::shared_ptr<const Values> values(int column, int64_t& row) const;
  std::shared_ptr<const Pages> pages(int leaf, size_t group) const;
  // A page whose header is at `header`: a data page of `rows` rows (`dictionary` for its indices), or the
  // dictionary page itself (rows and dictionary unused).
  std::shared_ptr<const Values> decode_page(int leaf, size_t group, int64_t header, int64_t rows,
                                            std::shared_ptr<const Values> dictionary) const;
  // A list leaf's data page (decode_page's): per row its first slot's level, its null items and its items' range;
  // the values (`encoding`: PLAIN, dictionary indices or RLE booleans) kept encoded. `what` names the chunk.
  static void fill_list(Values& out, const std::string& what, int physical, int encoding, std::string_view values,
                        const std::vector<uint32_t>& repetitions, const std::vector<uint32_t>& levels, int max_level,
                        int item_level, int64_t rows, std::shared_ptr<const Values> dictionary);
  // The decoded pages kept, by (group x leaves + leaf, page; -1 for the dictionary), least recently used dropped
  // beyond kCacheBytes.
  std::shared_ptr<const Values> cached(std::pair<int64_t, int64_t> key) const;
  std::shared_ptr<const Values> keep(std::pair<int64_t, int64_t> key, std::shared_ptr<const Values> values) const;
  std::string where(int leaf, size_t group) const;  // "file: column 'x' in row group 3", for errors
  [[noreturn]] void fail(const std::string& what) const;

  std::string_view bytes_;
  std::string name_;
  std::vector<TableColumn> columns_;
  std::vector<Node> nodes_;
  std::vector<int> leaves_;  // the column of each leaf
  std::vector<Group> groups_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  int64_t rows_ = 0;
  static constexpr int64_t kCacheBytes = int64_t{64} << 20;  // about 64 pages of pyarrow's default 1 MiB
  mutable std::mutex mutex_;  // guards what follows: samples are read from several loader threads at once
  mutable std::map<int64_t, std::shared_ptr<const Pages>> pages_;  // by group x leaves + leaf
  mutable std::list<std::pair<std::pair<int64_t, int64_t>, std::shared_ptr<const Values>>> cache_;  // newest first
  mutable int64_t cached_bytes_ = 0;
};

}  // namespace shardtrain::data
