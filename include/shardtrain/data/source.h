// A source of raw samples: the files of one kind of data, indexed once, read by sample number from any thread.
//
// WebDataset tars: consecutive members sharing a key (the path up to the first '.' of the file name) form a
// sample; by extension: jpg/jpeg/png/bmp/gif/ppm/pgm = the image, txt/text/caption = the text, cls = an integer
// label. Text files: .txt (each non-empty line a sample) and .jsonl (each line an object; its "text" field).
// Directories stand for every .tar/.txt/.jsonl inside, sorted.
//
// What cannot be used is counted, never fatal: a truncated or corrupt tar contributes the samples before the
// damage (scan_problems says where it stopped), a sample lacking the kind's parts is left out
// (incomplete_samples); a sample whose bytes turn out bad when read (undecodable image, malformed JSON) is the
// loader's to skip and count.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::io {
class ReadOnlyFile;
}

namespace shardtrain::data {

enum class SampleKind { IMAGE_TEXT, TEXT, IMAGE };
const char* kind_name(SampleKind kind);  // "image_text", "text", "image"

struct RawSample {
  std::string key;    // "shard-00003.tar:000123" or "corpus.txt:17" (line number)
  std::string image;  // encoded bytes; empty when the kind has none
  std::string text;
  std::optional<int64_t> label;  // the .cls member
};

class SampleSource {
 public:
  // Throws std::invalid_argument when a path does not exist, names no usable file, or yields no sample at all.
  SampleSource(const std::vector<std::string>& paths, SampleKind kind);
  ~SampleSource();
  SampleSource(const SampleSource&) = delete;
  SampleSource& operator=(const SampleSource&) = delete;

  SampleKind kind() const { return kind_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  // Throws std::runtime_error for bytes that cannot be read or parsed (a .jsonl line that is not JSON).
  RawSample read(int64_t i) const;

  const std::vector<std::string>& files() const { return files_; }
  const std::vector<std::string>& scan_problems() const { return problems_; }  // "file: why the scan stopped"
  int64_t incomplete_samples() const { return incomplete_; }

 private:
  struct Range {
    int64_t offset = -1, size = 0;  // -1: absent
  };
  struct Entry {
    int32_t file = 0;
    int64_t number = 0;  // member key number or line number, for RawSample::key
    Range image, text, label;
  };
  void index_tar(int32_t file);
  void index_lines(int32_t file, bool jsonl);

  SampleKind kind_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<io::ReadOnlyFile>> handles_;
  std::vector<std::string> keys_;  // tar sample keys, parallel to index_ for tars (empty strings for lines)
  std::vector<Entry> index_;
  std::vector<std::string> problems_;
  int64_t incomplete_ = 0;
};

// The files a list of paths stands for (directories expanded, sorted), checked to exist.
std::vector<std::string> expand_paths(const std::vector<std::string>& paths);

}  // namespace shardtrain::data
