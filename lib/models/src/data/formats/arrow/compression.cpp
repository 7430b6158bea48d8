#include <arrow/util/compression.h>

#include <stdexcept>

#include "data/formats/compression.h"

namespace shardtrain::data {
namespace {

// Parquet's codec as Arrow names it (parquet/types.h maps them the same way); UNCOMPRESSED for LZO, not read.
arrow::Compression::type arrow_codec(int codec) {
  switch (codec) {
    case 1: return arrow::Compression::SNAPPY;
    case 2: return arrow::Compression::GZIP;
    case 4: return arrow::Compression::BROTLI;
    case 5: return arrow::Compression::LZ4_HADOOP;
    case 6: return arrow::Compression::ZSTD;
    case 7: return arrow::Compression::LZ4;  // LZ4_RAW: LZ4's block format, unframed
    default: return arrow::Compression::UNCOMPRESSED;
  }
}

}  // namespace

void decompress_page(int codec, const char* p, int64_t n, std::string& out, const std::string& what) {
  const arrow::Compression::type type = arrow_codec(codec);
  auto made = type == arrow::Compression::UNCOMPRESSED ? arrow::Status::NotImplemented("")
                                                       : arrow::util::Codec::Create(type);
  if (!made.ok()) {
    throw std::runtime_error(what + " is compressed with " + parquet_codec_name(codec) + " (" +
                             std::to_string(codec) + "), which is not read (snappy, gzip, brotli, lz4, zstd or none "
                             "are)");
  }
  const auto got = (*made)->Decompress(n, reinterpret_cast<const uint8_t*>(p), static_cast<int64_t>(out.size()),
                                       reinterpret_cast<uint8_t*>(out.data()));
  if (!got.ok() || *got != static_cast<int64_t>(out.size())) {
    throw std::runtime_error(what + ": a page does not decompress (" + parquet_codec_name(codec) + ") to the " +
                             std::to_string(out.size()) + " bytes its header says" +
                             (got.ok() ? "" : ": " + got.status().message()));
  }
}

}  // namespace shardtrain::data
