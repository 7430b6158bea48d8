#include "shardtrain/data/pipeline/records.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "shardtrain/data/pipeline/source.h"

namespace shardtrain::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

RecordFormat record_format_of(const std::string& path) {
  if (ends_with(path, ".txt")) return RecordFormat::TEXT_LINES;
  if (ends_with(path, ".jsonl")) return RecordFormat::JSONL;
  if (ends_with(path, ".tsv")) return RecordFormat::TSV;
  if (ends_with(path, ".csv")) return RecordFormat::CSV;
  if (ends_with(path, ".arrow")) return RecordFormat::ARROW;
  if (ends_with(path, ".parquet")) return RecordFormat::PARQUET;
  if (ends_with(path, ".conll")) return RecordFormat::CONLL;
  return RecordFormat::TAR;
}

std::vector<std::string> split_record(const std::string& text, RecordFormat format) {
  std::string line = text;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> fields(1);
  if (format != RecordFormat::CSV) {
    for (char c : line) {
      if (c == '\t') fields.emplace_back();
      else fields.back() += c;
    }
    return fields;
  }
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') fields.back() += c;
      else if (i + 1 < line.size() && line[i + 1] == '"') fields.back() += '"', ++i;  // "" inside quotes
      else quoted = false;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  if (quoted) throw std::runtime_error("a quoted field is not closed on its line");
  return fields;
}

bool conll_separator(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos || line.rfind("-DOCSTART-", 0) == 0;
}

bool conll_line(const std::string& line, std::string& word, std::string& tag) {
  std::istringstream fields(line);  // '\r' is whitespace to >>
  if (!(fields >> word >> tag)) return false;
  for (std::string next; fields >> next;) tag = next;
  return true;
}

void conll_words(const std::string& sentence, const std::string& key, int64_t first_line,
                 std::vector<std::string>& words, std::vector<std::string>& tags) {
  std::stringstream lines(sentence);
  int64_t number = first_line;
  for (std::string line; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string word, tag;
    if (!conll_line(line, word, tag)) {
      throw std::runtime_error(key + ": line " + std::to_string(number) + " ('" + line.substr(0, 40) + "') holds " +
                               "1 field, expected a word and its tag (CoNLL columns)");
    }
    words.push_back(word);
    tags.push_back(tag);
  }
}

std::vector<std::string> listed_values(const std::string& field) {
  std::vector<std::string> values;
  std::stringstream items(field);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
    if (first != std::string::npos) values.push_back(item.substr(first, last - first + 1));
  }
  return values;
}

std::vector<int64_t> as_label_set(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int64_t class_of(const std::string& value, const std::vector<std::string>& classes) {
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i] == value) return static_cast<int64_t>(i);
  }
  if (value.empty() || value.size() > 18) return -1;
  for (char c : value) {
    if (c < '0' || c > '9') return -1;
  }
  const int64_t n = std::stoll(value);
  return classes.empty() || n < static_cast<int64_t>(classes.size()) ? n : -1;
}

std::string not_a_class(const std::string& value, const std::vector<std::string>& classes) {
  if (classes.empty()) return "label '" + value.substr(0, 40) + "' is not a whole number";
  std::string list;
  for (const auto& c : classes) list += (list.empty() ? "" : ", ") + c;
  return "label '" + value.substr(0, 40) + "' is not one of the classes [" + list + "] (data.labels) nor a class id "
         "below " + std::to_string(classes.size());
}

std::vector<int64_t> class_ids(const std::vector<std::string>& values, const std::vector<std::string>& classes,
                               const std::string& key) {
  std::vector<int64_t> ids;
  for (const std::string& value : values) {
    const int64_t id = class_of(value, classes);
    if (id < 0) throw std::runtime_error(key + ": " + not_a_class(value, classes));
    ids.push_back(id);
  }
  return ids;
}

std::optional<double> score_of(const std::string& value) {
  if (value.empty() || value.size() > 64 || value.find_first_not_of("0123456789+-.eE") != std::string::npos) {
    return std::nullopt;  // also no spaces, hexadecimal, "nan" or "inf", which strtod would take
  }
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

double checked_score(const std::string& value, const std::string& prefix) {
  const std::optional<double> score = score_of(value);
  if (!score) {
    throw std::runtime_error(prefix + "label '" + value.substr(0, 40) +
                             "' is not a number (a regression's score: data.labels names one)");
  }
  return *score;
}

std::vector<std::string> text_field_names(const std::vector<std::string>& text, bool has_text, bool has_input_ids) {
  if (text == std::vector<std::string>{"text"} && !has_text && has_input_ids) return {"input_ids"};
  return text;
}

void set_tokens(RawSample& s, const std::vector<int64_t>& ids, const std::vector<int64_t>& types,
                const std::vector<int64_t>& mask, const std::string& types_name, const std::string& mask_name,
                const std::vector<int64_t>& pair_ids) {
  for (const auto* list : {&types, &mask}) {
    if (!list->empty() && list->size() != ids.size()) {
      throw std::runtime_error(s.key + ": '" + (list == &types ? types_name : mask_name) + "' holds " +
                               std::to_string(list->size()) + " values for " + std::to_string(ids.size()) +
                               " token ids");
    }
  }
  s.tokenized = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!mask.empty() && mask[i] == 0) continue;
    s.input_ids.push_back(ids[i]);
    if (!types.empty()) s.token_type_ids.push_back(types[i]);
  }
  for (int64_t id : pair_ids) {
    if (id != -100) s.pair_ids.push_back(id);
  }
  if (s.input_ids.empty()) throw std::runtime_error(s.key + ": no token ids (an empty list)");
}

}  // namespace shardtrain::data
