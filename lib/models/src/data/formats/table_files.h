// The table files a source reads, each opened as a ColumnTable: Apache Arrow IPC (what Hugging Face `datasets` keeps
// its data in: load_dataset's cache files and save_to_disk's data-*.arrow, both the streaming format; what pyarrow
// writes as .arrow/.feather, the file format) and Apache Parquet (datasets on the Hugging Face Hub; what pandas,
// pyarrow, polars and Spark write). Arrow IPC is read by Apache Arrow's C++ library, the one inside the pyarrow wheel
// (data/formats/arrow/); Parquet in place by our reader (data/formats/parquet.h), its pages decompressed by Arrow's
// codecs, and for a shuffled loader from its Arrow copy (parquet_arrow_copy). A build configured without Arrow
// (-DSHARDTRAIN_ARROW=OFF: the GPU machine, which has no pyarrow) refuses Arrow IPC files, compressed Parquet pages and
// copies.
//
// `bytes` is the whole file and must outlive the table. Each throws std::runtime_error naming `name` and what is
// wrong: not of its format, cut short, damaged (every Arrow buffer is validated before a value of it is read), and
// for a build without Arrow, that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/data/formats/column_table.h"

namespace shardtrain::data {

// An Arrow IPC stream or file; its record batches validated whole when opened.
std::unique_ptr<ColumnTable> open_arrow_ipc(std::string_view bytes, std::string name);
// A Parquet file (data/formats/parquet.h); its footer read when opened, a page decoded when a value of it is read (a
// damaged page throws then).
std::unique_ptr<ColumnTable> open_parquet(std::string_view bytes, std::string name);

// A Parquet file's Arrow IPC copy, for a shuffled loader: our Parquet reader decodes the ~1 MiB page holding a row
// and keeps 64 MiB of pages, so a file larger than that read in shuffled order decodes a page for nearly every
// row; its copy is read in place, as datasets reads the Arrow files it converts Parquet into. The copy is
// `cache_dir`/tables/<name>-<hash of the file's path, size and time>.arrow (an Arrow IPC file, the source's
// identity in its schema's metadata under "shardtrain.source"), made when missing or damaged by reading the Parquet
// file sequentially with Arrow's reader, written whole or not at all; of processes of one machine opening the file
// at once, one makes it while the others wait. Returns its path. Throws std::runtime_error naming `path` when no
// copy can be made (no room, a file Arrow cannot read, a build without Arrow): the caller reads the file in place.
std::string parquet_arrow_copy(const std::string& path, const std::string& cache_dir);

// A copy in a cache directory (`shardtrain data cache` lists them).
struct TableCopy {
  std::string path;
  int64_t bytes = 0;
  bool whole = false;   // its footer and schema read, with a source recorded (else damaged or foreign; rest unset)
  std::string source;   // the Parquet file it was copied from
  bool current = false;  // the source is still as it was copied (same path, size and modification time)
};
// The copies in `cache_dir`/tables/, sorted by name; none when it does not exist.
std::vector<TableCopy> table_copies(const std::string& cache_dir);

}  // namespace shardtrain::data
