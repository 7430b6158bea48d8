// TensorBoard event files, written without TensorFlow: TFRecord framing (length, masked CRC-32C of the length,
// payload, masked CRC-32C of the payload) around hand-encoded `Event` protocol buffers holding scalar summaries.
// `tensorboard --logdir DIR` reads them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace shardtrain::train {

// CRC-32C (Castagnoli), and TFRecord's masking of it.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

class EventWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host> (dir is created) and writes the file-version event.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// The payloads of a TFRecord file, with every length and CRC checked (throws std::runtime_error naming the file and
// offset otherwise). For tests and tools.
std::vector<std::string> read_tfrecords(const std::string& path);

}  // namespace shardtrain::train
