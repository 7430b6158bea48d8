#include "progress_relay.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "shardtrain/launch/launch.h"

namespace shardtrain::cli {
namespace {

class RelaySink : public log::Sink {
 public:
  void line(log::Level level, const std::string& text) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::FILE* out = level >= log::Level::WARNING ? stderr : stdout;
    std::fprintf(out, "%s\n", text.c_str());
    std::fflush(out);
  }
  void status(const std::string& text) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fprintf(stderr, "%c%s\n", launch::kStatusLineMarker, text.c_str());
    std::fflush(stderr);
  }
  bool shows_status() const override { return true; }

 private:
  std::mutex mutex_;
};

}  // namespace

std::shared_ptr<log::Sink> train_console_sink() {
  const char* mode = std::getenv(launch::kProgressEnv);
  if (mode && std::strcmp(mode, "relay") == 0) return std::make_shared<RelaySink>();
  return log::console_sink();
}

}  // namespace shardtrain::cli
