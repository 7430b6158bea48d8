// What Apache Arrow gives data/formats/table_files.h and data/formats/compression.h, in a build without it
// (-DSHARDTRAIN_ARROW=OFF): Arrow IPC files and compressed Parquet pages are refused.
#include <stdexcept>

#include "data/formats/compression.h"
#include "data/formats/table_files.h"

namespace shardtrain::data {
namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw std::runtime_error(what + " read with Apache Arrow, which this build of shardtrain was configured without "
                           "(-DSHARDTRAIN_ARROW=OFF); build it with pyarrow installed");
}

}  // namespace

std::unique_ptr<ColumnTable> open_arrow_ipc(std::string_view, std::string name) {
  refuse(name + ": Arrow IPC files are");
}

std::string parquet_arrow_copy(const std::string& path, const std::string&) {
  refuse(path + ": Arrow copies of Parquet files are");
}

std::vector<TableCopy> table_copies(const std::string&) { return {}; }

void decompress_page(int codec, const char*, int64_t, std::string&, const std::string& what) {
  refuse(what + " is compressed with " + parquet_codec_name(codec) + ": compressed Parquet pages are");
}

}  // namespace shardtrain::data
