#include "shardtrain/data/pipeline/source.h"

#include <nlohmann/json.hpp>

#include <glob.h>

#include <algorithm>
#include <map>
#include <regex>
#include <stdexcept>

#include "shardtrain/data/pipeline/records.h"
#include "shardtrain/data/pipeline/table_records.h"
#include "data/formats/tar.h"
#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Part { kImage, kText, kLabel, kOther };

Part part_of(const std::string& ext) {
  std::string e = ext;
  for (auto& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* x : {"jpg", "jpeg", "png", "bmp", "gif", "ppm", "pgm", "tga"}) {
    if (e == x) return Part::kImage;
  }
  if (e == "txt" || e == "text" || e == "caption") return Part::kText;
  if (e == "cls") return Part::kLabel;
  return Part::kOther;
}

// WebDataset's split of a member path into (key, extension): the key ends at the first '.' of the file name.
std::pair<std::string, std::string> key_and_ext(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t start = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', start);
  if (dot == std::string::npos) return {path, ""};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

}  // namespace

const char* kind_name(SampleKind kind) {
  switch (kind) {
    case SampleKind::IMAGE_TEXT: return "image_text";
    case SampleKind::TEXT: return "text";
    case SampleKind::IMAGE: return "image";
  }
  return "?";
}

namespace {

// The files of a directory: every data file inside, sorted; for datasets' directories, their own lists.
std::vector<std::string> directory_files(const std::string& path) {
  const std::vector<std::string> names = io::list_directory(path);
  auto has = [&](const char* name) { return std::find(names.begin(), names.end(), name) != names.end(); };
  if (has("dataset_dict.json")) {  // DatasetDict.save_to_disk: a directory per split
    std::string splits;
    for (const auto& n : names) {
      if (io::is_directory(path + "/" + n)) splits += (splits.empty() ? "" : ", ") + n;
    }
    throw std::invalid_argument("data directory '" + path + "' holds a dataset's splits (" + splits +
                                "): name one, as '" + path + "/train'");
  }
  std::vector<std::string> files;
  if (has("state.json")) {  // Dataset.save_to_disk: its data files, in order
    try {
      const std::vector<char> text = io::read_file(path + "/state.json");
      const nlohmann::json state = nlohmann::json::parse(text.begin(), text.end());
      for (const auto& f : state.at("_data_files")) {
        files.push_back(path + "/" + f.at("filename").get<std::string>());
      }
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("data directory '" + path + "': its state.json (datasets' save_to_disk) does not "
                                  "list its _data_files: " + e.what());
    }
    for (const auto& f : files) {
      if (!io::path_exists(f)) {
        throw std::invalid_argument("data directory '" + path + "': its state.json lists '" + f +
                                    "', which is not there");
      }
    }
    return files;
  }
  // The files of several splits side by side: load_dataset's cache (glue-train.arrow, glue-validation.arrow), a
  // dataset repository of the Hub (train-00000-of-00002.parquet, test-00000-of-00001.parquet).
  static const std::regex split_file(
      R"((?:.*-)?(train|validation|valid|dev|test|eval)(?:-\d+-of-\d+)?\.(arrow|parquet))");
  std::map<std::string, std::string> splits;  // split -> a file of it
  for (const auto& name : names) {
    for (const char* ext : {".tar", ".txt", ".jsonl", ".tsv", ".csv", ".arrow", ".parquet", ".conll"}) {
      if (ends_with(name, ext)) files.push_back(path + "/" + name);
    }
    std::smatch m;
    if (std::regex_match(name, m, split_file)) splits.emplace(m[1], name);
  }
  if (splits.size() > 1) {
    std::string list;
    for (const auto& [split, file] : splits) list += (list.empty() ? "" : ", ") + split;
    const std::string& example = splits.begin()->second;
    const size_t cut = example.find(splits.begin()->first) + splits.begin()->first.size();
    throw std::invalid_argument("data directory '" + path + "' holds the files of several splits (" + list +
                                "): name one's files, as '" + path + "/" + example.substr(0, cut) + "*." +
                                example.substr(example.rfind('.') + 1) + "'");
  }
  return files;
}

// A tokenized .jsonl line ({"input_ids": [101, 7592, 102], "attention_mask": [1, 1, 1]}, as datasets' to_json
// writes a tokenized dataset) into `s`: the first text field, or by default input_ids, holds an array (a second field
// another: a seq2seq target). False when it holds text.
bool json_tokens(RawSample& s, const nlohmann::json& j, const TextFields& fields) {
  const std::vector<std::string> names =
      text_field_names(fields.text, j.contains("text"), j.contains("input_ids") && j["input_ids"].is_array());
  if (names.empty() || !j.contains(names[0]) || !j[names[0]].is_array()) return false;
  if (names.size() > 1 && (!j.contains(names[1]) || !j[names[1]].is_array())) {
    throw std::runtime_error(s.key + ": \"" + names[0] + "\" holds token ids, so \"" + names[1] +
                             "\" must too (a seq2seq target's ids)");
  }
  auto list = [&](const std::string& key) {
    std::vector<int64_t> out;
    const auto it = j.find(key);
    if (it == j.end()) return out;
    if (!it->is_array()) throw std::runtime_error(s.key + ": \"" + key + "\" is not a list of whole numbers");
    for (const auto& v : *it) {
      if (!v.is_number_integer()) {
        throw std::runtime_error(s.key + ": \"" + key + "\" holds " + v.dump().substr(0, 20) +
                                 ", not a whole number");
      }
      out.push_back(v.get<int64_t>());
    }
    return out;
  };
  set_tokens(s, list(names[0]), list("token_type_ids"), list("attention_mask"), "token_type_ids", "attention_mask",
             names.size() > 1 ? list(names[1]) : std::vector<int64_t>{});
  return true;
}

// A .jsonl array's class names or ids (`field` holds it), as text for class_ids. Throws naming an item that is
// neither.
std::vector<std::string> json_class_values(const nlohmann::json& array, const std::string& field,
                                           const std::string& key) {
  std::vector<std::string> values;
  for (const auto& item : array) {
    if (!item.is_string() && !item.is_number_integer()) {
      throw std::runtime_error(key + ": label " + item.dump() + " in \"" + field + "\" is not a class name or id");
    }
    values.push_back(item.is_string() ? item.get<std::string>() : item.dump());
  }
  return values;
}

// A .jsonl record's words and their classes (TextFields::words): two arrays of the same length, strings and class
// names or ids.
void json_words(RawSample& s, const nlohmann::json& j, const TextFields& fields) {
  const std::string& name = fields.text[0];
  const auto words = j.find(name), labels = j.find(fields.label);
  if (words == j.end() || !words->is_array()) {
    throw std::runtime_error(s.key + ": a .jsonl line needs \"" + name + "\" holding an array of words");
  }
  if (labels == j.end() || !labels->is_array() || labels->size() != words->size()) {
    throw std::runtime_error(s.key + ": a .jsonl line needs \"" + fields.label + "\" holding a class for each of the " +
                             std::to_string(words->size()) + " words of \"" + name + "\"" +
                             (labels != j.end() && labels->is_array()
                                  ? " (it holds " + std::to_string(labels->size()) + ")" : std::string()));
  }
  for (const auto& w : *words) {
    if (!w.is_string()) throw std::runtime_error(s.key + ": \"" + name + "\" holds " + w.dump() + ", not a word");
    s.words.push_back(w.get<std::string>());
  }
  s.word_labels = class_ids(json_class_values(*labels, fields.label, s.key), fields.classes, s.key);
}

// A .jsonl record's set of classes: its label field, an array of class names or ids.
std::vector<int64_t> json_label_set(const nlohmann::json& j, const TextFields& fields, const std::string& key) {
  const auto it = j.find(fields.label);
  if (it == j.end() || !it->is_array()) {
    throw std::runtime_error(key + ": a .jsonl line needs a label field \"" + fields.label + "\" holding an array " +
                             "of class names or ids (multi-label)");
  }
  return as_label_set(class_ids(json_class_values(*it, fields.label, key), fields.classes, key));
}

// A .tsv/.csv field's set of classes: names or ids separated by commas ("2,15", as go_emotions' own .tsv files
// hold them; spaces around each left out); an empty field is the empty set.
std::vector<int64_t> listed_label_set(const std::string& field, const TextFields& fields, const std::string& key) {
  return as_label_set(class_ids(listed_values(field), fields.classes, key));
}

}  // namespace

