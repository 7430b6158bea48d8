// libFuzzer: a checkpoint's own metadata from an untrusted directory: the bytes as manifest.json (read, then the
// checkpoint verified against it) and as trainer.json (parsed). Damage must throw std::runtime_error or be reported
// by verify_files.
#include <sys/stat.h>

#include <stdexcept>

#include "fuzz_input.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/trainer_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/tmp/shardtrain-fuzz-" + std::to_string(::getpid()) + "-step-00000001";
  ::mkdir(dir.c_str(), 0755);
  const std::string manifest = shardtrain::fuzz::input_file(data, size, "step-00000001/manifest.json");
  try {
    shardtrain::ckpt::read_manifest(dir);
  } catch (const std::runtime_error&) {
  }
  shardtrain::ckpt::verify_files(dir);  // reports, never throws
  try {
    shardtrain::ckpt::parse_trainer_state(std::string(reinterpret_cast<const char*>(data), size), "trainer.json");
  } catch (const std::runtime_error&) {
  }
  return 0;
}
