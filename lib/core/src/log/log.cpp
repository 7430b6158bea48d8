#include "shardtrain/log/log.h"

#include <unistd.h>

#include <cstdio>
#include <mutex>

namespace shardtrain::log {
namespace {

// The one place in the library that writes to the console.
class ConsoleSink : public Sink {
 public:
  void line(Level level, const std::string& text) override {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_status();
    std::FILE* out = level >= Level::WARNING ? stderr : stdout;
    std::fprintf(out, "%s\n", text.c_str());
    std::fflush(out);
    redraw_status();
  }
  void status(const std::string& text) override {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_status();
    status_ = text;
    redraw_status();
  }
  bool shows_status() const override { return ::isatty(2) != 0; }

 private:
  void clear_status() {
    if (status_.empty()) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  void redraw_status() {
    if (status_.empty()) return;
    std::fprintf(stderr, "\r%s", status_.c_str());
    std::fflush(stderr);
  }

  std::mutex mutex_;
  std::string status_;
};

}  // namespace

std::shared_ptr<Sink> console_sink() { return std::make_shared<ConsoleSink>(); }

Logger::Logger(std::shared_ptr<Sink> sink, int rank, LoggerOptions options)
    : sink_(std::move(sink)), rank_(rank), options_(options) {}

bool Logger::writes(Level level) const {
  return sink_ != nullptr && level >= options_.level && (rank_ == 0 || options_.every_rank);
}

void Logger::write(Level level, const std::string& text, bool every_rank) const {
  if (!sink_ || level < options_.level) return;
  if (rank_ != 0 && !every_rank && !options_.every_rank) return;
  sink_->line(level, text);
}

bool Logger::shows_status() const { return sink_ && rank_ == 0 && sink_->shows_status(); }

void Logger::status(const std::string& text) const {
  if (sink_ && rank_ == 0) sink_->status(text);
}

}  // namespace shardtrain::log
