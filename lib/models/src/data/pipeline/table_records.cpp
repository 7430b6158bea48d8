#include "shardtrain/data/pipeline/table_records.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "data/formats/table_files.h"
#include "shardtrain/data/pipeline/records.h"
#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

// datasets' features by column name ({"label": {"_type": "ClassLabel", "names": [...]}, ...}); empty when the file
// carries none (pyarrow wrote it) or they do not parse (the Arrow types still say what each column holds).
nlohmann::json features_of(const ColumnTable& table) {
  const std::string text = table.metadata("huggingface");
  if (text.empty()) return nlohmann::json::object();
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return nlohmann::json::object();
  const auto info = j.find("info");
  if (info == j.end() || !info->is_object() || !info->contains("features") || !(*info)["features"].is_object()) {
    return nlohmann::json::object();
  }
  return (*info)["features"];
}

std::string feature_type(const nlohmann::json& features, const std::string& column) {
  const auto f = features.find(column);
  if (f == features.end() || !f->is_object() || !f->contains("_type") || !(*f)["_type"].is_string()) return "";
  return (*f)["_type"].get<std::string>();
}

// Whether `column` (-1: none) is a top-level column of lists of whole numbers: token ids, or a List(ClassLabel)'s.
bool whole_number_lists(const ColumnTable& t, int column) {
  if (column < 0) return false;
  const TableColumn& c = t.columns()[static_cast<size_t>(column)];
  if (c.parent >= 0 || c.kind != ColumnKind::LIST || c.items < 0) return false;
  return t.columns()[static_cast<size_t>(c.items)].kind == ColumnKind::INT;
}

// Whether a column is a list of ClassLabel (datasets' List, Sequence before datasets 4: a multi-label column).
bool class_label_list(const nlohmann::json& features, const std::string& column) {
  const std::string type = feature_type(features, column);
  if (type != "List" && type != "Sequence") return false;
  const nlohmann::json& item = features[column].contains("feature") ? features[column]["feature"] : nlohmann::json();
  return item.is_object() && item.value("_type", nlohmann::json()) == "ClassLabel";
}

// The names of a ClassLabel column, or of a list of ClassLabel's items; empty for a column of another feature.
std::vector<std::string> class_names(const nlohmann::json& features, const std::string& column) {
  std::vector<std::string> names;
  const bool list = class_label_list(features, column);
  if (!list && feature_type(features, column) != "ClassLabel") return names;
  const nlohmann::json& f = list ? features[column]["feature"] : features[column];
  if (!f.contains("names") || !f["names"].is_array()) return names;
  for (const auto& n : f["names"]) {
    if (n.is_string()) names.push_back(n.get<std::string>());
  }
  return names;
}

// A Value feature as "Value(int32)"; "" for another.
std::string feature_of_json(const nlohmann::json& f) {
  if (!f.is_object() || !f.contains("_type") || f["_type"] != "Value" || !f.contains("dtype") ||
      !f["dtype"].is_string()) {
    return "";
  }
  return "Value(" + f["dtype"].get<std::string>() + ")";
}

std::string list_of(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return "[" + out + "]";
}

}  // namespace

TableFile open_table_file(const std::string& path, const std::string& table_cache) {
  if (record_format_of(path) == RecordFormat::PARQUET && !table_cache.empty()) {
    try {
      const std::string copy = parquet_arrow_copy(path, table_cache);
      TableFile f{io::file_bytes(copy), nullptr, path + ": read from its Arrow copy " + copy};
      f.table = open_arrow_ipc(std::string_view(f.bytes.data(), f.bytes.size()), path);
      return f;
    } catch (const std::runtime_error& e) {
      TableFile f = open_table_file(path);
      f.note = std::string(e.what()) + "; read in place";
      return f;
    }
  }
  TableFile f{io::file_bytes(path), nullptr, ""};
  const std::string_view view(f.bytes.data(), f.bytes.size());
  f.table = record_format_of(path) == RecordFormat::PARQUET ? open_parquet(view, path) : open_arrow_ipc(view, path);
  return f;
}

