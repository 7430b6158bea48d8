#include "data/formats/tar.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

constexpr int64_t kBlock = 512;

// A NUL-terminated field of at most n bytes.
std::string field(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// Octal numeric fields (size, checksum); GNU's base-256 form (high bit set) for sizes of 8 GiB and more.
bool parse_number(const char* p, size_t n, int64_t& out) {
  if (static_cast<unsigned char>(p[0]) & 0x80) {
    out = 0;
    for (size_t i = 1; i < n; ++i) out = (out << 8) | static_cast<unsigned char>(p[i]);
    return true;
  }
  out = 0;
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\0')) ++i;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) out = out * 8 + (p[i] - '0'), any = true;
  return any;
}

int64_t header_checksum(const char* h) {
  int64_t sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  return sum;
}

int64_t padded(int64_t size) { return (size + kBlock - 1) / kBlock * kBlock; }

// The "path" record of a pax extended header ("<len> path=<value>\n" records).
std::string pax_path(const std::string& records) {
  size_t pos = 0;
  while (pos < records.size()) {
    const size_t space = records.find(' ', pos);
    if (space == std::string::npos) break;
    const int64_t len = std::atoll(records.c_str() + pos);
    if (len <= 0 || pos + static_cast<size_t>(len) > records.size()) break;
    const std::string record = records.substr(space + 1, pos + static_cast<size_t>(len) - space - 2);
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    pos += static_cast<size_t>(len);
  }
  return "";
}

}  // namespace

TarScan scan_tar(const io::ReadOnlyFile& file) {
  TarScan scan;
  const int64_t size = file.size();
  std::string long_name;  // from a preceding 'L' or 'x' member
  char h[kBlock];
  for (int64_t offset = 0;;) {
    if (offset + kBlock > size) {
      if (offset < size || offset == 0) {
        scan.error = "truncated: the file ends inside the header at offset " + std::to_string(offset) + " (" +
                     std::to_string(size) + " bytes)";
      } else {
        scan.error = "truncated: no end-of-archive blocks after offset " + std::to_string(offset);
      }
      return scan;
    }
    file.read(offset, kBlock, h);
    if (std::all_of(h, h + kBlock, [](char c) { return c == 0; })) return scan;  // end of archive
    int64_t stored = 0, data_size = 0;
    if (!parse_number(h + 148, 8, stored) || stored != header_checksum(h)) {
      scan.error = "bad header checksum at offset " + std::to_string(offset) + " (not a tar, or corrupt)";
      return scan;
    }
    if (!parse_number(h + 124, 12, data_size) || data_size < 0) {
      scan.error = "bad member size at offset " + std::to_string(offset);
      return scan;
    }
    std::string name = field(h, 100);
    const std::string prefix = std::memcmp(h + 257, "ustar", 5) == 0 ? field(h + 345, 155) : "";
    if (!prefix.empty()) name = prefix + "/" + name;
    const char type = h[156];
    const int64_t data = offset + kBlock;
    if (data + data_size > size) {
      scan.error = "truncated: member '" + name + "' needs " + std::to_string(data_size) + " bytes at offset " +
                   std::to_string(data) + ", the file has " + std::to_string(size);
      return scan;
    }
    if (type == 'L') {
      long_name = file.read(data, data_size);
      long_name.resize(strnlen(long_name.c_str(), long_name.size()));
    } else if (type == 'x') {
      long_name = pax_path(file.read(data, data_size));
    } else if (type == 'g') {
      // global pax header: nothing per member
    } else {
      if (type == '0' || type == '\0' || type == '7') {
        scan.members.push_back({long_name.empty() ? name : long_name, data, data_size});
      }
      long_name.clear();
    }
    offset = data + padded(data_size);
  }
}

TarWriter::TarWriter(const std::string& path) : file_(std::make_unique<io::AtomicFile>(path)) {}
TarWriter::~TarWriter() = default;

void TarWriter::add(const std::string& name, const std::string& bytes) {
  if (!file_) throw std::logic_error("TarWriter::add after finish");
  char h[kBlock] = {};
  std::string stem = name, prefix;
  if (stem.size() > 100) {  // split at a '/' into ustar's prefix (155) and name (100)
    const size_t slash = name.find('/', name.size() > 101 ? name.size() - 101 : 0);
    if (slash == std::string::npos || slash > 155 || name.size() - slash - 1 > 100) {
      throw std::invalid_argument("tar member name too long for ustar (" + std::to_string(name.size()) +
                                  " bytes): " + name);
    }
    prefix = name.substr(0, slash), stem = name.substr(slash + 1);
  }
  std::memcpy(h, stem.data(), stem.size());
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(bytes.size()));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memcpy(h + 345, prefix.data(), prefix.size());
  char checksum[16];  // at most 512 * 255: six octal digits, then NUL and space
  std::snprintf(checksum, sizeof(checksum), "%06o", static_cast<unsigned>(header_checksum(h)) & 0777777u);
  std::memcpy(h + 148, checksum, 7);
  h[155] = ' ';
  file_->write(h, kBlock);
  file_->write(bytes.data(), bytes.size());
  const char zeros[kBlock] = {};
  file_->write(zeros, static_cast<size_t>(padded(static_cast<int64_t>(bytes.size())) - bytes.size()));
}

void TarWriter::finish() {
  if (!file_) throw std::logic_error("TarWriter::finish twice");
  const char zeros[2 * kBlock] = {};
  file_->write(zeros, sizeof(zeros));
  file_->commit();
  file_.reset();
}

}  // namespace shardtrain::data
