#include "regex.h"

#include <oniguruma.h>

#include <mutex>
#include <stdexcept>

namespace shardtrain::data {

struct Regex::Compiled {
  regex_t* regex = nullptr;
};

namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

const OnigUChar* bytes(const std::string& s) { return reinterpret_cast<const OnigUChar*>(s.data()); }

}  // namespace

Regex::Regex(const std::string& pattern) : compiled_(std::make_unique<Compiled>()) {
  initialize_oniguruma();
  OnigErrorInfo info;
  const int rc = onig_new(&compiled_->regex, bytes(pattern), bytes(pattern) + pattern.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_RUBY, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    throw std::invalid_argument("regular expression '" + pattern + "': " + reinterpret_cast<const char*>(message));
  }
}

Regex::~Regex() {
  if (compiled_ && compiled_->regex) onig_free(compiled_->regex);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(const std::string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  OnigRegion* region = onig_region_new();
  const OnigUChar* begin = bytes(text);
  const OnigUChar* end = begin + text.size();
  size_t at = 0;
  bool after_match = false;
  size_t last_end = 0;
  while (at <= text.size()) {
    const int found = onig_search(compiled_->regex, begin, end, begin + at, end, region, ONIG_OPTION_NONE);
    if (found < 0) break;  // ONIG_MISMATCH (or an error, which a valid pattern does not give)
    const auto b = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
    if (b == e) {
      if (!(after_match && b == last_end)) out.emplace_back(b, e);
      if (b >= text.size()) break;
      // step over one UTF-8 character
      size_t step = 1;
      while (b + step < text.size() && (static_cast<unsigned char>(text[b + step]) & 0xC0) == 0x80) ++step;
      at = b + step;
    } else {
      out.emplace_back(b, e);
      at = e;
    }
    after_match = true;
    last_end = e;
  }
  onig_region_free(region, 1);
  return out;
}

}  // namespace shardtrain::data