std::string feature_of(const ColumnTable& table, const std::string& column) {
  const nlohmann::json features = features_of(table);
  const std::string type = feature_type(features, column);
  if (type == "ClassLabel") return "ClassLabel " + list_of(class_names(features, column));
  if (class_label_list(features, column)) return type + "(ClassLabel " + list_of(class_names(features, column)) + ")";
  const auto f = features.find(column);
  if (type == "Value") {
    const std::string value = feature_of_json(*f);
    return value.empty() ? type : value;
  }
  if ((type == "List" || type == "Sequence" || type == "LargeList") && f->contains("feature")) {
    const std::string item = feature_of_json((*f)["feature"]);  // List(Value(int32)): a tokenized text's ids
    return item.empty() ? type : type + "(" + item + ")";
  }
  return type;
}

TableRecords::TableRecords(const std::string& path, SampleKind kind, const TextFields& fields,
                           const std::string& table_cache)
    : path_(path), file_(open_table_file(path, table_cache)), table_(file_.table.get()), classes_(fields.classes) {
  const nlohmann::json features = features_of(*table_);
  if (fields.words) {  // token classification: a list of words, a list of their classes
    words_ = list_column(fields.text[0], "data.text_fields", {ColumnKind::UTF8}, "lists of words (strings)");
    label_ = list_column(fields.label, "data.label_field", {ColumnKind::INT, ColumnKind::UTF8},
                         "lists of class ids or names, one per word (datasets' List(ClassLabel))");
    check_class_names(class_names(features, fields.label), fields.label);
    return;
  }
  if (kind != SampleKind::IMAGE) {
    // Token ids: the named column holds lists of whole numbers, or by default the table has input_ids and no text.
    const std::vector<std::string> names =
        text_field_names(fields.text, table_->column("text") >= 0, token_list(table_->column("input_ids")));
    size_t lists = 0;
    for (const std::string& name : names) lists += token_list(table_->column(name));
    if (lists > 0 && lists < names.size()) {
      throw std::invalid_argument("data file '" + path + "': data.text_fields [" + names[0] + ", " + names[1] +
                                  "] mix token ids and text: name one column of token ids (a tokenized pair is one "
                                  "list), or two (seq2seq's input_ids and labels)");
    }
    if (lists > 0) {
      ids_ = table_->column(names[0]);
      if (names.size() > 1) pair_ids_ = table_->column(names[1]);
      if (token_list(table_->column("token_type_ids"))) type_ids_ = table_->column("token_type_ids");
      if (token_list(table_->column("attention_mask"))) mask_ = table_->column("attention_mask");
    }
    if (ids_ < 0) {
      for (const std::string& name : names) text_.push_back(find(name, "data.text_fields", {ColumnKind::UTF8}));
    }
  }
  if (kind != SampleKind::TEXT) {
    // The configured column, else the one datasets marks as an Image when there is exactly one.
    std::string name = fields.image;
    if (table_->column(name) < 0) {
      std::vector<std::string> images;
      for (const auto& c : table_->columns()) {
        if (c.parent < 0 && feature_type(features, c.path) == "Image") images.push_back(c.path);
      }
      if (images.size() == 1) name = images[0];
    }
    image_ = find(name, "data.image_field", {ColumnKind::BINARY, ColumnKind::STRUCT});
    if (table_->columns()[static_cast<size_t>(image_)].kind == ColumnKind::STRUCT) {  // datasets' Image: {bytes, path}
      const int bytes = table_->column(name + ".bytes"), file = table_->column(name + ".path");
      if (bytes < 0 || table_->columns()[static_cast<size_t>(bytes)].kind != ColumnKind::BINARY) {
        throw std::invalid_argument("data file '" + path + "': column '" + name +
                                    "' is a struct without binary 'bytes' (datasets' Image holds {bytes, path})");
      }
      image_ = bytes;
      if (file >= 0 && table_->columns()[static_cast<size_t>(file)].kind == ColumnKind::UTF8) image_path_ = file;
    }
  }
  if (!fields.label.empty() && fields.scores) {  // a regression's target
    scores_ = true;
    label_ = find(fields.label, "data.label_field", {ColumnKind::FLOAT, ColumnKind::INT, ColumnKind::UTF8});
  } else if (!fields.label.empty()) {
    sets_ = fields.multi_label;
    label_ = sets_ ? find(fields.label, "data.label_field", {ColumnKind::LIST})
                   : find(fields.label, "data.label_field", {ColumnKind::INT, ColumnKind::BOOL, ColumnKind::UTF8});
    if (sets_ && !token_list(label_)) {
      const TableColumn& items =
          table_->columns()[static_cast<size_t>(table_->columns()[static_cast<size_t>(label_)].items)];
      throw std::invalid_argument("data file '" + path + "': column '" + fields.label + "' (data.label_field) holds " +
                                  "lists of " + items.type + ", expected lists of class ids (datasets' "
                                  "List(ClassLabel))");
    }
    check_class_names(class_names(features, fields.label), fields.label);
  }
}

