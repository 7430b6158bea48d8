// The table files a source reads, each opened as a ColumnTable: Apache Arrow IPC (what Hugging Face `datasets`
// keeps its data in: load_dataset's cache files and save_to_disk's data-*.arrow, both the streaming format; what
// pyarrow writes as .arrow/.feather, the file format) and Apache Parquet (datasets on the Hugging Face Hub; what
// pandas, pyarrow, polars and Spark write). Arrow IPC is read by Apache Arrow's C++ library, the one inside the
// pyarrow wheel (data/arrow/); Parquet by our reader (data/parquet.h), its pages decompressed by Arrow's codecs. A
// build configured without Arrow (-DSHARDTRAIN_ARROW=OFF: the GPU machine, which has no pyarrow) refuses Arrow
// IPC files and compressed Parquet pages.
//
// `bytes` is the whole file and must outlive the table. Each throws std::runtime_error naming `name` and what is
// wrong: not of its format, cut short, damaged (every Arrow buffer is validated before a value of it is read), and
// for a build without Arrow, that.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shardtrain/data/column_table.h"

namespace shardtrain::data {

// An Arrow IPC stream or file; its record batches validated whole when opened.
std::unique_ptr<ColumnTable> open_arrow_ipc(std::string_view bytes, std::string name);
// A Parquet file (data/parquet.h); its footer read when opened, a page decoded when a value of it is read (a
// damaged page throws then).
std::unique_ptr<ColumnTable> open_parquet(std::string_view bytes, std::string name);

}  // namespace shardtrain::data
