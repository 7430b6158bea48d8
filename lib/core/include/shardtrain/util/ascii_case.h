// ASCII case folding of names and keywords (config values, GPU presets, yes/no answers): the letters A-Z and a-z,
// every other byte left as it is. Text a tokenizer reads has its own Unicode folding (data/tokenizers).
#pragma once

#include <cctype>
#include <string>

namespace shardtrain::util {

inline std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace shardtrain::util
