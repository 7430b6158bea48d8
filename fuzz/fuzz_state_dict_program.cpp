// libFuzzer: an untrusted torch.save pickle program (a pytorch_model.bin's data.pkl) through
// io::run_state_dict_program, every storage it names zeros of the size it asks for (at most 64 Ki elements). A
// malformed program must throw std::runtime_error; anything else (a crash, a sanitizer report, another exception, a
// tensor that reaches past its storage) is a bug.
#include <ATen/ATen.h>

#include <stdexcept>

#include "io/state_dict_program.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto storage_of = [](const std::string& key, at::ScalarType dtype, int64_t numel) {
    if (numel < 0 || numel > (1 << 16)) throw std::runtime_error("storage " + key + " of " + std::to_string(numel));
    return at::zeros({numel}, at::TensorOptions().dtype(dtype)).storage();
  };
  try {
    for (const auto& [name, t] : shardtrain::io::run_state_dict_program(
             "fuzz", reinterpret_cast<const char*>(data), size, storage_of)) {
      // The view stays inside its storage (LibTorch's reads are not instrumented: checked here instead).
      if (t.numel() == 0) continue;
      int64_t last = t.storage_offset();
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
      if (last >= static_cast<int64_t>(t.storage().nbytes() / t.element_size())) __builtin_trap();
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
