#include "shardtrain/data/pipeline/label_values.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <stdexcept>

#include "shardtrain/data/pipeline/records.h"

namespace shardtrain::data {
namespace {

// A .jsonl line's labels into `out` (nothing for a line that is not an object holding the field).
void json_labels(const std::string& line, const std::string& field, std::set<std::string>& out, bool& lists) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains(field)) return;
  auto add = [&](const nlohmann::json& v) {
    if (v.is_string()) out.insert(v.get<std::string>());
    else if (v.is_number()) out.insert(v.dump());
  };
  if (j[field].is_array()) {
    lists = true;
    for (const auto& v : j[field]) add(v);
  } else {
    add(j[field]);
  }
}

}  // namespace

LabelValues label_values(const std::vector<std::string>& files, const std::string& field, bool sets, bool words) {
  std::set<std::string> seen;
  LabelValues out;
  for (const std::string& path : files) {
    const RecordFormat format = record_format_of(path);
    const bool conll = format == RecordFormat::CONLL || (words && format == RecordFormat::TEXT_LINES);
    if (!conll && format != RecordFormat::JSONL && format != RecordFormat::TSV && format != RecordFormat::CSV) {
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument("data file '" + path + "' cannot be read");
    std::string line;
    size_t column = std::string::npos;  // a .tsv/.csv's label column, from its header
    if (format == RecordFormat::TSV || format == RecordFormat::CSV) {
      if (!std::getline(in, line)) continue;
      const std::vector<std::string> header = split_record(line, format);
      column = static_cast<size_t>(std::find(header.begin(), header.end(), field) - header.begin());
      if (column == header.size()) continue;  // the source names the missing column when it opens
    }
    while (std::getline(in, line)) {
      if (conll) {
        std::string word, tag;
        if (!conll_separator(line) && conll_line(line, word, tag)) seen.insert(tag);
      } else if (format == RecordFormat::JSONL) {
        json_labels(line, field, seen, out.lists);
      } else {
        std::vector<std::string> row;
        try {
          row = split_record(line, format);
        } catch (const std::runtime_error&) {
          continue;
        }
        if (column >= row.size()) continue;
        if (sets) {  // a set's items, as the reader splits them
          const std::vector<std::string> items = listed_values(row[column]);
          seen.insert(items.begin(), items.end());
          continue;
        }
        const std::string& value = row[column];
        const size_t first = value.find_first_not_of(' '), last = value.find_last_not_of(' ');
        if (first != std::string::npos) seen.insert(value.substr(first, last - first + 1));
      }
    }
  }
  bool numbers = !seen.empty(), whole = true;
  for (const std::string& v : seen) {
    numbers = numbers && score_of(v).has_value();
    whole = whole && v.find_first_not_of("0123456789") == std::string::npos && v.size() <= 18;
  }
  if (numbers && !whole) {
    out.scores = true;
    return out;
  }
  out.names.assign(seen.begin(), seen.end());
  if (whole) {
    std::sort(out.names.begin(), out.names.end(),
              [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
  }
  return out;
}

}  // namespace shardtrain::data
