// libFuzzer: untrusted YAML through config::parse_config (with an override, as the command line gives them), and a
// config that parses written back and read again. Bad input must throw config::ConfigError.
#include <string>

#include "fuzz_input.h"
#include "shardtrain/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  try {
    const shardtrain::config::Config c = shardtrain::config::parse_config(yaml, "fuzz.yaml", {"--train.steps=3"});
    const shardtrain::config::Config again = shardtrain::config::parse_config(shardtrain::config::to_yaml(c), "again");
    if (again.train.steps != 3) __builtin_trap();
  } catch (const shardtrain::config::ConfigError&) {
  }
  return 0;
}
