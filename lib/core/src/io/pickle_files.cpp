#include "shardtrain/io/pickle_files.h"

#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "shardtrain/io/files.h"
#include "shardtrain/io/mapped_file.h"

namespace shardtrain::io {

namespace {

// `value` with every list, dict and tuple rebuilt untyped (elements of any type): the pickler writes a List[int]
// (a shape) through torch.jit._pickle.build_intlist, a global Python's torch.load refuses by default
// (weights_only=True since PyTorch 2.6), and a plain list otherwise. Tensors and scalars are kept as they are.
c10::IValue untyped(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const c10::IValue& item : value.toListRef()) out.push_back(untyped(item));
    return out;
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), c10::AnyType::get());
    for (const auto& item : dict) out.insert(item.key(), untyped(item.value()));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(untyped(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace

void save_pickle(const std::string& path, const c10::IValue& value) {
  // The pickle program alone (kilobytes): tensors are references to records written after it, as pickle_save does.
  // Containers untagged (no torch.jit._pickle.restore_type_tag) and untyped (above): Python's torch.load reads the
  // file with its defaults.
  std::vector<char> program;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) { program.insert(program.end(), bytes, bytes + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(untyped(value));
  pickler.stop();
  AtomicFile file(path);
  // The writer calls back from inside miniz and finishes the archive in its destructor, where an exception ends the
  // process (std::terminate): a failed write (a full disk) is kept here, the rest of the archive is dropped, and the
  // error is thrown once the writer is done with it.
  std::string failed;
  try {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
      if (failed.empty()) {
        try {
          file.write(bytes, size);
        } catch (const std::exception& e) {
          failed = e.what();
        }
      }
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", program.data(), program.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot write " + path + ": " + e.what_without_backtrace());
  }
  if (!failed.empty()) throw std::runtime_error(failed);
  file.commit();
}


c10::IValue load_pickle(const std::string& path) {
  if (!path_exists(path)) throw std::runtime_error("cannot read " + path + ": no such file");
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    auto file = std::make_shared<MappedFile>(path);
    if (!file->mapped()) {  // a file system that cannot map it: each storage read into memory
      return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"", std::nullopt,
                                               std::nullopt, at::Device(at::kCPU), reader);
    }
    // As readArchiveAndTensors, but each storage is the record's bytes in the mapping (torch.load's mmap=True):
    // records are stored uncompressed, 64-byte aligned, so a storage is a view of the file and loading the state
    // it holds into a model's shards reads the file once, with no copy of it in memory. (Read into memory, every
    // storage of the file was alive at once beside the state it was loaded into.)
    at::DataPtr program;
    size_t program_size = 0, consumed = 0;
    std::tie(program, program_size) = reader.getRecord("data.pkl");
    auto read_program = [&](char* buffer, size_t len) -> size_t {
      len = std::min(program_size - consumed, len);
      std::memcpy(buffer, static_cast<const char*>(program.get()) + consumed, len);
      consumed += len;
      return len;
    };
    auto read_record = [&](const std::string& key) {
      const std::string record = "data/" + key;
      const size_t offset = reader.getRecordOffset(record), size = reader.getRecordSize(record);
      if (offset > file->size() || size > file->size() - offset) {
        throw std::runtime_error("cannot read " + path + ": record " + record + " (" + std::to_string(size) +
                                 " bytes at " + std::to_string(offset) + ") lies past the file's end");
      }
      return mapped_bytes(file, offset);
    };
    torch::jit::Unpickler unpickler(read_program, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr, read_record,
                                    at::Device(at::kCPU));
    unpickler.set_version(reader.version());
    return unpickler.parse_ivalue();
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot read " + path + " as a torch.save archive: " + e.what_without_backtrace());
  }
}

std::vector<int64_t> int_vector(const c10::IValue& list, const std::string& what) {
  if (!list.isList()) throw std::runtime_error(what + ": a list of integers expected, found " + list.tagKind());
  std::vector<int64_t> out;
  for (const c10::IValue& item : list.toListRef()) {
    if (!item.isInt()) throw std::runtime_error(what + ": a list of integers holds a " + item.tagKind());
    out.push_back(item.toInt());
  }
  return out;
}

}  // namespace shardtrain::io