std::vector<std::string> expand_paths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& path : paths) {
    if (path.find_first_of("*?[") != std::string::npos) {  // a pattern: train-*.parquet
      glob_t found{};
      const int status = ::glob(path.c_str(), 0, nullptr, &found);
      for (size_t i = 0; status == 0 && i < found.gl_pathc; ++i) files.emplace_back(found.gl_pathv[i]);
      ::globfree(&found);
      if (status != 0) throw std::invalid_argument("data path '" + path + "' matches no file");
      continue;
    }
    if (!io::path_exists(path)) throw std::invalid_argument("data path '" + path + "' does not exist");
    if (!io::is_directory(path)) {
      files.push_back(path);
      continue;
    }
    const std::vector<std::string> inside = directory_files(path);
    if (inside.empty()) {
      throw std::invalid_argument("data directory '" + path +
                                  "' has no .tar, .txt, .jsonl, .tsv, .csv, .arrow or .parquet file");
    }
    files.insert(files.end(), inside.begin(), inside.end());
  }
  return files;
}

SampleSource::SampleSource(const std::vector<std::string>& paths, SampleKind kind, TextFields fields,
                           const std::string& table_cache)
    : kind_(kind), fields_(std::move(fields)) {
  if (fields_.text.empty() || fields_.text.size() > 2) {
    throw std::invalid_argument("text fields: " + std::to_string(fields_.text.size()) +
                                " given, expected one (a text) or two (a sentence pair)");
  }
  files_ = expand_paths(paths);
  if (files_.empty()) throw std::invalid_argument(std::string("no files given for the ") + kind_name(kind) + " data");
  if (fields_.words && (fields_.text.size() != 1 || fields_.label.empty() || fields_.classes.empty())) {
    throw std::invalid_argument("token classification reads one field of words (data.text_fields: [tokens]) and "
                                "one of their classes (data.label_field: ner_tags), the classes named (data.labels, "
                                "or a dataset's List(ClassLabel))");
  }
  if (fields_.multi_label && !fields_.label.empty() && fields_.classes.empty()) {
    throw std::invalid_argument("multi-label data needs its classes named (data.labels, or a dataset's "
                                "List(ClassLabel)): each sample's set of them is one output per class");
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    const std::string& path = files_[f];
    const RecordFormat format = record_format_of(path);
    const bool table = format == RecordFormat::ARROW || format == RecordFormat::PARQUET;
    // A table is read through its own mapping (TableRecords): no descriptor of its own held beside it.
    handles_.push_back(table ? nullptr : std::make_unique<io::ReadOnlyFile>(path));
    formats_.push_back(static_cast<int>(format));
    columns_.emplace_back();
    tables_.emplace_back();
    const size_t entries = index_.size();
    if (fields_.multi_label && !fields_.label.empty() &&
        (format == RecordFormat::TAR || format == RecordFormat::TEXT_LINES)) {
      throw std::invalid_argument("data file '" + path + "': a multi-label sample's set of classes is a .jsonl "
                                  "array, a .tsv/.csv field of names or ids separated by commas, or a table's list "
                                  "column (datasets' List(ClassLabel)); this file holds one label per sample");
    }
    const bool conll = format == RecordFormat::CONLL || (fields_.words && format == RecordFormat::TEXT_LINES);
    if (fields_.words && format != RecordFormat::JSONL && !table && !conll) {
      throw std::invalid_argument("data file '" + path + "': token classification's words and their classes are "
                                  ".jsonl arrays ({\"tokens\": [...], \"ner_tags\": [...]}), a dataset's list "
                                  "columns (.arrow, .parquet) or CoNLL columns (.conll, .txt); this file cannot "
                                  "hold them");
    }
    if (conll && (!fields_.words || kind != SampleKind::TEXT)) {
      throw std::invalid_argument("data file '" + path + "': a .conll file holds words and their tags, for "
                                  "model.task token_classify");
    }
    if (conll) {
      formats_.back() = static_cast<int>(RecordFormat::CONLL);
      index_sentences(static_cast<int32_t>(f));
    } else if (format == RecordFormat::TAR && ends_with(path, ".tar")) {
      index_tar(static_cast<int32_t>(f));
    } else if (table) {
      tables_.back() = std::make_unique<TableRecords>(path, kind, fields_, table_cache);
      if (!tables_.back()->note().empty()) table_notes_.push_back(tables_.back()->note());
    } else if (kind == SampleKind::TEXT && format != RecordFormat::TAR) {
      if (format == RecordFormat::TEXT_LINES && (pairs() || !fields_.label.empty())) {
        throw std::invalid_argument("data file '" + path + "': a .txt file holds one text per line, without " +
                                    (pairs() ? "a second text" : "a label") + "; use .jsonl, .tsv or .csv");
      }
      index_lines(static_cast<int32_t>(f));
      if (format == RecordFormat::TSV || format == RecordFormat::CSV) read_header(static_cast<int32_t>(f));
    } else {
      throw std::invalid_argument("data file '" + path + "': expected a .tar" +
                                  (kind == SampleKind::TEXT ? ", .txt, .jsonl, .tsv, .csv" : std::string()) +
                                  " or .arrow/.parquet file for " + kind_name(kind) + " data");
    }
    const int64_t samples = table ? tables_.back()->rows() : static_cast<int64_t>(index_.size() - entries);
    if (samples > 0) spans_.push_back(Span{size_, static_cast<int32_t>(f), table ? -1 : static_cast<int64_t>(entries)});
    size_ += samples;
  }
  if (size_ == 0) {
    std::string why;
    for (const auto& p : problems_) why += "\n  " + p;
    throw std::invalid_argument(std::string("the ") + kind_name(kind) + " data (" + std::to_string(files_.size()) +
                                " files, first '" + files_[0] + "') has no usable sample (" +
                                std::to_string(incomplete_) + " incomplete)" + why);
  }
}

