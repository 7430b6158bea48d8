#include "shardtrain/io/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "shardtrain/io/files.h"

namespace shardtrain::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<std::string, at::ScalarType>> names = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},   {"U8", at::kByte},        {"BOOL", at::kBool}};
  return names;
}

at::ScalarType dtype_of(const std::string& name) {
  for (const auto& [n, t] : dtype_names()) {
    if (n == name) return t;
  }
  throw std::invalid_argument("dtype '" + name + "' is not one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL");
}

class Fd {
 public:
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  }
  ~Fd() { ::close(fd); }
  void read_at(void* out, uint64_t size, uint64_t offset, const std::string& path) const {
    char* p = static_cast<char*>(out);
    while (size > 0) {
      const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("cannot read '" + path + "' at byte " + std::to_string(offset));
      p += n;
      size -= static_cast<uint64_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }
  int fd;
};

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& [n, t] : dtype_names()) {
    if (t == dtype) return n;
  }
  throw std::invalid_argument(std::string("safetensors: dtype ") + c10::toString(dtype) + " has no safetensors name");
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  auto bad = [this](const std::string& what) { return std::runtime_error("safetensors '" + path_ + "': " + what); };
  Fd file(path_);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw bad(std::strerror(errno));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) throw bad("file is " + std::to_string(file_bytes) + " bytes, shorter than the 8-byte header length");
  unsigned char length_bytes[8];
  file.read_at(length_bytes, 8, 0, path_);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    throw bad("header length " + std::to_string(header_bytes) + " exceeds the file (" + std::to_string(file_bytes) +
              " bytes) or the 100 MiB limit");
  }
  std::string text(header_bytes, '\0');
  file.read_at(text.data(), header_bytes, 8, path_);
  data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw bad("__metadata__['" + m.key() + "'] is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad_tensor = [&](const std::string& what) { return bad("tensor '" + name + "': " + what); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      throw bad_tensor("entry needs dtype, shape and data_offsets");
    }
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string()) throw bad_tensor("dtype is not a string");
    try {
      e.dtype = dtype_of(v["dtype"].get<std::string>());
    } catch (const std::invalid_argument& err) {
      throw bad_tensor(err.what());
    }
    if (!v["shape"].is_array()) throw bad_tensor("shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad_tensor("shape " + v["shape"].dump() + " has a non-natural size");
      e.shape.push_back(d.get<int64_t>());
      numel *= static_cast<uint64_t>(e.shape.back());
    }
    const auto& offsets = v["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      throw bad_tensor("data_offsets " + offsets.dump() + " is not [begin, end]");
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_bytes) {
      throw bad_tensor("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                       "] outside the data section of " + std::to_string(data_bytes) + " bytes");
    }
    const uint64_t expected = numel * c10::elementSize(e.dtype);
    if (e.end - e.begin != expected) {
      throw bad_tensor("holds " + std::to_string(e.end - e.begin) + " bytes, its dtype and shape " + v["shape"].dump() +
                       " need " + std::to_string(expected));
    }
    entries_.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw bad("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
    }
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) throw std::runtime_error("safetensors '" + path_ + "': no tensor '" + name + "'");
  at::Tensor out = at::empty(e->shape, at::TensorOptions().dtype(e->dtype));
  Fd file(path_);
  file.read_at(out.data_ptr(), e->end - e->begin, data_start_ + e->begin, path_);
  return out;
}

at::Tensor SafetensorsReader::read_rows(const std::string& name, int64_t first_row, int64_t rows) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) throw std::runtime_error("safetensors '" + path_ + "': no tensor '" + name + "'");
  const int64_t total = e->shape.empty() ? 1 : e->shape[0];
  if (rows < 0 || (rows > 0 && (first_row < 0 || first_row + rows > total))) {  // no rows: from anywhere
    throw std::out_of_range("safetensors '" + path_ + "': tensor '" + name + "' has " + std::to_string(total) +
                            " rows, rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + rows) +
                            ") asked for");
  }
  std::vector<int64_t> shape = e->shape.empty() ? std::vector<int64_t>{1} : e->shape;
  shape[0] = rows;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(e->dtype));
  const uint64_t row_bytes = total == 0 ? 0 : (e->end - e->begin) / static_cast<uint64_t>(total);
  if (rows > 0) {
    Fd file(path_);
    file.read_at(out.data_ptr(), row_bytes * rows, data_start_ + e->begin + row_bytes * first_row, path_);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, at::Tensor>> sorted = tensors;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& [name, t] = sorted[i];
    if (i > 0 && name == sorted[i - 1].first) throw std::invalid_argument("write_safetensors: tensor '" + name + "' given twice");
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  unsigned char length_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) length_bytes[i] = static_cast<unsigned char>(n & 0xff);
  io::AtomicFile file(path);
  file.write(length_bytes, 8);
  file.write(text.data(), text.size());
  for (const auto& [name, t] : sorted) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    file.write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  file.commit();
}

}  // namespace shardtrain::io
