#include "shardtrain/io/pickle_files.h"

#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <stdexcept>
#include <vector>

#include "shardtrain/io/files.h"

namespace shardtrain::io {

void save_pickle(const std::string& path, const c10::IValue& value) {
  // The pickle program alone (kilobytes): tensors are references to records written after it, as pickle_save does.
  std::vector<char> program;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) { program.insert(program.end(), bytes, bytes + size); });
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  AtomicFile file(path);
  try {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
      file.write(bytes, size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", program.data(), program.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot write " + path + ": " + e.what_without_backtrace());
  }
  file.commit();
}

c10::IValue load_pickle(const std::string& path) {
  if (!path_exists(path)) throw std::runtime_error("cannot read " + path + ": no such file");
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"", std::nullopt,
                                             std::nullopt, at::Device(at::kCPU), reader);
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot read " + path + " as a torch.save archive: " + e.what_without_backtrace());
  }
}

}  // namespace shardtrain::io
