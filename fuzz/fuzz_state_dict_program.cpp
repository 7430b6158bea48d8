// libFuzzer: an untrusted torch.save state dict through the restricted pickle machine — a pickle program (a
// pytorch_model.bin's data.pkl) through io::run_state_dict_program, every storage it names zeros of the size it
// asks for (at most 64 Ki elements); or, when the input begins as the legacy format does, the whole input as such a
// file through io::run_legacy_state_dict, storages views of the input. A malformed input must throw
// std::runtime_error; anything else (a crash, a sanitizer report, another exception, a tensor that reaches past its
// storage) is a bug.
#include <ATen/ATen.h>

#include <stdexcept>

#include "io/state_dict_program.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain::io;
  const char* bytes = reinterpret_cast<const char*>(data);
  auto storage_of = [](const std::string& key, at::ScalarType dtype, int64_t numel) {
    if (numel < 0 || numel > (1 << 16)) throw std::runtime_error("storage " + key + " of " + std::to_string(numel));
    return at::zeros({numel}, at::TensorOptions().dtype(dtype)).storage();
  };
  auto bytes_at = [&](size_t offset) { return at::DataPtr(const_cast<char*>(bytes) + offset, at::Device(at::kCPU)); };
  try {
    const auto entries = is_legacy_torch_save(bytes, size) ? run_legacy_state_dict("fuzz", bytes, size, bytes_at)
                                                           : run_state_dict_program("fuzz", bytes, size, storage_of);
    for (const auto& [name, t] : entries) {
      // The view stays inside its storage, and a legacy storage inside the input (LibTorch's reads are not
      // instrumented: checked here instead).
      if (t.numel() == 0) continue;
      int64_t last = t.storage_offset();
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
      if (last >= static_cast<int64_t>(t.storage().nbytes() / t.element_size())) __builtin_trap();
      const char* begin = static_cast<const char*>(t.storage().data());
      if (is_legacy_torch_save(bytes, size) &&
          (begin < bytes || begin + t.storage().nbytes() > bytes + size)) {
        __builtin_trap();
      }
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
