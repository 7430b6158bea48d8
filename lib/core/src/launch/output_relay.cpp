#include "launch/output_relay.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>

#include "shardtrain/launch/launch.h"

namespace shardtrain::launch {

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

StatusLine::StatusLine() : terminal_(::isatty(STDERR_FILENO) != 0) {}

void StatusLine::set(const std::string& text) {
  clear();
  text_ = text;
  draw();
}

void StatusLine::clear() {
  if (shown_) write_all(STDERR_FILENO, "\r\033[K");
  shown_ = false;
}

void StatusLine::draw() {
  if (!terminal_ || text_.empty()) return;
  winsize size{};
  const size_t columns = ::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1 ? size.ws_col - 1 : 200;
  write_all(STDERR_FILENO, "\r" + text_.substr(0, columns));
  shown_ = true;
}

void StatusLine::forget() {
  if (shown_) write_all(STDERR_FILENO, "\n");
  shown_ = false;
  text_.clear();
}

LineRelay::LineRelay(int rank, int out_fd, StatusLine& status)
    : prefix_("[rank" + std::to_string(rank) + "]: "), out_fd_(out_fd), status_(&status) {}

void LineRelay::feed(const char* data, size_t size) {
  pending_.append(data, size);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit(pending_.substr(start, nl - start));
  }
  pending_.erase(0, start);
}

void LineRelay::flush() {
  if (!pending_.empty()) emit(pending_);
  pending_.clear();
}

void LineRelay::emit(const std::string& line) {
  const bool marked = !line.empty() && line[0] == kStatusLineMarker;
  if (marked && status_->terminal()) {
    status_->set(line.size() > 1 ? prefix_ + line.substr(1) : "");
    return;
  }
  status_->clear();
  write_all(out_fd_, prefix_ + (marked ? line.substr(1) : line) + "\n");
  status_->draw();
}

bool pump(int fd, LineRelay& relay) {
  char buffer[65536];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      relay.feed(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      relay.flush();
      return false;
    }
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;  // nothing more now; any other error ends the stream
  }
}

}  // namespace shardtrain::launch