void SampleSource::read_header(int32_t file) {
  const std::string& path = files_[static_cast<size_t>(file)];
  auto first = std::find_if(index_.begin(), index_.end(), [&](const Entry& e) { return e.file == file; });
  if (first == index_.end()) throw std::invalid_argument("data file '" + path + "' is empty: expected a header row");
  const auto format = static_cast<RecordFormat>(formats_[static_cast<size_t>(file)]);
  const std::vector<std::string> header =
      split_record(handles_[static_cast<size_t>(file)]->read(first->text.offset, first->text.size), format);
  std::vector<std::string> wanted = fields_.text;
  if (!fields_.label.empty()) wanted.push_back(fields_.label);
  for (const std::string& name : wanted) {
    const auto at = std::find(header.begin(), header.end(), name);
    if (at == header.end()) {
      std::string list;
      for (const auto& h : header) list += (list.empty() ? "'" : ", '") + h + "'";
      throw std::invalid_argument("data file '" + path + "': no column '" + name + "' in its header (columns: " +
                                  list + ")");
    }
    columns_[static_cast<size_t>(file)].push_back(static_cast<size_t>(at - header.begin()));
  }
  const auto position = first - index_.begin();
  index_.erase(first);
  keys_.erase(keys_.begin() + position);
}

SampleSource::~SampleSource() = default;

