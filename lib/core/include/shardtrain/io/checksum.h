// XXH3-64 checksums (Debian's libxxhash-dev, header only): of a file's contents, for checkpoint manifests, and of
// bytes in memory, for fingerprints of what a cache holds (a tokenizer's file, a corpus's identity).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardtrain::io {

// XXH3-64 of a file's contents (read in 4 MiB pieces) and of bytes in memory, seed 0. Throws std::runtime_error
// naming the path when the file cannot be read.
uint64_t checksum_file(const std::string& path);
uint64_t checksum_bytes(const void* data, size_t size);
inline uint64_t checksum_bytes(const std::string& bytes) { return checksum_bytes(bytes.data(), bytes.size()); }
std::string to_hex(uint64_t value);  // 16 lowercase digits

}  // namespace shardtrain::io
