#include "unicode_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

namespace shardtrain::data::unicode {

Codepoints from_utf8(const std::string& text) {
  Codepoints out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) cp = 0xFFFD, n = 1;
    out.push_back(cp);
    p += n, left -= n;
  }
  return out;
}

std::string to_utf8(int32_t cp) {
  utf8proc_uint8_t buffer[4];
  const auto n = utf8proc_encode_char(cp, buffer);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

std::string to_utf8(const Codepoints& cps) {
  std::string out;
  out.reserve(cps.size());
  for (auto cp : cps) out += to_utf8(cp);
  return out;
}

size_t char_length(const std::string& text, size_t at) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + at,
                                  static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
  return n <= 0 ? 1 : static_cast<size_t>(n);
}

std::string normalize(const std::string& text, Form form) {
  const std::string valid = to_utf8(from_utf8(text));  // utf8proc refuses invalid UTF-8 and stops at NUL
  std::string out;
  size_t begin = 0;
  while (begin <= valid.size()) {  // NUL-separated runs: utf8proc's NF* functions take C strings
    const size_t end = std::min(valid.find('\0', begin), valid.size());
    const std::string run = valid.substr(begin, end - begin);
    const auto* in = reinterpret_cast<const utf8proc_uint8_t*>(run.c_str());
    utf8proc_uint8_t* result = form == Form::NFC    ? utf8proc_NFC(in)
                               : form == Form::NFD  ? utf8proc_NFD(in)
                               : form == Form::NFKC ? utf8proc_NFKC(in)
                                                    : utf8proc_NFKD(in);
    out += result ? reinterpret_cast<const char*>(result) : run;
    std::free(result);
    if (end == valid.size()) break;
    out += '\0';
    begin = end + 1;
  }
  return out;
}

bool is_other(int32_t cp) {
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN:
      return true;
    default:
      return false;
  }
}

bool is_rust_whitespace(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_bert_whitespace(int32_t cp) {
  return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS;
}

bool is_punctuation(int32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126)) {
    return true;
  }
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool is_cjk(int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool is_nonspacing_mark(int32_t cp) { return utf8proc_category(cp) == UTF8PROC_CATEGORY_MN; }

bool is_numeric(int32_t cp) {
  const auto c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_combining_mark(int32_t cp) {
  const auto c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

bool is_word(int32_t cp) {
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

std::string lowercase(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (auto cp : from_utf8(text)) {
    if (cp == 0x130) {  // the one full mapping that is not a single character
      out += "i\xCC\x87";
    } else {
      out += to_utf8(utf8proc_tolower(cp));
    }
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> graphemes(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> out;
  utf8proc_int32_t state = 0, previous = -1;
  size_t at = 0, begin = 0;
  while (at < text.size()) {
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + at,
                              static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
    if (n <= 0) cp = 0xFFFD, n = 1;
    if (previous >= 0 && utf8proc_grapheme_break_stateful(previous, cp, &state)) {
      out.emplace_back(begin, at);
      begin = at;
    }
    previous = cp;
    at += static_cast<size_t>(n);
  }
  if (at > begin) out.emplace_back(begin, at);
  return out;
}

}  // namespace shardtrain::data::unicode
