#include "train/event_writer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "shardtrain/io/files.h"

namespace shardtrain::train {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <class T>
void put_fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; oneof { string file_version = 3; Summary summary = 5; } }
std::string event(int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  put_varint(e, 1 << 3 | 1);
  put_fixed<double>(e, now_seconds());
  put_varint(e, 2 << 3 | 0);
  put_varint(e, static_cast<uint64_t>(step));
  if (file_version) put_bytes_field(e, 3, *file_version);
  if (summary) put_bytes_field(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  io::make_directories(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host;
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw std::runtime_error("cannot create '" + path_ + "': " + std::strerror(errno));
  const std::string version = "brain.Event:2";
  try {
    write_record(event(0, &version, nullptr));
    flush();
  } catch (...) {  // no destructor runs for a constructor that throws
    std::fclose(file_);
    throw;
  }
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  // Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
  std::string v;
  put_bytes_field(v, 1, tag);
  put_varint(v, 2 << 3 | 5);
  put_fixed<float>(v, static_cast<float>(value));
  std::string summary;
  put_bytes_field(summary, 1, v);
  write_record(event(step, nullptr, &summary));
}

void EventWriter::flush() {
  if (std::fflush(file_) != 0) throw std::runtime_error("cannot write '" + path_ + "': " + std::strerror(errno));
}

void EventWriter::write_record(const std::string& payload) {
  std::string record;
  put_fixed<uint64_t>(record, payload.size());
  const uint32_t length_crc = masked_crc32c(record.data(), 8);
  put_fixed<uint32_t>(record, length_crc);
  record += payload;
  put_fixed<uint32_t>(record, masked_crc32c(payload.data(), payload.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    throw std::runtime_error("cannot write '" + path_ + "': " + std::strerror(errno));
  }
}

std::vector<std::string> read_tfrecords(const std::string& path) {
  const std::vector<char> bytes = io::read_file(path);
  std::vector<std::string> out;
  size_t pos = 0;
  auto fail = [&](const std::string& what) {
    return std::runtime_error(path + ": " + what + " at offset " + std::to_string(pos));
  };
  while (pos < bytes.size()) {
    if (pos + 12 > bytes.size()) throw fail("truncated record header");
    uint64_t length;
    uint32_t length_crc, data_crc;
    std::memcpy(&length, &bytes[pos], 8);
    std::memcpy(&length_crc, &bytes[pos + 8], 4);
    if (masked_crc32c(&bytes[pos], 8) != length_crc) throw fail("bad length CRC");
    if (pos + 12 + length + 4 > bytes.size()) throw fail("truncated record");
    std::memcpy(&data_crc, &bytes[pos + 12 + length], 4);
    if (masked_crc32c(&bytes[pos + 12], length) != data_crc) throw fail("bad payload CRC");
    out.emplace_back(&bytes[pos + 12], length);
    pos += 12 + length + 4;
  }
  return out;
}

}  // namespace shardtrain::train
