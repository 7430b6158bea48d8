// What the fuzz targets share: the input as a file, for parsers that read files. Each libFuzzer process reuses one
// path of its own.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace shardtrain::fuzz {

inline std::string input_file(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = "/tmp/shardtrain-fuzz-" + std::to_string(::getpid()) + "-" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();  // the fuzzer's own set-up failed
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace shardtrain::fuzz
