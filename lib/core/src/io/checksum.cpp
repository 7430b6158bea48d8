#include "shardtrain/io/checksum.h"

#define XXH_INLINE_ALL  // header only: nothing to link, nothing to carry to the GPU machine but the header
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <new>
#include <vector>

#include "shardtrain/io/files.h"

namespace shardtrain::io {
namespace {

constexpr int64_t kReadPiece = 4 << 20;  // bytes per read while hashing

}  // namespace

uint64_t checksum_bytes(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t checksum_file(const std::string& path) {
  const ReadOnlyFile file(path);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  std::vector<char> piece(static_cast<size_t>(std::min(kReadPiece, std::max<int64_t>(file.size(), 1))));
  for (int64_t at = 0; at < file.size(); at += kReadPiece) {
    const int64_t n = std::min(kReadPiece, file.size() - at);
    file.read(at, n, piece.data());
    XXH3_64bits_update(state.get(), piece.data(), static_cast<size_t>(n));
  }
  return XXH3_64bits_digest(state.get());
}

std::string to_hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace shardtrain::io
