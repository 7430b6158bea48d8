// Unicode helpers the tokenizers share (utf8proc underneath): UTF-8 to code points and back, normalization forms,
// the character classes Hugging Face's tokenizers test (each named after the Rust or Python predicate it mirrors),
// lower-casing and grapheme clusters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::data::unicode {

using Codepoints = std::vector<int32_t>;

// Invalid bytes become U+FFFD, one per byte, like a lossy decode.
Codepoints from_utf8(const std::string& text);
std::string to_utf8(const Codepoints& cps);
std::string to_utf8(int32_t cp);
size_t char_length(const std::string& text, size_t at);  // bytes of the character starting at byte `at` (1 if bad)

enum class Form { NFC, NFD, NFKC, NFKD };
std::string normalize(const std::string& text, Form form);

bool is_other(int32_t cp);            // categories Cc Cf Cs Co Cn (Rust's is_other; BERT's "control")
bool is_rust_whitespace(int32_t cp);  // the White_Space property (Rust's char::is_whitespace)
bool is_bert_whitespace(int32_t cp);  // \t \n \r, space and category Zs (transformers' BasicTokenizer)
bool is_punctuation(int32_t cp);      // ASCII punctuation or a P* category (BERT's and tokenizers' punctuation)
bool is_cjk(int32_t cp);              // the CJK ideograph blocks BERT pads with spaces
bool is_nonspacing_mark(int32_t cp);  // category Mn
bool is_numeric(int32_t cp);          // categories Nd Nl No (Rust's char::is_numeric)
bool is_combining_mark(int32_t cp);   // categories Mn Mc Me
bool is_word(int32_t cp);             // categories L* M* N* Pc (a regex's \w)

// Rust's str::to_lowercase: each character's full lower-case mapping (U+0130 becomes "i" + U+0307).
std::string lowercase(const std::string& text);

// Extended grapheme clusters (UAX #29), as byte ranges [begin, end) of `text`.
std::vector<std::pair<size_t, size_t>> graphemes(const std::string& text);

}  // namespace shardtrain::data::unicode
