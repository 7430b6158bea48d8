#include "shardtrain/data/source.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

#include "data/tar.h"
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

std::vector<std::string> expand_paths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& path : paths) {
    if (!io::path_exists(path)) throw std::invalid_argument("data path '" + path + "' does not exist");
    if (!io::is_directory(path)) {
      files.push_back(path);
      continue;
    }
    bool any = false;
    for (const auto& name : io::list_directory(path)) {
      if (ends_with(name, ".tar") || ends_with(name, ".txt") || ends_with(name, ".jsonl")) {
        files.push_back(path + "/" + name);
        any = true;
      }
    }
    if (!any) throw std::invalid_argument("data directory '" + path + "' has no .tar, .txt or .jsonl file");
  }
  return files;
}

SampleSource::SampleSource(const std::vector<std::string>& paths, SampleKind kind) : kind_(kind) {
  files_ = expand_paths(paths);
  if (files_.empty()) throw std::invalid_argument(std::string("no files given for the ") + kind_name(kind) + " data");
  for (size_t f = 0; f < files_.size(); ++f) {
    const std::string& path = files_[f];
    handles_.push_back(std::make_unique<io::ReadOnlyFile>(path));
    if (ends_with(path, ".tar")) {
      index_tar(static_cast<int32_t>(f));
    } else if (kind == SampleKind::TEXT && (ends_with(path, ".txt") || ends_with(path, ".jsonl"))) {
      index_lines(static_cast<int32_t>(f), ends_with(path, ".jsonl"));
    } else {
      throw std::invalid_argument("data file '" + path + "': expected a .tar" +
                                  (kind == SampleKind::TEXT ? ", .txt or .jsonl" : std::string()) + " file for " +
                                  kind_name(kind) + " data");
    }
  }
  if (index_.empty()) {
    std::string why;
    for (const auto& p : problems_) why += "\n  " + p;
    throw std::invalid_argument(std::string("the ") + kind_name(kind) + " data (" + std::to_string(files_.size()) +
                                " files, first '" + files_[0] + "') has no usable sample (" +
                                std::to_string(incomplete_) + " incomplete)" + why);
  }
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

void SampleSource::index_lines(int32_t file, bool jsonl) {
  (void)jsonl;  // parsed when read: a malformed line is the loader's to skip and count
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

RawSample SampleSource::read(int64_t i) const {
  const Entry& e = index_.at(static_cast<size_t>(i));
  const auto& handle = *handles_[static_cast<size_t>(e.file)];
  const std::string& file = files_[static_cast<size_t>(e.file)];
  RawSample s;
  const std::string& key = keys_[static_cast<size_t>(i)];
  s.key = file + ":" + (key.empty() ? std::to_string(e.number) : key);
  if (e.image.offset >= 0) s.image = handle.read(e.image.offset, e.image.size);
  if (e.text.offset >= 0) s.text = handle.read(e.text.offset, e.text.size);
  if (ends_with(file, ".jsonl")) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(s.text);
    } catch (const nlohmann::json::exception& ex) {
      throw std::runtime_error(s.key + ": not a JSON line (" + ex.what() + ")");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
      throw std::runtime_error(s.key + ": a .jsonl line needs a string field \"text\"");
    }
    s.text = j["text"].get<std::string>();
  } else if (!s.text.empty() && s.text.back() == '\r') {
    s.text.pop_back();
  }
  if (e.label.offset >= 0) {
    const std::string text = handle.read(e.label.offset, e.label.size);
    try {
      size_t used = 0;
      s.label = std::stoll(text, &used);
    } catch (const std::exception&) {
      throw std::runtime_error(s.key + ": .cls is not an integer ('" + text.substr(0, 20) + "')");
    }
  }
  return s;
}

}  // namespace shardtrain::data
