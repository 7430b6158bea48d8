#include "shardtrain/io/torch_state_dict.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "shardtrain/io/files.h"
#include "shardtrain/io/mapped_file.h"
#include "io/state_dict_program.h"
#include "io/torch_archive.h"

namespace shardtrain::io {
namespace {

std::string first_bytes(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string out(n, '\0');
  in.read(out.data(), static_cast<std::streamsize>(n));
  out.resize(static_cast<size_t>(in.gcount()));
  return out;
}

constexpr size_t kHead = 15;  // enough to tell the legacy format's magic number
bool is_legacy(const std::string& head) { return is_legacy_torch_save(head.data(), head.size()); }
bool is_zip(const std::string& head) { return head.compare(0, 4, std::string("PK\x03\x04", 4)) == 0; }

// Bytes in memory as PyTorchStreamReader's input.
class MemoryAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  MemoryAdapter(const char* bytes, size_t size) : bytes_(bytes), size_(size) {}
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= size_) return 0;
    n = std::min<size_t>(n, size_ - pos);
    std::memcpy(buf, bytes_ + pos, n);
    return n;
  }

 private:
  const char* bytes_;
  size_t size_;
};

// Runs the zip archive in `bytes`: its byte order checked, then `run(what, program, size, storage_of)` with each
// storage a view of the archive's bytes (data_at), its record checked to hold the storage's elements.
template <class Run>
auto run_archive(const std::string& what, const char* bytes, size_t size, const ArchiveBytes& data_at, Run run) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MemoryAdapter>(bytes, size));
    if (reader.hasRecord("byteorder")) {
      auto [order_bytes, n] = reader.getRecord("byteorder");
      const std::string order(static_cast<const char*>(order_bytes.get()), n);
      if (order != "little") throw std::runtime_error(what + ": saved " + order + "-endian (little expected)");
    }
    auto storage_of = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
      const std::string record = "data/" + key;
      if (!reader.hasRecord(record)) throw std::runtime_error(what + ": no record " + record + " for a storage");
      const size_t record_size = reader.getRecordSize(record), item = at::elementSize(dtype);
      if (numel < 0 || static_cast<uint64_t>(numel) > record_size / item) {
        throw std::runtime_error(what + ": record " + record + " holds " + std::to_string(record_size) +
                                 " bytes, not " + std::to_string(numel) + " elements of " + std::to_string(item));
      }
      const size_t offset = reader.getRecordOffset(record);
      if (offset > size || record_size > size - offset) {
        throw std::runtime_error(what + ": record " + record + " lies past the archive's end");
      }
      return at::Storage(at::Storage::use_byte_size_t(), record_size, data_at(offset), nullptr, /*resizable=*/false);
    };
    auto [program, length] = reader.getRecord("data.pkl");
    return run(what, static_cast<const char*>(program.get()), length, storage_of);
  } catch (const c10::Error& e) {
    throw std::runtime_error(what + ": not a readable torch.save archive: " + e.what_without_backtrace());
  }
}

}  // namespace

bool is_torch_save_file(const std::string& path) {
  const std::string head = first_bytes(path, kHead);
  return is_zip(head) || is_legacy(head);
}

std::vector<std::pair<std::string, at::Tensor>> load_torch_state_dict(const std::string& path) {
  const std::string head = first_bytes(path, kHead);
  if (head.empty() && !std::ifstream(path).good()) throw std::runtime_error("cannot read " + path + ": no such file");
  if (!is_legacy(head) && !is_zip(head)) {
    throw std::runtime_error(path + ": not a torch.save archive (a zip file expected)");
  }
  const FileBytes file = file_bytes(path);
  auto data_at = [&](size_t offset) { return file.at(offset); };
  if (is_legacy(head)) return run_legacy_state_dict(path, file.data(), file.size(), data_at);
  return run_archive(path, file.data(), file.size(), data_at, run_state_dict_program);
}

at::Tensor load_saved_tensor(const std::string& what, const char* bytes, size_t size, const ArchiveBytes& data_at) {
  return run_archive(what, bytes, size, data_at, run_tensor_program);
}

}  // namespace shardtrain::io