void TableRecords::check_class_names(const std::vector<std::string>& names, const std::string& column) const {
  if (!names.empty() && !classes_.empty() && names != classes_) {
    throw std::invalid_argument("data file '" + path_ + "': column '" + column + "' holds the classes " +
                                list_of(names) + " (datasets' ClassLabel), the run " + list_of(classes_) +
                                " (data.labels, or the model's id2label): give the dataset's names in its order, "
                                "so that a label id means the same class");
  }
}

int TableRecords::list_column(const std::string& field, const std::string& key, const std::vector<ColumnKind>& items,
                              const std::string& wanted) const {
  const int c = table_->column(field);
  if (c < 0 || table_->columns()[static_cast<size_t>(c)].parent >= 0) return find(field, key, {});  // names them
  const TableColumn& col = table_->columns()[static_cast<size_t>(c)];
  const TableColumn* item = col.items >= 0 ? &table_->columns()[static_cast<size_t>(col.items)] : nullptr;
  if (col.kind != ColumnKind::LIST || !item || std::find(items.begin(), items.end(), item->kind) == items.end()) {
    throw std::invalid_argument("data file '" + path_ + "': column '" + field + "' (" + key + ") holds " + col.type +
                                (item ? "<" + item->type + ">" : std::string()) + ", expected " + wanted);
  }
  return c;
}

bool TableRecords::token_list(int column) const { return whole_number_lists(*table_, column); }

std::string TableRecords::tokenized() const {
  if (ids_ < 0) return "";
  std::string out = table_->columns()[static_cast<size_t>(ids_)].path;
  for (int c : {pair_ids_, type_ids_, mask_}) {
    if (c >= 0) out += ", " + table_->columns()[static_cast<size_t>(c)].path;
  }
  return out;
}

// A tokenized row: its ids with the padding (attention_mask 0, left or right) left out, and their token types.
void TableRecords::read_tokens(int64_t row, RawSample& s) const {
  auto list = [&](int c) {
    if (table_->is_null(c, row)) {
      throw std::runtime_error(s.key + ": column '" + table_->columns()[static_cast<size_t>(c)].path + "' is null");
    }
    return table_->integers(c, row);
  };
  set_tokens(s, list(ids_), type_ids_ >= 0 ? list(type_ids_) : std::vector<int64_t>{},
             mask_ >= 0 ? list(mask_) : std::vector<int64_t>{}, "token_type_ids", "attention_mask",
             pair_ids_ >= 0 ? list(pair_ids_) : std::vector<int64_t>{});
}

LabelColumn label_column(const std::string& path, const std::string& column) {
  const TableFile file = open_table_file(path);
  const ColumnTable& t = *file.table;
  const int c = t.column(column);
  if (c >= 0 && t.columns()[static_cast<size_t>(c)].kind == ColumnKind::FLOAT) return {{column}, false, true};
  return {class_names(features_of(t), column), whole_number_lists(t, c)};
}

int TableRecords::find(const std::string& field, const std::string& key, const std::vector<ColumnKind>& kinds) const {
  const int c = table_->column(field);
  if (c < 0 || table_->columns()[static_cast<size_t>(c)].parent >= 0) {
    std::vector<std::string> columns;
    for (const auto& col : table_->columns()) {
      if (col.parent < 0) columns.push_back(col.path + " (" + col.type + ")");
    }
    throw std::invalid_argument("data file '" + path_ + "': no column '" + field + "' (" + key + "); it has " +
                                list_of(columns));
  }
  const TableColumn& col = table_->columns()[static_cast<size_t>(c)];
  if (std::find(kinds.begin(), kinds.end(), col.kind) == kinds.end()) {
    const std::string items = col.items >= 0 ? "<" + table_->columns()[static_cast<size_t>(col.items)].type + ">" : "";
    const char* wanted = key == "data.label_field"
                             ? (scores_ ? "numbers"
                                : sets_ ? "lists of class ids (datasets' List(ClassLabel)) for data.multi_label"
                                        : col.kind == ColumnKind::LIST ? "whole numbers or strings (a list of classes "
                                                                         "per sample is data.multi_label's)"
                                                                       : "whole numbers or strings")
                         : key == "data.image_field" ? "encoded images (binary, or datasets' Image)" : "strings";
    throw std::invalid_argument("data file '" + path_ + "': column '" + field + "' (" + key + ") holds " + col.type +
                                items + ", expected " + wanted);
  }
  return c;
}

