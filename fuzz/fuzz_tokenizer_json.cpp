// libFuzzer: an untrusted tokenizer.json through data::HfTokenizer (JSON, base64, SentencePiece's precompiled
// character map, regular expressions, merges, templates), which then encodes, pairs and decodes the same bytes as
// text (invalid UTF-8 included). A bad file must throw std::invalid_argument.
#include <stdexcept>

#include "fuzz_input.h"
#include "shardtrain/data/tokenizers/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = shardtrain::fuzz::input_file(data, size, "tokenizer.json");
  const std::string text(reinterpret_cast<const char*>(data), std::min<size_t>(size, 2048));
  try {
    const shardtrain::data::HfTokenizer tok(path);
    const shardtrain::data::Encoding e = tok.encode(text, 64);
    tok.encode_pair(text, text.substr(text.size() / 2), 32);
    tok.decode(e.ids, false);
    tok.decode(tok.token_ids(text), true);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