void SampleSource::index_tar(int32_t file) {
  const TarScan scan = scan_tar(*handles_[static_cast<size_t>(file)]);
  if (!scan.error.empty()) problems_.push_back(files_[static_cast<size_t>(file)] + ": " + scan.error);
  const bool wants_image = kind_ != SampleKind::TEXT, wants_text = kind_ != SampleKind::IMAGE;
  Entry current;
  std::string current_key;
  bool open = false;
  int64_t number = 0;
  auto close = [&] {
    if (!open) return;
    const bool complete = (!wants_image || current.image.offset >= 0) && (!wants_text || current.text.offset >= 0);
    if (complete) {
      index_.push_back(current);
      keys_.push_back(current_key);
    } else {
      ++incomplete_;
    }
    open = false;
  };
  for (const auto& m : scan.members) {
    const auto [key, ext] = key_and_ext(m.name);
    if (!open || key != current_key) {
      close();
      current = Entry{file, number++, {}, {}, {}};
      current_key = key;
      open = true;
    }
    const Range range{m.offset, m.size};
    switch (part_of(ext)) {
      case Part::kImage: current.image = range; break;
      case Part::kText: current.text = range; break;
      case Part::kLabel: current.label = range; break;
      case Part::kOther: break;
    }
  }
  close();
}