// A token-classification row: its words and their class ids (names looked up), as many of each.
void TableRecords::read_words(int64_t row, RawSample& s) const {
  for (int c : {words_, label_}) {
    if (table_->is_null(c, row)) {
      throw std::runtime_error(s.key + ": column '" + table_->columns()[static_cast<size_t>(c)].path + "' is null");
    }
  }
  s.words = table_->strings(words_, row);
  const bool names = table_->columns()[static_cast<size_t>(table_->columns()[static_cast<size_t>(label_)].items)]
                         .kind == ColumnKind::UTF8;
  std::vector<std::string> values;
  if (names) {
    values = table_->strings(label_, row);
  } else {
    for (int64_t id : table_->integers(label_, row)) values.push_back(std::to_string(id));
  }
  if (values.size() != s.words.size()) {
    throw std::runtime_error(s.key + ": " + std::to_string(values.size()) + " classes in '" +
                             table_->columns()[static_cast<size_t>(label_)].path + "' for " +
                             std::to_string(s.words.size()) + " words in '" +
                             table_->columns()[static_cast<size_t>(words_)].path + "'");
  }
  s.word_labels = class_ids(values, classes_, s.key);
}

void TableRecords::read(int64_t row, RawSample& s) const {
  if (words_ >= 0) return read_words(row, s);
  if (ids_ >= 0) read_tokens(row, s);
  for (size_t i = 0; i < text_.size(); ++i) {
    const int c = text_[i];
    if (table_->is_null(c, row)) {
      throw std::runtime_error(s.key + ": column '" + table_->columns()[static_cast<size_t>(c)].path + "' is null");
    }
    (i == 0 ? s.text : s.text_pair) = std::string(table_->bytes(c, row));
  }
  if (image_ >= 0) {
    if (!table_->is_null(image_, row)) {
      s.image = std::string(table_->bytes(image_, row));
    } else if (image_path_ >= 0 && !table_->is_null(image_path_, row)) {
      std::string file(table_->bytes(image_path_, row));
      if (!file.empty() && file[0] != '/') file = path_.substr(0, path_.rfind('/') + 1) + file;
      try {
        const std::vector<char> b = io::read_file(file);
        s.image.assign(b.begin(), b.end());
      } catch (const std::exception& e) {
        throw std::runtime_error(s.key + ": the image's bytes are not in the file and its path cannot be read (" +
                                 e.what() + ")");
      }
    } else {
      throw std::runtime_error(s.key + ": no image (null)");
    }
  }
  if (label_ < 0) return;
  const TableColumn& c = table_->columns()[static_cast<size_t>(label_)];
  if (table_->is_null(label_, row)) throw std::runtime_error(s.key + ": label '" + c.path + "' is null");
  if (scores_) {
    s.score = c.kind == ColumnKind::UTF8 ? checked_score(table_->bytes(label_, row), s.key + ": ")
                                         : table_->number(label_, row);
    if (!std::isfinite(*s.score)) {  // a float column's nan or inf
      throw std::runtime_error(s.key + ": label '" + c.path + "' is " + std::to_string(*s.score) + ", not finite");
    }
    return;
  }
  if (sets_) {
    std::vector<int64_t> ids = table_->integers(label_, row);
    for (int64_t id : ids) {
      if (id < 0 || id >= static_cast<int64_t>(classes_.size())) {
        throw std::runtime_error(s.key + ": " + not_a_class(std::to_string(id), classes_));
      }
    }
    s.label_set = as_label_set(std::move(ids));
    return;
  }
  const std::string value =
      c.kind == ColumnKind::UTF8 ? table_->bytes(label_, row) : std::to_string(table_->integer(label_, row));
  const int64_t id = class_of(value, classes_);
  if (id < 0) throw std::runtime_error(s.key + ": " + not_a_class(value, classes_));
  s.label = id;
}

}  // namespace shardtrain::data
