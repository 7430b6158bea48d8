#include "shardtrain/io/torch_state_dict.h"

#include <caffe2/serialize/inline_container.h>

#include <fstream>
#include <memory>
#include <stdexcept>

#include "shardtrain/io/files.h"
#include "io/mapped_file.h"
#include "io/state_dict_program.h"

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

// A legacy-format file, mapped (or where it cannot be, read whole), its storages views of it.
std::vector<std::pair<std::string, at::Tensor>> load_legacy(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  if (file->mapped()) {
    return run_legacy_state_dict(path, file->at(0), file->size(),
                                 [&](size_t offset) { return mapped_bytes(file, offset); });
  }
  auto bytes = std::make_shared<std::vector<char>>(read_file(path));
  return run_legacy_state_dict(path, bytes->data(), bytes->size(), [&](size_t offset) {
    auto* owner = new std::shared_ptr<std::vector<char>>(bytes);
    return at::DataPtr(bytes->data() + offset, owner,
                       [](void* p) { delete static_cast<std::shared_ptr<std::vector<char>>*>(p); },
                       at::Device(at::kCPU));
  });
}

}  // namespace

bool is_torch_save_file(const std::string& path) {
  const std::string head = first_bytes(path, kHead);
  return is_zip(head) || is_legacy(head);
}

std::vector<std::pair<std::string, at::Tensor>> load_torch_state_dict(const std::string& path) {
  const std::string head = first_bytes(path, kHead);
  if (head.empty() && !std::ifstream(path).good()) throw std::runtime_error("cannot read " + path + ": no such file");
  if (is_legacy(head)) return load_legacy(path);
  if (!is_zip(head)) throw std::runtime_error(path + ": not a torch.save archive (a zip file expected)");
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (reader.hasRecord("byteorder")) {
      auto [bytes, size] = reader.getRecord("byteorder");
      const std::string order(static_cast<const char*>(bytes.get()), size);
      if (order != "little") throw std::runtime_error(path + ": saved " + order + "-endian (little expected)");
    }
    auto file = std::make_shared<MappedFile>(path);
    auto storage_of = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
      const std::string record = "data/" + key;
      if (!reader.hasRecord(record)) throw std::runtime_error(path + ": no record " + record + " for a storage");
      const size_t size = reader.getRecordSize(record), item = at::elementSize(dtype);
      if (numel < 0 || static_cast<uint64_t>(numel) > size / item) {
        throw std::runtime_error(path + ": record " + record + " holds " + std::to_string(size) + " bytes, not " +
                                 std::to_string(numel) + " elements of " + std::to_string(item));
      }
      if (!file->mapped()) {  // a file system that cannot map it: the record read into memory
        auto [bytes, n] = reader.getRecord(record);
        return at::Storage(at::Storage::use_byte_size_t(), n, std::move(bytes), nullptr, /*resizable=*/false);
      }
      const size_t offset = reader.getRecordOffset(record);
      if (offset > file->size() || size > file->size() - offset) {
        throw std::runtime_error(path + ": record " + record + " lies past the file's end");
      }
      return at::Storage(at::Storage::use_byte_size_t(), size, mapped_bytes(file, offset), nullptr,
                         /*resizable=*/false);
    };
    auto [program, size] = reader.getRecord("data.pkl");
    return run_state_dict_program(path, static_cast<const char*>(program.get()), size, storage_of);
  } catch (const c10::Error& e) {
    throw std::runtime_error(path + ": not a readable torch.save archive: " + e.what_without_backtrace());
  }
}

}  // namespace shardtrain::io
