// libFuzzer: an untrusted vocabulary file through data::load_vocab and the WordPiece tokenizer built on it, which
// then tokenizes the same bytes as text (invalid UTF-8 included). Bad vocabularies must throw std::runtime_error
// or std::invalid_argument.
#include <stdexcept>

#include "fuzz_input.h"
#include "shardtrain/data/tokenizers/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = shardtrain::fuzz::input_file(data, size, "vocab.txt");
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const shardtrain::data::WordPieceTokenizer lower(shardtrain::data::load_vocab(path), /*lowercase=*/true);
    lower.encode(text, 64);
    const shardtrain::data::WordPieceTokenizer cased(shardtrain::data::load_vocab(path), /*lowercase=*/false);
    cased.tokenize(text);
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