// CoNLL columns: each sentence (a run of lines up to a blank or -DOCSTART- line) one entry, numbered by its first
// line.
void SampleSource::index_sentences(int32_t file) {
  const auto& handle = *handles_[static_cast<size_t>(file)];
  const int64_t size = handle.size();
  constexpr int64_t kChunk = 1 << 20;
  int64_t line_start = 0, line_number = 0, sentence_start = -1, sentence_end = 0, first_line = 0;
  std::string chunk, line;
  auto end_line = [&](int64_t end) {
    ++line_number;
    if (conll_separator(line)) {
      if (sentence_start >= 0) {
        index_.push_back(Entry{file, first_line, {}, {sentence_start, sentence_end - sentence_start}, {}});
        keys_.emplace_back();
      }
      sentence_start = -1;
    } else {
      if (sentence_start < 0) sentence_start = line_start, first_line = line_number;
      sentence_end = end;
    }
    line.clear();
    line_start = end + 1;
  };
  for (int64_t offset = 0; offset < size; offset += kChunk) {
    chunk = handle.read(offset, std::min(kChunk, size - offset));
    for (size_t i = 0; i < chunk.size(); ++i) {
      if (chunk[i] == '\n') end_line(offset + static_cast<int64_t>(i));
      else line += chunk[i];
    }
  }
  if (line_start < size) end_line(size);  // a last line without its newline
  line.clear();
  end_line(size);  // the end: a separator
}

// Lines are parsed when read: a malformed one is the loader's to skip and count.
void SampleSource::index_lines(int32_t file) {
  const auto& handle = *handles_[static_cast<size_t>(file)];
  const int64_t size = handle.size();
  constexpr int64_t kChunk = 1 << 20;
  int64_t line_start = 0, line_number = 0;
  std::string chunk;
  for (int64_t offset = 0; offset < size; offset += kChunk) {
    chunk = handle.read(offset, std::min(kChunk, size - offset));
    for (size_t i = 0; i < chunk.size(); ++i) {
      if (chunk[i] != '\n') continue;
      const int64_t end = offset + static_cast<int64_t>(i);
      ++line_number;
      if (end > line_start) {
        index_.push_back(Entry{file, line_number, {}, {line_start, end - line_start}, {}});
        keys_.emplace_back();
      }
      line_start = end + 1;
    }
  }
  if (size > line_start) {
    index_.push_back(Entry{file, line_number + 1, {}, {line_start, size - line_start}, {}});
    keys_.emplace_back();
  }
}

std::string SampleSource::tokenized() const {
  for (const auto& table : tables_) {
    const std::string columns = table ? table->tokenized() : "";
    if (!columns.empty()) return columns;
  }
  return "";
}

RawSample SampleSource::read(int64_t i) const {
  if (i < 0 || i >= size_) throw std::out_of_range("sample " + std::to_string(i) + " of " + std::to_string(size_));
  const Span& span = *(std::upper_bound(spans_.begin(), spans_.end(), i,
                                        [](int64_t x, const Span& s) { return x < s.first; }) - 1);
  if (span.entries < 0) {
    RawSample s;
    s.key = files_[static_cast<size_t>(span.file)] + ":" + std::to_string(i - span.first);
    tables_[static_cast<size_t>(span.file)]->read(i - span.first, s);
    return s;
  }
  i = span.entries + (i - span.first);
  const Entry& e = index_.at(static_cast<size_t>(i));
  const auto& handle = *handles_[static_cast<size_t>(e.file)];
  const std::string& file = files_[static_cast<size_t>(e.file)];
  RawSample s;
  const std::string& key = keys_[static_cast<size_t>(i)];
  s.key = file + ":" + (key.empty() ? std::to_string(e.number) : key);
  if (e.image.offset >= 0) s.image = handle.read(e.image.offset, e.image.size);
  if (e.text.offset >= 0) s.text = handle.read(e.text.offset, e.text.size);
  if (static_cast<RecordFormat>(formats_[static_cast<size_t>(e.file)]) != RecordFormat::TAR) {
    read_fields(s, std::string(s.text), e.file);
  }
  if (e.label.offset >= 0) {
    const std::string text = handle.read(e.label.offset, e.label.size);
    if (fields_.scores) {
      s.score = checked_score(text, s.key + ": .cls ");
      return s;
    }
    try {
      size_t used = 0;
      s.label = std::stoll(text, &used);
    } catch (const std::exception&) {
      throw std::runtime_error(s.key + ": .cls is not an integer ('" + text.substr(0, 20) + "')");
    }
    if (!fields_.classes.empty() && (*s.label < 0 || *s.label >= static_cast<int64_t>(fields_.classes.size()))) {
      throw std::runtime_error(s.key + ": .cls label " + std::to_string(*s.label) + " is not a class id below " +
                               std::to_string(fields_.classes.size()));
    }
  }
  return s;
}

