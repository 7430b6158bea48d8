// The compressed pages of Parquet files (data/formats/parquet.h), decompressed by Apache Arrow's codecs (the pyarrow
// wheel's libarrow, data/formats/arrow/compression.cpp): Snappy, gzip, Brotli, LZ4 (raw, and Hadoop's framing) and
// zstd. A build without Arrow (-DSHARDTRAIN_ARROW=OFF) reads uncompressed pages only and refuses the others.
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain::data {

// Parquet's CompressionCodec: UNCOMPRESSED 0, SNAPPY 1, GZIP 2, LZO 3, BROTLI 4, LZ4 5 (Hadoop's framing), ZSTD 6,
// LZ4_RAW 7.
const char* parquet_codec_name(int codec);

// The `n` bytes at `p`, compressed with `codec` (not 0), into `out`, whose size is what the page's header says they
// decompress to. Throws std::runtime_error naming `what` (the chunk) when the codec is not read (LZO) or the bytes
// do not decompress to exactly that many.
void decompress_page(int codec, const char* p, int64_t n, std::string& out, const std::string& what);

}  // namespace shardtrain::data