// The text(s) and label of one line of a .txt/.jsonl/.tsv/.csv file into `s`.
void SampleSource::read_fields(RawSample& s, const std::string& line, int32_t file) const {
  const auto format = static_cast<RecordFormat>(formats_[static_cast<size_t>(file)]);
  std::vector<std::string> values;  // the text fields' values, then the label's
  if (format == RecordFormat::CONLL) {  // a sentence: its lines' words and tags
    std::vector<std::string> tags;
    const int64_t first_line = std::stoll(s.key.substr(s.key.rfind(':') + 1));  // the key ends in it
    conll_words(line, s.key, first_line, s.words, tags);
    s.word_labels = class_ids(tags, fields_.classes, s.key);
    s.text.clear();
    return;
  }
  if (format == RecordFormat::TEXT_LINES) {
    values.push_back(!line.empty() && line.back() == '\r' ? line.substr(0, line.size() - 1) : line);
  } else if (format == RecordFormat::JSONL) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& ex) {
      throw std::runtime_error(s.key + ": not a JSON line (" + ex.what() + ")");
    }
    if (!j.is_object()) throw std::runtime_error(s.key + ": a .jsonl line must be a JSON object");
    if (fields_.words) return json_words(s, j, fields_);
    if (json_tokens(s, j, fields_)) values.assign(fields_.text.size(), "");  // token ids, not text
    for (size_t f = values.size(); f < fields_.text.size(); ++f) {
      const std::string& name = fields_.text[f];
      if (!j.contains(name) || !j[name].is_string()) {
        throw std::runtime_error(s.key + ": a .jsonl line needs a string field \"" + name + "\"");
      }
      values.push_back(j[name].get<std::string>());
    }
    if (!fields_.label.empty() && fields_.multi_label) {
      s.label_set = json_label_set(j, fields_, s.key);
    } else if (!fields_.label.empty()) {
      const auto it = j.find(fields_.label);
      if (it == j.end() || !(it->is_string() || (fields_.scores ? it->is_number() : it->is_number_integer()))) {
        throw std::runtime_error(s.key + ": a .jsonl line needs a label field \"" + fields_.label + "\" (" +
                                 (fields_.scores ? "a number" : "a class name or id") + ")");
      }
      values.push_back(it->is_string() ? it->get<std::string>() : it->dump());  // a number's shortest round trip
    }
  } else {
    std::vector<std::string> row;
    try {
      row = split_record(line, format);
    } catch (const std::runtime_error& ex) {
      throw std::runtime_error(s.key + ": " + ex.what());
    }
    for (size_t column : columns_[static_cast<size_t>(file)]) {
      if (column >= row.size()) {
        throw std::runtime_error(s.key + ": " + std::to_string(row.size()) + " fields, the header has more");
      }
      values.push_back(row[column]);
    }
  }
  s.text = values[0];
  if (pairs()) s.text_pair = values[1];
  if (fields_.label.empty() || s.label_set) return;  // no label, or a .jsonl array already read
  const std::string& label = values.back();
  if (fields_.multi_label) {
    s.label_set = listed_label_set(label, fields_, s.key);
    return;
  }
  if (fields_.scores) {
    s.score = checked_score(label, s.key + ": ");
    return;
  }
  const int64_t id = class_of(label, fields_.classes);
  if (id < 0) throw std::runtime_error(s.key + ": " + not_a_class(label, fields_.classes));
  s.label = id;
}

}  // namespace shardtrain::data
